//go:build linux

package store_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/shoalfs/shoal/store"
)

func newLocal(t testing.TB, maxOpen int) (*store.Local, string) {
	t.Helper()
	dir := t.TempDir()
	l, err := store.NewLocal(dir, store.LocalOptions{MaxOpen: maxOpen})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l, dir
}

// writeData makes ino's data file (Open with create) and writes data at 0.
func writeData(t testing.TB, l *store.Local, ino uint64, data string) {
	t.Helper()
	f, err := l.Open(ino, true)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte(data), 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestReadWriteSync(t *testing.T) {
	l, dir := newLocal(t, 8)
	if _, err := l.Open(0x1234, false); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("open missing: %v", err)
	}
	f, err := l.Open(0x1234, true)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := os.Stat(filepath.Join(dir, "data", "34", "4660")); err != nil {
		t.Fatalf("data file not at expected path: %v", err)
	}
	cases := []struct {
		off  int64
		data string
	}{{0, "hello"}, {100, "world"}, {3, "LO"}}
	for _, c := range cases {
		if n, err := f.WriteAt([]byte(c.data), c.off); err != nil || n != len(c.data) {
			t.Fatalf("write %d: %d %v", c.off, n, err)
		}
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := l.Sync(0x1234); err != nil {
		t.Fatal(err)
	}
	if err := l.Sync(999); err != nil {
		t.Fatalf("sync missing: %v", err)
	}
	if sz, err := f.Size(); err != nil || sz != 105 {
		t.Fatalf("size %d %v", sz, err)
	}
	buf := make([]byte, 5)
	for _, c := range []struct {
		off  int64
		want string
		n    int
		err  error
	}{
		{0, "helLO", 5, nil},
		{5, "\x00\x00\x00\x00\x00", 5, nil},
		{102, "rld", 3, io.EOF},
		{105, "", 0, io.EOF},
		{200, "", 0, io.EOF},
	} {
		n, err := f.ReadAt(buf, c.off)
		if n != c.n || err != c.err || string(buf[:n]) != c.want {
			t.Fatalf("read %d = %q %v, want %q %v", c.off, buf[:n], err, c.want, c.err)
		}
	}
	// A second handle shares the data; a handle refuses use after Close.
	g, err := l.Open(0x1234, false)
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := g.ReadAt(buf, 100); string(buf[:n]) != "world" {
		t.Fatalf("second handle read %q", buf[:n])
	}
	g.Close()
	if err := g.Close(); err != nil {
		t.Fatalf("double close: %v", err)
	}
	if _, err := g.ReadAt(buf, 0); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("read after close: %v", err)
	}
	// Truncate shrinks and grows.
	if err := l.Truncate(0x1234, 2); err != nil {
		t.Fatal(err)
	}
	if sz, _ := f.Size(); sz != 2 {
		t.Fatalf("size after truncate %d", sz)
	}
	if err := l.Truncate(77, 1<<20); err != nil {
		t.Fatal(err)
	}
	h, err := l.Open(77, false)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if sz, _ := h.Size(); sz != 1<<20 {
		t.Fatalf("size %d", sz)
	}
	total, free, avail, err := l.StatFS()
	if err != nil || total == 0 || free > total || avail > total {
		t.Fatalf("statfs %d %d %d %v", total, free, avail, err)
	}
}

func TestHolesAndSeek(t *testing.T) {
	l, _ := newLocal(t, 8)
	f, err := l.Open(5, true)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const blk = 1 << 16
	data := bytes.Repeat([]byte{0xab}, 4*blk)
	if _, err := f.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}
	if err := f.PunchHole(blk, 2*blk); errors.Is(err, store.ErrNotSupported) {
		t.Skip("file system cannot punch holes")
	} else if err != nil {
		t.Fatal(err)
	}
	if sz, _ := f.Size(); sz != 4*blk {
		t.Fatalf("punch changed size to %d", sz)
	}
	got := make([]byte, 4*blk)
	if _, err := f.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	want := bytes.Clone(data)
	clear(want[blk : 3*blk])
	if !bytes.Equal(got, want) {
		t.Fatal("hole does not read as zeros")
	}
	hole, err := f.Seek(0, store.SeekHole)
	if errors.Is(err, store.ErrNotSupported) {
		t.Skip("file system cannot seek holes")
	}
	if err != nil {
		t.Fatal(err)
	}
	if hole != blk {
		// Some file systems report holes at coarser granularity; only
		// check what is guaranteed.
		t.Logf("first hole at %d (expected %d)", hole, blk)
	}
	dataOff, err := f.Seek(blk, store.SeekData)
	if err != nil || dataOff > 3*blk || dataOff < blk {
		t.Fatalf("seek data from hole = %d %v", dataOff, err)
	}
	if _, err := f.Seek(4*blk, store.SeekData); err != io.EOF {
		t.Fatalf("seek data at eof: %v", err)
	}
	if _, err := f.Seek(0, io.SeekStart); err == nil {
		t.Fatal("plain seek accepted")
	}
	if err := f.Allocate(4*blk, blk); errors.Is(err, store.ErrNotSupported) {
		t.Skip("no fallocate")
	} else if err != nil {
		t.Fatal(err)
	}
	if sz, _ := f.Size(); sz != 5*blk {
		t.Fatalf("allocate size %d", sz)
	}
	if err := f.PunchHole(0, 0); err == nil {
		t.Fatal("zero-length punch accepted")
	}
}

