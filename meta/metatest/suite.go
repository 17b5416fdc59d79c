// Package metatest is the conformance suite every meta.Engine must pass.
// Each KV engine's test calls Run with a constructor; the constructor takes a
// directory so the suite can close an engine and reopen the same database to
// check persistence.
package metatest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/shoalfs/shoal/meta"
)

// Opener opens (or reopens) an engine whose state lives in dir. The
// returned engine must already be initialised.
type Opener func(t *testing.T, dir string) meta.Engine

type env struct {
	t    *testing.T
	ctx  context.Context
	dir  string
	open Opener
	e    meta.Engine
	now  time.Time
}

func newEnv(t *testing.T, open Opener, ctx context.Context) *env {
	t.Helper()
	v := &env{t: t, ctx: ctx, dir: t.TempDir(), open: open,
		now: time.Unix(1_700_000_000, 0)}
	v.e = open(t, v.dir)
	t.Cleanup(func() { v.e.Close() })
	return v
}

// tick returns a strictly later timestamp for each call.
func (v *env) tick() time.Time {
	v.now = v.now.Add(time.Second + time.Nanosecond)
	return v.now
}

func (v *env) reopen() {
	v.t.Helper()
	if err := v.e.Close(); err != nil {
		v.t.Fatalf("close: %v", err)
	}
	v.e = v.open(v.t, v.dir)
}

func (v *env) create(parent meta.Ino, name string, typ meta.FileType) meta.Node {
	v.t.Helper()
	args := meta.CreateArgs{Type: typ, Mode: 0o644, UID: 1, GID: 2}
	if typ == meta.TypeSymlink {
		args.Target = "target-of-" + name
	}
	n, _, err := v.e.Create(v.ctx, parent, name, args, v.tick())
	if err != nil {
		v.t.Fatalf("create %q in %d: %v", name, parent, err)
	}
	return n
}

func (v *env) attr(ino meta.Ino) meta.Attr {
	v.t.Helper()
	a, err := v.e.GetAttr(v.ctx, ino)
	if err != nil {
		v.t.Fatalf("getattr %d: %v", ino, err)
	}
	return a
}

func (v *env) names(dir meta.Ino) []string {
	v.t.Helper()
	var out []string
	cookie := uint64(0)
	for range 10000 {
		ents, eof, err := v.e.ReadDir(v.ctx, dir, cookie, 7)
		if err != nil {
			v.t.Fatalf("readdir %d: %v", dir, err)
		}
		for _, en := range ents {
			out = append(out, en.Name)
			cookie = en.Cookie
		}
		if eof {
			return out
		}
	}
	v.t.Fatalf("readdir %d did not reach eof", dir)
	return nil
}

func (v *env) lookupErr(parent meta.Ino, name string) error {
	_, err := v.e.Lookup(v.ctx, parent, name)
	return err
}

func wantErr(t *testing.T, what string, err, want error) {
	t.Helper()
	if want == nil && err != nil || want != nil && !errors.Is(err, want) {
		t.Fatalf("%s: err = %v, want %v", what, err, want)
	}
}

// Run runs the conformance suite against engines made by open.
func Run(t *testing.T, open Opener) { run(t, open, context.Background()) }

// RunDeferred runs the suite with every call made under meta.Deferred, as
// the NFS server makes them: changes may be answered before they are
// durable, and every result must be the same (persistence across Close
// included).
func RunDeferred(t *testing.T, open Opener) { run(t, open, meta.Deferred(context.Background())) }

func run(t *testing.T, open Opener, ctx context.Context) {
	tests := []struct {
		name string
		fn   func(t *testing.T, v *env)
	}{
		{"Root", testRoot},
		{"CreateTypes", testCreateTypes},
		{"CreateErrors", testCreateErrors},
		{"CreateExisting", testCreateExisting},
		{"SetAttr", testSetAttr},
		{"Wrote", testWrote},
		{"LinkCounts", testLinkCounts},
		{"Remove", testRemove},
		{"RenameRules", testRenameRules},
		{"RenameDirs", testRenameDirs},
		{"RenameAtomic", testRenameAtomic},
		{"ReadDirPaging", testReadDirPaging},
		{"ReadDirCookieStability", testReadDirCookies},
		{"ChangeAttr", testChange},
		{"Persistence", testPersistence},
		{"ClientsAndConfig", testClientsConfig},
		{"ConcurrentCreates", testConcurrentCreates},
		{"Closed", testClosed},
		{"StripeMaps", testStripeMaps},
		{"StripeMapPlaceRace", testStripeMapPlaceRace},
		{"StripeMapsReplicas", testStripeMapsReplicas},
		{"Inline", testInline},
		{"ReadCoherence", testReadCoherence},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.fn(t, newEnv(t, open, ctx))
		})
	}
	runOrphans(t, open, ctx)
	runPolicies(t, open, ctx)
	runXattrs(t, open, ctx)
	runReplays(t, open, ctx)
}

func testRoot(t *testing.T, v *env) {
	a := v.attr(meta.RootIno)
	if a.Type != meta.TypeDirectory || a.Nlink != 2 || a.Parent != meta.RootIno || a.Change == 0 {
		t.Fatalf("root attr = %+v", a)
	}
	if err := v.e.Init(v.ctx); err != nil {
		t.Fatalf("second Init: %v", err)
	}
	if b := v.attr(meta.RootIno); b.Change != a.Change || !b.Btime.Equal(a.Btime) {
		t.Fatalf("Init not idempotent: %+v -> %+v", a, b)
	}
	st, err := v.e.StatFS(v.ctx)
	if err != nil || st.Files != 1 {
		t.Fatalf("statfs = %+v, %v", st, err)
	}
	_, err = v.e.GetAttr(v.ctx, 9999)
	wantErr(t, "getattr missing", err, meta.ErrStale)
	if meta.DirVerifier(a) == [8]byte{} {
		t.Fatal("zero dir verifier")
	}
}

