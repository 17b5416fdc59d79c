package metatest

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/shoalfs/shoal/meta"
)

// runXattrs runs the extended-attribute cases (Engine.GetXattr and the
// rest).
func runXattrs(t *testing.T, open Opener, ctx context.Context) {
	tests := []struct {
		name string
		fn   func(t *testing.T, v *env)
	}{
		{"SetGetModes", testXattrModes},
		{"Limits", testXattrLimits},
		{"ChangeAndCtime", testXattrChange},
		{"ListPaging", testXattrList},
		{"Remove", testXattrRemove},
		{"DeletedWithInode", testXattrDeleted},
		{"Concurrent", testXattrConcurrent},
	}
	for _, tc := range tests {
		t.Run("Xattrs/"+tc.name, func(t *testing.T) {
			tc.fn(t, newEnv(t, open, ctx))
		})
	}
}

func (v *env) setXattr(ino meta.Ino, name, value string, mode meta.XattrMode) meta.ChangeInfo {
	v.t.Helper()
	ci, err := v.e.SetXattr(v.ctx, ino, name, []byte(value), mode, v.tick())
	if err != nil {
		v.t.Fatalf("set xattr %q of %d: %v", name, ino, err)
	}
	return ci
}

func (v *env) wantXattr(ino meta.Ino, name, want string) {
	v.t.Helper()
	got, err := v.e.GetXattr(v.ctx, ino, name)
	if err != nil {
		v.t.Fatalf("get xattr %q of %d: %v", name, ino, err)
	}
	if string(got) != want {
		v.t.Fatalf("xattr %q of %d = %q, want %q", name, ino, got, want)
	}
}

// xattrNames lists all names of ino, max at a time, checking cookies.
func (v *env) xattrNames(ino meta.Ino, max int) []string {
	v.t.Helper()
	var out []string
	cookie := uint64(0)
	for range 1000 {
		names, eof, err := v.e.ListXattrs(v.ctx, ino, cookie, max)
		if err != nil {
			v.t.Fatalf("list xattrs of %d after %d: %v", ino, cookie, err)
		}
		if len(names) > max || !eof && len(names) != max {
			v.t.Fatalf("list xattrs of %d, max %d: %d names, eof %v", ino, max, len(names), eof)
		}
		for _, n := range names {
			if n.Cookie <= cookie {
				v.t.Fatalf("list xattrs of %d: cookie %d after %d", ino, n.Cookie, cookie)
			}
			cookie = n.Cookie
			out = append(out, n.Name)
		}
		if eof {
			return out
		}
	}
	v.t.Fatalf("list xattrs of %d did not reach eof", ino)
	return nil
}

// testXattrModes checks EITHER, CREATE and REPLACE on every inode type,
// binary and empty values, and that the values survive a reopen.
func testXattrModes(t *testing.T, v *env) {
	var inos []meta.Ino
	for _, typ := range []meta.FileType{meta.TypeRegular, meta.TypeDirectory, meta.TypeSymlink, meta.TypeFIFO} {
		inos = append(inos, v.create(meta.RootIno, "n-"+typ.String(), typ).Ino)
	}
	inos = append(inos, meta.RootIno)
	for _, ino := range inos {
		_, err := v.e.GetXattr(v.ctx, ino, "a")
		wantErr(t, "get missing", err, meta.ErrNoXattr)
		_, err = v.e.SetXattr(v.ctx, ino, "a", []byte("x"), meta.XattrReplace, v.tick())
		wantErr(t, "replace missing", err, meta.ErrNoXattr)
		v.setXattr(ino, "a", "one", meta.XattrCreate)
		_, err = v.e.SetXattr(v.ctx, ino, "a", []byte("two"), meta.XattrCreate, v.tick())
		wantErr(t, "create existing", err, meta.ErrExist)
		v.wantXattr(ino, "a", "one")
		v.setXattr(ino, "a", "two", meta.XattrReplace)
		v.wantXattr(ino, "a", "two")
		v.setXattr(ino, "a", "three", meta.XattrEither)
		v.setXattr(ino, "b", "", meta.XattrEither)
		v.setXattr(ino, "bin", "\x00\xff\x00", meta.XattrEither)
		v.setXattr(ino, "ünï cødé", "v", meta.XattrCreate)
		_, err = v.e.SetXattr(v.ctx, ino, "c", nil, meta.XattrMode(9), v.tick())
		wantErr(t, "unknown mode", err, meta.ErrInval)
	}
	v.reopen()
	for _, ino := range inos {
		v.wantXattr(ino, "a", "three")
		v.wantXattr(ino, "b", "")
		v.wantXattr(ino, "bin", "\x00\xff\x00")
		v.wantXattr(ino, "ünï cødé", "v")
		if got := v.xattrNames(ino, 100); !slices.Equal(got, []string{"a", "b", "bin", "ünï cødé"}) {
			t.Fatalf("names of %d: %q", ino, got)
		}
	}
	if got, err := v.e.GetXattr(v.ctx, inos[0], "b"); err != nil || got == nil {
		t.Fatalf("empty value read as %v, %v; want an empty, non-nil value", got, err)
	}
}

