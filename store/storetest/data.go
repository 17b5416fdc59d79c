package storetest

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"sync"
	"testing"

	"github.com/shoalfs/shoal/store"
)

// testNeverWritten: data never written is empty (missing, or there and
// empty, whichever the backend does, consistently), syncing and removing
// it are no errors, creating it makes empty data, and truncating it gives
// it the size asked for, or (for a backend that does not tell missing
// data from empty) leaves it empty.
func testNeverWritten(t *testing.T, v *env) {
	ino := v.file()
	v.learn(ino)
	if err := v.b.Sync(ino); err != nil {
		t.Fatalf("sync of data never written: %v", err)
	}
	if err := v.b.Remove(ino); err != nil {
		t.Fatalf("remove of data never written: %v", err)
	}
	f := v.open(ino, true)
	if n := v.size(f); n != 0 {
		t.Fatalf("created data: size %d, want 0", n)
	}
	if n, err := f.ReadAt(make([]byte, 100), 0); n != 0 || !errors.Is(err, io.EOF) {
		t.Fatalf("read of created data: %d, %v; want 0, io.EOF", n, err)
	}

	for _, size := range []int64{0, 100, 3*block + 5} {
		ino := v.file()
		if err := v.b.Truncate(ino, uint64(size)); err != nil {
			t.Fatalf("truncate data never written to %d: %v", size, err)
		}
		got := v.fileSize(ino)
		if got != size && (v.tracked || got != 0) {
			t.Fatalf("truncate data never written to %d: size %d", size, got)
		}
		v.check("after truncating data never written", ino, make([]byte, got))
	}
}

// testReadAtEOF: reads at and past the end of the data, like os.File:
// io.EOF whenever the read reaches past the end, nil when it ends at or
// before it.
func testReadAtEOF(t *testing.T, v *env) {
	for _, size := range []int{10000, block + 100} {
		ino := v.file()
		data := pattern(size, 3)
		v.writeFile(ino, data, 0)
		f := v.open(ino, false)
		cases := []struct {
			name    string
			off     int
			n       int
			wantN   int
			wantEOF bool
		}{
			{"whole", 0, size, size, false},
			{"middle", 100, 200, 200, false},
			{"ends at the end", size - 10, 10, 10, false},
			{"longer than the data", 0, size + 1, size, true},
			{"over the end", size - 10, 100, 10, true},
			{"at the end", size, 1, 0, true},
			{"past the end", size + 3*block, 10, 0, true},
			{"far past the end", 1 << 40, 10, 0, true},
		}
		for _, c := range cases {
			t.Run(fmt.Sprintf("%d/%s", size, c.name), func(t *testing.T) {
				buf := make([]byte, c.n)
				n, err := f.ReadAt(buf, int64(c.off))
				if c.wantEOF && !errors.Is(err, io.EOF) || !c.wantEOF && err != nil {
					t.Fatalf("read %d at %d of %d: %d, %v; want %d, EOF %v", c.n, c.off, size, n, err, c.wantN, c.wantEOF)
				}
				if n != c.wantN {
					t.Fatalf("read %d at %d of %d: %d bytes, want %d", c.n, c.off, size, n, c.wantN)
				}
				if i := firstDiff(buf[:n], data[min(c.off, size):min(c.off, size)+n]); i >= 0 {
					t.Fatalf("read %d at %d: byte %d differs", c.n, c.off, i)
				}
			})
		}
	}
}

// testWriteRead: writes at unaligned offsets, across checksum blocks and
// stripe units, over each other and past the end, each followed by a full
// comparison. An empty write changes nothing, not even the size.
func testWriteRead(t *testing.T, v *env) {
	ino := v.file()
	f := v.open(ino, true)
	var m model
	writes := []struct {
		name string
		off  int64
		n    int
	}{
		{"small at zero", 0, 100},
		{"extends unaligned", 77, 5000},
		{"crosses a block", block - 300, 700},
		{"empty past the end", 3 * block, 0},
		{"whole block", 2 * block, block},
		{"over several", 100, 3*block + 11},
		{"past the end after a gap", 5*block + 3, 4096},
		{"one byte inside", block + 1, 1},
		{"empty inside", 10, 0},
	}
	for i, w := range writes {
		p := pattern(w.n, byte(i*13))
		n, err := f.WriteAt(p, w.off)
		if err != nil || n != w.n {
			t.Fatalf("%s: write %d at %d: %d, %v", w.name, w.n, w.off, n, err)
		}
		m.write(p, w.off)
		v.check(w.name, ino, m)
	}
	// A second handle sees the same data.
	v.check("through another handle", ino, m)
}