// TestCacheEviction hammers a cache far smaller than the working set from
// several goroutines; every file must read back exactly what was written.
func TestCacheEviction(t *testing.T) {
	l, _ := newLocal(t, 3)
	const files, workers, rounds = 24, 8, 60
	var wg sync.WaitGroup
	errc := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range rounds {
				ino := uint64((w*7 + r*5) % files)
				f, err := l.Open(ino, true)
				if err != nil {
					errc <- err
					return
				}
				rec := []byte(fmt.Sprintf("%02d", w))
				if _, err := f.WriteAt(rec, int64(w*2)); err != nil {
					errc <- err
					f.Close()
					return
				}
				got := make([]byte, 2)
				if _, err := f.ReadAt(got, int64(w*2)); err != nil || !bytes.Equal(got, rec) {
					errc <- fmt.Errorf("ino %d: read %q %v", ino, got, err)
					f.Close()
					return
				}
				f.Close()
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	for ino := range uint64(files) {
		if err := l.Sync(ino); err != nil {
			t.Fatal(err)
		}
	}
}

func TestRemoveWhileOpen(t *testing.T) {
	l, dir := newLocal(t, 4)
	f, err := l.Open(9, true)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("old"), 0); err != nil {
		t.Fatal(err)
	}
	if err := l.Remove(9); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "data", "09", "9")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("data file still present: %v", err)
	}
	// The open handle still works on the unlinked file.
	buf := make([]byte, 3)
	if _, err := f.ReadAt(buf, 0); err != nil || string(buf) != "old" {
		t.Fatalf("read after remove: %q %v", buf, err)
	}
	if _, err := f.WriteAt([]byte("x"), 3); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Open(9, false); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("open removed: %v", err)
	}
	g, err := l.Open(9, true)
	if err != nil {
		t.Fatal(err)
	}
	if sz, _ := g.Size(); sz != 0 {
		t.Fatalf("recreated file has size %d", sz)
	}
	f.Close()
	g.Close()
	if err := l.Remove(9); err != nil {
		t.Fatal(err)
	}
	if err := l.Remove(9); err != nil {
		t.Fatalf("remove missing: %v", err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Open(1, true); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("open after close: %v", err)
	}
}

// benchModes runs a benchmark on a file in a store without and with
// checksums.
func benchModes(b *testing.B, fn func(b *testing.B, f store.File)) {
	for _, mode := range []struct {
		name string
		crc  bool
	}{{"plain", false}, {"checksums", true}} {
		b.Run(mode.name, func(b *testing.B) {
			l, err := store.NewLocal(b.TempDir(), store.LocalOptions{MaxOpen: 8, Checksums: mode.crc})
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			f, err := l.Open(1, true)
			if err != nil {
				b.Fatal(err)
			}
			defer f.Close()
			b.ReportAllocs()
			fn(b, f)
		})
	}
}