// testXattrLimits checks the name and value limits, the limit on all of
// an inode's attributes, and that refused calls change nothing.
func testXattrLimits(t *testing.T, v *env) {
	f := v.create(meta.RootIno, "f", meta.TypeRegular)
	long := strings.Repeat("n", meta.MaxXattrNameLen)
	v.setXattr(f.Ino, long, "ok", meta.XattrCreate)
	v.wantXattr(f.Ino, long, "ok")
	big := bytes.Repeat([]byte{'v'}, meta.MaxXattrValueLen)
	if _, err := v.e.SetXattr(v.ctx, f.Ino, "big", big, meta.XattrCreate, v.tick()); err != nil {
		t.Fatalf("value of %d bytes: %v", len(big), err)
	}
	before := v.attr(f.Ino)
	for _, c := range []struct {
		what  string
		name  string
		value []byte
		want  error
	}{
		{"name too long", long + "n", nil, meta.ErrXattrTooBig},
		{"value too long", "v", append(big, 'v'), meta.ErrXattrTooBig},
		{"empty name", "", nil, meta.ErrInval},
		{"NUL in name", "a\x00b", nil, meta.ErrInval},
	} {
		_, err := v.e.SetXattr(v.ctx, f.Ino, c.name, c.value, meta.XattrEither, v.tick())
		wantErr(t, "set: "+c.what, err, c.want)
		if c.value == nil {
			_, err = v.e.GetXattr(v.ctx, f.Ino, c.name)
			wantErr(t, "get: "+c.what, err, c.want)
			_, err = v.e.RemoveXattr(v.ctx, f.Ino, c.name, v.tick())
			wantErr(t, "remove: "+c.what, err, c.want)
		}
	}
	// Fill the inode up to MaxXattrBytes: values of 64 KiB until one
	// more does not fit.
	var i int
	for i = 0; ; i++ {
		_, err := v.e.SetXattr(v.ctx, f.Ino, fmt.Sprintf("fill%d", i), big, meta.XattrCreate, v.tick())
		if err != nil {
			wantErr(t, "over the per-inode limit", err, meta.ErrNoSpace)
			break
		}
		if i > meta.MaxXattrBytes/meta.MaxXattrValueLen {
			t.Fatalf("%d values of %d bytes fit in %d bytes", i+2, len(big), meta.MaxXattrBytes)
		}
	}
	if i == 0 {
		t.Fatal("no second 64 KiB value fits")
	}
	if after := v.attr(f.Ino); after.Change != before.Change+uint64(i) {
		t.Fatalf("change %d -> %d after %d successful sets", before.Change, after.Change, i)
	}
	// Replacing a value by a smaller one always fits.
	v.setXattr(f.Ino, "big", "small", meta.XattrReplace)
	v.setXattr(f.Ino, fmt.Sprintf("fill%d", i), "fits now", meta.XattrCreate)
	v.reopen()
	v.wantXattr(f.Ino, "big", "small")
	v.wantXattr(f.Ino, long, "ok")
}

