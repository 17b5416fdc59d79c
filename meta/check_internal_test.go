package meta

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// checkFixture is a namespace built through the Engine: every kind of
// inode and record Check knows, so that each corruption below has
// something to break.
type checkFixture struct {
	e                    *kvEngine
	dir, sub, file, link Ino
	sym, orphan, other   Ino
}

func newCheckFixture(t *testing.T, wal bool) checkFixture {
	t.Helper()
	eng, err := OpenBolt(filepath.Join(t.TempDir(), "meta.db"), BoltOptions{WAL: wal, NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	e := eng.(*kvEngine)
	ctx := context.Background()
	now := time.Now()
	mk := func(parent Ino, name string, args CreateArgs) Ino {
		t.Helper()
		n, _, err := e.Create(ctx, parent, name, args, now)
		if err != nil {
			t.Fatalf("create %s: %v", name, err)
		}
		return n.Ino
	}
	f := checkFixture{e: e}
	f.dir = mk(RootIno, "d", CreateArgs{Type: TypeDirectory, Mode: 0o755})
	if err := e.SetPolicy(ctx, f.dir, Policy{Mirrors: 2}); err != nil {
		t.Fatal(err)
	}
	f.sub = mk(f.dir, "sub", CreateArgs{Type: TypeDirectory, Mode: 0o755})
	f.file = mk(f.dir, "f", CreateArgs{Type: TypeRegular, Mode: 0o644})
	if _, _, err := e.Link(ctx, f.file, f.sub, "hard", now); err != nil {
		t.Fatal(err)
	}
	f.link = f.file
	f.sym = mk(f.dir, "s", CreateArgs{Type: TypeSymlink, Target: "f"})
	if _, err := e.SetXattr(ctx, f.file, "user.a", []byte("v"), XattrEither, now); err != nil {
		t.Fatal(err)
	}
	f.orphan = mk(f.dir, "gone", CreateArgs{Type: TypeRegular, Mode: 0o644})
	if _, _, err := e.Remove(ctx, f.dir, "gone", now); err != nil {
		t.Fatal(err)
	}
	f.other = mk(RootIno, "x", CreateArgs{Type: TypeRegular, Mode: 0o644})
	if _, err := e.Rename(ctx, RootIno, "x", f.sub, "y", now); err != nil {
		t.Fatal(err)
	}
	tmp := mk(f.sub, "tmpdir", CreateArgs{Type: TypeDirectory, Mode: 0o755})
	_ = tmp
	if _, _, err := e.Remove(ctx, f.sub, "tmpdir", now); err != nil {
		t.Fatal(err)
	}
	return f
}

// raw changes the database beneath the engine, as damage would.
func (f checkFixture) raw(t *testing.T, fn func(t kvTxn) error) {
	t.Helper()
	if err := f.e.kv.Update(fn); err != nil {
		t.Fatal(err)
	}
}

// setInode rewrites ino's record through edit.
func (f checkFixture) setInode(t *testing.T, ino Ino, edit func(n *inode)) {
	t.Helper()
	f.raw(t, func(tx kvTxn) error {
		v, err := tx.Get(inodeKey(ino))
		if err != nil {
			return err
		}
		n, err := decodeInode(v)
		if err != nil {
			return err
		}
		edit(n)
		return tx.Put(inodeKey(ino), n.encode())
	})
}

func TestCheckClean(t *testing.T) {
	for _, wal := range []bool{false, true} {
		f := newCheckFixture(t, wal)
		rep, err := Check(context.Background(), f.e, CheckOptions{DataObjects: []Ino{f.file, f.orphan}})
		if err != nil {
			t.Fatal(err)
		}
		if err := rep.Err(); err != nil {
			t.Fatalf("wal=%v: a namespace made by the engine fails the check: %v", wal, err)
		}
		// root, d, sub, f, s, gone (orphan), x→y
		if rep.Inodes != 7 || rep.Directories != 3 || rep.Orphans != 1 || rep.DataObjects != 2 {
			t.Fatalf("wal=%v: report %+v", wal, rep)
		}
	}
}

// TestCheckFindsDamage corrupts a database in one way per case, beneath
// the engine, and expects Check to report it under the rule's kind.
func TestCheckFindsDamage(t *testing.T) {
	cases := []struct {
		name    string
		damage  func(t *testing.T, f checkFixture)
		objects func(f checkFixture) []Ino
		want    string
	}{
		{"entry without its inode", func(t *testing.T, f checkFixture) {
			f.raw(t, func(tx kvTxn) error { return tx.Delete(inodeKey(f.sym)) })
		}, nil, "dangling-entry"},
		{"inode without its entry", func(t *testing.T, f checkFixture) {
			f.raw(t, func(tx kvTxn) error {
				v, err := tx.Get(dentryKey(f.dir, "s"))
				if err != nil {
					return err
				}
				d, err := decodeDentry(v)
				if err != nil {
					return err
				}
				if err := tx.Delete(dentryKey(f.dir, "s")); err != nil {
					return err
				}
				return tx.Delete(seqKey(f.dir, d.seq))
			})
		}, nil, "unlinked-inode"},
		{"file link count", func(t *testing.T, f checkFixture) {
			f.setInode(t, f.file, func(n *inode) { n.Nlink = 3 })
		}, nil, "nlink"},
		{"directory link count", func(t *testing.T, f checkFixture) {
			f.setInode(t, f.dir, func(n *inode) { n.Nlink = 2 })
		}, nil, "nlink"},
		{"entry type", func(t *testing.T, f checkFixture) {
			f.raw(t, func(tx kvTxn) error {
				v, err := tx.Get(dentryKey(f.dir, "f"))
				if err != nil {
					return err
				}
				d, err := decodeDentry(v)
				if err != nil {
					return err
				}
				d.typ = TypeFIFO
				return tx.Put(dentryKey(f.dir, "f"), d.encode())
			})
		}, nil, "entry-type"},
		{"entry without index record", func(t *testing.T, f checkFixture) {
			f.raw(t, func(tx kvTxn) error {
				v, err := tx.Get(dentryKey(f.dir, "f"))
				if err != nil {
					return err
				}
				d, err := decodeDentry(v)
				if err != nil {
					return err
				}
				return tx.Delete(seqKey(f.dir, d.seq))
			})
		}, nil, "entry-index"},
		{"index record without entry", func(t *testing.T, f checkFixture) {
			f.raw(t, func(tx kvTxn) error { return tx.Put(seqKey(f.dir, FirstCookie+1000), []byte("ghost")) })
		}, nil, "entry-index"},
		{"entry beyond the directory's sequence", func(t *testing.T, f checkFixture) {
			f.setInode(t, f.dir, func(n *inode) { n.nextSeq = FirstCookie })
		}, nil, "entry-index"},
		{"unlinked file without orphan mark", func(t *testing.T, f checkFixture) {
			f.raw(t, func(tx kvTxn) error { return tx.Delete(orphanKey(f.orphan)) })
		}, nil, "unlinked-inode"},
		{"orphan mark on a linked file", func(t *testing.T, f checkFixture) {
			f.raw(t, func(tx kvTxn) error { return tx.Put(orphanKey(f.file), []byte{1}) })
		}, nil, "unlinked-inode"},
		{"orphan mark without inode", func(t *testing.T, f checkFixture) {
			f.raw(t, func(tx kvTxn) error { return tx.Put(orphanKey(99999), []byte{1}) })
		}, nil, "unlinked-inode"},
		{"directory with a wrong parent pointer", func(t *testing.T, f checkFixture) {
			f.setInode(t, f.sub, func(n *inode) { n.Parent = RootIno })
		}, nil, "dir-links"},
		{"directory cycle cut off from the root", func(t *testing.T, f checkFixture) {
			// d's entry moves into sub, which is inside d: both
			// still have one entry and the right link counts.
			f.raw(t, func(tx kvTxn) error {
				v, err := tx.Get(dentryKey(RootIno, "d"))
				if err != nil {
					return err
				}
				d, err := decodeDentry(v)
				if err != nil {
					return err
				}
				for _, k := range [][]byte{dentryKey(RootIno, "d"), seqKey(RootIno, d.seq)} {
					if err := tx.Delete(k); err != nil {
						return err
					}
				}
				d.seq = FirstCookie + 500
				if err := tx.Put(dentryKey(f.sub, "loop"), d.encode()); err != nil {
					return err
				}
				return tx.Put(seqKey(f.sub, d.seq), []byte("loop"))
			})
			f.setInode(t, f.dir, func(n *inode) { n.Parent = f.sub })
			f.setInode(t, f.sub, func(n *inode) { n.Nlink++; n.nextSeq = FirstCookie + 501 })
			f.setInode(t, RootIno, func(n *inode) { n.Nlink-- })
		}, nil, "unreachable"},
		{"symlink without target", func(t *testing.T, f checkFixture) {
			f.raw(t, func(tx kvTxn) error { return tx.Delete(symlinkKey(f.sym)) })
		}, nil, "symlink"},
		{"symlink target of a missing inode", func(t *testing.T, f checkFixture) {
			f.raw(t, func(tx kvTxn) error { return tx.Put(symlinkKey(88888), []byte("t")) })
		}, nil, "record-without-inode"},
		{"stripe map of a missing inode", func(t *testing.T, f checkFixture) {
			f.raw(t, func(tx kvTxn) error { return tx.Put(stripeKey(88888), []byte{1}) })
		}, nil, "record-without-inode"},
		{"inline data of a directory", func(t *testing.T, f checkFixture) {
			f.raw(t, func(tx kvTxn) error { return tx.Put(inlineKey(f.sub), []byte{1}) })
		}, nil, "record-without-inode"},
		{"extended attributes of a missing inode", func(t *testing.T, f checkFixture) {
			f.raw(t, func(tx kvTxn) error { return tx.Put(xattrKey(77777), []byte{1}) })
		}, nil, "record-without-inode"},
		{"damaged inode record", func(t *testing.T, f checkFixture) {
			f.raw(t, func(tx kvTxn) error { return tx.Put(inodeKey(f.other), []byte{9, 9}) })
		}, nil, "bad-record"},
		{"inodes-in-use counter", func(t *testing.T, f checkFixture) {
			f.raw(t, func(tx kvTxn) error { return tx.Put(keyFiles, be.AppendUint64(nil, 99)) })
		}, nil, "counter"},
		{"next inode number behind", func(t *testing.T, f checkFixture) {
			f.raw(t, func(tx kvTxn) error { return tx.Put(keyNextIno, be.AppendUint64(nil, 2)) })
		}, nil, "counter"},
		{"unknown key", func(t *testing.T, f checkFixture) {
			f.raw(t, func(tx kvTxn) error { return tx.Put([]byte("Zz"), []byte{1}) })
		}, nil, "unknown-key"},
		{"data object of no inode", nil, func(f checkFixture) []Ino { return []Ino{f.file, 4242} }, "unreferenced-data-object"},
		{"data object of a directory", nil, func(f checkFixture) []Ino { return []Ino{f.sub} }, "unreferenced-data-object"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for _, wal := range []bool{false, true} {
				f := newCheckFixture(t, wal)
				if tc.damage != nil {
					tc.damage(t, f)
				}
				var opts CheckOptions
				if tc.objects != nil {
					opts.DataObjects = tc.objects(f)
				}
				rep, err := Check(context.Background(), f.e, opts)
				if err != nil {
					t.Fatal(err)
				}
				var kinds []string
				for _, p := range rep.Problems {
					kinds = append(kinds, p.Kind)
				}
				if !slices.Contains(kinds, tc.want) {
					t.Fatalf("wal=%v: want a %s problem, got %v", wal, tc.want, rep.Problems)
				}
				if err := rep.Err(); !errors.Is(err, ErrInconsistent) {
					t.Fatalf("Err() = %v", err)
				}
				t.Logf("wal=%v: %v", wal, rep.Problems)
			}
		})
	}
}

func TestCheckMaxProblems(t *testing.T) {
	f := newCheckFixture(t, false)
	objs := make([]Ino, 50)
	for i := range objs {
		objs[i] = Ino(100000 + i)
	}
	rep, err := Check(context.Background(), f.e, CheckOptions{DataObjects: objs, MaxProblems: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Problems) != 10 || rep.Omitted != 40 || rep.OK() {
		t.Fatalf("%d problems, %d omitted", len(rep.Problems), rep.Omitted)
	}
}
