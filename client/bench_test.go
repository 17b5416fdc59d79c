package client_test

import (
	"context"
	"os"
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

func BenchmarkSeqWrite1MiB(b *testing.B) {
	for name, connect := range benchTargets(b) {
		b.Run(name, func(b *testing.B) {
			c := connect(b)
			ctx := b.Context()
			f, err := c.Open(ctx, "/bench-write", os.O_CREATE|os.O_RDWR|os.O_TRUNC, 0o644)
			if err != nil {
				b.Fatal(err)
			}
			defer c.Remove(context.Background(), "/bench-write")
			buf := make([]byte, 1<<20)
			for i := range buf {
				buf[i] = byte(i)
			}
			b.SetBytes(int64(len(buf)))
			b.ResetTimer()
			var off int64
			for b.Loop() {
				if _, err := f.WriteAt(buf, off); err != nil {
					b.Fatal(err)
				}
				off = (off + int64(len(buf))) % benchFileSize
			}
			if err := f.Close(); err != nil {
				b.Fatal(err)
			}
		})
	}
}

func BenchmarkSeqRead1MiB(b *testing.B) {
	const size = 64 << 20
	for name, connect := range benchTargets(b) {
		b.Run(name, func(b *testing.B) {
			c := connect(b)
			ctx := b.Context()
			f, err := c.Open(ctx, "/bench-read", os.O_CREATE|os.O_RDWR|os.O_TRUNC, 0o644)
			if err != nil {
				b.Fatal(err)
			}
			defer c.Remove(context.Background(), "/bench-read")
			defer f.Close()
			data := make([]byte, size)
			for i := range data {
				data[i] = byte(i >> 12)
			}
			if _, err := f.WriteAt(data, 0); err != nil {
				b.Fatal(err)
			}
			if err := f.Sync(); err != nil {
				b.Fatal(err)
			}
			buf := make([]byte, 1<<20)
			b.SetBytes(int64(len(buf)))
			b.ResetTimer()
			var off int64
			for b.Loop() {
				if n, err := f.ReadAt(buf, off); n != len(buf) {
					b.Fatal(n, err)
				}
				off = (off + int64(len(buf))) % size
			}
		})
	}
}
