package metatest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/shoalfs/shoal/meta"
)

// runOrphans runs the orphan cases: a regular file whose last link goes
// away stays, with Nlink zero, until FreeOrphan (see meta.Engine.Remove).
func runOrphans(t *testing.T, open Opener, ctx context.Context) {
	tests := []struct {
		name string
		fn   func(t *testing.T, v *env)
	}{
		{"Remove", testOrphanRemove},
		{"OtherRemovesUnchanged", testOrphanOtherRemoves},
		{"Rename", testOrphanRename},
		{"FreeRules", testOrphanFreeRules},
		{"Persistence", testOrphanPersistence},
		{"ConcurrentFree", testOrphanConcurrentFree},
		{"ManyOrphans", testOrphanMany},
		{"FreeMany", testOrphanFreeMany},
	}
	for _, tc := range tests {
		t.Run("Orphans/"+tc.name, func(t *testing.T) {
			tc.fn(t, newEnv(t, open, ctx))
		})
	}
}

// freeOrphan frees ino, which must not have links.
func (v *env) freeOrphan(ino meta.Ino) meta.Attr {
	v.t.Helper()
	a, err := v.e.FreeOrphan(v.ctx, ino)
	if err != nil {
		v.t.Fatalf("free orphan %d: %v", ino, err)
	}
	return a
}

func (v *env) orphans() []meta.Ino {
	v.t.Helper()
	inos, err := v.e.Orphans(v.ctx)
	if err != nil {
		v.t.Fatalf("orphans: %v", err)
	}
	return inos
}

func (v *env) files() uint64 {
	v.t.Helper()
	st, err := v.e.StatFS(v.ctx)
	if err != nil {
		v.t.Fatalf("statfs: %v", err)
	}
	return st.Files
}

func (v *env) wantOrphans(want ...meta.Ino) {
	v.t.Helper()
	if got := v.orphans(); !slices.Equal(got, want) {
		v.t.Fatalf("orphans = %v, want %v", got, want)
	}
}

func testOrphanRemove(t *testing.T, v *env) {
	d := v.create(meta.RootIno, "d", meta.TypeDirectory)
	f := v.create(d.Ino, "f", meta.TypeRegular)
	if _, err := v.e.Wrote(v.ctx, f.Ino, 4096, v.tick()); err != nil {
		t.Fatal(err)
	}
	v.wantOrphans()
	filesBefore := v.files()

	n, _, err := v.e.Remove(v.ctx, d.Ino, "f", v.tick())
	if err != nil || n.Ino != f.Ino || n.Attr.Nlink != 0 || n.Attr.Type != meta.TypeRegular {
		t.Fatalf("remove = %+v, %v", n, err)
	}
	wantErr(t, "lookup removed", v.lookupErr(d.Ino, "f"), meta.ErrNotFound)
	if names := v.names(d.Ino); len(names) != 0 {
		t.Fatalf("dir still lists %v", names)
	}
	a := v.attr(f.Ino)
	if a.Nlink != 0 || a.Size != 4096 || a.Type != meta.TypeRegular || a.Change != n.Attr.Change {
		t.Fatalf("orphan attr = %+v (remove returned %+v)", a, n.Attr)
	}
	v.wantOrphans(f.Ino)
	if got := v.files(); got != filesBefore {
		t.Fatalf("statfs files %d with an orphan, want %d (orphans are in use)", got, filesBefore)
	}

	// An open file stays usable: writes, truncation and attribute
	// changes go on.
	if a, err := v.e.Wrote(v.ctx, f.Ino, 8192, v.tick()); err != nil || a.Size != 8192 || a.Nlink != 0 {
		t.Fatalf("wrote orphan = %+v, %v", a, err)
	}
	if a, err := v.e.SetAttr(v.ctx, f.Ino, meta.SetAttr{Mask: meta.SetSize | meta.SetMode, Size: 100, Mode: 0o600}, v.tick()); err != nil || a.Size != 100 || a.Mode != 0o600 || a.Nlink != 0 {
		t.Fatalf("setattr orphan = %+v, %v", a, err)
	}
	// It cannot get a name again (link(2) of an unlinked file: ENOENT).
	_, _, err = v.e.Link(v.ctx, f.Ino, d.Ino, "again", v.tick())
	wantErr(t, "link orphan", err, meta.ErrNotFound)
	wantErr(t, "lookup after refused link", v.lookupErr(d.Ino, "again"), meta.ErrNotFound)
	// The name is free for a new file, which is a different inode.
	g := v.create(d.Ino, "f", meta.TypeRegular)
	if g.Ino == f.Ino {
		t.Fatalf("new file reuses orphan ino %d", f.Ino)
	}

	last := v.freeOrphan(f.Ino)
	if last.Type != meta.TypeRegular || last.Nlink != 0 || last.Size != 100 {
		t.Fatalf("free returned %+v", last)
	}
	_, err = v.e.GetAttr(v.ctx, f.Ino)
	wantErr(t, "getattr freed", err, meta.ErrStale)
	v.wantOrphans()
	if got := v.files(); got != filesBefore {
		t.Fatalf("statfs files %d after free, want %d (orphan freed, g created)", got, filesBefore)
	}
	// Idempotent: a second free finds nothing and changes nothing.
	if again := v.freeOrphan(f.Ino); again != (meta.Attr{}) {
		t.Fatalf("second free returned %+v", again)
	}
	if got := v.files(); got != filesBefore {
		t.Fatalf("statfs files %d after second free", got)
	}
	if a := v.attr(g.Ino); a.Nlink != 1 {
		t.Fatalf("new file %+v", a)
	}
}

