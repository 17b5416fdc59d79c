package client_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"testing"
	"time"

	"github.com/shoalfs/shoal/client"
)

// BenchmarkAccessMethods moves 64 MiB sequentially per iteration, written
// (then closed, so the time includes write-back and COMMIT) or read (by a
// fresh Client, so the cache starts cold), in application requests of 4 KiB
// to 4 MiB, with each access method and the default policy otherwise,
// against an in-process two-data-server cluster ("pnfs2") and a plain
// Shoal server like `shoal serve` ("mds"). docs/client-policy.md has the
// numbers behind the defaults.
//
// BenchmarkAccessBlockSize varies Policy.BlockSize and Policy.Readahead for
// 4 KiB requests in cached mode, which is what the defaults were chosen
// from.
func BenchmarkAccessMethods(b *testing.B) {
	targets := []struct {
		name  string
		start func(b *testing.B) string
	}{
		{"pnfs2", func(b *testing.B) string { return startCluster(b, 2).MDS.Addr.String() }},
		{"mds", func(b *testing.B) string { return startShoal(b) }},
	}
	for _, tg := range targets {
		b.Run(tg.name, func(b *testing.B) {
			addr := tg.start(b)
			for _, op := range []string{"write", "read"} {
				for _, a := range accessMethods {
					for _, req := range []int{4 << 10, 64 << 10, 1 << 20, 4 << 20} {
						b.Run(fmt.Sprintf("%s/%s/%s", op, a, sizeName(req)), func(b *testing.B) {
							benchAccess(b, addr, op == "write", req, client.Policy{Access: a})
						})
					}
				}
			}
		})
	}
}

func BenchmarkAccessBlockSize(b *testing.B) {
	addr := startCluster(b, 2).MDS.Addr.String()
	for _, op := range []string{"write", "read"} {
		for _, blk := range []int{256 << 10, 1 << 20, 4 << 20, 8 << 20} {
			for _, ra := range []int{1 << 20, 8 << 20} {
				if op == "write" && ra != 8<<20 {
					continue
				}
				b.Run(fmt.Sprintf("%s/block=%s/readahead=%s", op, sizeName(blk), sizeName(ra)), func(b *testing.B) {
					benchAccess(b, addr, op == "write", 4<<10, client.Policy{Access: client.AccessCached, BlockSize: blk, Readahead: ra})
				})
			}
		}
	}
}

func sizeName(n int) string {
	if n >= 1<<20 {
		return fmt.Sprintf("%dM", n>>20)
	}
	return fmt.Sprintf("%dK", n>>10)
}

func benchAccess(b *testing.B, addr string, write bool, req int, pol client.Policy) {
	const total = 64 << 20
	dial := func() *client.Client {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := client.Dial(ctx, addr, client.Options{Policy: pol})
		if err != nil {
			b.Fatal(err)
		}
		return c
	}
	name := fmt.Sprintf("/bench-access-%d", req)
	buf := make([]byte, req)
	pattern(buf, 0)
	if !write {
		c := dial()
		f, err := c.Open(b.Context(), name, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
		if err != nil {
			b.Fatal(err)
		}
		big := make([]byte, total)
		if _, err := f.WriteAt(big, 0); err != nil {
			b.Fatal(err)
		}
		if err := f.Close(); err != nil {
			b.Fatal(err)
		}
		c.Close()
	}
	b.SetBytes(total)
	var closing time.Duration
	b.ResetTimer()
	for b.Loop() {
		b.StopTimer()
		c := dial()
		flag := os.O_RDONLY
		if write {
			flag = os.O_CREATE | os.O_WRONLY | os.O_TRUNC
		}
		f, err := c.Open(b.Context(), name, flag, 0o644)
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		for off := int64(0); off < total; off += int64(req) {
			var n int
			if write {
				n, err = f.WriteAt(buf, off)
			} else {
				n, err = f.ReadAt(buf, off)
				if err == io.EOF && n == req {
					err = nil
				}
			}
			if n != req || err != nil {
				b.Fatal(n, err)
			}
		}
		closeStart := time.Now()
		if err := f.Close(); err != nil {
			b.Fatal(err)
		}
		closing += time.Since(closeStart)
		b.StopTimer()
		c.Close()
		b.StartTimer()
	}
	b.ReportMetric(float64(closing.Milliseconds())/float64(b.N), "close-ms/op")
}
