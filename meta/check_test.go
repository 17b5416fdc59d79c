package meta_test

import (
	"context"
	"testing"
	"time"

	"github.com/shoalfs/shoal/meta"
	"github.com/shoalfs/shoal/meta/etcdtest"
)

// TestCheckEngines runs Check over a namespace made through each engine
// (bolt with and without the log, and real embedded etcd, whose scans
// page), with a file removed while "open" (an orphan), a hard link, a
// rename across directories and a symlink: it must find nothing.
func TestCheckEngines(t *testing.T) {
	engines := map[string]func(t *testing.T) meta.Engine{
		"bolt": func(t *testing.T) meta.Engine { return openBolt(meta.BoltOptions{NoSync: true})(t, t.TempDir()) },
		"bolt-wal": func(t *testing.T) meta.Engine {
			return openBolt(meta.BoltOptions{WAL: true, NoSync: true})(t, t.TempDir())
		},
		"etcd": func(t *testing.T) meta.Engine {
			return openEtcdOpts(etcdtest.Start(t, 1, etcdtest.Options{NoFsync: true}), meta.EtcdOptions{ScanPage: 3})(t, t.TempDir())
		},
	}
	for name, open := range engines {
		t.Run(name, func(t *testing.T) {
			e := open(t)
			defer e.Close()
			ctx, now := context.Background(), time.Now()
			must := func(err error) {
				t.Helper()
				if err != nil {
					t.Fatal(err)
				}
			}
			d, _, err := e.Create(ctx, meta.RootIno, "d", meta.CreateArgs{Type: meta.TypeDirectory, Mode: 0o755}, now)
			must(err)
			for _, n := range []string{"a", "b", "c", "gone"} {
				_, _, err := e.Create(ctx, d.Ino, n, meta.CreateArgs{Type: meta.TypeRegular, Mode: 0o644}, now)
				must(err)
			}
			a, err := e.Lookup(ctx, d.Ino, "a")
			must(err)
			_, _, err = e.Link(ctx, a.Ino, meta.RootIno, "a-link", now)
			must(err)
			_, err = e.Rename(ctx, d.Ino, "b", meta.RootIno, "b", now)
			must(err)
			_, _, err = e.Remove(ctx, d.Ino, "gone", now)
			must(err)
			_, _, err = e.Create(ctx, meta.RootIno, "s", meta.CreateArgs{Type: meta.TypeSymlink, Target: "d/a"}, now)
			must(err)
			rep, err := meta.Check(ctx, e, meta.CheckOptions{DataObjects: []meta.Ino{a.Ino}})
			must(err)
			if err := rep.Err(); err != nil {
				t.Fatal(err)
			}
			// root, d, a, b, c, gone (an orphan), s; entries d, d/a, d/c, a-link, b, s
			if rep.Inodes != 7 || rep.Orphans != 1 || rep.Entries != 6 {
				t.Fatalf("report %+v", rep)
			}
		})
	}
}
