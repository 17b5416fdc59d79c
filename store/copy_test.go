//go:build linux

package store_test

import (
	"bytes"
	"errors"
	"io"
	"io/fs"
	"math/rand/v2"
	"testing"

	"github.com/shoalfs/shoal/store"
)

// TestCopyRange checks Local.CopyRange against a model of both files'
// bytes, with checksums on and off: afterwards every byte reads back as
// the model says and Verify finds no block whose entry disagrees.
func TestCopyRange(t *testing.T) {
	const bs = store.ChecksumBlockSize
	type write struct {
		ino uint64
		off int64
		n   int
	}
	for _, tc := range []struct {
		name              string
		writes            []write
		src, dst          uint64
		srcOff, dstOff, n int64
		wantErr           error
	}{
		{"whole file into a new one", []write{{1, 0, 3*bs + 100}}, 1, 2, 0, 0, 3*bs + 100, nil},
		{"aligned blocks, unaligned ends", []write{{1, 0, 5 * bs}, {2, 0, 5 * bs}}, 1, 2, 100, 2*bs + 100, 2 * bs, nil},
		{"offsets that do not line up", []write{{1, 0, 4 * bs}, {2, 0, bs}}, 1, 2, 7, 3*bs + 1, 2*bs + 5, nil},
		{"past the source's end over data", []write{{1, 0, bs + 10}, {2, 0, 4 * bs}}, 1, 2, 0, 0, 3 * bs, nil},
		{"tail block with data after it", []write{{1, 0, bs + 10}, {2, 0, 2*bs + 50}}, 1, 2, 0, 0, bs + 10, nil},
		{"sparse source over data", []write{{1, 0, bs}, {1, 3 * bs, bs}, {2, 0, 5 * bs}}, 1, 2, 0, 0, 4 * bs, nil},
		{"no source data", []write{{2, 0, 2 * bs}}, 1, 2, 0, 100, bs, nil},
		{"within one file", []write{{1, 0, 2 * bs}}, 1, 1, 0, 4 * bs, 2 * bs, nil},
		{"overlapping within one file", []write{{1, 0, 2 * bs}}, 1, 1, 0, bs, 2 * bs, fs.ErrInvalid},
		{"negative offset", nil, 1, 2, -1, 0, 1, fs.ErrInvalid},
	} {
		for _, sums := range []bool{false, true} {
			name := tc.name
			if sums {
				name += " with checksums"
			}
			t.Run(name, func(t *testing.T) {
				l, err := store.NewLocal(t.TempDir(), store.LocalOptions{Checksums: sums})
				if err != nil {
					t.Fatal(err)
				}
				defer l.Close()
				model := map[uint64][]byte{}
				rng := rand.New(rand.NewPCG(1, 2))
				for _, w := range tc.writes {
					p := make([]byte, w.n)
					for i := range p {
						p[i] = byte(rng.Uint32())
					}
					f, err := l.Open(w.ino, true)
					if err != nil {
						t.Fatal(err)
					}
					if _, err := f.WriteAt(p, w.off); err != nil {
						t.Fatal(err)
					}
					f.Close()
					m := model[w.ino]
					if int64(len(m)) < w.off+int64(w.n) {
						m = append(m, make([]byte, w.off+int64(w.n)-int64(len(m)))...)
					}
					copy(m[w.off:], p)
					model[w.ino] = m
				}
				err = l.CopyRange(tc.src, tc.dst, tc.srcOff, tc.dstOff, tc.n)
				if tc.wantErr != nil {
					if !errors.Is(err, tc.wantErr) {
						t.Fatalf("CopyRange: %v, want %v", err, tc.wantErr)
					}
					return
				}
				if err != nil {
					t.Fatalf("CopyRange: %v", err)
				}
				// The model: source bytes past its data are zeros; the
				// destination grows to the last byte of source data.
				src := model[tc.src]
				part := make([]byte, tc.n)
				if tc.srcOff < int64(len(src)) {
					copy(part, src[tc.srcOff:])
				}
				dataEnd := tc.dstOff + max(0, min(tc.n, int64(len(src))-tc.srcOff))
				dst := model[tc.dst]
				if int64(len(dst)) < dataEnd {
					dst = append(dst, make([]byte, dataEnd-int64(len(dst)))...)
				}
				for i := range part {
					if o := tc.dstOff + int64(i); o < int64(len(dst)) {
						dst[o] = part[i]
					}
				}
				f, err := l.Open(tc.dst, false)
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				if sz, _ := f.Size(); sz != int64(len(dst)) {
					t.Errorf("destination size %d, want %d", sz, len(dst))
				}
				got := make([]byte, len(dst))
				if n, err := f.ReadAt(got, 0); n != len(dst) || err != nil && err != io.EOF {
					t.Fatalf("read back: %d %v", n, err)
				}
				if !bytes.Equal(got, dst) {
					for i := range got {
						if got[i] != dst[i] {
							t.Fatalf("destination differs from the model first at %d", i)
						}
					}
				}
				if sums {
					for _, ino := range []uint64{tc.src, tc.dst} {
						if bad, err := l.Verify(ino); err != nil || len(bad) > 0 {
							t.Errorf("Verify(%d): bad blocks %v, %v", ino, bad, err)
						}
					}
				}
			})
		}
	}
}

// TestCopyRangeCorruptSource: a source block that fails its checksum is
// never vouched for in the copy: the copy's block fails it too.
func TestCopyRangeCorruptSource(t *testing.T) {
	const bs = store.ChecksumBlockSize
	dir := t.TempDir()
	l, err := store.NewLocal(dir, store.LocalOptions{Checksums: true})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	f, _ := l.Open(1, true)
	if _, err := f.WriteAt(bytes.Repeat([]byte{'a'}, 2*bs), 0); err != nil {
		t.Fatal(err)
	}
	f.Close()
	flip(t, objPath(dir, 1), bs+5)
	err = l.CopyRange(1, 2, 0, 0, 2*bs)
	if err != nil && !errors.Is(err, store.ErrCorrupt) {
		t.Fatalf("CopyRange: %v", err)
	}
	if err == nil {
		if bad, err := l.Verify(2); err != nil || len(bad) != 1 || bad[0] != bs {
			t.Errorf("Verify of the copy: %v %v, want block at %d", bad, err, bs)
		}
	}
}