// testHoles: ranges never written read as zeros, between writes, before
// the first one and within a block partly written.
func testHoles(t *testing.T, v *env) {
	cases := []struct {
		name   string
		writes []int64 // offsets of 4 KiB writes
	}{
		{"gap between", []int64{0, mib + 100}},
		{"first write far in", []int64{2*mib + 5}},
		{"inside one block", []int64{10, 9000}},
		{"many units apart", []int64{block - 1, 7*block + 2, 3 * mib}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ino := v.file()
			var m model
			for i, off := range c.writes {
				p := pattern(4096, byte(i+1))
				v.writeFile(ino, p, off)
				m.write(p, off)
			}
			v.check(c.name, ino, m)
		})
	}
}

// testTruncate: the size goes down and up again, what grows reads as
// zeros (never the old bytes), across checksum blocks and stripe units.
func testTruncate(t *testing.T, v *env) {
	ino := v.file()
	var m model
	p := pattern(3*block+300, 9)
	v.writeFile(ino, p, 0)
	m.write(p, 0)
	for _, size := range []int64{
		4*block + 1,   // up, past a block
		3*block + 300, // down to where it was
		block + 7,     // down into a block
		3 * block,     // up again: zeros, not the old bytes
		3 * block,     // the same size
		0,             // empty
		2*mib + 11,    // up from empty
		100,           // down, into the first block
	} {
		if err := v.b.Truncate(ino, uint64(size)); err != nil {
			t.Fatalf("truncate to %d: %v", size, err)
		}
		m.truncate(size)
		v.check(fmt.Sprintf("truncated to %d", size), ino, m)
	}
	// Writing after truncating down: the bytes between stay zeros.
	p = pattern(50, 4)
	v.writeFile(ino, p, 2*block)
	m.write(p, 2*block)
	v.check("written after truncating", ino, m)
}

// testDurability: what File.Sync, Backend.Sync and Truncate made durable
// is there after the backend restarts.
func testDurability(t *testing.T, v *env) {
	if v.tg.Reopen == nil {
		t.Skip("the target cannot reopen its backend")
	}
	type file struct {
		ino uint64
		m   model
	}
	var files []*file
	add := func() *file {
		fl := &file{ino: v.file()}
		files = append(files, fl)
		return fl
	}

	// File.Sync.
	a := add()
	f := v.open(a.ino, true)
	p := pattern(2*block+77, 1)
	v.write(f, p, 0)
	a.m.write(p, 0)
	if err := f.Sync(); err != nil {
		t.Fatalf("File.Sync: %v", err)
	}
	f.Close()

	// Backend.Sync, with a hole first.
	b := add()
	p = pattern(5000, 2)
	v.writeFile(b.ino, p, mib)
	b.m.write(p, mib)
	if err := v.b.Sync(b.ino); err != nil {
		t.Fatalf("Backend.Sync: %v", err)
	}

	// Truncate is durable by itself, down and up.
	for i, size := range []int64{5000, 3*block + 1} {
		c := add()
		p = pattern(100<<10, byte(3+i))
		v.writeFile(c.ino, p, 0)
		c.m.write(p, 0)
		if err := v.b.Sync(c.ino); err != nil {
			t.Fatalf("Backend.Sync: %v", err)
		}
		if err := v.b.Truncate(c.ino, uint64(size)); err != nil {
			t.Fatalf("truncate to %d: %v", size, err)
		}
		c.m.truncate(size)
	}

	// Removed data stays removed.
	d := add()
	v.writeFile(d.ino, pattern(100, 5), 0)
	if err := v.b.Sync(d.ino); err != nil {
		t.Fatalf("Backend.Sync: %v", err)
	}
	if err := v.b.Remove(d.ino); err != nil {
		t.Fatalf("remove: %v", err)
	}

	for _, fl := range files {
		v.check("before the restart", fl.ino, fl.m)
	}
	v.reopen()
	for _, fl := range files {
		v.check("after the restart", fl.ino, fl.m)
	}
}

