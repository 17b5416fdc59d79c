package meta_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
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

// TestBoltWAL runs the suite on bbolt behind the write-ahead log, as
// servers open it.
func TestBoltWAL(t *testing.T) {
	metatest.Run(t, openBolt(meta.BoltOptions{WAL: true, MaxBatch: 8}))
}

// TestBoltWALCheckpoints checkpoints every few KiB, so that the suite's
// reads and scans meet all three layers (active, frozen, bbolt) and
// reopening finds several log files.
func TestBoltWALCheckpoints(t *testing.T) {
	metatest.Run(t, openBolt(meta.BoltOptions{WAL: true, MaxBatch: 8, WALCheckpointBytes: 4 << 10}))
}

// TestBoltWALDeferred runs the suite with every change made under
// meta.Deferred, as the NFS server makes them: answered once written to
// the log, made durable by Sync, a later synced change, the commit
// interval or Close.
func TestBoltWALDeferred(t *testing.T) {
	metatest.RunDeferred(t, openBolt(meta.BoltOptions{WAL: true, MaxBatch: 8}))
}

// TestBoltWALDeferredCheckpoints is TestBoltWALCheckpoints in the deferred
// mode: a checkpoint's switch to a new log file syncs the old one first.
func TestBoltWALDeferredCheckpoints(t *testing.T) {
	metatest.RunDeferred(t, openBolt(meta.BoltOptions{WAL: true, MaxBatch: 8, WALCheckpointBytes: 4 << 10}))
}

func benchEngine(b *testing.B, opts meta.BoltOptions) meta.Engine {
	e, err := meta.OpenBolt(filepath.Join(b.TempDir(), "meta.db"), opts)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { e.Close() })
	return e
}

// BenchmarkCreate measures durable creates on each bbolt configuration,
// from 1, 4 and 16 goroutines: plain bbolt (a commit per create), group
// commit (concurrent creates share a bbolt commit) and the write-ahead log
// (concurrent creates share one log append and fdatasync), and the log
// with creates answered before their fdatasync (meta.Deferred, which is
// what an export with sync: false gets).
func BenchmarkCreate(b *testing.B) {
	for _, eng := range []struct {
		name string
		opts meta.BoltOptions
	}{
		{"bolt", meta.BoltOptions{}},
		{"bolt-group", meta.BoltOptions{GroupCommit: true}},
		{"bolt-wal", meta.BoltOptions{WAL: true}},
		{"bolt-nosync", meta.BoltOptions{NoSync: true, GroupCommit: true}},
		{"bolt-wal-nosync", meta.BoltOptions{WAL: true, NoSync: true}},
		{"bolt-wal-deferred", meta.BoltOptions{WAL: true}},
	} {
		for _, par := range []int{1, 4, 16} {
			b.Run(fmt.Sprintf("%s/par%d", eng.name, par), func(b *testing.B) {
				e := benchEngine(b, eng.opts)
				ctx := context.Background()
				if strings.HasSuffix(eng.name, "-deferred") {
					ctx = meta.Deferred(ctx) // sync: false
				}
				var n atomic.Int64
				b.ResetTimer()
				var wg sync.WaitGroup
				for range par {
					wg.Go(func() {
						for {
							i := n.Add(1)
							if i > int64(b.N) {
								return
							}
							name := "f" + strconv.FormatInt(i, 10)
							if _, _, err := e.Create(ctx, meta.RootIno, name, meta.CreateArgs{Type: meta.TypeRegular, Mode: 0o644}, time.Time{}); err != nil {
								b.Error(err)
								return
							}
						}
					})
				}
				wg.Wait()
			})
		}
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

// BenchmarkReplayRecords measures what replay records (meta.WithReplay)
// add to a namespace change, serially, as the NFS server asks for them:
// each iteration creates a directory and removes it, and with records on
// each change writes its record and deletes the one before (retired by
// the client's next request on the slot, piggybacked on this change).
func BenchmarkReplayRecords(b *testing.B) {
	for _, eng := range []struct {
		name string
		opts meta.BoltOptions
	}{
		{"bolt-wal", meta.BoltOptions{WAL: true, GroupCommit: true}},
		{"bolt-wal-nosync", meta.BoltOptions{WAL: true, GroupCommit: true, NoSync: true}},
	} {
		for _, records := range []bool{false, true} {
			b.Run(fmt.Sprintf("%s/records=%v", eng.name, records), func(b *testing.B) {
				e := benchEngine(b, eng.opts)
				ctx := context.Background()
				var seq uint64
				var prev []meta.ReplayID
				change := func() context.Context {
					if !records {
						return ctx
					}
					seq++
					w := &meta.ReplayWrite{Drop: prev}
					w.Record.Key.Owner[0] = 1
					w.Record.Key.Digest[0] = byte(seq)
					w.Record.Writer, w.Record.Seq, w.Record.Op = 1, seq, 6
					prev = []meta.ReplayID{w.Record.ReplayID}
					return meta.WithReplay(ctx, w)
				}
				i := 0
				for b.Loop() {
					i++
					name := "d" + strconv.Itoa(i)
					if _, _, err := e.Create(change(), meta.RootIno, name, meta.CreateArgs{Type: meta.TypeDirectory, Mode: 0o755}, time.Time{}); err != nil {
						b.Fatal(err)
					}
					if _, _, err := e.Remove(change(), meta.RootIno, name, time.Time{}); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkSmallFile measures the metadata side of writing one small file
// through the MDS, as its COMPOUNDs change the engine: the create, the
// inline write (data, size, mtime) and the SETATTR of the writeback
// mtime. synced makes each change durable on its own (each call, as
// before the durability barrier); compound defers the three and syncs
// once, as a COMPOUND that carries them does in the default mode (the
// server syncs at the end of every COMPOUND, so a client that sends them
// in separate COMPOUNDs pays a sync for each); async defers them and
// leaves the sync to the commit interval (sync: false).
func BenchmarkSmallFile(b *testing.B) {
	data := make([]byte, 4096)
	for _, mode := range []string{"synced", "compound", "async"} {
		for _, par := range []int{1, 4} {
			b.Run(fmt.Sprintf("%s/par%d", mode, par), func(b *testing.B) {
				e := benchEngine(b, meta.BoltOptions{WAL: true})
				ctx := context.Background()
				if mode != "synced" {
					ctx = meta.Deferred(ctx)
				}
				var n atomic.Int64
				b.ResetTimer()
				var wg sync.WaitGroup
				for range par {
					wg.Go(func() {
						for {
							i := n.Add(1)
							if i > int64(b.N) {
								return
							}
							nd, _, err := e.Create(ctx, meta.RootIno, "f"+strconv.FormatInt(i, 10), meta.CreateArgs{Type: meta.TypeRegular, Mode: 0o644}, time.Time{})
							if err == nil {
								_, err = e.WriteInline(ctx, nd.Ino, 0, data, 32<<10, time.Time{})
							}
							if err == nil {
								_, err = e.SetAttr(ctx, nd.Ino, meta.SetAttr{Mask: meta.SetMtime, Mtime: time.Unix(1_700_000_000, 0)}, time.Time{})
							}
							if err == nil && mode == "compound" {
								err = e.(meta.Syncer).Sync(ctx)
							}
							if err != nil {
								b.Error(err)
								return
							}
						}
					})
				}
				wg.Wait()
			})
		}
	}
}
