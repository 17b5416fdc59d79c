//go:build linux

package store_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/shoalfs/shoal/store"
)

const blk = store.ChecksumBlockSize

func openLocal(t testing.TB, dir string, checksums bool) *store.Local {
	t.Helper()
	l, err := store.NewLocal(dir, store.LocalOptions{MaxOpen: 8, Checksums: checksums})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func objPath(dir string, ino uint64) string {
	return filepath.Join(dir, "data", fmt.Sprintf("%02x", ino&0xff), strconv.FormatUint(ino, 10))
}

func openFile(t testing.TB, l *store.Local, ino uint64) store.File {
	t.Helper()
	f, err := l.Open(ino, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// model is the plain in-memory file the store must agree with.
type model struct{ b []byte }

func (m *model) grow(n int64) {
	if n > int64(len(m.b)) {
		m.b = append(m.b, make([]byte, n-int64(len(m.b)))...)
	}
}
func (m *model) write(p []byte, off int64) { m.grow(off + int64(len(p))); copy(m.b[off:], p) }
func (m *model) truncate(n int64) {
	if n < int64(len(m.b)) {
		m.b = m.b[:n]
	}
	m.grow(n)
}
func (m *model) punch(off, n int64) {
	if off < int64(len(m.b)) {
		clear(m.b[off:min(off+n, int64(len(m.b)))])
	}
}
func (m *model) readAt(p []byte, off int64) (int, error) {
	if off >= int64(len(m.b)) {
		return 0, io.EOF
	}
	n := copy(p, m.b[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// pattern returns n bytes that differ with seed and position.
func pattern(seed, n int) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = byte(seed*131 + i*7 + i>>9)
	}
	return p
}

// check compares f with m over the whole file and a set of probe ranges,
// and checks that Verify finds nothing wrong.
func check(t *testing.T, l *store.Local, ino uint64, f store.File, m *model) {
	t.Helper()
	size := int64(len(m.b))
	if sz, err := f.Size(); err != nil || sz != size {
		t.Fatalf("size %d %v, want %d", sz, err, size)
	}
	offs := []int64{0, 1, blk - 1, blk, blk + 7, 3*blk - 5, size / 2, size - 1, size, size + 5, size + blk}
	lens := []int{1, 100, blk, blk + 1, 3*blk + 2, 1<<20 + 3}
	probe := func(off int64, n int) {
		if off < 0 {
			return
		}
		got, want := make([]byte, n), make([]byte, n)
		gn, gerr := f.ReadAt(got, off)
		wn, werr := m.readAt(want, off)
		if gn != wn || gerr != werr || !bytes.Equal(got[:gn], want[:wn]) {
			t.Fatalf("ReadAt(%d, %d) = %d %v, want %d %v (bytes equal %v)", n, off, gn, gerr, wn, werr, bytes.Equal(got[:gn], want[:wn]))
		}
	}
	probe(0, int(size)+blk/2)
	for _, off := range offs {
		for _, n := range lens {
			probe(off, n)
		}
	}
	if bad, err := l.Verify(ino); err != nil || len(bad) != 0 {
		t.Fatalf("Verify = %v %v", bad, err)
	}
}

type op struct {
	kind   string // write, truncate, punch, allocate
	off, n int64
}

func apply(t *testing.T, l *store.Local, ino uint64, f store.File, m *model, i int, o op) {
	t.Helper()
	switch o.kind {
	case "write":
		p := pattern(i+1, int(o.n))
		if n, err := f.WriteAt(p, o.off); err != nil || n != len(p) {
			t.Fatalf("WriteAt(%d, %d) = %d %v", o.n, o.off, n, err)
		}
		m.write(p, o.off)
	case "truncate":
		if err := l.Truncate(ino, uint64(o.off)); err != nil {
			t.Fatal(err)
		}
		m.truncate(o.off)
	case "punch":
		if err := f.PunchHole(o.off, o.n); errors.Is(err, store.ErrNotSupported) {
			t.Skip("file system cannot punch holes")
		} else if err != nil {
			t.Fatal(err)
		}
		m.punch(o.off, o.n)
	case "allocate":
		if err := f.Allocate(o.off, o.n); errors.Is(err, store.ErrNotSupported) {
			t.Skip("no fallocate")
		} else if err != nil {
			t.Fatal(err)
		}
		m.grow(o.off + o.n)
	default:
		t.Fatalf("bad op %q", o.kind)
	}
}

func w(off, n int64) op { return op{"write", off, n} }

var opCases = []struct {
	name string
	ops  []op
}{
	{"aligned", []op{w(0, blk), w(blk, 1<<20), w(0, 2*blk)}},
	{"unaligned", []op{w(3, 10), w(1000, 5000), w(7, 1)}},
	{"straddling", []op{w(blk-10, 20), w(2*blk-1, blk+2), w(blk/2, 3*blk)}},
	{"past eof with gaps", []op{w(0, 100), w(5*blk+3, 50), w(40*blk, blk), w(2*blk, 10)}},
	{"multi-chunk unaligned", []op{w(12345, 3<<20+777), w(1<<20-1, 2)}},
	{"overwrite tail of last block", []op{w(0, blk+100), w(blk+50, 100), w(blk+150, 1)}},
	{"truncate shrink unaligned", []op{w(0, 5*blk), {"truncate", 2*blk + 123, 0}, w(2*blk+100, 10)}},
	{"truncate shrink aligned then grow", []op{w(0, 5*blk), {"truncate", 3 * blk, 0}, {"truncate", 7*blk + 5, 0}, w(6*blk, 4)}},
	{"truncate to zero", []op{w(10, 3*blk), {"truncate", 0, 0}, w(blk+1, 5)}},
	{"truncate grow in last block", []op{w(0, 100), {"truncate", 200, 0}, w(150, 10)}},
	{"truncate shrink old data block", []op{w(0, 3*blk), {"truncate", blk / 2, 0}}},
	{"punch partial", []op{w(0, 4*blk), {"punch", 100, 200}}},
	{"punch whole and partial", []op{w(0, 6*blk+10), {"punch", blk / 2, 3 * blk}}},
	{"punch tail past eof", []op{w(0, 2*blk+100), {"punch", blk + 5, 10 * blk}, w(2*blk+50, 10)}},
	{"punch beyond eof", []op{w(0, blk), {"punch", 4 * blk, blk}}},
	{"allocate", []op{w(0, blk+3), {"allocate", blk, 4*blk + 7}, w(3*blk, 5)}},
}

func TestChecksumRoundTrip(t *testing.T) {
	for _, tc := range opCases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			l := openLocal(t, dir, true)
			const ino = 42
			f := openFile(t, l, ino)
			var m model
			for i, o := range tc.ops {
				apply(t, l, ino, f, &m, i, o)
				check(t, l, ino, f, &m)
			}
			if err := f.Sync(); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(objPath(dir, ino) + ".crc"); err != nil {
				t.Fatalf("no sidecar: %v", err)
			}
			// The entries survive a restart of the store.
			l.Close()
			l2 := openLocal(t, dir, true)
			check(t, l2, ino, openFile(t, l2, ino), &m)
		})
	}
}

// flip inverts one byte of a file on disk, behind the store's back.
func flip(t *testing.T, path string, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0xff
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

func TestChecksumCorruption(t *testing.T) {
	const size = 4*blk + 1000
	cases := []struct {
		name  string
		at    int64 // byte flipped in the object
		block int64
	}{
		{"first byte", 0, 0},
		{"middle block", 2*blk + 77, 2},
		{"last byte of block", 2*blk - 1, 1},
		{"partial last block", 4*blk + 999, 4},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			l := openLocal(t, dir, true)
			const ino = 7
			f := openFile(t, l, ino)
			var m model
			m.write(pattern(3, size), 0)
			if _, err := f.WriteAt(m.b, 0); err != nil {
				t.Fatal(err)
			}
			flip(t, objPath(dir, ino), tc.at)
			bs := tc.block * blk
			for _, r := range []struct{ off, n int64 }{
				{bs, blk}, {tc.at, 1}, {bs + 1, 10}, {max(0, bs-blk), 3 * blk}, {0, size}, {tc.at, 1 << 20},
			} {
				p := make([]byte, r.n)
				n, err := f.ReadAt(p, r.off)
				if !errors.Is(err, store.ErrCorrupt) {
					t.Fatalf("ReadAt(%d, %d) = %d %v, want ErrCorrupt", r.n, r.off, n, err)
				}
				if !strings.Contains(err.Error(), fmt.Sprintf("block %d at offset %d", tc.block, bs)) {
					t.Fatalf("error does not name the block: %v", err)
				}
				if int64(n) > max(0, bs-r.off) {
					t.Fatalf("ReadAt(%d, %d) returned %d bytes, reaching into the bad block", r.n, r.off, n)
				}
				if !bytes.Equal(p[:n], m.b[r.off:r.off+int64(n)]) {
					t.Fatal("good prefix differs")
				}
				if bytes.Count(p[n:], []byte{0}) != len(p)-n {
					t.Fatal("bytes past the good prefix were left in the buffer")
				}
			}
			for b := range int64(5) {
				if b == tc.block {
					continue
				}
				p := make([]byte, blk)
				n, err := f.ReadAt(p, b*blk)
				if (err != nil && err != io.EOF) || !bytes.Equal(p[:n], m.b[b*blk:min(size, (b+1)*blk)]) {
					t.Fatalf("block %d: %d %v", b, n, err)
				}
			}
			if bad, err := l.Verify(ino); err != nil || !slices.Equal(bad, []int64{bs}) {
				t.Fatalf("Verify = %v %v, want [%d]", bad, err, bs)
			}
			// Operations that need the rest of the bad block refuse.
			if _, err := f.WriteAt([]byte("x"), bs+blk/2); !errors.Is(err, store.ErrCorrupt) {
				t.Fatalf("partial write into bad block: %v", err)
			}
			if err := f.PunchHole(bs+1, 1); err != nil && !errors.Is(err, store.ErrCorrupt) && !errors.Is(err, store.ErrNotSupported) {
				t.Fatalf("partial punch of bad block: %v", err)
			}
			if bs+1 < size {
				if err := l.Truncate(ino, uint64(bs+1)); !errors.Is(err, store.ErrCorrupt) {
					t.Fatalf("truncate into bad block: %v", err)
				}
			}
			// Rewriting the block whole heals it.
			heal := pattern(9, blk)
			if _, err := f.WriteAt(heal, bs); err != nil {
				t.Fatal(err)
			}
			m.write(heal, bs)
			check(t, l, ino, f, &m)
		})
	}
}