func testCreateTypes(t *testing.T, v *env) {
	types := []meta.FileType{meta.TypeRegular, meta.TypeDirectory, meta.TypeSymlink,
		meta.TypeBlock, meta.TypeChar, meta.TypeSocket, meta.TypeFIFO}
	seen := map[meta.Ino]bool{meta.RootIno: true}
	for _, typ := range types {
		name := "n-" + typ.String()
		now := v.tick()
		args := meta.CreateArgs{Type: typ, Mode: 0o17755, UID: 7, GID: 8, RdevMajor: 3, RdevMinor: 4, Target: "/x/y"}
		before := v.attr(meta.RootIno)
		n, ci, err := v.e.Create(v.ctx, meta.RootIno, name, args, now)
		if err != nil {
			t.Fatalf("create %v: %v", typ, err)
		}
		if seen[n.Ino] {
			t.Fatalf("ino %d reused", n.Ino)
		}
		seen[n.Ino] = true
		a := n.Attr
		if a.Type != typ || a.Mode != 0o7755 || a.UID != 7 || a.GID != 8 || !a.Ctime.Equal(now) || !a.Btime.Equal(now) {
			t.Fatalf("create %v attr = %+v", typ, a)
		}
		if ci.Before != before.Change || ci.After <= ci.Before {
			t.Fatalf("change info %+v, dir change before %d", ci, before.Change)
		}
		after := v.attr(meta.RootIno)
		if after.Change != ci.After || !after.Mtime.Equal(now) || !after.Ctime.Equal(now) {
			t.Fatalf("parent after create = %+v (ci %+v)", after, ci)
		}
		switch typ {
		case meta.TypeDirectory:
			if a.Nlink != 2 || a.Parent != meta.RootIno {
				t.Fatalf("dir attr %+v", a)
			}
		case meta.TypeSymlink:
			s, err := v.e.Readlink(v.ctx, n.Ino)
			if err != nil || s != "/x/y" || a.Size != 4 {
				t.Fatalf("readlink = %q, %v (size %d)", s, err, a.Size)
			}
		case meta.TypeBlock, meta.TypeChar:
			if a.RdevMajor != 3 || a.RdevMinor != 4 {
				t.Fatalf("rdev %+v", a)
			}
		}
		if typ != meta.TypeDirectory && a.Nlink != 1 {
			t.Fatalf("nlink %d", a.Nlink)
		}
		got, err := v.e.Lookup(v.ctx, meta.RootIno, name)
		if err != nil || got.Ino != n.Ino || got.Attr.Type != typ {
			t.Fatalf("lookup %q = %+v, %v", name, got, err)
		}
		if typ != meta.TypeSymlink {
			_, err := v.e.Readlink(v.ctx, n.Ino)
			wantErr(t, "readlink non-link", err, meta.ErrNotSymlink)
		}
	}
	if a := v.attr(meta.RootIno); a.Nlink != 3 {
		t.Fatalf("root nlink %d, want 3", a.Nlink)
	}
	st, _ := v.e.StatFS(v.ctx)
	if st.Files != uint64(len(types))+1 {
		t.Fatalf("files = %d", st.Files)
	}
}

func testCreateErrors(t *testing.T, v *env) {
	file := v.create(meta.RootIno, "f", meta.TypeRegular)
	long := string(bytes.Repeat([]byte("x"), meta.MaxNameLen+1))
	ok255 := string(bytes.Repeat([]byte("y"), meta.MaxNameLen))
	cases := []struct {
		name   string
		parent meta.Ino
		args   meta.CreateArgs
		want   error
	}{
		{"", meta.RootIno, meta.CreateArgs{Type: meta.TypeRegular}, meta.ErrInval},
		{".", meta.RootIno, meta.CreateArgs{Type: meta.TypeRegular}, meta.ErrInval},
		{"..", meta.RootIno, meta.CreateArgs{Type: meta.TypeRegular}, meta.ErrInval},
		{"a/b", meta.RootIno, meta.CreateArgs{Type: meta.TypeRegular}, meta.ErrInval},
		{"a\x00b", meta.RootIno, meta.CreateArgs{Type: meta.TypeRegular}, meta.ErrInval},
		{long, meta.RootIno, meta.CreateArgs{Type: meta.TypeRegular}, meta.ErrNameTooLong},
		{ok255, meta.RootIno, meta.CreateArgs{Type: meta.TypeRegular}, nil},
		{"badtype", meta.RootIno, meta.CreateArgs{Type: 9}, meta.ErrInval},
		{"notype", meta.RootIno, meta.CreateArgs{}, meta.ErrInval},
		{"nolink", meta.RootIno, meta.CreateArgs{Type: meta.TypeSymlink}, meta.ErrInval},
		{"x", file.Ino, meta.CreateArgs{Type: meta.TypeRegular}, meta.ErrNotDir},
		{"x", 12345, meta.CreateArgs{Type: meta.TypeRegular}, meta.ErrStale},
	}
	for _, c := range cases {
		_, _, err := v.e.Create(v.ctx, c.parent, c.name, c.args, v.tick())
		wantErr(t, fmt.Sprintf("create %.20q", c.name), err, c.want)
	}
	wantErr(t, "lookup in file", v.lookupErr(file.Ino, "x"), meta.ErrNotDir)
	wantErr(t, "lookup missing", v.lookupErr(meta.RootIno, "nope"), meta.ErrNotFound)
	wantErr(t, "lookup dot", v.lookupErr(meta.RootIno, "."), meta.ErrNotFound)
	wantErr(t, "lookup stale", v.lookupErr(777, "x"), meta.ErrStale)
}

