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
		{"Reconnect", testReconnect},
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
	// UNSTABLE data that is not committed before the restart must be
	// reported by Sync, since the server may have dropped it.
	h, err := e.c.Open(e.ctx, e.path("unsynced"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if _, err := h.WriteAt(pattern(100<<10, 5), 0); err != nil {
		t.Fatal(err)
	}

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
	if err := w.Sync(); err != nil && !errors.Is(err, client.ErrVerifierChanged) {
		t.Fatalf("sync of the busy file: %v", err)
	}
	if err := h.Sync(); !errors.Is(err, client.ErrVerifierChanged) {
		t.Errorf("sync of data written before the restart: %v, want ErrVerifierChanged", err)
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