func TestChecksumBadEntry(t *testing.T) {
	dir := t.TempDir()
	l := openLocal(t, dir, true)
	f := openFile(t, l, 3)
	if _, err := f.WriteAt(pattern(1, 3*blk), 0); err != nil {
		t.Fatal(err)
	}
	flip(t, objPath(dir, 3)+".crc", 8*1+1) // magic of block 1's entry
	if _, err := f.ReadAt(make([]byte, 10), blk+5); !errors.Is(err, store.ErrCorrupt) {
		t.Fatalf("read with damaged entry: %v", err)
	}
	if bad, err := l.Verify(3); err != nil || !slices.Equal(bad, []int64{blk}) {
		t.Fatalf("Verify = %v %v", bad, err)
	}
}

// TestChecksumOldData turns checksums on for a store written without them:
// the old data is readable, unverified, and gains entries when written.
func TestChecksumOldData(t *testing.T) {
	dir := t.TempDir()
	l := openLocal(t, dir, false)
	old := pattern(5, 3*blk+10)
	if _, err := openFile(t, l, 11).WriteAt(old, 0); err != nil {
		t.Fatal(err)
	}
	l.Close()

	l = openLocal(t, dir, true)
	f := openFile(t, l, 11)
	m := model{b: bytes.Clone(old)}
	check(t, l, 11, f, &m)
	// Damage in a block without an entry goes unnoticed...
	flip(t, objPath(dir, 11), 5)
	m.b[5] ^= 0xff
	check(t, l, 11, f, &m)
	// ...until a write gives it one.
	apply(t, l, 11, f, &m, 1, w(100, 10))
	flip(t, objPath(dir, 11), 5)
	if _, err := f.ReadAt(make([]byte, 1), 0); !errors.Is(err, store.ErrCorrupt) {
		t.Fatalf("read: %v", err)
	}
}