func testCreateExisting(t *testing.T, v *env) {
	verf := [8]byte{1, 2, 3, 4, 5, 6, 7, 8}
	n, _, err := v.e.Create(v.ctx, meta.RootIno, "ex", meta.CreateArgs{Type: meta.TypeRegular, Mode: 0o600, Exclusive: true, Verifier: verf}, v.tick())
	if err != nil || n.Attr.Verifier != verf {
		t.Fatalf("exclusive create: %+v, %v", n, err)
	}
	before := v.attr(meta.RootIno).Change
	for _, typ := range []meta.FileType{meta.TypeRegular, meta.TypeDirectory} {
		got, _, err := v.e.Create(v.ctx, meta.RootIno, "ex", meta.CreateArgs{Type: typ, Exclusive: true, Verifier: [8]byte{9}}, v.tick())
		wantErr(t, "create existing", err, meta.ErrExist)
		if got.Ino != n.Ino || got.Attr.Verifier != verf || got.Attr.Type != meta.TypeRegular {
			t.Fatalf("existing node = %+v, want ino %d", got, n.Ino)
		}
	}
	if after := v.attr(meta.RootIno).Change; after != before {
		t.Fatalf("failed create changed dir: %d -> %d", before, after)
	}
	plain := v.create(meta.RootIno, "plain", meta.TypeRegular)
	if plain.Attr.Verifier != ([8]byte{}) {
		t.Fatal("non-exclusive create stored a verifier")
	}
}

func testSetAttr(t *testing.T, v *env) {
	f := v.create(meta.RootIno, "f", meta.TypeRegular)
	d := v.create(meta.RootIno, "d", meta.TypeDirectory)
	l := v.create(meta.RootIno, "l", meta.TypeSymlink)
	at, mt := time.Unix(100, 5), time.Unix(200, 7)
	now := v.tick()
	a, err := v.e.SetAttr(v.ctx, f.Ino, meta.SetAttr{
		Mask: meta.SetMode | meta.SetUID | meta.SetGID | meta.SetSize | meta.SetAtime | meta.SetMtime,
		Mode: 0o104711, UID: 10, GID: 20, Size: 4096, Atime: at, Mtime: mt,
	}, now)
	if err != nil {
		t.Fatal(err)
	}
	if a.Mode != 0o4711 || a.UID != 10 || a.GID != 20 || a.Size != 4096 || !a.Atime.Equal(at) || !a.Mtime.Equal(mt) || !a.Ctime.Equal(now) || a.Change <= f.Attr.Change {
		t.Fatalf("setattr = %+v", a)
	}
	if g := v.attr(f.Ino); g != a && !(g.Atime.Equal(a.Atime) && g.Change == a.Change && g.Size == a.Size) {
		t.Fatalf("getattr after setattr = %+v", g)
	}
	now = v.tick()
	a, err = v.e.SetAttr(v.ctx, f.Ino, meta.SetAttr{Mask: meta.SetAtimeNow | meta.SetMtimeNow}, now)
	if err != nil || !a.Atime.Equal(now) || !a.Mtime.Equal(now) || a.Size != 4096 {
		t.Fatalf("setattr now = %+v, %v", a, err)
	}
	// Size change alone moves mtime.
	now = v.tick()
	a, err = v.e.SetAttr(v.ctx, f.Ino, meta.SetAttr{Mask: meta.SetSize, Size: 10}, now)
	if err != nil || a.Size != 10 || !a.Mtime.Equal(now) {
		t.Fatalf("truncate = %+v, %v", a, err)
	}
	// Empty mask still bumps ctime and change.
	c := a.Change
	a, err = v.e.SetAttr(v.ctx, f.Ino, meta.SetAttr{}, v.tick())
	if err != nil || a.Change <= c {
		t.Fatalf("empty setattr: %+v, %v", a, err)
	}
	_, err = v.e.SetAttr(v.ctx, d.Ino, meta.SetAttr{Mask: meta.SetSize}, v.tick())
	wantErr(t, "size on dir", err, meta.ErrIsDir)
	_, err = v.e.SetAttr(v.ctx, l.Ino, meta.SetAttr{Mask: meta.SetSize}, v.tick())
	wantErr(t, "size on symlink", err, meta.ErrInval)
	_, err = v.e.SetAttr(v.ctx, 4242, meta.SetAttr{Mask: meta.SetMode}, v.tick())
	wantErr(t, "setattr stale", err, meta.ErrStale)
	a, err = v.e.SetAttr(v.ctx, d.Ino, meta.SetAttr{Mask: meta.SetMode, Mode: 0o1777}, v.tick())
	if err != nil || a.Mode != 0o1777 {
		t.Fatalf("chmod dir: %+v %v", a, err)
	}
}

func testWrote(t *testing.T, v *env) {
	f := v.create(meta.RootIno, "f", meta.TypeRegular)
	now := v.tick()
	a, err := v.e.Wrote(v.ctx, f.Ino, 100, now)
	if err != nil || a.Size != 100 || !a.Mtime.Equal(now) || a.Change <= f.Attr.Change {
		t.Fatalf("wrote = %+v, %v", a, err)
	}
	a2, err := v.e.Wrote(v.ctx, f.Ino, 50, v.tick())
	if err != nil || a2.Size != 100 || a2.Change <= a.Change {
		t.Fatalf("wrote inside = %+v, %v", a2, err)
	}
	d := v.create(meta.RootIno, "d", meta.TypeDirectory)
	_, err = v.e.Wrote(v.ctx, d.Ino, 1, v.tick())
	wantErr(t, "wrote dir", err, meta.ErrInval)
}