// testOrphanOtherRemoves checks that only the last link of a regular file
// makes an orphan: other types go at once, other links leave a named file.
func testOrphanOtherRemoves(t *testing.T, v *env) {
	cases := []struct {
		typ   meta.FileType
		links int // extra hard links made before the remove
	}{
		{meta.TypeDirectory, 0},
		{meta.TypeSymlink, 0},
		{meta.TypeFIFO, 0},
		{meta.TypeSocket, 0},
		{meta.TypeChar, 0},
		{meta.TypeBlock, 0},
		{meta.TypeSymlink, 1},
		{meta.TypeRegular, 1},
		{meta.TypeRegular, 2},
	}
	for i, c := range cases {
		t.Run(fmt.Sprintf("%v+%d", c.typ, c.links), func(t *testing.T) {
			d := v.create(meta.RootIno, fmt.Sprintf("case%d", i), meta.TypeDirectory)
			n := v.create(d.Ino, "x", c.typ)
			for j := range c.links {
				if _, _, err := v.e.Link(v.ctx, n.Ino, d.Ino, fmt.Sprintf("l%d", j), v.tick()); err != nil {
					t.Fatal(err)
				}
			}
			files := v.files()
			got, _, err := v.e.Remove(v.ctx, d.Ino, "x", v.tick())
			if err != nil {
				t.Fatal(err)
			}
			v.wantOrphans()
			if c.links > 0 {
				if got.Attr.Nlink != uint32(c.links) || v.attr(n.Ino).Nlink != uint32(c.links) || v.files() != files {
					t.Fatalf("remove of a linked %v = %+v, files %d -> %d", c.typ, got.Attr, files, v.files())
				}
				_, err := v.e.FreeOrphan(v.ctx, n.Ino)
				wantErr(t, "free linked inode", err, meta.ErrInval)
				if a := v.attr(n.Ino); a.Nlink != uint32(c.links) {
					t.Fatalf("refused free changed nlink to %d", a.Nlink)
				}
				return
			}
			if got.Attr.Nlink != 0 {
				t.Fatalf("remove = %+v", got.Attr)
			}
			_, err = v.e.GetAttr(v.ctx, n.Ino)
			wantErr(t, "getattr removed", err, meta.ErrStale)
			if v.files() != files-1 {
				t.Fatalf("files %d -> %d", files, v.files())
			}
		})
	}
}

