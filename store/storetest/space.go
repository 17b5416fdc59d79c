package storetest

import (
	"errors"
	"io"
	"io/fs"
	"testing"

	"github.com/shoalfs/shoal/store"
)

// skipUnsupported skips the test if err says the backend cannot do what
// was asked (its file system cannot), and fails it on any other error.
func skipUnsupported(t *testing.T, what string, err error) {
	t.Helper()
	if errors.Is(err, store.ErrNotSupported) {
		t.Skipf("%s: not supported here: %v", what, err)
	}
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// seekCase is one seek and what it must find: an offset in [lo, hi], or
// io.EOF.
type seekCase struct {
	name   string
	off    int64
	whence int
	lo, hi int64
	eof    bool
}

// testSeek: SEEK_DATA and SEEK_HOLE on files of data, holes (1 MiB less
// 4 KiB, 4 KiB aligned, so every file system sees them) and data again,
// and on a small file. SeekData past the last data is io.EOF; SeekHole
// finds the hole at the end of the data.
func testSeek(t *testing.T, v *env) {
	const gapSize = mib + 4096
	files := []struct {
		name   string
		writes [][2]int64 // offset, length
		size   int64
		cases  []seekCase
	}{
		{"gap", [][2]int64{{0, 4096}, {mib, 4096}}, gapSize, []seekCase{
			{"data at the start", 0, store.SeekData, 0, 0, false},
			{"data inside data", 100, store.SeekData, 100, 100, false},
			{"hole after the first data", 0, store.SeekHole, 4096, 4096, false},
			{"hole inside the hole", 8192, store.SeekHole, 8192, 8192, false},
			{"data after the hole", 4096, store.SeekData, mib, mib, false},
			{"data inside the second data", mib + 100, store.SeekData, mib + 100, mib + 100, false},
			{"hole at the end", mib, store.SeekHole, gapSize, gapSize, false},
			{"data at the end", gapSize, store.SeekData, 0, 0, true},
			{"data past the end", gapSize + 3*block, store.SeekData, 0, 0, true},
		}},
		{"small", [][2]int64{{0, 100}}, 100, []seekCase{
			{"data at the start", 0, store.SeekData, 0, 0, false},
			{"data inside", 50, store.SeekData, 50, 50, false},
			{"hole at the end", 0, store.SeekHole, 100, 100, false},
			{"data at the end", 100, store.SeekData, 0, 0, true},
		}},
	}
	for _, fl := range files {
		t.Run(fl.name, func(t *testing.T) {
			ino := v.file()
			f := v.open(ino, true)
			for j, w := range fl.writes {
				v.write(f, pattern(int(w[1]), byte(j+1)), w[0])
			}
			_, err := f.Seek(0, store.SeekData)
			skipUnsupported(t, "SeekData", err)
			for _, c := range fl.cases {
				got, err := f.Seek(c.off, c.whence)
				if c.eof {
					if !errors.Is(err, io.EOF) {
						t.Errorf("%s: seek(%d, %d) = %d, %v; want io.EOF", c.name, c.off, c.whence, got, err)
					}
					continue
				}
				if err != nil || got < c.lo || got > c.hi {
					t.Errorf("%s: seek(%d, %d) = %d, %v; want %d to %d", c.name, c.off, c.whence, got, err, c.lo, c.hi)
				}
			}
			// A hole sought from the end of the data is there or
			// nowhere: a backend may say io.EOF (lseek's ENXIO) or the
			// end itself.
			if got, err := f.Seek(fl.size, store.SeekHole); !errors.Is(err, io.EOF) && (err != nil || got != fl.size) {
				t.Errorf("seek hole at the end: %d, %v; want io.EOF or %d", got, err, fl.size)
			}
			if _, err := f.Seek(-1, store.SeekData); err == nil {
				t.Errorf("seek to -1 succeeded")
			}
			if _, err := f.Seek(0, io.SeekStart); err == nil {
				t.Errorf("seek with whence SeekStart succeeded")
			}
		})
	}
}

// testAllocate: Allocate extends the size with zeros and never changes a
// byte inside it.
func testAllocate(t *testing.T, v *env) {
	ino := v.file()
	f := v.open(ino, true)
	var m model
	p := pattern(10000, 1)
	v.write(f, p, 0)
	m.write(p, 0)
	err := f.Allocate(100<<10, 50<<10)
	skipUnsupported(t, "Allocate", err)
	m.truncate(150 << 10)
	v.check("allocated past the end", ino, m)
	steps := []struct {
		name     string
		off, len int64
	}{
		{"inside the data", 100, 5000},
		{"over the end", 140 << 10, 20 << 10},
		{"across units", 3*block - 10, 4 * block},
	}
	for _, s := range steps {
		if err := f.Allocate(s.off, s.len); err != nil {
			t.Fatalf("%s: allocate [%d,+%d): %v", s.name, s.off, s.len, err)
		}
		if end := s.off + s.len; end > int64(len(m)) {
			m.truncate(end)
		}
		v.check(s.name, ino, m)
	}
	// Data never written can be allocated too.
	fresh := v.file()
	g := v.open(fresh, true)
	if err := g.Allocate(0, 2*block); err != nil {
		t.Fatalf("allocate new data: %v", err)
	}
	v.check("allocated new data", fresh, make([]byte, 2*block))
	for _, bad := range [][2]int64{{-1, 10}, {0, 0}, {10, -5}} {
		if err := f.Allocate(bad[0], bad[1]); err == nil {
			t.Errorf("allocate [%d,+%d) succeeded", bad[0], bad[1])
		}
	}
	v.check("after bad allocations", ino, m)
}

// testPunchHole: PunchHole zeroes whole and partial blocks, across block
// and unit boundaries, without changing the size, also past the end.
func testPunchHole(t *testing.T, v *env) {
	ino := v.file()
	f := v.open(ino, true)
	var m model
	p := pattern(5*block+123, 1)
	v.write(f, p, 0)
	m.write(p, 0)
	steps := []struct {
		name     string
		off, len int64
	}{
		{"a whole block", block, block},
		{"inside a block", 100, 50},
		{"across a block boundary", 2*block - 10, 20},
		{"over the end", 4*block + 5, 10 * block},
		{"the first byte", 0, 1},
		{"already a hole", block + 10, 100},
	}
	for i, s := range steps {
		err := f.PunchHole(s.off, s.len)
		if i == 0 {
			skipUnsupported(t, "PunchHole", err)
		} else if err != nil {
			t.Fatalf("%s: punch [%d,+%d): %v", s.name, s.off, s.len, err)
		}
		m.punch(s.off, s.len)
		v.check(s.name, ino, m)
	}
	// Writing into a punched range works as anywhere else.
	p = pattern(300, 5)
	v.write(f, p, block+1000)
	m.write(p, block+1000)
	v.check("written into a hole", ino, m)
	for _, bad := range [][2]int64{{-1, 10}, {0, 0}} {
		if err := f.PunchHole(bad[0], bad[1]); err == nil {
			t.Errorf("punch [%d,+%d) succeeded", bad[0], bad[1])
		}
	}
	v.check("after bad punches", ino, m)
}

// testCopyRange: store.Copier copies ranges between files and within
// one, reads bytes past the source's end as zeros, grows the destination
// only to the last byte copied from the source's data, and refuses
// overlapping ranges of one file. A range it refuses with
// store.ErrNotSupported is left unchanged.
func testCopyRange(t *testing.T, v *env) {
	cp, ok := v.b.(store.Copier)
	if !ok {
		t.Skip("the backend is not a store.Copier")
	}
	src := v.file()
	var sm model
	p := pattern(3*block+500, 1)
	v.writeFile(src, p, 0)
	sm.write(p, 0)
	srcLen := int64(len(sm))

	// srcBytes returns [off, off+n) of the source as it is now, zeros
	// past its end.
	srcBytes := func(off, n int64) []byte {
		out := make([]byte, n)
		if off < int64(len(sm)) {
			copy(out, sm[off:])
		}
		return out
	}
	cases := []struct {
		name             string
		dstData          int // bytes of the destination before the copy
		srcOff, dstOff   int64
		n                int64
		fromNeverWritten bool
	}{
		{"whole file", 0, 0, 0, srcLen, false},
		{"offsets unaligned", 0, 100, block + 7, 2 * block, false},
		{"aligned blocks", 0, block, 2 * block, block, false},
		{"over the source's end", 0, srcLen - 100, 0, 1000, false},
		{"all past the source's end", 3000, srcLen + 10, 0, 1000, false},
		{"into existing data", 4 * block, 0, 2*block + 1, block, false},
		{"from data never written", 2000, 0, 500, 1000, true},
		{"nothing", 100, 0, 0, 0, false},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dst := v.file()
			var dm model
			if c.dstData > 0 {
				q := pattern(c.dstData, byte(10+i))
				v.writeFile(dst, q, 0)
				dm.write(q, 0)
			}
			from, bytes := src, srcBytes(c.srcOff, c.n)
			if c.fromNeverWritten {
				from, bytes = v.file(), make([]byte, c.n)
			}
			err := cp.CopyRange(from, dst, c.srcOff, c.dstOff, c.n)
			if errors.Is(err, store.ErrNotSupported) {
				t.Logf("refused: %v", err)
				v.check("refused copy", dst, dm)
				return
			}
			if err != nil {
				t.Fatalf("copy: %v", err)
			}
			// The destination grows to the end of the last byte copied
			// from the source's data: a copy that reads only zeros past
			// the source's end does not grow it.
			grow := int64(0)
			if !c.fromNeverWritten && c.srcOff < srcLen {
				grow = c.dstOff + min(c.n, srcLen-c.srcOff)
			}
			end := max(int64(len(dm)), grow)
			dm.truncate(end)
			if c.dstOff < end {
				copy(dm[c.dstOff:], bytes)
			}
			v.check(c.name, dst, dm)
		})
	}

	t.Run("within one file", func(t *testing.T) {
		err := cp.CopyRange(src, src, 0, 4*block, block)
		if errors.Is(err, store.ErrNotSupported) {
			t.Logf("refused: %v", err)
			v.check("refused copy", src, sm)
			return
		}
		if err != nil {
			t.Fatalf("copy: %v", err)
		}
		sm.write(sm[:block:block], 4*block)
		v.check("copied within", src, sm)
	})
	t.Run("overlapping", func(t *testing.T) {
		for _, r := range [][2]int64{{0, 100}, {100, 0}, {block, block + block/2}} {
			err := cp.CopyRange(src, src, r[0], r[1], block)
			if !errors.Is(err, fs.ErrInvalid) {
				t.Errorf("copy [%d,+%d) to %d of one file: %v, want fs.ErrInvalid", r[0], block, r[1], err)
			}
		}
		v.check("after refused overlapping copies", src, sm)
	})
}
