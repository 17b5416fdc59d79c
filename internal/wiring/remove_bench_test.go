package wiring

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"runtime/pprof"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/shoalfs/shoal/client"
	"github.com/shoalfs/shoal/meta"
	"github.com/shoalfs/shoal/server"
)

// BenchmarkRemove measures the delete of a small file as issue 27's
// fuse-meta.sh delete phase makes it: `shoal up --ds 4`'s cluster (MDS and
// four data servers in this process, built by Start as the binary does),
// files of 4 KiB kept inline at the MDS, and REMOVEs as Shoal's FUSE mount
// sends them (SEQUENCE, PUTFH of the directory, REMOVE) from procs
// goroutines at once, each in a directory of its own. The files are made
// before the timer starts. ns/op times the removes; cpu-µs/op is the
// process's CPU time (user and system) per delete, from the first REMOVE
// until the MDS has freed every orphan they left (the freer works in the
// background), so it includes the freeing and the client's share (the
// same on both sides of a comparison); syncs/op counts the metadata
// log's fdatasyncs per delete in the same span, and drain-ms is how long
// the MDS took after the last REMOVE to free the orphans (polled every
// 50 ms, a poll costing a scan of the orphan set).
//
//	go test ./internal/wiring -run '^$' -bench BenchmarkRemove -benchtime 4000x
//
// -remove.cpuprofile FILE (after -args) writes a CPU profile of the
// deletes alone, from the first REMOVE until the orphans are freed (go
// test's -cpuprofile also covers making the files, which is most of it).
func BenchmarkRemove(b *testing.B) {
	for _, async := range []bool{false, true} {
		for _, procs := range []int{1, 4} {
			b.Run(fmt.Sprintf("async=%v/procs=%d", async, procs), func(b *testing.B) {
				benchRemove(b, async, procs)
			})
		}
	}
}

var removeProfile = flag.String("remove.cpuprofile", "", "BenchmarkRemove: write a CPU profile of the deletes to this file (the last sub-benchmark run's)")

func benchRemove(b *testing.B, async bool, procs int) {
	f := false
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cl, err := Start(ctx, Config{
		Dir: b.TempDir(), DataServers: 4, Listen: "127.0.0.1:0",
		Exports: []*server.Export{{Path: "/", RootSquash: &f}},
		Lease:   10 * time.Second, Logger: slog.New(slog.DiscardHandler),
		Async: async,
	})
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	c, err := client.Dial(ctx, cl.MDS.Addr.String(), client.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	data := make([]byte, 4096)
	per := (b.N + procs - 1) / procs
	dirs := make([][]byte, procs)
	for p := range procs {
		dir := "/d" + strconv.Itoa(p)
		if err := c.Mkdir(ctx, dir, 0o755); err != nil {
			b.Fatal(err)
		}
		if dirs[p], _, err = c.Lookup(ctx, dir); err != nil {
			b.Fatal(err)
		}
		for i := range per {
			f, err := c.OpenAt(ctx, dirs[p], "f"+strconv.Itoa(i), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := f.Write(data); err != nil {
				b.Fatal(err)
			}
			if err := f.Close(); err != nil {
				b.Fatal(err)
			}
		}
	}
	srv := cl.MDS.Server
	orphansFreed(b, srv)
	if *removeProfile != "" {
		f, err := os.Create(*removeProfile)
		if err != nil {
			b.Fatal(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			b.Fatal(err)
		}
		defer func() {
			pprof.StopCPUProfile()
			if err := f.Close(); err != nil {
				b.Error(err)
			}
		}()
	}
	cpu0, log0 := processCPU(b), srv.Stats().Log
	b.ResetTimer()
	var wg sync.WaitGroup
	errs := make(chan error, procs)
	for p := range procs {
		wg.Go(func() {
			for i := range per {
				if err := c.RemoveAt(ctx, dirs[p], "f"+strconv.Itoa(i)); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	t0 := time.Now()
	orphansFreed(b, srv)
	b.ReportMetric(float64(time.Since(t0).Milliseconds()), "drain-ms")
	n := float64(per * procs)
	b.ReportMetric(float64((processCPU(b)-cpu0).Microseconds())/n, "cpu-µs/op")
	log1 := srv.Stats().Log
	b.ReportMetric(float64(log1.Syncs-log0.Syncs)/n, "syncs/op")
	b.ReportMetric(float64(log1.Bytes-log0.Bytes)/n, "log-B/op")
	d := meta.LogStats{SyncBuckets: make([]uint64, len(log1.SyncBuckets))}
	for i := range d.SyncBuckets {
		d.SyncBuckets[i] = log1.SyncBuckets[i] - log0.SyncBuckets[i]
	}
	if !async {
		b.ReportMetric(float64(d.SyncQuantile(0.5))/float64(time.Microsecond), "sync-p50-µs")
	}
}

// orphansFreed waits (bounded) until the MDS has freed every orphan.
func orphansFreed(b *testing.B, srv *server.Server) {
	b.Helper()
	var left int
	for range 1200 {
		inos, err := srv.Meta().Orphans(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		if left = len(inos); left == 0 {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	b.Fatalf("%d orphans not freed after 1200 polls", left)
}

// processCPU is the CPU time (user and system) this process used so far.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
