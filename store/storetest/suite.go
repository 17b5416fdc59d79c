// Package storetest is the conformance suite every store.Backend must pass:
// store.Local (with and without checksums), the MDS's cluster.Striped, a
// data server's cluster.ReplicaStore and the MDS's inline-data store. Each
// backend's test calls Run with a function that makes a Target, the
// backend under test and what the suite needs around it.
//
// The suite checks what the NFS server relies on: reads at and past the
// end (io.EOF, like os.File), holes reading as zeros, truncation up and
// down, data surviving Sync and a restart, Remove while a File is open,
// concurrent writers to distinct ranges, StatFS. The optional parts of the
// contract are capabilities, and the suite tests each only where the
// backend offers it:
//
//   - Seeking to data and holes, Allocate and PunchHole are File methods
//     a backend may refuse with store.ErrNotSupported (its file system
//     cannot): the suite asks once and skips the part if refused.
//   - Copying inside the backend is the store.Copier interface, found by
//     type assertion as the server does. A Copier may refuse a range with
//     store.ErrNotSupported, and must then change nothing.
//   - Reopening (a restart over the same storage) is Target.Reopen.
//
// Two behaviours of data never written are allowed, because the server
// treats them alike (a missing data file is zeros up to the size in
// meta): Open without create fails with fs.ErrNotExist, or it returns a
// File whose data is empty. The suite finds out which on a fresh file and
// holds the backend to that choice.
package storetest

import (
	"bytes"
	"errors"
	"io"
	"io/fs"
	"testing"

	"github.com/shoalfs/shoal/store"
)

// Target is one backend under test.
type Target struct {
	// Backend is the backend under test. Targets may share storage (a
	// cluster started once for the whole suite) as long as every file
	// the suite gets is new to it. The suite closes Backend.
	Backend store.Backend
	// NewFile returns the inode number of a new regular file whose data
	// Backend may hold: backends that keep data only for files their
	// metadata knows (a stripe map, inline data) need one to exist. Nil
	// means any number will do, and the suite numbers files itself.
	NewFile func(t *testing.T) uint64
	// Reopen, if not nil, closes Backend and returns a backend over the
	// same storage, as after a restart of the processes holding it. The
	// suite closes its handles first, and what it synced must be there
	// afterwards. Nil skips the parts of the suite that reopen.
	Reopen func(t *testing.T) store.Backend
}

// env is the world of one subtest.
type env struct {
	t    *testing.T
	tg   Target
	b    store.Backend
	next uint64

	// tracked is whether the backend tells data never written from empty
	// data (Open without create fails with fs.ErrNotExist); see learn.
	tracked bool
}

func newEnv(t *testing.T, newTarget func(t *testing.T) Target) *env {
	t.Helper()
	tg := newTarget(t)
	v := &env{t: t, tg: tg, b: tg.Backend, next: 1000}
	t.Cleanup(func() { v.b.Close() })
	return v
}

// file returns a new file, without data.
func (v *env) file() uint64 {
	v.t.Helper()
	if v.tg.NewFile != nil {
		return v.tg.NewFile(v.t)
	}
	v.next++
	return v.next
}

// reopen restarts the backend, or skips the test if the target cannot.
func (v *env) reopen() {
	v.t.Helper()
	if v.tg.Reopen == nil {
		v.t.Skip("the target cannot reopen its backend")
	}
	v.b = v.tg.Reopen(v.t)
}

// open opens ino, failing the test on error; the handle is closed at the
// end of the test.
func (v *env) open(ino uint64, create bool) store.File {
	v.t.Helper()
	f, err := v.b.Open(ino, create)
	if err != nil {
		v.t.Fatalf("open %d (create %v): %v", ino, create, err)
	}
	v.t.Cleanup(func() { f.Close() })
	return f
}

// openData opens ino's data for reading, nil if it has none.
func (v *env) openData(ino uint64) store.File {
	v.t.Helper()
	f, err := v.b.Open(ino, false)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		v.t.Fatalf("open %d: %v", ino, err)
	}
	return f
}

func (v *env) write(f store.File, p []byte, off int64) {
	v.t.Helper()
	if n, err := f.WriteAt(p, off); err != nil || n != len(p) {
		v.t.Fatalf("write %d bytes at %d: %d, %v", len(p), off, n, err)
	}
}

// writeFile writes p at off of ino through a handle of its own.
func (v *env) writeFile(ino uint64, p []byte, off int64) {
	v.t.Helper()
	f, err := v.b.Open(ino, true)
	if err != nil {
		v.t.Fatalf("open %d: %v", ino, err)
	}
	defer f.Close()
	v.write(f, p, off)
}

func (v *env) size(f store.File) int64 {
	v.t.Helper()
	n, err := f.Size()
	if err != nil {
		v.t.Fatalf("size: %v", err)
	}
	return n
}

// fileSize is the size of ino's data, 0 if it has none.
func (v *env) fileSize(ino uint64) int64 {
	v.t.Helper()
	f := v.openData(ino)
	if f == nil {
		return 0
	}
	defer f.Close()
	return v.size(f)
}