func testLinkCounts(t *testing.T, v *env) {
	d1 := v.create(meta.RootIno, "d1", meta.TypeDirectory)
	d2 := v.create(d1.Ino, "d2", meta.TypeDirectory)
	v.create(d1.Ino, "d3", meta.TypeDirectory)
	f := v.create(d2.Ino, "f", meta.TypeRegular)
	if a := v.attr(d1.Ino); a.Nlink != 4 {
		t.Fatalf("d1 nlink %d, want 4", a.Nlink)
	}
	if a := v.attr(meta.RootIno); a.Nlink != 3 {
		t.Fatalf("root nlink %d", a.Nlink)
	}
	if a := v.attr(d2.Ino); a.Nlink != 2 || a.Parent != d1.Ino {
		t.Fatalf("d2 = %+v", a)
	}
	before := v.attr(meta.RootIno).Change
	a, ci, err := v.e.Link(v.ctx, f.Ino, meta.RootIno, "f-link", v.tick())
	if err != nil || a.Nlink != 2 || ci.Before != before || ci.After <= before {
		t.Fatalf("link = %+v %+v %v", a, ci, err)
	}
	if a.Change <= f.Attr.Change {
		t.Fatal("link did not bump change of target")
	}
	if _, _, err := v.e.Link(v.ctx, f.Ino, d1.Ino, "f2", v.tick()); err != nil {
		t.Fatal(err)
	}
	if a := v.attr(f.Ino); a.Nlink != 3 {
		t.Fatalf("nlink %d after two links", a.Nlink)
	}
	for _, c := range []struct {
		ino, parent meta.Ino
		name        string
		want        error
	}{
		{d2.Ino, meta.RootIno, "dirlink", meta.ErrIsDir},
		{f.Ino, meta.RootIno, "f-link", meta.ErrExist},
		{f.Ino, f.Ino, "x", meta.ErrNotDir},
		{999, meta.RootIno, "x", meta.ErrStale},
		{f.Ino, meta.RootIno, "..", meta.ErrInval},
	} {
		_, _, err := v.e.Link(v.ctx, c.ino, c.parent, c.name, v.tick())
		wantErr(t, "link "+c.name, err, c.want)
	}
	n, _, err := v.e.Remove(v.ctx, d2.Ino, "f", v.tick())
	if err != nil || n.Ino != f.Ino || n.Attr.Nlink != 2 {
		t.Fatalf("remove one link = %+v %v", n, err)
	}
	if got, err := v.e.Lookup(v.ctx, meta.RootIno, "f-link"); err != nil || got.Attr.Nlink != 2 {
		t.Fatalf("lookup other link %+v %v", got, err)
	}
}

func testRemove(t *testing.T, v *env) {
	d := v.create(meta.RootIno, "d", meta.TypeDirectory)
	sub := v.create(d.Ino, "sub", meta.TypeDirectory)
	f := v.create(sub.Ino, "f", meta.TypeRegular)
	l := v.create(d.Ino, "l", meta.TypeSymlink)
	_, _, err := v.e.Remove(v.ctx, meta.RootIno, "d", v.tick())
	wantErr(t, "remove nonempty", err, meta.ErrNotEmpty)
	_, _, err = v.e.Remove(v.ctx, meta.RootIno, "missing", v.tick())
	wantErr(t, "remove missing", err, meta.ErrNotFound)
	_, _, err = v.e.Remove(v.ctx, f.Ino, "x", v.tick())
	wantErr(t, "remove in file", err, meta.ErrNotDir)
	_, _, err = v.e.Remove(v.ctx, 31337, "x", v.tick())
	wantErr(t, "remove in stale", err, meta.ErrStale)

	before := v.attr(sub.Ino)
	now := v.tick()
	n, ci, err := v.e.Remove(v.ctx, sub.Ino, "f", now)
	if err != nil || n.Ino != f.Ino || n.Attr.Nlink != 0 || ci.Before != before.Change || ci.After <= ci.Before {
		t.Fatalf("remove file = %+v %+v %v", n, ci, err)
	}
	if a := v.attr(sub.Ino); !a.Mtime.Equal(now) || a.Change != ci.After {
		t.Fatalf("parent after remove %+v", a)
	}
	v.freeOrphan(f.Ino) // a regular file stays an orphan until freed (orphans.go)
	_, err = v.e.GetAttr(v.ctx, f.Ino)
	wantErr(t, "getattr removed", err, meta.ErrStale)
	n, _, err = v.e.Remove(v.ctx, d.Ino, "l", v.tick())
	if err != nil || n.Ino != l.Ino || n.Attr.Nlink != 0 {
		t.Fatalf("remove symlink %+v %v", n, err)
	}
	_, err = v.e.Readlink(v.ctx, l.Ino)
	wantErr(t, "readlink removed", err, meta.ErrStale)
	if a := v.attr(d.Ino); a.Nlink != 3 {
		t.Fatalf("d nlink %d", a.Nlink)
	}
	n, _, err = v.e.Remove(v.ctx, d.Ino, "sub", v.tick())
	if err != nil || n.Attr.Nlink != 0 || n.Attr.Type != meta.TypeDirectory {
		t.Fatalf("rmdir %+v %v", n, err)
	}
	if a := v.attr(d.Ino); a.Nlink != 2 {
		t.Fatalf("d nlink after rmdir %d", a.Nlink)
	}
	if _, _, err := v.e.Remove(v.ctx, meta.RootIno, "d", v.tick()); err != nil {
		t.Fatal(err)
	}
	if a := v.attr(meta.RootIno); a.Nlink != 2 {
		t.Fatalf("root nlink %d", a.Nlink)
	}
	st, _ := v.e.StatFS(v.ctx)
	if st.Files != 1 {
		t.Fatalf("files %d after removing everything", st.Files)
	}
	if names := v.names(meta.RootIno); len(names) != 0 {
		t.Fatalf("root not empty: %v", names)
	}
	// Inode numbers are never reused.
	g := v.create(meta.RootIno, "g", meta.TypeRegular)
	if g.Ino <= l.Ino {
		t.Fatalf("new ino %d not above old %d", g.Ino, l.Ino)
	}
}

