package server

import (
	"context"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/shoalfs/shoal/client"
)

// BenchmarkSmallFileOps measures what one small-file operation costs the
// server, as `shoal bench --workloads small` drives it: Shoal's Go client
// over loopback TCP, one operation at a time, on the server's own engine
// (bbolt behind its write-ahead log), synced (the default) and with
// Config.Async (sync: false). create is OPEN(CREATE)+CLOSE of an empty
// file, stat a LOOKUP+GETATTR of it, remove its REMOVE; every iteration
// does one of each, so -benchmem's allocs/op counts the server's and
// the client's allocations for the three (the client's are the same on
// both sides of a comparison). The async case is where the CPU per change
// shows: nothing waits for the disk. cpu-µs/op is the process's CPU time
// (user and system, server and client) per iteration, which a loaded
// machine disturbs less than the wall time.
func BenchmarkSmallFileOps(b *testing.B) {
	for _, async := range []bool{false, true} {
		b.Run("async="+strconv.FormatBool(async), func(b *testing.B) {
			ts := startServer(b, Config{Async: async})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			c, err := client.Dial(ctx, ts.addr, client.Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			if err := c.Mkdir(ctx, "/d", 0o755); err != nil {
				b.Fatal(err)
			}
			i := 0
			cpu0 := processCPU(b)
			for b.Loop() {
				i++
				name := "/d/f" + strconv.Itoa(i)
				f, err := c.Open(ctx, name, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
				if err != nil {
					b.Fatal(err)
				}
				if err := f.Close(); err != nil {
					b.Fatal(err)
				}
				if _, err := c.Stat(ctx, name); err != nil {
					b.Fatal(err)
				}
				if err := c.Remove(ctx, name); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64((processCPU(b)-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
		})
	}
}

// processCPU is the CPU time (user and system) this process used so far.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