func BenchmarkWriteAt1MiB(b *testing.B) {
	benchModes(b, func(b *testing.B, f store.File) {
		buf := bytes.Repeat([]byte{1}, 1<<20)
		b.SetBytes(int64(len(buf)))
		i := 0
		for b.Loop() {
			if _, err := f.WriteAt(buf, int64(i%64)<<20); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
}

func BenchmarkReadAt1MiB(b *testing.B) {
	benchModes(b, func(b *testing.B, f store.File) {
		buf := bytes.Repeat([]byte{1}, 1<<20)
		for i := range 64 {
			if _, err := f.WriteAt(buf, int64(i)<<20); err != nil {
				b.Fatal(err)
			}
		}
		b.SetBytes(int64(len(buf)))
		i := 0
		for b.Loop() {
			if _, err := f.ReadAt(buf, int64(i%64)<<20); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
}

// BenchmarkWriteAt4KiBUnaligned writes 4 KiB at offsets that are not
// block-aligned, the read-modify-write case with checksums.
func BenchmarkWriteAt4KiBUnaligned(b *testing.B) {
	benchModes(b, func(b *testing.B, f store.File) {
		buf := bytes.Repeat([]byte{1}, 4<<10)
		if _, err := f.WriteAt(make([]byte, 64<<20), 0); err != nil {
			b.Fatal(err)
		}
		b.SetBytes(int64(len(buf)))
		i := 0
		for b.Loop() {
			if _, err := f.WriteAt(buf, int64(i%16384)*4096+100); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
}

// BenchmarkReadAt4KiBUnaligned reads 4 KiB at offsets that are not
// block-aligned: with checksums, each read verifies a whole block.
func BenchmarkReadAt4KiBUnaligned(b *testing.B) {
	benchModes(b, func(b *testing.B, f store.File) {
		if _, err := f.WriteAt(bytes.Repeat([]byte{1}, 64<<20), 0); err != nil {
			b.Fatal(err)
		}
		buf := make([]byte, 4<<10)
		b.SetBytes(int64(len(buf)))
		i := 0
		for b.Loop() {
			if _, err := f.ReadAt(buf, int64(i%16000)*4096+100); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
}

// BenchmarkCommit16MiB appends 16 MiB in 1 MiB writes and syncs, as a
// data server does for one file between two COMMITs of a client that
// streams to it (Policy.UnstableLimit's rounds, client package); the
// time per op is the writes and the COMMIT, and sync-ms/op the COMMIT's
// share (the fdatasyncs), which is what a client's commit round waits
// for at each data server.
func BenchmarkCommit16MiB(b *testing.B) {
	benchModes(b, func(b *testing.B, f store.File) {
		buf := bytes.Repeat([]byte{1}, 1<<20)
		b.SetBytes(16 << 20)
		var off int64
		var synced time.Duration
		for b.Loop() {
			for range 16 {
				if _, err := f.WriteAt(buf, off); err != nil {
					b.Fatal(err)
				}
				off += int64(len(buf))
			}
			t0 := time.Now()
			if err := f.Sync(); err != nil {
				b.Fatal(err)
			}
			synced += time.Since(t0)
		}
		b.ReportMetric(float64(synced.Microseconds())/1e3/float64(b.N), "sync-ms/op")
	})
}

// TestRemoveFiles: Remove unlinks a file's data and its checksum
// sidecar, takes a file that never had data in its stride (what the
// server's freer meets most: an empty or inline file), removes an empty
// directory in the data file's place as os.Remove would, and reports a
// non-empty one, which it leaves.
func TestRemoveFiles(t *testing.T) {
	for _, tc := range []struct {
		name      string
		checksums bool
		write     bool // write data first
		dir       bool // a directory where the data file would be
		full      bool // with a file in it
		wantErr   bool
	}{
		{name: "never written"},
		{name: "never written/checksums", checksums: true},
		{name: "written", write: true},
		{name: "written/checksums", checksums: true, write: true},
		{name: "empty directory in the way", dir: true},
		{name: "non-empty directory in the way", dir: true, full: true, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			l, err := store.NewLocal(dir, store.LocalOptions{Checksums: tc.checksums})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			const ino = 0x2a
			path := filepath.Join(dir, "data", "2a", "42")
			if tc.write {
				writeData(t, l, ino, "data")
				if _, err := os.Stat(path); err != nil {
					t.Fatalf("data file not where the test looks: %v", err)
				}
				if _, err := os.Stat(path + ".crc"); tc.checksums && err != nil {
					t.Fatalf("sidecar not where the test looks: %v", err)
				}
			}
			if tc.dir {
				if err := os.Mkdir(path, 0o700); err != nil {
					t.Fatal(err)
				}
				if tc.full {
					if err := os.WriteFile(filepath.Join(path, "x"), nil, 0o600); err != nil {
						t.Fatal(err)
					}
				}
			}
			err = l.Remove(ino)
			if (err != nil) != tc.wantErr {
				t.Fatalf("Remove: %v, want error %v", err, tc.wantErr)
			}
			if tc.full {
				if fi, err := os.Stat(path); err != nil || !fi.IsDir() {
					t.Fatalf("directory at the data path: %v, %v; want it kept", fi, err)
				}
				return
			}
			for _, p := range []string{path, path + ".crc"} {
				if _, err := os.Stat(p); !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("%s after Remove: %v, want it gone", p, err)
				}
			}
			if _, err := l.Open(ino, false); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("open after Remove: %v, want ErrNotExist", err)
			}
		})
	}
}