func testOrphanRename(t *testing.T, v *env) {
	cases := []struct {
		name   string
		victim meta.FileType
		links  int
		orphan bool
	}{
		{"over file", meta.TypeRegular, 0, true},
		{"over linked file", meta.TypeRegular, 1, false},
		{"over symlink", meta.TypeSymlink, 0, false},
		{"over fifo", meta.TypeFIFO, 0, false},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := v.create(meta.RootIno, fmt.Sprintf("r%d", i), meta.TypeDirectory)
			src := v.create(d.Ino, "new", meta.TypeRegular)
			dst := v.create(d.Ino, "old", c.victim)
			for j := range c.links {
				if _, _, err := v.e.Link(v.ctx, dst.Ino, d.Ino, fmt.Sprintf("l%d", j), v.tick()); err != nil {
					t.Fatal(err)
				}
			}
			files := v.files()
			res, err := v.e.Rename(v.ctx, d.Ino, "new", d.Ino, "old", v.tick())
			if err != nil || res.Replaced.Ino != dst.Ino || res.Replaced.Attr.Nlink != uint32(c.links) {
				t.Fatalf("rename = %+v, %v", res, err)
			}
			if got, err := v.e.Lookup(v.ctx, d.Ino, "old"); err != nil || got.Ino != src.Ino {
				t.Fatalf("lookup old = %+v, %v", got, err)
			}
			switch {
			case c.orphan:
				v.wantOrphans(dst.Ino)
				if a := v.attr(dst.Ino); a.Nlink != 0 || a.Type != meta.TypeRegular {
					t.Fatalf("orphan attr %+v", a)
				}
				if v.files() != files {
					t.Fatalf("files %d -> %d", files, v.files())
				}
				v.freeOrphan(dst.Ino)
				v.wantOrphans()
				_, err := v.e.GetAttr(v.ctx, dst.Ino)
				wantErr(t, "getattr freed", err, meta.ErrStale)
				if v.files() != files-1 {
					t.Fatalf("files %d -> %d after free", files, v.files())
				}
			case c.links > 0:
				v.wantOrphans()
				if a := v.attr(dst.Ino); a.Nlink != uint32(c.links) {
					t.Fatalf("nlink %d", a.Nlink)
				}
			default:
				v.wantOrphans()
				_, err := v.e.GetAttr(v.ctx, dst.Ino)
				wantErr(t, "getattr replaced", err, meta.ErrStale)
			}
		})
	}
}

func testOrphanFreeRules(t *testing.T, v *env) {
	d := v.create(meta.RootIno, "d", meta.TypeDirectory)
	f := v.create(d.Ino, "f", meta.TypeRegular)
	cases := []struct {
		name string
		ino  meta.Ino
		want error
	}{
		{"root", meta.RootIno, meta.ErrInval},
		{"directory", d.Ino, meta.ErrInval},
		{"named file", f.Ino, meta.ErrInval},
		{"never existed", 987654, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before, _ := v.e.GetAttr(v.ctx, c.ino)
			a, err := v.e.FreeOrphan(v.ctx, c.ino)
			wantErr(t, "free", err, c.want)
			if a != (meta.Attr{}) {
				t.Fatalf("free returned %+v", a)
			}
			after, _ := v.e.GetAttr(v.ctx, c.ino)
			if after != before {
				t.Fatalf("refused free changed %+v -> %+v", before, after)
			}
		})
	}
	if _, err := v.e.Lookup(v.ctx, d.Ino, "f"); err != nil {
		t.Fatal(err)
	}
}