func testRenameRules(t *testing.T, v *env) {
	type setup map[string]meta.FileType
	cases := []struct {
		name     string
		files    setup
		src, dst string
		want     error
		replaced bool
	}{
		{"file to new name", setup{"a": meta.TypeRegular}, "a", "b", nil, false},
		{"file over file", setup{"a": meta.TypeRegular, "b": meta.TypeRegular}, "a", "b", nil, true},
		{"file over symlink", setup{"a": meta.TypeRegular, "b": meta.TypeSymlink}, "a", "b", nil, true},
		{"dir over empty dir", setup{"a": meta.TypeDirectory, "b": meta.TypeDirectory}, "a", "b", nil, true},
		{"dir over file", setup{"a": meta.TypeDirectory, "b": meta.TypeRegular}, "a", "b", meta.ErrNotDir, false},
		{"file over dir", setup{"a": meta.TypeRegular, "b": meta.TypeDirectory}, "a", "b", meta.ErrIsDir, false},
		{"missing source", setup{"b": meta.TypeRegular}, "a", "b", meta.ErrNotFound, false},
		{"same name", setup{"a": meta.TypeRegular}, "a", "a", nil, false},
		{"bad dst name", setup{"a": meta.TypeRegular}, "a", "x/y", meta.ErrInval, false},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := v.create(meta.RootIno, fmt.Sprintf("case%d", i), meta.TypeDirectory)
			inos := map[string]meta.Ino{}
			for name, typ := range c.files {
				inos[name] = v.create(d.Ino, name, typ).Ino
			}
			before := v.names(d.Ino)
			res, err := v.e.Rename(v.ctx, d.Ino, c.src, d.Ino, c.dst, v.tick())
			wantErr(t, "rename", err, c.want)
			if err != nil {
				if after := v.names(d.Ino); fmt.Sprint(after) != fmt.Sprint(before) {
					t.Fatalf("failed rename changed dir: %v -> %v", before, after)
				}
				return
			}
			if c.replaced != (res.Replaced.Ino != 0) {
				t.Fatalf("replaced = %+v", res.Replaced)
			}
			if c.replaced && (res.Replaced.Ino != inos[c.dst] || res.Replaced.Attr.Nlink != 0) {
				t.Fatalf("replaced = %+v, want ino %d nlink 0", res.Replaced, inos[c.dst])
			}
			got, err := v.e.Lookup(v.ctx, d.Ino, c.dst)
			if err != nil || got.Ino != inos[c.src] {
				t.Fatalf("lookup dst = %+v %v", got, err)
			}
			if c.src != c.dst {
				wantErr(t, "lookup src", v.lookupErr(d.Ino, c.src), meta.ErrNotFound)
				if res.Src.After <= res.Src.Before {
					t.Fatalf("change info %+v", res.Src)
				}
				if c.replaced {
					v.freeOrphan(inos[c.dst]) // a replaced regular file is an orphan
					_, err := v.e.GetAttr(v.ctx, inos[c.dst])
					wantErr(t, "replaced inode", err, meta.ErrStale)
				}
			}
		})
	}

	t.Run("hard link onto itself", func(t *testing.T) {
		d := v.create(meta.RootIno, "hl", meta.TypeDirectory)
		f := v.create(d.Ino, "a", meta.TypeRegular)
		if _, _, err := v.e.Link(v.ctx, f.Ino, d.Ino, "b", v.tick()); err != nil {
			t.Fatal(err)
		}
		res, err := v.e.Rename(v.ctx, d.Ino, "a", d.Ino, "b", v.tick())
		if err != nil || res.Replaced.Ino != 0 {
			t.Fatalf("rename onto own link: %+v %v", res, err)
		}
		if names := v.names(d.Ino); fmt.Sprint(names) != "[a b]" {
			t.Fatalf("names %v", names)
		}
		if a := v.attr(f.Ino); a.Nlink != 2 {
			t.Fatalf("nlink %d", a.Nlink)
		}
	})

	t.Run("over hard-linked file", func(t *testing.T) {
		d := v.create(meta.RootIno, "hl2", meta.TypeDirectory)
		v.create(d.Ino, "a", meta.TypeRegular)
		b := v.create(d.Ino, "b", meta.TypeRegular)
		if _, _, err := v.e.Link(v.ctx, b.Ino, d.Ino, "c", v.tick()); err != nil {
			t.Fatal(err)
		}
		res, err := v.e.Rename(v.ctx, d.Ino, "a", d.Ino, "b", v.tick())
		if err != nil || res.Replaced.Ino != b.Ino || res.Replaced.Attr.Nlink != 1 {
			t.Fatalf("rename = %+v %v", res, err)
		}
		if a := v.attr(b.Ino); a.Nlink != 1 {
			t.Fatalf("nlink %d", a.Nlink)
		}
	})
}