// check verifies that ino's data is exactly want: its size, its bytes,
// and io.EOF at its end.
func (v *env) check(what string, ino uint64, want []byte) {
	v.t.Helper()
	f := v.openData(ino)
	if f == nil {
		if len(want) != 0 {
			v.t.Fatalf("%s: ino %d has no data, want %d bytes", what, ino, len(want))
		}
		return
	}
	defer f.Close()
	if got := v.size(f); got != int64(len(want)) {
		v.t.Fatalf("%s: size %d, want %d", what, got, len(want))
	}
	buf := make([]byte, len(want)+1000)
	n, err := f.ReadAt(buf, 0)
	if n != len(want) || !errors.Is(err, io.EOF) {
		v.t.Fatalf("%s: read %d bytes at 0 of %d: %d, %v; want %d, io.EOF", what, len(buf), len(want), n, err, len(want))
	}
	if i := firstDiff(buf[:n], want); i >= 0 {
		v.t.Fatalf("%s: byte %d is %#x, want %#x", what, i, buf[i], want[i])
	}
}

// firstDiff returns the first index where a and b (of one length) differ,
// or -1.
func firstDiff(a, b []byte) int {
	if bytes.Equal(a, b) {
		return -1
	}
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// learn finds out, on ino, which has never been written, how the backend
// opens data never written, and checks that it is empty either way.
func (v *env) learn(ino uint64) {
	v.t.Helper()
	f, err := v.b.Open(ino, false)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		v.tracked = true
	case err != nil:
		v.t.Fatalf("open %d, never written, without create: %v; want fs.ErrNotExist or empty data", ino, err)
	default:
		defer f.Close()
		if n := v.size(f); n != 0 {
			v.t.Fatalf("open %d, never written: size %d, want 0", ino, n)
		}
		if n, err := f.ReadAt(make([]byte, 10), 0); n != 0 || !errors.Is(err, io.EOF) {
			v.t.Fatalf("read of %d, never written: %d, %v; want 0, io.EOF", ino, n, err)
		}
	}
}

// pattern returns n bytes that differ with position and seed and contain
// no zero byte, so misplaced or missing data shows.
func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7+i/4093+int(seed))%251 + 1
	}
	return b
}

// model is what a file's data should be.
type model []byte

// write puts p at off, growing the model with zeros as a file grows; an
// empty write changes nothing.
func (m *model) write(p []byte, off int64) {
	if len(p) == 0 {
		return
	}
	if end := int(off) + len(p); end > len(*m) {
		*m = append(*m, make([]byte, end-len(*m))...)
	}
	copy((*m)[off:], p)
}

// truncate sets the size, zeroing what grows.
func (m *model) truncate(size int64) {
	if int(size) <= len(*m) {
		*m = (*m)[:size]
		return
	}
	*m = append(*m, make([]byte, int(size)-len(*m))...)
}

// punch zeroes [off, off+n) inside the size.
func (m *model) punch(off, n int64) {
	end := min(int(off+n), len(*m))
	if int(off) < end {
		clear((*m)[off:end])
	}
}

// Sizes the suite uses: a checksum block, and a stripe unit the cluster
// targets are asked to use, so that ranges cross both.
const (
	block = 64 << 10
	mib   = 1 << 20
)

// Run runs the conformance suite, each subtest on a Target newTarget
// makes.
func Run(t *testing.T, newTarget func(t *testing.T) Target) {
	tests := []struct {
		name string
		fn   func(t *testing.T, v *env)
	}{
		{"NeverWritten", testNeverWritten},
		{"ReadAtEOF", testReadAtEOF},
		{"WriteRead", testWriteRead},
		{"Holes", testHoles},
		{"Seek", testSeek},
		{"Allocate", testAllocate},
		{"PunchHole", testPunchHole},
		{"Truncate", testTruncate},
		{"Durability", testDurability},
		{"Remove", testRemove},
		{"ClosedFile", testClosedFile},
		{"CopyRange", testCopyRange},
		{"ConcurrentWriters", testConcurrentWriters},
		{"StatFS", testStatFS},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.fn(t, newEnv(t, newTarget))
		})
	}
}

func testStatFS(t *testing.T, v *env) {
	total, free, avail, err := v.b.StatFS()
	if err != nil {
		t.Fatalf("StatFS: %v", err)
	}
	if total == 0 || free > total || avail > free {
		t.Fatalf("StatFS: total %d, free %d, avail %d; want 0 < total, avail <= free <= total", total, free, avail)
	}
	// Writing must not make the numbers inconsistent either.
	ino := v.file()
	v.writeFile(ino, pattern(block, 1), 0)
	if err := v.b.Sync(ino); err != nil {
		t.Fatalf("sync: %v", err)
	}
	total, free, avail, err = v.b.StatFS()
	if err != nil || total == 0 || free > total || avail > free {
		t.Fatalf("StatFS after a write: total %d, free %d, avail %d, %v", total, free, avail, err)
	}
}
