package meta

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/shoalfs/shoal/internal/leader"
	"github.com/shoalfs/shoal/meta/etcdtest"
)

// TestReadCacheConcurrentWriters: many updates at once (group commit
// shares rounds between them) create, remove, rename and resize files in
// two directories while readers look them up; once all have returned,
// everything the read cache holds must be what the store holds. An
// update that stored what it committed over a later update's change (the
// ordering rule of readCache.end), or a read that stored what an update
// in flight was changing, leaves a stale entry behind that nothing would
// ever drop: this finds it. It runs on each engine with a cache: bbolt
// with its log and group commit, and etcd under a leadership term.
func TestReadCacheConcurrentWriters(t *testing.T) {
	engines := []struct {
		name string
		open func(t *testing.T) *kvEngine
	}{
		{"bolt", func(t *testing.T) *kvEngine {
			e, err := OpenBolt(filepath.Join(t.TempDir(), "kv.db"), BoltOptions{WAL: true, GroupCommit: true})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { e.Close() })
			return e.(*kvEngine)
		}},
		{"etcd", func(t *testing.T) *kvEngine {
			c := etcdtest.Start(t, 1, etcdtest.Options{NoFsync: true})
			cli, err := DialEtcd(context.Background(), EtcdOptions{Endpoints: c.Endpoints})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { cli.Close() })
			term, err := leader.Campaign(context.Background(), leader.Config{Client: cli, Prefix: "/cw", TTL: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = term.Resign(context.Background()) })
			e, err := OpenEtcd(context.Background(), EtcdOptions{Client: cli, Prefix: "/cw",
				Fence: &EtcdFence{Key: term.Key(), CreateRevision: int64(term.Number()), Valid: term.Check}})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { e.Close() })
			return e.(*kvEngine)
		}},
	}
	for _, eng := range engines {
		t.Run(eng.name, func(t *testing.T) {
			e := eng.open(t)
			if e.cache == nil {
				t.Fatal("the engine has no read cache")
			}
			ctx := context.Background()
			var dirs [2]Ino
			for i := range dirs {
				nd, _, err := e.Create(ctx, RootIno, fmt.Sprint("d", i), CreateArgs{Type: TypeDirectory, Mode: 0o755}, time.Time{})
				if err != nil {
					t.Fatal(err)
				}
				dirs[i] = nd.Ino
			}
			const workers, ops, nnames = 16, 60, 6
			var wg sync.WaitGroup
			errs := make(chan error, workers)
			for w := range workers {
				wg.Go(func() {
					r := rand.New(rand.NewPCG(uint64(w), 1))
					for range ops {
						d, name := dirs[r.IntN(2)], fmt.Sprint("n", r.IntN(nnames))
						var err error
						switch r.IntN(5) {
						case 0:
							_, _, err = e.Create(ctx, d, name, CreateArgs{Type: TypeRegular, Mode: 0o644}, time.Time{})
						case 1:
							_, _, err = e.Remove(ctx, d, name, time.Time{})
						case 2:
							_, err = e.Rename(ctx, d, name, dirs[r.IntN(2)], fmt.Sprint("n", r.IntN(nnames)), time.Time{})
						case 3:
							var nd Node
							if nd, err = e.Lookup(ctx, d, name); err == nil {
								_, err = e.SetAttr(ctx, nd.Ino, SetAttr{Mask: SetSize, Size: r.Uint64N(1 << 20)}, time.Time{})
							}
						default:
							var nd Node
							if nd, err = e.Lookup(ctx, d, name); err == nil {
								_, err = e.GetAttr(ctx, nd.Ino)
							}
						}
						if err != nil && !errors.Is(err, ErrExist) && !errors.Is(err, ErrNotFound) && !errors.Is(err, ErrStale) {
							errs <- err
							return
						}
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			// Everything cached against the store, read past the cache.
			c := e.cache
			c.mu.Lock()
			attrs := make(map[Ino]Attr, len(c.attrs))
			for k, v := range c.attrs {
				attrs[k] = v
			}
			names := make(map[nameKey]Ino, len(c.names))
			for k, v := range c.names {
				names[k] = v
			}
			book := len(c.busyIno) + len(c.lastIno) + len(c.busyName) + len(c.lastName)
			inflight := c.inflight
			c.mu.Unlock()
			if book != 0 || inflight != 0 {
				t.Errorf("with no update in flight (%d counted), the cache still keeps %d entries of bookkeeping", inflight, book)
			}
			if len(attrs) == 0 || len(names) == 0 {
				t.Fatalf("the cache holds %d inodes and %d names after the run: nothing was tested", len(attrs), len(names))
			}
			err := e.view(ctx, func(x *tx) error {
				for ino, a := range attrs {
					n, err := x.inode(ino)
					if err != nil {
						return fmt.Errorf("inode %d cached (%+v) but not in the store: %w", ino, a, err)
					}
					if n.Attr != a {
						return fmt.Errorf("inode %d: cached %+v, the store has %+v", ino, a, n.Attr)
					}
				}
				for k, ino := range names {
					d, ok, err := x.lookup(k.parent, k.name)
					if err != nil {
						return err
					}
					if ok != (ino != 0) || ok && d.ino != ino {
						return fmt.Errorf("entry %q in %d: cached %d, the store has %d (exists %v)", k.name, k.parent, ino, d.ino, ok)
					}
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%d inodes and %d names cached, all as in the store", len(attrs), len(names))
		})
	}
}
