package meta_test

import (
	"context"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shoalfs/shoal/meta"
	"github.com/shoalfs/shoal/meta/metatest"
)

func openBolt(opts meta.BoltOptions) metatest.Opener {
	return func(t *testing.T, dir string) meta.Engine {
		t.Helper()
		e, err := meta.OpenBolt(filepath.Join(dir, "meta.db"), opts)
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
}

func TestBolt(t *testing.T) {
	metatest.Run(t, openBolt(meta.BoltOptions{}))
}

func TestBoltGroupCommit(t *testing.T) {
	metatest.Run(t, openBolt(meta.BoltOptions{GroupCommit: true, MaxBatch: 8}))
}

func benchEngine(b *testing.B, opts meta.BoltOptions) meta.Engine {
	e, err := meta.OpenBolt(filepath.Join(b.TempDir(), "meta.db"), opts)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { e.Close() })
	return e
}

// BenchmarkCreate measures durable creates: serial, and from parallel
// goroutines with and without group commit.
func BenchmarkCreate(b *testing.B) {
	for _, bc := range []struct {
		name     string
		opts     meta.BoltOptions
		parallel bool
	}{
		{"serial", meta.BoltOptions{}, false},
		{"serial-group", meta.BoltOptions{GroupCommit: true}, false},
		{"parallel", meta.BoltOptions{}, true},
		{"parallel-group", meta.BoltOptions{GroupCommit: true}, true},
		{"serial-nosync", meta.BoltOptions{NoSync: true}, false},
	} {
		b.Run(bc.name, func(b *testing.B) {
			e := benchEngine(b, bc.opts)
			ctx := context.Background()
			var n atomic.Int64
			create := func() {
				name := "f" + strconv.FormatInt(n.Add(1), 10)
				if _, _, err := e.Create(ctx, meta.RootIno, name, meta.CreateArgs{Type: meta.TypeRegular, Mode: 0o644}, time.Time{}); err != nil {
					b.Error(err)
				}
			}
			if bc.parallel {
				b.SetParallelism(8)
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						create()
					}
				})
				return
			}
			for b.Loop() {
				create()
			}
		})
	}
}

func populate(b *testing.B, e meta.Engine, n int) []meta.Ino {
	ctx := context.Background()
	inos := make([]meta.Ino, n)
	for i := range inos {
		nd, _, err := e.Create(ctx, meta.RootIno, "f"+strconv.Itoa(i), meta.CreateArgs{Type: meta.TypeRegular}, time.Time{})
		if err != nil {
			b.Fatal(err)
		}
		inos[i] = nd.Ino
	}
	return inos
}

func BenchmarkGetAttr(b *testing.B) {
	e := benchEngine(b, meta.BoltOptions{NoSync: true})
	inos := populate(b, e, 1000)
	ctx := context.Background()
	i := 0
	for b.Loop() {
		if _, err := e.GetAttr(ctx, inos[i%len(inos)]); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

func BenchmarkLookup(b *testing.B) {
	e := benchEngine(b, meta.BoltOptions{NoSync: true})
	populate(b, e, 1000)
	ctx := context.Background()
	i := 0
	for b.Loop() {
		if _, err := e.Lookup(ctx, meta.RootIno, "f"+strconv.Itoa(i%1000)); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

// BenchmarkReadDir lists a 1000-entry directory, the bbolt counterpart of
// BenchmarkEtcd/readdir-1000.
func BenchmarkReadDir(b *testing.B) {
	e := benchEngine(b, meta.BoltOptions{NoSync: true})
	populate(b, e, 1000)
	ctx := context.Background()
	for b.Loop() {
		ents, eof, err := e.ReadDir(ctx, meta.RootIno, 0, 1000)
		if err != nil || !eof || len(ents) != 1000 {
			b.Fatalf("%d entries, eof %v, %v", len(ents), eof, err)
		}
	}
}
