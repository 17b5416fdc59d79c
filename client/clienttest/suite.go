// Package clienttest is a conformance suite for Shoal's NFS client against
// a real NFSv4.1+ server. The same suite runs against NFS-Ganesha (as an
// independent reference implementation) and against Shoal's own server, so
// a failure on one and not the other points at the side that is wrong.
//
// Every test works in a fresh directory of its own under the client's root
// and removes it afterwards, so the suite can share one server.
package clienttest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/shoalfs/shoal/client"
)

// Dialer returns a new Client connected to the server under test. The
// suite closes it.
type Dialer func(t *testing.T) *client.Client

// testTimeout bounds every test of the suite.
const testTimeout = 2 * time.Minute

// Run runs the suite. dial is called at least once per test; the lock tests
// call it twice to get two independent clients.
func Run(t *testing.T, dial Dialer) {
	tests := []struct {
		name string
		fn   func(t *testing.T, e *env)
	}{
		{"ReadWriteSizes", testReadWriteSizes},
		{"ReadDirPaging", testReadDirPaging},
		{"RenameAcrossDirs", testRename},
		{"LinkSymlinkReadlink", testLinks},
		{"SetAttr", testSetAttr},
		{"RemoveErrors", testRemoveErrors},
		{"ExclusiveCreate", testExclusive},
		{"Locks", testLocks},
		{"ConcurrentWriters", testConcurrentWriters},
		{"SeekReadWrite", testSeek},
		{"OpenHandle", testOpenHandle},
		{"ReadDelegation", testReadDelegation},
		{"Reconnect", testReconnect},
		{"Mknod", testMknod},
		{"Statfs", testStatfs},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.fn(t, newEnv(t, dial))
		})
	}
}

// env is one test's client, context and scratch directory.
type env struct {
	dial Dialer
	c    *client.Client
	ctx  context.Context
	dir  string
}

func newEnv(t *testing.T, dial Dialer) *env {
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	t.Cleanup(cancel)
	c := dial(t)
	t.Cleanup(func() { c.Close() })
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	e := &env{dial: dial, c: c, ctx: ctx, dir: "/clienttest-" + hex.EncodeToString(rnd[:])}
	if c.MaxRead() == 0 || c.MaxWrite() == 0 {
		t.Fatalf("client reports maxread %d, maxwrite %d", c.MaxRead(), c.MaxWrite())
	}
	if err := c.Mkdir(ctx, e.dir, 0o755); err != nil {
		t.Fatalf("mkdir scratch dir: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := c.RemoveAll(ctx, e.dir); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	return e
}

func (e *env) path(name string) string { return e.dir + "/" + name }

// pattern returns n bytes that differ with seed and position.
func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7+i>>10) ^ seed
	}
	return b
}

func writeFile(t *testing.T, e *env, c *client.Client, path string, data []byte) {
	t.Helper()
	f, err := c.Open(e.ctx, path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatalf("open %s for writing: %v", path, err)
	}
	if n, err := f.WriteAt(data, 0); err != nil || n != len(data) {
		t.Fatalf("write %s: %d, %v", path, n, err)
	}
	if err := f.Close(); err != nil {
		t.Fatalf("close %s: %v", path, err)
	}
}

func readFile(t *testing.T, e *env, c *client.Client, path string) []byte {
	t.Helper()
	f, err := c.Open(e.ctx, path, os.O_RDONLY, 0)
	if err != nil {
		t.Fatalf("open %s for reading: %v", path, err)
	}
	defer f.Close()
	a, err := f.Stat(e.ctx)
	if err != nil {
		t.Fatalf("stat %s: %v", path, err)
	}
	buf := make([]byte, a.Size+100) // ask for more than there is
	n, err := f.ReadAt(buf, 0)
	if err != io.EOF {
		t.Fatalf("read %s past EOF: got %d, %v; want io.EOF", path, n, err)
	}
	return buf[:n]
}