// testXattrChange checks that set and remove bump change and set ctime
// but not mtime, report the change before and after, and that failed
// calls leave the inode alone.
func testXattrChange(t *testing.T, v *env) {
	f := v.create(meta.RootIno, "f", meta.TypeRegular)
	a0 := v.attr(f.Ino)
	now := v.tick()
	ci, err := v.e.SetXattr(v.ctx, f.Ino, "k", []byte("v"), meta.XattrEither, now)
	if err != nil {
		t.Fatal(err)
	}
	a1 := v.attr(f.Ino)
	if ci.Before != a0.Change || ci.After != a1.Change || a1.Change <= a0.Change {
		t.Fatalf("set: change info %+v, change %d -> %d", ci, a0.Change, a1.Change)
	}
	if !a1.Ctime.Equal(now) || !a1.Mtime.Equal(a0.Mtime) || !a1.Atime.Equal(a0.Atime) {
		t.Fatalf("set: ctime %v (want %v), mtime %v -> %v", a1.Ctime, now, a0.Mtime, a1.Mtime)
	}
	for _, fail := range []func() error{
		func() error { _, err := v.e.SetXattr(v.ctx, f.Ino, "k", nil, meta.XattrCreate, v.tick()); return err },
		func() error { _, err := v.e.SetXattr(v.ctx, f.Ino, "x", nil, meta.XattrReplace, v.tick()); return err },
		func() error { _, err := v.e.RemoveXattr(v.ctx, f.Ino, "x", v.tick()); return err },
	} {
		if fail() == nil {
			t.Fatal("call succeeded")
		}
	}
	if a := v.attr(f.Ino); !sameAttr(a, a1) {
		t.Fatalf("failed calls changed the inode: %+v, was %+v", a, a1)
	}
	now = v.tick()
	ci, err = v.e.RemoveXattr(v.ctx, f.Ino, "k", now)
	if err != nil {
		t.Fatal(err)
	}
	a2 := v.attr(f.Ino)
	if ci.Before != a1.Change || ci.After != a2.Change || a2.Change <= a1.Change || !a2.Ctime.Equal(now) || !a2.Mtime.Equal(a0.Mtime) {
		t.Fatalf("remove: change info %+v, change %d -> %d, ctime %v", ci, a1.Change, a2.Change, a2.Ctime)
	}
}

// testXattrList pages through names with every page size, and checks
// cookies past the end and the max argument.
func testXattrList(t *testing.T, v *env) {
	d := v.create(meta.RootIno, "d", meta.TypeDirectory)
	if got := v.xattrNames(d.Ino, 1); len(got) != 0 {
		t.Fatalf("new directory has xattrs %q", got)
	}
	var want []string
	for i := range 7 {
		name := fmt.Sprintf("x%02d", 6-i) // set in reverse order
		v.setXattr(d.Ino, name, "v", meta.XattrCreate)
		want = append([]string{name}, want...)
	}
	for max := 1; max <= 8; max++ {
		if got := v.xattrNames(d.Ino, max); !slices.Equal(got, want) {
			t.Fatalf("max %d: %q, want %q", max, got, want)
		}
	}
	names, eof, err := v.e.ListXattrs(v.ctx, d.Ino, 7, 10)
	if err != nil || len(names) != 0 || !eof {
		t.Fatalf("after the last cookie: %v, %v, %v", names, eof, err)
	}
	names, eof, err = v.e.ListXattrs(v.ctx, d.Ino, 1<<63, 10)
	if err != nil || len(names) != 0 || !eof {
		t.Fatalf("far past the end: %v, %v, %v", names, eof, err)
	}
	names, eof, err = v.e.ListXattrs(v.ctx, d.Ino, 5, 1)
	if err != nil || len(names) != 1 || names[0].Name != want[5] || eof {
		t.Fatalf("from cookie 5: %v, %v, %v", names, eof, err)
	}
	_, _, err = v.e.ListXattrs(v.ctx, d.Ino, 0, 0)
	wantErr(t, "max 0", err, meta.ErrInval)
}

// testXattrRemove removes attributes down to none.
func testXattrRemove(t *testing.T, v *env) {
	f := v.create(meta.RootIno, "f", meta.TypeRegular)
	v.setXattr(f.Ino, "a", "1", meta.XattrCreate)
	v.setXattr(f.Ino, "b", "2", meta.XattrCreate)
	if _, err := v.e.RemoveXattr(v.ctx, f.Ino, "a", v.tick()); err != nil {
		t.Fatal(err)
	}
	_, err := v.e.GetXattr(v.ctx, f.Ino, "a")
	wantErr(t, "get removed", err, meta.ErrNoXattr)
	_, err = v.e.RemoveXattr(v.ctx, f.Ino, "a", v.tick())
	wantErr(t, "remove twice", err, meta.ErrNoXattr)
	v.wantXattr(f.Ino, "b", "2")
	if _, err := v.e.RemoveXattr(v.ctx, f.Ino, "b", v.tick()); err != nil {
		t.Fatal(err)
	}
	v.reopen()
	if got := v.xattrNames(f.Ino, 10); len(got) != 0 {
		t.Fatalf("names after removing all: %q", got)
	}
	v.setXattr(f.Ino, "a", "again", meta.XattrCreate)
	v.wantXattr(f.Ino, "a", "again")
}