// TestChecksumToggle runs a store with checksums, then without (writes
// made then do not update the sidecars), then with again: the stale
// sidecars must be gone.
func TestChecksumToggle(t *testing.T) {
	dir := t.TempDir()
	l := openLocal(t, dir, true)
	if _, err := openFile(t, l, 1).WriteAt(pattern(1, 2*blk), 0); err != nil {
		t.Fatal(err)
	}
	l.Close()
	if _, err := os.Stat(filepath.Join(dir, "data", "checksums")); err != nil {
		t.Fatalf("no marker: %v", err)
	}

	l = openLocal(t, dir, false)
	m := model{b: pattern(1, 2*blk)}
	if _, err := openFile(t, l, 1).WriteAt([]byte("changed"), blk+3); err != nil {
		t.Fatal(err)
	}
	m.write([]byte("changed"), blk+3)
	l.Close()
	if _, err := os.Stat(filepath.Join(dir, "data", "checksums")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("marker kept with checksums off: %v", err)
	}

	l = openLocal(t, dir, true)
	check(t, l, 1, openFile(t, l, 1), &m)
}

// TestChecksumCrashLeftovers simulates what a crash can leave: entries
// past the end of the data, and a sidecar without its object.
func TestChecksumCrashLeftovers(t *testing.T) {
	dir := t.TempDir()
	l := openLocal(t, dir, true)
	if _, err := openFile(t, l, 2).WriteAt(pattern(2, 4*blk), 0); err != nil {
		t.Fatal(err)
	}
	l.Close()
	// The data lost its last two blocks; the sidecar did not.
	if err := os.Truncate(objPath(dir, 2), 2*blk); err != nil {
		t.Fatal(err)
	}
	// A sidecar whose object is gone.
	if err := os.WriteFile(objPath(dir, 3)+".crc", bytes.Repeat([]byte("C32Cxxxx"), 4), 0o600); err != nil {
		t.Fatal(err)
	}

	l = openLocal(t, dir, true)
	f := openFile(t, l, 2)
	m := model{b: pattern(2, 4*blk)[:2*blk]}
	check(t, l, 2, f, &m)
	apply(t, l, 2, f, &m, 1, w(3*blk+5, 10)) // blocks 2 and 3 are zeros again
	check(t, l, 2, f, &m)

	g := openFile(t, l, 3)
	var m3 model
	apply(t, l, 3, g, &m3, 1, w(blk+1, 5))
	check(t, l, 3, g, &m3)
}

