package client_test

import (
	"context"
	"fmt"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/shoalfs/shoal/client"
)

// Sequential 1 MiB I/O through one File, against each server. Ganesha runs
// only with SHOAL_GANESHA=1. Offsets wrap every benchFileSize bytes so the
// file stays bounded whatever b.N is.
const benchFileSize = 256 << 20

func benchTargets(b *testing.B) map[string]func(b *testing.B) *client.Client {
	dial := func(addr string, opts client.Options) func(b *testing.B) *client.Client {
		return func(b *testing.B) *client.Client {
			ctx, cancel := context.WithTimeout(b.Context(), 30*time.Second)
			defer cancel()
			c, err := client.Dial(ctx, addr, opts)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { c.Close() })
			return c
		}
	}
	return map[string]func(b *testing.B) *client.Client{
		"ganesha": func(b *testing.B) *client.Client {
			return dial(ganeshaAddr(b), client.Options{Root: "/export"})(b)
		},
		"shoal": func(b *testing.B) *client.Client {
			return dial(startShoal(b), client.Options{})(b)
		},
	}
}

// Sequential I/O in blocks of 1 MiB (one RPC per call) and 8 MiB (eight
// pipelined RPCs per call).
func BenchmarkSeqWrite1MiB(b *testing.B) { benchSeq(b, true, 1<<20) }
func BenchmarkSeqRead1MiB(b *testing.B)  { benchSeq(b, false, 1<<20) }
func BenchmarkSeqWrite8MiB(b *testing.B) { benchSeq(b, true, 8<<20) }
func BenchmarkSeqRead8MiB(b *testing.B)  { benchSeq(b, false, 8<<20) }

func benchSeq(b *testing.B, write bool, block int) {
	const readSize = 64 << 20
	for _, name := range []string{"ganesha", "shoal"} {
		connect := benchTargets(b)[name]
		b.Run(name, func(b *testing.B) {
			c := connect(b)
			ctx := b.Context()
			p := fmt.Sprintf("/bench-%d", block)
			f, err := c.Open(ctx, p, os.O_CREATE|os.O_RDWR|os.O_TRUNC, 0o644)
			if err != nil {
				b.Fatal(err)
			}
			defer c.Remove(context.Background(), p)
			buf := make([]byte, block)
			for i := range buf {
				buf[i] = byte(i >> 12)
			}
			size := int64(benchFileSize)
			if !write {
				size = readSize
				for off := int64(0); off < size; off += int64(len(buf)) {
					if _, err := f.WriteAt(buf, off); err != nil {
						b.Fatal(err)
					}
				}
				if err := f.Sync(); err != nil {
					b.Fatal(err)
				}
			}
			b.SetBytes(int64(block))
			b.ResetTimer()
			var off int64
			for b.Loop() {
				var n int
				if write {
					n, err = f.WriteAt(buf, off)
				} else {
					n, err = f.ReadAt(buf, off)
				}
				if n != len(buf) {
					b.Fatal(n, err)
				}
				off = (off + int64(len(buf))) % size
			}
			if err := f.Close(); err != nil {
				b.Fatal(err)
			}
		})
	}
}

// BenchmarkPNFSWrite64MiB and BenchmarkPNFSRead64MiB move 64 MiB per
// iteration with one WriteAt/ReadAt through a local cluster of 1, 2 and 4
// data servers, with pNFS on and off (all I/O through the MDS).
func BenchmarkPNFSWrite64MiB(b *testing.B) { benchPNFS(b, true) }
func BenchmarkPNFSRead64MiB(b *testing.B)  { benchPNFS(b, false) }

func benchPNFS(b *testing.B, write bool) {
	const size = 64 << 20
	buf := make([]byte, size)
	pattern(buf, 0)
	for _, n := range []int{1, 2, 4} {
		for _, off := range []bool{false, true} {
			mode := "pnfs"
			if off {
				mode = "mds"
			}
			b.Run(fmt.Sprintf("ds=%d/%s", n, mode), func(b *testing.B) {
				cl := startCluster(b, n)
				ctx, cancel := context.WithTimeout(b.Context(), 30*time.Second)
				c, err := client.Dial(ctx, cl.MDS.Addr.String(), client.Options{PNFSOff: off})
				cancel()
				if err != nil {
					b.Fatal(err)
				}
				defer c.Close()
				f, err := c.Open(b.Context(), "/bench", os.O_CREATE|os.O_RDWR|os.O_TRUNC, 0o644)
				if err != nil {
					b.Fatal(err)
				}
				if !write {
					if _, err := f.WriteAt(buf, 0); err != nil {
						b.Fatal(err)
					}
					if err := f.Sync(); err != nil {
						b.Fatal(err)
					}
				}
				b.SetBytes(size)
				b.ResetTimer()
				cpu0 := processCPU(b)
				for b.Loop() {
					var n int
					if write {
						n, err = f.WriteAt(buf, 0)
						if err == nil {
							err = f.Sync()
						}
					} else {
						n, err = f.ReadAt(buf, 0)
					}
					if n != size || err != nil {
						b.Fatal(n, err)
					}
				}
				b.StopTimer()
				// CPU-seconds per GiB of the whole process (client, MDS and
				// data servers): unlike MB/s, hardly moved by other load
				// on the machine (issue 27).
				b.ReportMetric((processCPU(b)-cpu0).Seconds()/(float64(b.N)*size/(1<<30)), "cpu-s/GiB")
				if err := f.Close(); err != nil {
					b.Fatal(err)
				}
			})
		}
	}
}

// BenchmarkStat: one client stats files by path, one request at a time
// (what `shoal bench`'s stat phase does), against each server. The files
// are created first; the loop cycles over them.
func BenchmarkStat(b *testing.B) {
	const files = 1000
	for _, name := range []string{"ganesha", "shoal"} {
		connect := benchTargets(b)[name]
		b.Run(name, func(b *testing.B) {
			c := connect(b)
			ctx := b.Context()
			dir := fmt.Sprintf("/bench-stat-%d", time.Now().UnixNano())
			if err := c.Mkdir(ctx, dir, 0o755); err != nil {
				b.Fatal(err)
			}
			defer c.RemoveAll(context.Background(), dir)
			names := make([]string, files)
			for i := range names {
				names[i] = fmt.Sprintf("%s/f%04d", dir, i)
				f, err := c.Open(ctx, names[i], os.O_CREATE|os.O_WRONLY, 0o644)
				if err != nil {
					b.Fatal(err)
				}
				if err := f.Close(); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				if _, err := c.Stat(ctx, names[i%files]); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// processCPU returns the CPU time (user and system) this process has used.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