// testXattrDeleted checks that attributes go with their inode however it
// goes (rmdir, unlink of a symlink, rename over, an orphan freed), that an
// orphan keeps its attributes until then, and that links and renames keep
// them. Every inode carries as many attributes as fit, so freeing one must
// not grow with their number (etcd's operation limit).
func testXattrDeleted(t *testing.T, v *env) {
	d := v.create(meta.RootIno, "d", meta.TypeDirectory)
	rmdir := v.create(d.Ino, "rmdir", meta.TypeDirectory)
	link := v.create(d.Ino, "link", meta.TypeSymlink)
	victim := v.create(d.Ino, "victim", meta.TypeRegular)
	mover := v.create(d.Ino, "mover", meta.TypeRegular)
	orphan := v.create(d.Ino, "orphan", meta.TypeRegular)
	all := []meta.Ino{rmdir.Ino, link.Ino, victim.Ino, mover.Ino, orphan.Ino}
	const many = 40 // more than the etcd suite's budget of 32 operations
	for _, ino := range all {
		for i := range many {
			v.setXattr(ino, fmt.Sprintf("k%03d", i), "v", meta.XattrCreate)
		}
	}
	if _, _, err := v.e.Link(v.ctx, mover.Ino, meta.RootIno, "hard", v.tick()); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"rmdir", "link", "orphan"} {
		if _, _, err := v.e.Remove(v.ctx, d.Ino, name, v.tick()); err != nil {
			t.Fatalf("remove %s: %v", name, err)
		}
	}
	if _, err := v.e.Rename(v.ctx, d.Ino, "mover", d.Ino, "victim", v.tick()); err != nil {
		t.Fatal(err)
	}
	v.wantXattr(orphan.Ino, "k007", "v")
	v.setXattr(orphan.Ino, "late", "v", meta.XattrCreate)
	v.freeOrphan(victim.Ino)
	v.freeOrphan(orphan.Ino)
	v.reopen()
	for _, ino := range []meta.Ino{rmdir.Ino, link.Ino, victim.Ino, orphan.Ino} {
		_, err := v.e.GetXattr(v.ctx, ino, "k000")
		wantErr(t, fmt.Sprintf("get xattr of deleted %d", ino), err, meta.ErrStale)
		_, err = v.e.SetXattr(v.ctx, ino, "k000", nil, meta.XattrEither, v.tick())
		wantErr(t, fmt.Sprintf("set xattr of deleted %d", ino), err, meta.ErrStale)
		_, _, err = v.e.ListXattrs(v.ctx, ino, 0, 10)
		wantErr(t, fmt.Sprintf("list xattrs of deleted %d", ino), err, meta.ErrStale)
		_, err = v.e.RemoveXattr(v.ctx, ino, "k000", v.tick())
		wantErr(t, fmt.Sprintf("remove xattr of deleted %d", ino), err, meta.ErrStale)
	}
	if got := v.xattrNames(mover.Ino, 1000); len(got) != many {
		t.Fatalf("renamed and linked file has %d xattrs, want %d", len(got), many)
	}
	fresh := v.create(d.Ino, "rmdir", meta.TypeDirectory)
	if got := v.xattrNames(fresh.Ino, 10); len(got) != 0 {
		t.Fatalf("fresh directory has xattrs %q", got)
	}
}

// testXattrConcurrent sets and removes attributes of one inode from
// several goroutines (for the race detector, and for engines that retry
// or batch transactions): nothing is lost, and change counts every call.
func testXattrConcurrent(t *testing.T, v *env) {
	f := v.create(meta.RootIno, "f", meta.TypeRegular)
	before := v.attr(f.Ino).Change
	const workers, each = 4, 8
	var wg sync.WaitGroup
	errs := make([]error, workers)
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				name := fmt.Sprintf("w%d-%d", w, i)
				if _, err := v.e.SetXattr(v.ctx, f.Ino, name, []byte(name), meta.XattrCreate, v.now); err != nil {
					errs[w] = err
					return
				}
				if i%2 == 1 {
					if _, err := v.e.RemoveXattr(v.ctx, f.Ino, name, v.now); err != nil {
						errs[w] = err
						return
					}
				}
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	var want []string
	for w := range workers {
		for i := 0; i < each; i += 2 {
			want = append(want, fmt.Sprintf("w%d-%d", w, i))
		}
	}
	slices.Sort(want)
	if got := v.xattrNames(f.Ino, 5); !slices.Equal(got, want) {
		t.Fatalf("names %q, want %q", got, want)
	}
	for _, name := range want {
		v.wantXattr(f.Ino, name, name)
	}
	if got := v.attr(f.Ino).Change; got != before+workers*each*3/2 {
		t.Fatalf("change %d -> %d after %d calls", before, got, workers*each*3/2)
	}
}