func testRenameDirs(t *testing.T, v *env) {
	a := v.create(meta.RootIno, "a", meta.TypeDirectory)
	b := v.create(a.Ino, "b", meta.TypeDirectory)
	c := v.create(b.Ino, "c", meta.TypeDirectory)
	x := v.create(meta.RootIno, "x", meta.TypeDirectory)
	full := v.create(meta.RootIno, "full", meta.TypeDirectory)
	v.create(full.Ino, "child", meta.TypeRegular)

	for _, tc := range []struct {
		sp   meta.Ino
		sn   string
		dp   meta.Ino
		dn   string
		want error
	}{
		{meta.RootIno, "a", c.Ino, "a", meta.ErrInval},
		{meta.RootIno, "a", a.Ino, "self", meta.ErrInval},
		{meta.RootIno, "x", meta.RootIno, "full", meta.ErrNotEmpty},
		{meta.RootIno, "x", 5555, "y", meta.ErrStale},
		{meta.RootIno, "x", v.create(meta.RootIno, "file", meta.TypeRegular).Ino, "y", meta.ErrNotDir},
	} {
		_, err := v.e.Rename(v.ctx, tc.sp, tc.sn, tc.dp, tc.dn, v.tick())
		wantErr(t, fmt.Sprintf("rename %s -> %d/%s", tc.sn, tc.dp, tc.dn), err, tc.want)
	}
	// Move b (with child c) from a to x.
	aBefore, xBefore := v.attr(a.Ino), v.attr(x.Ino)
	res, err := v.e.Rename(v.ctx, a.Ino, "b", x.Ino, "b2", v.tick())
	if err != nil {
		t.Fatal(err)
	}
	if res.Src.Before != aBefore.Change || res.Dst.Before != xBefore.Change || res.Src.After <= res.Src.Before || res.Dst.After <= res.Dst.Before {
		t.Fatalf("change info %+v (a %d, x %d)", res, aBefore.Change, xBefore.Change)
	}
	if ga, gx, gb := v.attr(a.Ino), v.attr(x.Ino), v.attr(b.Ino); ga.Nlink != 2 || gx.Nlink != 3 || gb.Parent != x.Ino || gb.Nlink != 3 {
		t.Fatalf("after move: a nlink %d, x nlink %d, b %+v", ga.Nlink, gx.Nlink, gb)
	}
	if got, err := v.e.Lookup(v.ctx, b.Ino, "c"); err != nil || got.Ino != c.Ino {
		t.Fatalf("child followed: %+v %v", got, err)
	}
	// Dir over empty dir in another parent.
	e := v.create(a.Ino, "empty", meta.TypeDirectory)
	res, err = v.e.Rename(v.ctx, x.Ino, "b2", a.Ino, "empty", v.tick())
	if err != nil || res.Replaced.Ino != e.Ino || res.Replaced.Attr.Nlink != 0 {
		t.Fatalf("dir over empty dir: %+v %v", res, err)
	}
	if ga, gx := v.attr(a.Ino), v.attr(x.Ino); ga.Nlink != 3 || gx.Nlink != 2 {
		t.Fatalf("nlinks a %d x %d", ga.Nlink, gx.Nlink)
	}
	if r := v.attr(meta.RootIno); r.Nlink != 2+3 { // a, x, full
		t.Fatalf("root nlink %d", r.Nlink)
	}
	st, _ := v.e.StatFS(v.ctx)
	if st.Files != 8 { // root a b c x full child file
		t.Fatalf("files %d", st.Files)
	}
}