func TestChecksumRemoveAndWalk(t *testing.T) {
	dir := t.TempDir()
	l := openLocal(t, dir, true)
	for _, ino := range []uint64{1, 256, 257, 1000} {
		if _, err := openFile(t, l, ino).WriteAt([]byte("x"), 0); err != nil {
			t.Fatal(err)
		}
	}
	// Not objects: a stray file and a non-canonical name.
	os.WriteFile(filepath.Join(dir, "data", "01", "junk"), nil, 0o600)
	os.WriteFile(filepath.Join(dir, "data", "01", "0001"), nil, 0o600)
	walk := func() []uint64 {
		var got []uint64
		if err := l.Walk(func(ino uint64) error { got = append(got, ino); return nil }); err != nil {
			t.Fatal(err)
		}
		slices.Sort(got)
		return got
	}
	if got := walk(); !slices.Equal(got, []uint64{1, 256, 257, 1000}) {
		t.Fatalf("Walk = %v", got)
	}
	if err := l.Remove(257); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{objPath(dir, 257), objPath(dir, 257) + ".crc"} {
		if _, err := os.Stat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("%s after Remove: %v", p, err)
		}
	}
	if got := walk(); !slices.Equal(got, []uint64{1, 256, 1000}) {
		t.Fatalf("Walk after Remove = %v", got)
	}
	stop := errors.New("stop")
	if err := l.Walk(func(uint64) error { return stop }); err != stop {
		t.Fatalf("Walk error = %v", err)
	}
	if bad, err := l.Verify(12345); err != nil || bad != nil {
		t.Fatalf("Verify missing = %v %v", bad, err)
	}
}

func TestChecksumsOff(t *testing.T) {
	dir := t.TempDir()
	l := openLocal(t, dir, false)
	f := openFile(t, l, 5)
	var m model
	for i, o := range []op{w(3, 2*blk), w(blk-1, 10), {"truncate", blk + 7, 0}} {
		apply(t, l, 5, f, &m, i, o)
	}
	if err := f.PunchHole(1, 10); err != nil && !errors.Is(err, store.ErrNotSupported) {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && p != objPath(dir, 5) {
			return fmt.Errorf("unexpected file %s", p)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Verify(5); !errors.Is(err, store.ErrNotSupported) {
		t.Fatalf("Verify with checksums off: %v", err)
	}
	// Flipped bytes go unnoticed, as before checksums existed.
	flip(t, objPath(dir, 5), 20)
	if _, err := f.ReadAt(make([]byte, 100), 0); err != nil {
		t.Fatal(err)
	}
}

// TestChecksumConcurrent runs writers on overlapping, unaligned ranges of
// a few blocks against readers and a scrubber; nobody may see a torn
// block.
func TestChecksumConcurrent(t *testing.T) {
	dir := t.TempDir()
	l := openLocal(t, dir, true)
	const ino, span = 9, 6 * blk
	if _, err := openFile(t, l, ino).WriteAt(pattern(0, span), 0); err != nil {
		t.Fatal(err)
	}
	const writers, readers, rounds = 4, 4, 150
	var wg sync.WaitGroup
	errc := make(chan error, writers+readers+1)
	for i := range writers + readers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(i), 1))
			f, err := l.Open(ino, false)
			if err != nil {
				errc <- err
				return
			}
			defer f.Close()
			for range rounds {
				off := r.Int64N(span - 1)
				n := 1 + r.IntN(int(min(2*blk, span-off)))
				p := make([]byte, n)
				if i < writers {
					for j := range p {
						p[j] = byte(i)
					}
					_, err = f.WriteAt(p, off)
				} else {
					_, err = f.ReadAt(p, off)
				}
				if err != nil {
					errc <- fmt.Errorf("worker %d at %d+%d: %w", i, off, n, err)
					return
				}
			}
		})
	}
	wg.Go(func() {
		for range 20 {
			if bad, err := l.Verify(ino); err != nil || len(bad) > 0 {
				errc <- fmt.Errorf("Verify = %v %v", bad, err)
				return
			}
		}
	})
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	if bad, err := l.Verify(ino); err != nil || len(bad) > 0 {
		t.Fatalf("Verify = %v %v", bad, err)
	}
}