func testOrphanPersistence(t *testing.T, v *env) {
	var kept, freed meta.Ino
	for i, name := range []string{"kept", "freed"} {
		n := v.create(meta.RootIno, name, meta.TypeRegular)
		if _, err := v.e.Wrote(v.ctx, n.Ino, uint64(1000*(i+1)), v.tick()); err != nil {
			t.Fatal(err)
		}
		if _, _, err := v.e.Remove(v.ctx, meta.RootIno, name, v.tick()); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			kept = n.Ino
		} else {
			freed = n.Ino
		}
	}
	v.reopen()
	v.wantOrphans(kept, freed)
	if a := v.attr(kept); a.Nlink != 0 || a.Size != 1000 {
		t.Fatalf("orphan after reopen %+v", a)
	}
	v.freeOrphan(freed)
	files := v.files()
	v.reopen()
	v.wantOrphans(kept)
	_, err := v.e.GetAttr(v.ctx, freed)
	wantErr(t, "freed after reopen", err, meta.ErrStale)
	if v.files() != files {
		t.Fatalf("files %d -> %d across reopen", files, v.files())
	}
	if a := v.freeOrphan(kept); a.Size != 1000 {
		t.Fatalf("free after reopen %+v", a)
	}
	v.reopen()
	v.wantOrphans()
	if v.files() != 1 {
		t.Fatalf("files %d, want only the root", v.files())
	}
}

// testOrphanConcurrentFree frees one orphan from several goroutines:
// exactly one of them gets its attributes.
func testOrphanConcurrentFree(t *testing.T, v *env) {
	const workers = 8
	for round := range 5 {
		name := fmt.Sprintf("f%d", round)
		n := v.create(meta.RootIno, name, meta.TypeRegular)
		if _, _, err := v.e.Remove(v.ctx, meta.RootIno, name, v.tick()); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		results := make([]meta.Attr, workers)
		errs := make([]error, workers)
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				results[w], errs[w] = v.e.FreeOrphan(v.ctx, n.Ino)
			}()
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
		won := 0
		for _, a := range results {
			if a.Type == meta.TypeRegular {
				won++
			}
		}
		if won != 1 {
			t.Fatalf("round %d: %d frees returned the inode, want 1", round, won)
		}
	}
	v.wantOrphans()
	if v.files() != 1 {
		t.Fatalf("files %d", v.files())
	}
}

// testOrphanMany lists more orphans than one engine transaction reads.
func testOrphanMany(t *testing.T, v *env) {
	d := v.create(meta.RootIno, "d", meta.TypeDirectory)
	v.wantOrphans(v.makeOrphans(d.Ino, 1100)...)
}

// makeOrphans creates n regular files in dir and removes them.
func (v *env) makeOrphans(dir meta.Ino, n int) []meta.Ino {
	v.t.Helper()
	inos := make([]meta.Ino, 0, n)
	for i := range n {
		name := fmt.Sprintf("f%04d", i)
		f := v.create(dir, name, meta.TypeRegular)
		if _, _, err := v.e.Remove(v.ctx, dir, name, v.tick()); err != nil {
			v.t.Fatal(err)
		}
		inos = append(inos, f.Ino)
	}
	return inos
}

// testOrphanFreeMany frees orphans in batches: all of a batch go, an
// inode already freed is no error, and a batch holding a file with links
// frees nothing. The batch is larger than one etcd transaction of the
// suite allows, so the engine has to split it.
func testOrphanFreeMany(t *testing.T, v *env) {
	inos := v.makeOrphans(meta.RootIno, 40)
	linked := v.create(meta.RootIno, "linked", meta.TypeRegular)
	err := v.e.FreeOrphans(v.ctx, []meta.Ino{inos[0], linked.Ino, inos[1]})
	wantErr(t, "FreeOrphans with a linked file", err, meta.ErrInval)
	v.wantOrphans(inos...)

	if _, err := v.e.FreeOrphan(v.ctx, inos[3]); err != nil {
		t.Fatal(err)
	}
	if err := v.e.FreeOrphans(v.ctx, inos); err != nil {
		t.Fatal(err)
	}
	v.wantOrphans()
	for _, ino := range inos {
		if _, err := v.e.GetAttr(v.ctx, ino); !errors.Is(err, meta.ErrStale) {
			t.Fatalf("GetAttr of freed orphan %d: %v", ino, err)
		}
	}
	if got := v.files(); got != 2 { // the root and linked
		t.Fatalf("files %d, want 2", got)
	}
	if err := v.e.FreeOrphans(v.ctx, nil); err != nil {
		t.Fatalf("FreeOrphans of nothing: %v", err)
	}
}