// testRemove: removing data is safe while a handle is open, removing
// missing data is no error, and data created again starts empty.
func testRemove(t *testing.T, v *env) {
	v.learn(v.file())
	ino := v.file()
	f := v.open(ino, true)
	v.write(f, pattern(3*block, 1), 0)
	if err := v.b.Remove(ino); err != nil {
		t.Fatalf("remove while open: %v", err)
	}
	// What the open handle sees now is the backend's business (the old
	// bytes for a local file, unlinked, or nothing), but it must answer.
	if _, err := f.ReadAt(make([]byte, 10), 0); err != nil && !errors.Is(err, io.EOF) {
		t.Logf("read through a handle on removed data: %v", err)
	}
	if err := f.Close(); err != nil {
		t.Fatalf("close of a handle on removed data: %v", err)
	}
	v.check("after remove", ino, nil)
	if v.tracked {
		// A backend that tells missing data from empty data has none.
		if f, err := v.b.Open(ino, false); !errors.Is(err, fs.ErrNotExist) {
			if err == nil {
				f.Close()
			}
			t.Fatalf("open of removed data without create: %v, want fs.ErrNotExist", err)
		}
	}
	if err := v.b.Remove(ino); err != nil {
		t.Fatalf("second remove: %v", err)
	}
	if err := v.b.Sync(ino); err != nil {
		t.Fatalf("sync of removed data: %v", err)
	}
	// Created again: only the new bytes, no trace of the old ones.
	p := pattern(100, 7)
	v.writeFile(ino, p, block)
	var m model
	m.write(p, block)
	v.check("created again", ino, m)
}

// testClosedFile: Close is idempotent, and every other method of a
// closed handle fails with store.ErrClosed, without touching the data.
func testClosedFile(t *testing.T, v *env) {
	ino := v.file()
	f := v.open(ino, true)
	var m model
	p := pattern(1000, 2)
	v.write(f, p, 0)
	m.write(p, 0)
	if err := f.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	if err := f.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
	calls := []struct {
		name string
		fn   func() error
	}{
		{"ReadAt", func() error { _, err := f.ReadAt(make([]byte, 10), 0); return err }},
		{"WriteAt", func() error { _, err := f.WriteAt(pattern(10, 9), 0); return err }},
		{"WriteAt past the end", func() error { _, err := f.WriteAt(pattern(10, 9), 2*block); return err }},
		{"Size", func() error { _, err := f.Size(); return err }},
		{"Sync", f.Sync},
	}
	for _, c := range calls {
		if err := c.fn(); !errors.Is(err, store.ErrClosed) {
			t.Errorf("%s after Close: %v, want store.ErrClosed", c.name, err)
		}
	}
	v.check("after calls on a closed handle", ino, m)
}

// testConcurrentWriters: writers on handles of their own write distinct
// ranges of one file at once, interleaved; every byte lands.
func testConcurrentWriters(t *testing.T, v *env) {
	cases := []struct {
		name    string
		writers int
		chunk   int
		rounds  int
	}{
		{"small", 8, 700, 4},
		// Small writes and larger ones at once: a backend keeping small
		// files elsewhere (inline data) moves the file while others write.
		{"small and large", 8, 5000, 2},
		{"across blocks", 4, block + 300, 3},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ino := v.file()
			var wg sync.WaitGroup
			errs := make([]error, c.writers)
			for w := range c.writers {
				wg.Go(func() {
					f, err := v.b.Open(ino, true)
					if err != nil {
						errs[w] = err
						return
					}
					defer f.Close()
					for r := range c.rounds {
						off := int64((r*c.writers + w) * c.chunk)
						p := pattern(c.chunk, byte(w*16+r))
						if n, err := f.WriteAt(p, off); err != nil || n != len(p) {
							errs[w] = fmt.Errorf("writer %d: write at %d: %d, %w", w, off, n, err)
							return
						}
					}
					errs[w] = f.Sync()
				})
			}
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				t.Fatal(err)
			}
			var m model
			for r := range c.rounds {
				for w := range c.writers {
					m.write(pattern(c.chunk, byte(w*16+r)), int64((r*c.writers+w)*c.chunk))
				}
			}
			v.check(c.name, ino, m)
		})
	}
}