func testReadWriteSizes(t *testing.T, e *env) {
	for _, size := range []int{0, 1, 4095, 4096, 4097, 3 << 20} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			p := e.path(fmt.Sprintf("f%d", size))
			want := pattern(size, byte(size))
			writeFile(t, e, e.c, p, want)
			a, err := e.c.Stat(e.ctx, p)
			if err != nil {
				t.Fatal(err)
			}
			if a.Type != client.TypeRegular || a.Size != uint64(size) || a.Mode != 0o644 {
				t.Fatalf("stat: type %v size %d mode %o; want file %d 644", a.Type, a.Size, a.Mode, size)
			}
			if got := readFile(t, e, e.c, p); !bytes.Equal(got, want) {
				t.Fatalf("read back %d bytes differ from the %d written", len(got), len(want))
			}
		})
	}
	if e.c.MaxRead() >= 3<<20 || e.c.MaxWrite() >= 3<<20 {
		t.Logf("note: maxread %d / maxwrite %d: 3 MiB did not need splitting", e.c.MaxRead(), e.c.MaxWrite())
	}
}

func testReadDirPaging(t *testing.T, e *env) {
	const n = 300
	d := e.path("many")
	if err := e.c.Mkdir(e.ctx, d, 0o755); err != nil {
		t.Fatal(err)
	}
	var want []string
	var wg sync.WaitGroup
	errs := make(chan error, n)
	sem := make(chan struct{}, 16)
	for i := range n {
		name := fmt.Sprintf("entry-with-a-longish-name-%04d", i)
		want = append(want, name)
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			f, err := e.c.Open(e.ctx, d+"/"+name, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
			if err == nil {
				err = f.Close()
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	ents, err := e.c.ReadDir(e.ctx, d)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, ent := range ents {
		got = append(got, ent.Name)
		if ent.Attr.Type != client.TypeRegular || ent.Attr.Mode != 0o600 {
			t.Errorf("%s: type %v mode %o", ent.Name, ent.Attr.Type, ent.Attr.Mode)
		}
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("readdir returned %d entries, want %d", len(got), len(want))
	}
}

func testRename(t *testing.T, e *env) {
	for _, d := range []string{"a", "b"} {
		if err := e.c.Mkdir(e.ctx, e.path(d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	data := []byte("moving day")
	writeFile(t, e, e.c, e.path("a/f"), data)
	if err := e.c.Rename(e.ctx, e.path("a/f"), e.path("b/g")); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.Stat(e.ctx, e.path("a/f")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("old name after rename: %v, want not exist", err)
	}
	if got := readFile(t, e, e.c, e.path("b/g")); !bytes.Equal(got, data) {
		t.Fatalf("renamed file holds %q", got)
	}
	// Renaming over an existing file replaces it.
	writeFile(t, e, e.c, e.path("a/h"), []byte("new"))
	if err := e.c.Rename(e.ctx, e.path("a/h"), e.path("b/g")); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, e, e.c, e.path("b/g")); string(got) != "new" {
		t.Fatalf("after replacing rename: %q", got)
	}
	if err := e.c.Rename(e.ctx, e.path("a/missing"), e.path("b/x")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("rename of missing file: %v", err)
	}
}

func testLinks(t *testing.T, e *env) {
	writeFile(t, e, e.c, e.path("orig"), []byte("linked"))
	if err := e.c.Link(e.ctx, e.path("orig"), e.path("hard")); err != nil {
		t.Fatal(err)
	}
	a1, err := e.c.Stat(e.ctx, e.path("orig"))
	if err != nil {
		t.Fatal(err)
	}
	a2, err := e.c.Stat(e.ctx, e.path("hard"))
	if err != nil {
		t.Fatal(err)
	}
	if a1.Nlink != 2 || a1.Fileid != a2.Fileid {
		t.Fatalf("hard link: nlink %d, fileids %d %d", a1.Nlink, a1.Fileid, a2.Fileid)
	}
	target := "orig"
	if err := e.c.Symlink(e.ctx, target, e.path("sym")); err != nil {
		t.Fatal(err)
	}
	got, err := e.c.Readlink(e.ctx, e.path("sym"))
	if err != nil || got != target {
		t.Fatalf("readlink: %q, %v", got, err)
	}
	a, err := e.c.Stat(e.ctx, e.path("sym"))
	if err != nil || a.Type != client.TypeSymlink || a.FileMode()&fs.ModeSymlink == 0 {
		t.Fatalf("stat of symlink: %v, %v (must not follow it)", a.Type, err)
	}
	if _, err := e.c.Readlink(e.ctx, e.path("orig")); err == nil {
		t.Fatal("readlink of a regular file succeeded")
	}
	if err := e.c.Symlink(e.ctx, "x", e.path("sym")); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("symlink over existing name: %v", err)
	}
}

func testSetAttr(t *testing.T, e *env) {
	p := e.path("attrs")
	writeFile(t, e, e.c, p, pattern(1000, 1))
	mode := uint32(0o640)
	uid, gid := uint32(1234), uint32(5678)
	size := uint64(10)
	atime := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	mtime := time.Date(2002, 3, 4, 5, 6, 7, 0, time.UTC)
	steps := []struct {
		name  string
		sa    client.SetAttr
		check func(a client.Attr) bool
	}{
		{"chmod", client.SetAttr{Mode: &mode}, func(a client.Attr) bool { return a.Mode == mode }},
		{"chown", client.SetAttr{UID: &uid, GID: &gid}, func(a client.Attr) bool { return a.UID == uid && a.GID == gid }},
		{"truncate", client.SetAttr{Size: &size}, func(a client.Attr) bool { return a.Size == size }},
		{"utimes", client.SetAttr{Atime: &atime, Mtime: &mtime}, func(a client.Attr) bool {
			return a.Atime.Equal(atime) && a.Mtime.Equal(mtime)
		}},
	}
	for _, s := range steps {
		if err := e.c.SetAttr(e.ctx, p, s.sa); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		a, err := e.c.Stat(e.ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		if !s.check(a) {
			t.Fatalf("%s: attributes after setattr: %+v", s.name, a)
		}
	}
	if got := readFile(t, e, e.c, p); !bytes.Equal(got, pattern(1000, 1)[:10]) {
		t.Fatalf("content after truncate: %x", got)
	}
	// Growing with SetAttr reads back zeros.
	big := uint64(5000)
	if err := e.c.SetAttr(e.ctx, p, client.SetAttr{Size: &big}); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, e, e.c, p); len(got) != 5000 || !bytes.Equal(got[10:], make([]byte, 4990)) {
		t.Fatalf("extended file reads %d bytes, tail not zero", len(got))
	}
}

func testRemoveErrors(t *testing.T, e *env) {
	err := e.c.Remove(e.ctx, e.path("nope"))
	if !errors.Is(err, fs.ErrNotExist) || !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("remove missing: %v", err)
	}
	var se *client.StatusError
	if !errors.As(err, &se) || se.Status() != 2 {
		t.Fatalf("remove missing: %v is not a StatusError with NFS4ERR_NOENT", err)
	}
	if err := e.c.MkdirAll(e.ctx, e.path("full/sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := e.c.Remove(e.ctx, e.path("full")); !errors.Is(err, syscall.ENOTEMPTY) {
		t.Fatalf("remove non-empty dir: %v", err)
	}
	if err := e.c.Remove(e.ctx, e.path("full/sub")); err != nil {
		t.Fatal(err)
	}
	if err := e.c.Remove(e.ctx, e.path("full")); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.Stat(e.ctx, e.path("full")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("stat removed dir: %v", err)
	}
	if err := e.c.Mkdir(e.ctx, e.dir, 0o755); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("mkdir existing: %v", err)
	}
	if _, err := e.c.Open(e.ctx, e.path("nope/x"), os.O_RDONLY, 0); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("open under missing dir: %v", err)
	}
}

func testExclusive(t *testing.T, e *env) {
	p := e.path("excl")
	f, err := e.c.Open(e.ctx, p, os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := e.c.Open(e.ctx, p, os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o600); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("second exclusive create: %v, want exist", err)
	}
	// Without O_EXCL the existing file opens; O_TRUNC empties it.
	if _, err := f.WriteAt([]byte("data"), 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	g, err := e.c.Open(e.ctx, p, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	if a, err := e.c.Stat(e.ctx, p); err != nil || a.Size != 0 {
		t.Fatalf("after O_TRUNC: size %d, %v", a.Size, err)
	}
}

func testLocks(t *testing.T, e *env) {
	p := e.path("locked")
	writeFile(t, e, e.c, p, make([]byte, 100))
	other := e.dial(t)
	defer other.Close()
	f1, err := e.c.Open(e.ctx, p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f1.Close()
	f2, err := other.Open(e.ctx, p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f2.Close()

	if err := f1.Lock(e.ctx, 0, 50, true, false); err != nil {
		t.Fatal(err)
	}
	if err := f2.Lock(e.ctx, 10, 10, true, false); !errors.Is(err, syscall.EAGAIN) {
		t.Fatalf("conflicting lock from a second client: %v, want EAGAIN", err)
	}
	if err := f2.Lock(e.ctx, 50, 10, true, false); err != nil {
		t.Fatalf("non-overlapping lock: %v", err)
	}
	conf, err := f2.TestLock(e.ctx, 0, 10, false)
	if err != nil {
		t.Fatal(err)
	}
	if conf == nil || conf.Offset != 0 || conf.Length != 50 || !conf.Write {
		t.Fatalf("TestLock: %v, want the write lock [0,+50)", conf)
	}
	if conf, err := f1.TestLock(e.ctx, 0, 10, true); err != nil || conf != nil {
		t.Fatalf("TestLock of own lock: %v, %v", conf, err)
	}
	if err := f1.Unlock(e.ctx, 0, 50); err != nil {
		t.Fatal(err)
	}
	if err := f2.Lock(e.ctx, 0, 10, true, false); err != nil {
		t.Fatalf("lock after unlock: %v", err)
	}
	// A waiting lock is granted once the holder lets go.
	got := make(chan error, 1)
	go func() { got <- f1.Lock(e.ctx, 0, 0, true, true) }()
	if err := f2.Unlock(e.ctx, 0, 10); err != nil {
		t.Fatal(err)
	}
	if err := f2.Unlock(e.ctx, 50, 10); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("waiting lock: %v", err)
	}
	if conf, err := f2.TestLock(e.ctx, 99, 1, false); err != nil || conf == nil {
		t.Fatalf("TestLock of the waited-for lock: %v, %v", conf, err)
	}
}

func testConcurrentWriters(t *testing.T, e *env) {
	const writers, region = 8, 300 << 10
	p := e.path("shared")
	f, err := e.c.Open(e.ctx, p, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, writers*2)
	for w := range writers {
		wg.Add(2)
		go func() { // disjoint regions of one File
			defer wg.Done()
			_, err := f.WriteAt(pattern(region, byte(w)), int64(w*region))
			errs <- err
		}()
		go func() { // and files of their own, on the same Client
			defer wg.Done()
			q := e.path(fmt.Sprintf("own%d", w))
			g, err := e.c.Open(e.ctx, q, os.O_CREATE|os.O_WRONLY, 0o644)
			if err == nil {
				_, err = g.WriteAt(pattern(region, byte(w+100)), 0)
				err = errors.Join(err, g.Close())
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	got := readFile(t, e, e.c, p)
	for w := range writers {
		if !bytes.Equal(got[w*region:(w+1)*region], pattern(region, byte(w))) {
			t.Fatalf("region %d corrupted", w)
		}
		if own := readFile(t, e, e.c, e.path(fmt.Sprintf("own%d", w))); !bytes.Equal(own, pattern(region, byte(w+100))) {
			t.Fatalf("file own%d corrupted", w)
		}
	}
}

func testOpenHandle(t *testing.T, e *env) {
	p := e.path("byhandle")
	writeFile(t, e, e.c, p, []byte("found by handle"))
	fh, a, err := e.c.Lookup(e.ctx, p)
	if err != nil || len(fh) == 0 || a.Size != 15 {
		t.Fatalf("lookup: %d-byte handle, size %d, %v", len(fh), a.Size, err)
	}
	// The handle stays valid across a rename: it names the file, not the path.
	if err := e.c.Rename(e.ctx, p, p+"-renamed"); err != nil {
		t.Fatal(err)
	}
	f, err := e.c.OpenHandle(e.ctx, fh, os.O_RDWR)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 64)
	n, err := f.ReadAt(buf, 0)
	if err != io.EOF || string(buf[:n]) != "found by handle" {
		t.Fatalf("read by handle: %q, %v", buf[:n], err)
	}
	if _, err := e.c.OpenHandle(e.ctx, []byte("not a handle"), os.O_RDONLY); err == nil {
		t.Fatal("open of a bogus handle succeeded")
	}
}

// testReadDelegation: a reader opens a file read-only by handle twice
// (the second open is satisfied under a read delegation when the server
// grants one), another client writes the file (the server recalls the
// delegation first), and the reader's File opened under it goes on
// working, while a new open sees the new data. With a server that grants
// no delegations it checks the same close-to-open consistency.
func testReadDelegation(t *testing.T, e *env) {
	p := e.path("delegated")
	v1, v2 := pattern(5000, 1), pattern(7000, 2)
	writeFile(t, e, e.c, p, v1)
	r := e.dial(t)
	defer r.Close()
	fh, _, err := r.Lookup(e.ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	readAll := func(f *client.File, n int) []byte {
		t.Helper()
		buf := make([]byte, n+100)
		m, err := f.ReadAt(buf, 0)
		if err != nil && err != io.EOF {
			t.Fatalf("read: %v", err)
		}
		return buf[:m]
	}
	for range 2 {
		f, err := r.OpenHandle(e.ctx, fh, os.O_RDONLY)
		if err != nil {
			t.Fatal(err)
		}
		if got := readAll(f, len(v1)); !bytes.Equal(got, v1) {
			t.Fatalf("read %d bytes, not what was written", len(got))
		}
		if a, err := f.Stat(e.ctx); err != nil || a.Size != uint64(len(v1)) {
			t.Fatalf("stat: size %d, %v", a.Size, err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
	held, err := r.OpenHandle(e.ctx, fh, os.O_RDONLY)
	if err != nil {
		t.Fatal(err)
	}
	w := e.dial(t)
	defer w.Close()
	writeFile(t, e, w, p, v2) // recalls the reader's delegation, if any
	readAll(held, len(v2))    // content depends on the access method
	if err := held.Close(); err != nil {
		t.Fatalf("close of a File open across a recall: %v", err)
	}
	f, err := r.OpenHandle(e.ctx, fh, os.O_RDONLY)
	if err != nil {
		t.Fatal(err)
	}
	if got := readAll(f, len(v2)); !bytes.Equal(got, v2) {
		t.Fatalf("after another client's write: read %d bytes, not the new data", len(got))
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if a, err := r.StatHandle(e.ctx, fh); err != nil || a.Size != uint64(len(v2)) {
		t.Fatalf("stat after another client's write: size %d, %v", a.Size, err)
	}
	st := r.Stats()
	t.Logf("reader: delegations kept %d, recalled %d, returned %d; local opens %d, attributes from a delegation %d",
		st.DelegationsKept, st.DelegationRecalls, st.DelegationReturns, st.LocalOpens, st.DelegatedAttrHits)
}

func testSeek(t *testing.T, e *env) {
	p := e.path("stream")
	f, err := e.c.Open(e.ctx, p, os.O_CREATE|os.O_RDWR|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, s := range []string{"one ", "two ", "three"} {
		if _, err := io.WriteString(f, s); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := f.Seek(4, io.SeekStart); err != nil {
		t.Fatal(err)
	}
	rest, err := io.ReadAll(f)
	if err != nil || string(rest) != "two three" {
		t.Fatalf("read after seek: %q, %v", rest, err)
	}
	if end, err := f.Seek(-5, io.SeekEnd); err != nil || end != 8 {
		t.Fatalf("seek from end: %d, %v", end, err)
	}
	if err := f.Truncate(e.ctx, 3); err != nil {
		t.Fatal(err)
	}
	if a, err := f.Stat(e.ctx); err != nil || a.Size != 3 {
		t.Fatalf("after truncate: %d, %v", a.Size, err)
	}
}

func testReconnect(t *testing.T, e *env) {
	p := e.path("survivor")
	f, err := e.c.Open(e.ctx, p, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Lock(e.ctx, 0, 1, true, false); err != nil {
		t.Fatal(err)
	}
	data := pattern(3<<20, 9)

	// Cut the connection while a split, pipelined write is in flight; the
	// write must still complete through the new connection.
	for round := range 3 {
		done := make(chan error, 1)
		go func() {
			_, err := f.WriteAt(data, int64(round)<<20)
			done <- err
		}()
		e.c.TestingCloseConn()
		if err := <-done; err != nil {
			t.Fatalf("round %d: write across reconnect: %v", round, err)
		}
	}
	e.c.TestingCloseConn()
	if _, err := e.c.Stat(e.ctx, p); err != nil {
		t.Fatalf("stat after reconnect: %v", err)
	}
	if err := f.Sync(); err != nil {
		t.Fatalf("sync after reconnect: %v", err)
	}
	want := make([]byte, 2<<20+len(data))
	for round := range 3 {
		copy(want[round<<20:], data)
	}
	e.c.TestingCloseConn()
	got := make([]byte, len(want))
	if n, err := f.ReadAt(got, 0); n != len(want) || (err != nil && err != io.EOF) {
		t.Fatalf("read after reconnect: %d, %v", n, err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("data differs after reconnects")
	}
	if st := e.c.Stats(); st.Reconnects == 0 {
		t.Fatalf("connection was closed %d times but the client never reconnected: %+v", 5, st)
	}

	// Non-idempotent operations cut off mid-flight are replayed from the
	// server's reply cache, not executed twice: every step must succeed.
	for i := range 20 {
		d := e.path(fmt.Sprintf("d%d", i))
		cut := make(chan struct{})
		go func() {
			defer close(cut)
			e.c.TestingCloseConn()
		}()
		if err := e.c.Mkdir(e.ctx, d, 0o755); err != nil {
			t.Fatalf("mkdir %d across reconnect: %v", i, err)
		}
		if err := e.c.Rename(e.ctx, d, d+"-renamed"); err != nil {
			t.Fatalf("rename %d across reconnect: %v", i, err)
		}
		<-cut
		if err := e.c.Remove(e.ctx, d+"-renamed"); err != nil {
			t.Fatalf("remove %d across reconnect: %v", i, err)
		}
	}

	// State survived: our lock still blocks another client.
	other := e.dial(t)
	defer other.Close()
	g, err := other.Open(e.ctx, p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if err := g.Lock(e.ctx, 0, 1, true, false); !errors.Is(err, syscall.EAGAIN) {
		t.Fatalf("lock held across reconnect was lost: %v", err)
	}
}

// testMknod creates every kind of file mknod(2) knows (the dialer's
// credential must be root's, as for chown in testSetAttr) and checks its
// type, permissions and device number, then the errors.
func testMknod(t *testing.T, e *env) {
	tests := []struct {
		name         string
		mode         uint32
		major, minor uint32
		typ          client.FileType
		fmode        fs.FileMode // type bits of Attr.FileMode
	}{
		{"fifo", syscall.S_IFIFO | 0o640, 0, 0, client.TypeFIFO, fs.ModeNamedPipe},
		{"socket", syscall.S_IFSOCK | 0o600, 0, 0, client.TypeSocket, fs.ModeSocket},
		{"char", syscall.S_IFCHR | 0o620, 1, 3, client.TypeChar, fs.ModeDevice | fs.ModeCharDevice},
		{"block", syscall.S_IFBLK | 0o660, 8, 17, client.TypeBlock, fs.ModeDevice},
		{"char-big-numbers", syscall.S_IFCHR | 0o600, 4095, 1 << 19, client.TypeChar, fs.ModeDevice | fs.ModeCharDevice},
		{"regular", syscall.S_IFREG | 0o604, 0, 0, client.TypeRegular, 0},
		{"no-type", 0o644, 0, 0, client.TypeRegular, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := e.path(tc.name)
			if err := e.c.Mknod(e.ctx, p, tc.mode, tc.major, tc.minor); err != nil {
				t.Fatalf("mknod %o: %v", tc.mode, err)
			}
			a, err := e.c.Stat(e.ctx, p)
			if err != nil {
				t.Fatal(err)
			}
			if a.Type != tc.typ || a.Mode != tc.mode&0o7777 || a.FileMode().Type() != tc.fmode {
				t.Fatalf("stat: type %v, mode %o, file mode %v; want %v, %o, %v", a.Type, a.Mode, a.FileMode(), tc.typ, tc.mode&0o7777, tc.fmode)
			}
			if a.RdevMajor != tc.major || a.RdevMinor != tc.minor {
				t.Fatalf("rdev %d,%d; want %d,%d", a.RdevMajor, a.RdevMinor, tc.major, tc.minor)
			}
			if a.Size != 0 || a.Nlink != 1 {
				t.Fatalf("size %d, nlink %d; want 0, 1", a.Size, a.Nlink)
			}
			ents, err := e.c.ReadDir(e.ctx, e.dir)
			if err != nil {
				t.Fatal(err)
			}
			if i := slices.IndexFunc(ents, func(d client.DirEntry) bool { return d.Name == tc.name }); i < 0 || ents[i].Attr.Type != tc.typ {
				t.Fatalf("readdir does not list %s as a %v: %+v", tc.name, tc.typ, ents)
			}
			if err := e.c.Mknod(e.ctx, p, tc.mode, tc.major, tc.minor); !errors.Is(err, fs.ErrExist) || !errors.Is(err, syscall.EEXIST) {
				t.Fatalf("mknod over an existing name: %v, want EEXIST", err)
			}
		})
	}
	writeFile(t, e, e.c, e.path("file"), []byte("x"))
	errs := []struct {
		name string
		path string
		mode uint32
		want syscall.Errno
	}{
		{"missing-parent", e.path("nope/fifo"), syscall.S_IFIFO | 0o644, syscall.ENOENT},
		{"parent-is-file", e.path("file/fifo"), syscall.S_IFIFO | 0o644, syscall.ENOTDIR},
		{"over-directory", e.dir, syscall.S_IFIFO | 0o644, syscall.EEXIST},
		{"directory", e.path("dir"), syscall.S_IFDIR | 0o755, syscall.EPERM},
		{"bad-type", e.path("bad"), 0o170000 | 0o644, syscall.EINVAL},
	}
	for _, tc := range errs {
		if err := e.c.Mknod(e.ctx, tc.path, tc.mode, 0, 0); !errors.Is(err, tc.want) {
			t.Errorf("%s: mknod %s %o: %v, want %v", tc.name, tc.path, tc.mode, err, tc.want)
		}
	}
	for _, name := range []string{"dir", "bad"} {
		if _, err := e.c.Stat(e.ctx, e.path(name)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("a rejected mknod left %s behind: %v", name, err)
		}
	}
}

// RunUnprivileged checks what a caller that is not root may not do: user
// must dial with a credential other than root's (and root with root's, to
// prepare). Creating a device is EPERM, creating anything in a directory
// without write permission EACCES; FIFOs and sockets are for everyone.
func RunUnprivileged(t *testing.T, root, user Dialer) {
	e := newEnv(t, root)
	if err := e.c.SetAttr(e.ctx, e.dir, client.SetAttr{Mode: ptr(uint32(0o777))}); err != nil {
		t.Fatal(err)
	}
	if err := e.c.Mkdir(e.ctx, e.path("closed"), 0o755); err != nil {
		t.Fatal(err)
	}
	u := user(t)
	defer u.Close()
	tests := []struct {
		path string
		mode uint32
		want []syscall.Errno // any of these; none: must succeed
	}{
		{e.path("fifo"), syscall.S_IFIFO | 0o644, nil},
		{e.path("socket"), syscall.S_IFSOCK | 0o644, nil},
		{e.path("char"), syscall.S_IFCHR | 0o666, []syscall.Errno{syscall.EPERM}},
		{e.path("block"), syscall.S_IFBLK | 0o666, []syscall.Errno{syscall.EPERM}},
		{e.path("closed/fifo"), syscall.S_IFIFO | 0o644, []syscall.Errno{syscall.EACCES}},
		// Both rules apply; which one a server checks first is its choice.
		{e.path("closed/char"), syscall.S_IFCHR | 0o644, []syscall.Errno{syscall.EPERM, syscall.EACCES}},
	}
	for _, tc := range tests {
		err := u.Mknod(e.ctx, tc.path, tc.mode, 1, 3)
		if len(tc.want) == 0 {
			if err != nil {
				t.Errorf("mknod %s %o: %v", tc.path, tc.mode, err)
			}
			continue
		}
		if !slices.ContainsFunc(tc.want, func(w syscall.Errno) bool { return errors.Is(err, w) }) {
			t.Errorf("mknod %s %o: %v, want %v", tc.path, tc.mode, err, tc.want)
		}
	}
	for _, name := range []string{"char", "block", "closed/fifo", "closed/char"} {
		if _, err := e.c.Stat(e.ctx, e.path(name)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("a refused mknod left %s behind: %v", name, err)
		}
	}
}

func ptr[T any](v T) *T { return &v }

// testStatfs checks that the space and file counts are present and
// consistent; the servers' own tests compare them with their disks.
func testStatfs(t *testing.T, e *env) {
	st, err := e.c.Statfs(e.ctx, e.dir)
	if err != nil {
		t.Fatal(err)
	}
	if st.Total == 0 || st.Free > st.Total || st.Avail > st.Free {
		t.Errorf("space: total %d, free %d, avail %d; want 0 < total, avail <= free <= total", st.Total, st.Free, st.Avail)
	}
	if st.Files == 0 || st.FilesFree > st.Files || st.FilesAvail > st.FilesFree {
		t.Errorf("files: total %d, free %d, avail %d; want 0 < total, avail <= free <= total", st.Files, st.FilesFree, st.FilesAvail)
	}
	// The file system's counts, whichever path asks.
	root, err := e.c.Statfs(e.ctx, "/")
	if err != nil {
		t.Fatal(err)
	}
	if root.Total != st.Total || root.Files != st.Files {
		t.Errorf("statfs of / says total %d bytes, %d files; of %s %d, %d", root.Total, root.Files, e.dir, st.Total, st.Files)
	}
	if _, err := e.c.Statfs(e.ctx, e.path("nope")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("statfs of a missing path: %v, want ENOENT", err)
	}
}

// RunRestart checks recovery from a server restart: restart must stop the
// server and start it again on the same address and storage. Afterwards
// the client must notice the lost session, establish a new one, reclaim its
// open file and lock, and carry on; data synced before the restart must
// still be there.
func RunRestart(t *testing.T, dial Dialer, restart func(t *testing.T)) {
	e := newEnv(t, dial)
	p := e.path("restart")
	f, err := e.c.Open(e.ctx, p, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	before := pattern(2<<20, 3)
	if _, err := f.WriteAt(before, 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := f.Lock(e.ctx, 0, 10, true, false); err != nil {
		t.Fatal(err)
	}
	// UNSTABLE data that is not committed before the restart may have
	// been dropped by the server, which says so with a new write
	// verifier: Sync must write it again and succeed.
	h, err := e.c.Open(e.ctx, e.path("unsynced"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	unsynced := pattern(100<<10, 5)
	if _, err := h.WriteAt(unsynced, 0); err != nil {
		t.Fatal(err)
	}
	resent := e.c.Stats().ResentBytes

	// Writes keep going while the server restarts; they must all complete.
	w, err := e.c.Open(e.ctx, e.path("busy"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	busy := make(chan error, 1)
	stop := make(chan struct{})
	go func() {
		chunk := pattern(256<<10, 6)
		for i := 0; i < 100_000; i++ { // until stopped; bounded all the same
			if _, err := w.WriteAt(chunk, int64(i%16)*int64(len(chunk))); err != nil {
				busy <- err
				return
			}
			select {
			case <-stop:
				busy <- nil
				return
			default:
			}
		}
		busy <- nil
	}()

	restart(t)

	close(stop)
	if err := <-busy; err != nil {
		t.Fatalf("write during the restart: %v", err)
	}
	if err := w.Sync(); err != nil {
		t.Fatalf("sync of the busy file: %v", err)
	}
	if err := h.Sync(); err != nil {
		t.Errorf("sync of data written UNSTABLE before the restart: %v", err)
	}
	if got := e.c.Stats().ResentBytes - resent; got < uint64(len(unsynced)) {
		t.Errorf("%d bytes written again after the restart, want at least the %d written UNSTABLE before it", got, len(unsynced))
	}
	back := make([]byte, len(unsynced)+1)
	if n, err := h.ReadAt(back, 0); n != len(unsynced) || err != io.EOF || !bytes.Equal(back[:n], unsynced) {
		t.Errorf("data written UNSTABLE before the restart read back %d bytes, %v (equal: %v)", n, err, bytes.Equal(back[:n], unsynced))
	}

	if a, err := e.c.Stat(e.ctx, p); err != nil || a.Size != uint64(len(before)) {
		t.Fatalf("stat after restart: size %d, %v", a.Size, err)
	}
	got := make([]byte, len(before))
	if n, err := f.ReadAt(got, 0); n != len(got) || (err != nil && err != io.EOF) {
		t.Fatalf("read through the reclaimed open: %d, %v", n, err)
	}
	if !bytes.Equal(got, before) {
		t.Fatal("synced data changed across the restart")
	}
	after := pattern(1<<20, 4)
	if _, err := f.WriteAt(after, 0); err != nil {
		t.Fatalf("write through the reclaimed open: %v", err)
	}
	if err := f.Sync(); err != nil {
		t.Fatalf("sync after restart: %v", err)
	}
	other := e.dial(t)
	defer other.Close()
	g, err := other.Open(e.ctx, p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if err := g.Lock(e.ctx, 0, 10, true, false); !errors.Is(err, syscall.EAGAIN) {
		t.Fatalf("lock not reclaimed after restart: other client's lock: %v", err)
	}
	if err := f.Unlock(e.ctx, 0, 10); err != nil {
		t.Fatal(err)
	}
	if err := g.Lock(e.ctx, 0, 10, true, false); err != nil {
		t.Fatalf("lock after unlock: %v", err)
	}
}