// testRenameAtomic swaps names back and forth while readers check that
// exactly one of the two names exists at every instant.
func testRenameAtomic(t *testing.T, v *env) {
	d := v.create(meta.RootIno, "d", meta.TypeDirectory)
	f := v.create(d.Ino, "one", meta.TypeRegular)
	const rounds = 200
	var wg sync.WaitGroup
	errc := make(chan error, 4)
	wg.Add(1)
	go func() {
		defer wg.Done()
		names := [2]string{"one", "two"}
		for i := range rounds {
			if _, err := v.e.Rename(v.ctx, d.Ino, names[i%2], d.Ino, names[(i+1)%2], time.Time{}); err != nil {
				errc <- err
				return
			}
		}
	}()
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				ents, eof, err := v.e.ReadDir(v.ctx, d.Ino, 0, 10)
				if err != nil {
					errc <- err
					return
				}
				if !eof || len(ents) != 1 || ents[0].Ino != f.Ino {
					errc <- fmt.Errorf("readdir saw %+v (eof %v)", ents, eof)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
}

func testReadDirPaging(t *testing.T, v *env) {
	d := v.create(meta.RootIno, "d", meta.TypeDirectory)
	var want []string
	for i := range 25 {
		name := fmt.Sprintf("e%02d", i)
		v.create(d.Ino, name, meta.TypeRegular)
		want = append(want, name)
	}
	for _, max := range []int{1, 2, 3, 24, 25, 26, 1000} {
		var got []string
		cookie := uint64(0)
		last := uint64(0)
		for calls := 0; ; calls++ {
			if calls > 30 {
				t.Fatalf("max %d: no eof", max)
			}
			ents, eof, err := v.e.ReadDir(v.ctx, d.Ino, cookie, max)
			if err != nil {
				t.Fatal(err)
			}
			if len(ents) > max {
				t.Fatalf("got %d > max %d", len(ents), max)
			}
			for _, en := range ents {
				if en.Cookie <= last || en.Cookie < meta.FirstCookie {
					t.Fatalf("cookie %d after %d", en.Cookie, last)
				}
				if en.Attr.Type != meta.TypeRegular || en.Ino == 0 {
					t.Fatalf("entry %+v", en)
				}
				last = en.Cookie
				cookie = en.Cookie
				got = append(got, en.Name)
			}
			if eof {
				break
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("max %d: got %v", max, got)
		}
	}
	_, _, err := v.e.ReadDir(v.ctx, d.Ino, 0, 0)
	wantErr(t, "max 0", err, meta.ErrInval)
	f := v.create(meta.RootIno, "f", meta.TypeRegular)
	_, _, err = v.e.ReadDir(v.ctx, f.Ino, 0, 10)
	wantErr(t, "readdir file", err, meta.ErrNotDir)
	_, _, err = v.e.ReadDir(v.ctx, 8888, 0, 10)
	wantErr(t, "readdir stale", err, meta.ErrStale)
	ents, eof, err := v.e.ReadDir(v.ctx, d.Ino, ^uint64(0), 10)
	if err != nil || !eof || len(ents) != 0 {
		t.Fatalf("readdir past end: %v %v %v", ents, eof, err)
	}
}

// testReadDirCookies interleaves paging with adds, removes and renames: no
// surviving entry is skipped or duplicated, and each call continues where the
// previous left off.
func testReadDirCookies(t *testing.T, v *env) {
	d := v.create(meta.RootIno, "d", meta.TypeDirectory)
	for i := range 10 {
		v.create(d.Ino, fmt.Sprintf("a%d", i), meta.TypeRegular)
	}
	seen := map[string]int{}
	cookie := uint64(0)
	removed := map[string]bool{}
	for step := 0; ; step++ {
		if step > 50 {
			t.Fatal("no eof")
		}
		ents, eof, err := v.e.ReadDir(v.ctx, d.Ino, cookie, 3)
		if err != nil {
			t.Fatal(err)
		}
		for _, en := range ents {
			seen[en.Name]++
			cookie = en.Cookie
		}
		if eof {
			break
		}
		// Mutate between calls: remove one not yet seen, remove one seen,
		// add one, rename one not yet seen.
		victim := fmt.Sprintf("a%d", 9-step)
		if _, ok := seen[victim]; !ok && step < 3 {
			if _, _, err := v.e.Remove(v.ctx, d.Ino, victim, v.tick()); err == nil {
				removed[victim] = true
			}
		}
		if step == 0 {
			if _, _, err := v.e.Remove(v.ctx, d.Ino, "a0", v.tick()); err != nil {
				t.Fatal(err)
			}
		}
		if step < 4 {
			v.create(d.Ino, fmt.Sprintf("new%d", step), meta.TypeRegular)
		}
	}
	for name, n := range seen {
		if n != 1 {
			t.Fatalf("%q returned %d times", name, n)
		}
		if removed[name] {
			t.Fatalf("removed %q was returned", name)
		}
	}
	for _, name := range []string{"a1", "a2", "a7", "new0", "new1", "new2"} {
		if seen[name] != 1 {
			t.Fatalf("%q missing from listing %v", name, seen)
		}
	}
	// A cookie stays valid after its own entry is removed.
	ents, _, err := v.e.ReadDir(v.ctx, d.Ino, 0, 2)
	if err != nil || len(ents) != 2 {
		t.Fatal(ents, err)
	}
	if _, _, err := v.e.Remove(v.ctx, d.Ino, ents[1].Name, v.tick()); err != nil {
		t.Fatal(err)
	}
	next, _, err := v.e.ReadDir(v.ctx, d.Ino, ents[1].Cookie, 1)
	if err != nil || len(next) != 1 || next[0].Cookie <= ents[1].Cookie {
		t.Fatalf("after removing cookie entry: %+v %v", next, err)
	}
	// Renamed entries get a new cookie at the end.
	res, _, err := v.e.ReadDir(v.ctx, d.Ino, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.e.Rename(v.ctx, d.Ino, res[0].Name, d.Ino, "renamed", v.tick()); err != nil {
		t.Fatal(err)
	}
	names := v.names(d.Ino)
	if names[len(names)-1] != "renamed" {
		t.Fatalf("renamed entry not last: %v", names)
	}
}

func testChange(t *testing.T, v *env) {
	d := v.create(meta.RootIno, "d", meta.TypeDirectory)
	last := v.attr(d.Ino).Change
	step := func(what string, fn func()) {
		t.Helper()
		fn()
		c := v.attr(d.Ino).Change
		if c <= last {
			t.Fatalf("%s: change %d not above %d", what, c, last)
		}
		last = c
	}
	step("create", func() { v.create(d.Ino, "f", meta.TypeRegular) })
	step("link", func() {
		f, _ := v.e.Lookup(v.ctx, d.Ino, "f")
		v.e.Link(v.ctx, f.Ino, d.Ino, "g", v.tick())
	})
	step("rename", func() { v.e.Rename(v.ctx, d.Ino, "g", d.Ino, "h", v.tick()) })
	step("remove", func() { v.e.Remove(v.ctx, d.Ino, "h", v.tick()) })
	step("setattr", func() { v.e.SetAttr(v.ctx, d.Ino, meta.SetAttr{Mask: meta.SetMode, Mode: 0o700}, v.tick()) })
	step("reopen+create", func() {
		v.reopen()
		v.create(d.Ino, "after", meta.TypeRegular)
	})
}

func testPersistence(t *testing.T, v *env) {
	d := v.create(meta.RootIno, "dir", meta.TypeDirectory)
	f := v.create(d.Ino, "file", meta.TypeRegular)
	l := v.create(d.Ino, "link", meta.TypeSymlink)
	if _, err := v.e.SetAttr(v.ctx, f.Ino, meta.SetAttr{Mask: meta.SetSize | meta.SetMtime, Size: 1 << 40, Mtime: time.Unix(-5, 999999999)}, v.tick()); err != nil {
		t.Fatal(err)
	}
	if err := v.e.PutConfig(v.ctx, "secret", []byte{1, 2, 3}); err != nil {
		t.Fatal(err)
	}
	if err := v.e.PutClient(v.ctx, []byte("c1"), []byte("rec1")); err != nil {
		t.Fatal(err)
	}
	want := map[meta.Ino]meta.Attr{meta.RootIno: v.attr(meta.RootIno), d.Ino: v.attr(d.Ino), f.Ino: v.attr(f.Ino), l.Ino: v.attr(l.Ino)}
	v.reopen()
	for ino, w := range want {
		g := v.attr(ino)
		if !sameAttr(g, w) {
			t.Fatalf("ino %d after reopen:\n got %+v\nwant %+v", ino, g, w)
		}
	}
	if names := v.names(d.Ino); fmt.Sprint(names) != "[file link]" {
		t.Fatalf("names %v", names)
	}
	if s, err := v.e.Readlink(v.ctx, l.Ino); err != nil || s != "target-of-link" {
		t.Fatalf("readlink %q %v", s, err)
	}
	if b, err := v.e.GetConfig(v.ctx, "secret"); err != nil || !bytes.Equal(b, []byte{1, 2, 3}) {
		t.Fatalf("config %v %v", b, err)
	}
	if cs, err := v.e.Clients(v.ctx); err != nil || len(cs) != 1 {
		t.Fatalf("clients %v %v", cs, err)
	}
	n := v.create(meta.RootIno, "new", meta.TypeRegular)
	if n.Ino <= l.Ino {
		t.Fatalf("ino %d reused after reopen (last %d)", n.Ino, l.Ino)
	}
	// New entries continue the directory's cookie sequence.
	ents, _, err := v.e.ReadDir(v.ctx, d.Ino, 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	v.create(d.Ino, "later", meta.TypeRegular)
	more, eof, err := v.e.ReadDir(v.ctx, d.Ino, ents[len(ents)-1].Cookie, 10)
	if err != nil || !eof || len(more) != 1 || more[0].Name != "later" {
		t.Fatalf("after reopen readdir: %+v %v %v", more, eof, err)
	}
}

func sameAttr(a, b meta.Attr) bool {
	ta := []time.Time{a.Atime, a.Mtime, a.Ctime, a.Btime}
	tb := []time.Time{b.Atime, b.Mtime, b.Ctime, b.Btime}
	for i := range ta {
		if !ta[i].Equal(tb[i]) {
			return false
		}
	}
	a.Atime, a.Mtime, a.Ctime, a.Btime = time.Time{}, time.Time{}, time.Time{}, time.Time{}
	b.Atime, b.Mtime, b.Ctime, b.Btime = time.Time{}, time.Time{}, time.Time{}, time.Time{}
	return a == b
}

func testClientsConfig(t *testing.T, v *env) {
	_, err := v.e.GetConfig(v.ctx, "nope")
	wantErr(t, "missing config", err, meta.ErrNotFound)
	wantErr(t, "empty config key", v.e.PutConfig(v.ctx, "", nil), meta.ErrInval)
	for i, val := range [][]byte{[]byte("v1"), []byte("v2"), {}} {
		if err := v.e.PutConfig(v.ctx, "k", val); err != nil {
			t.Fatal(err)
		}
		got, err := v.e.GetConfig(v.ctx, "k")
		if err != nil || !bytes.Equal(got, val) {
			t.Fatalf("round %d: %q %v", i, got, err)
		}
	}
	recs := map[string]string{"b": "2", "a": "1", "c\x00x": "3"}
	for k, r := range recs {
		if err := v.e.PutClient(v.ctx, []byte(k), []byte(r)); err != nil {
			t.Fatal(err)
		}
	}
	if err := v.e.PutClient(v.ctx, []byte("a"), []byte("1b")); err != nil {
		t.Fatal(err)
	}
	recs["a"] = "1b"
	wantErr(t, "empty client key", v.e.PutClient(v.ctx, nil, nil), meta.ErrInval)
	if err := v.e.DeleteClient(v.ctx, []byte("b")); err != nil {
		t.Fatal(err)
	}
	delete(recs, "b")
	if err := v.e.DeleteClient(v.ctx, []byte("never")); err != nil {
		t.Fatal(err)
	}
	cs, err := v.e.Clients(v.ctx)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, c := range cs {
		keys = append(keys, string(c.Key))
		if recs[string(c.Key)] != string(c.Rec) {
			t.Fatalf("client %q = %q", c.Key, c.Rec)
		}
	}
	if !sort.StringsAreSorted(keys) || len(keys) != len(recs) {
		t.Fatalf("client keys %q", keys)
	}
	// Client records and config do not show up as files.
	if names := v.names(meta.RootIno); len(names) != 0 {
		t.Fatalf("root lists %v", names)
	}
}

func testConcurrentCreates(t *testing.T, v *env) {
	const workers, per = 6, 25
	d := v.create(meta.RootIno, "d", meta.TypeDirectory)
	var wg sync.WaitGroup
	inos := make([][]meta.Ino, workers)
	errc := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range per {
				typ := meta.TypeRegular
				if i%5 == 0 {
					typ = meta.TypeDirectory
				}
				n, _, err := v.e.Create(v.ctx, d.Ino, fmt.Sprintf("w%d-%d", w, i), meta.CreateArgs{Type: typ, Mode: 0o644}, time.Time{})
				if err != nil {
					errc <- err
					return
				}
				inos[w] = append(inos[w], n.Ino)
				// Contend on one name too: exactly one creator wins.
				_, _, err = v.e.Create(v.ctx, d.Ino, fmt.Sprintf("shared-%d", i), meta.CreateArgs{Type: meta.TypeRegular}, time.Time{})
				if err != nil && !errors.Is(err, meta.ErrExist) {
					errc <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	seen := map[meta.Ino]bool{}
	for _, l := range inos {
		for _, ino := range l {
			if seen[ino] {
				t.Fatalf("ino %d allocated twice", ino)
			}
			seen[ino] = true
		}
	}
	names := v.names(d.Ino)
	if len(names) != workers*per+per {
		t.Fatalf("%d entries, want %d", len(names), workers*per+per)
	}
	if a := v.attr(d.Ino); a.Nlink != uint32(2+workers*per/5) {
		t.Fatalf("dir nlink %d", a.Nlink)
	}
	st, _ := v.e.StatFS(v.ctx)
	if st.Files != uint64(2+workers*per+per) {
		t.Fatalf("files %d", st.Files)
	}
}

func testClosed(t *testing.T, v *env) {
	if err := v.e.Close(); err != nil {
		t.Fatal(err)
	}
	_, err := v.e.GetAttr(v.ctx, meta.RootIno)
	wantErr(t, "getattr after close", err, meta.ErrClosed)
	_, _, err = v.e.Create(v.ctx, meta.RootIno, "x", meta.CreateArgs{Type: meta.TypeRegular}, time.Time{})
	wantErr(t, "create after close", err, meta.ErrClosed)
	v.e = v.open(t, v.dir) // so cleanup's Close succeeds
	ctx, cancel := context.WithCancel(v.ctx)
	cancel()
	_, err = v.e.GetAttr(ctx, meta.RootIno)
	wantErr(t, "canceled ctx", err, context.Canceled)
}
