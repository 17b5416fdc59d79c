//go:build linux

package store_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/shoalfs/shoal/store"
)

// allocated returns the size and the bytes allocated of object ino of a
// Local under dir.
func allocated(t *testing.T, dir string, ino uint64) (size, alloc int64) {
	t.Helper()
	fi, err := os.Stat(filepath.Join(dir, "data", fmt.Sprintf("%02x", ino&0xff), fmt.Sprint(ino)))
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size(), fi.Sys().(*syscall.Stat_t).Blocks * 512
}

// TestPreallocation: a write that takes an object past 16 MiB allocates
// ahead of itself (on ext4 and XFS, where the store does so), without
// changing the object's size or data; Sync gives back what lies past the
// end; small objects and the gap a sparse write leaves are not
// allocated. With and without checksums.
func TestPreallocation(t *testing.T) {
	var st unix.Statfs_t
	if err := unix.Statfs(t.TempDir(), &st); err != nil {
		t.Fatal(err)
	}
	if st.Type != unix.EXT4_SUPER_MAGIC && st.Type != unix.XFS_SUPER_MAGIC {
		t.Skipf("the temporary directory is not on ext4 or XFS (f_type %#x): no preallocation", st.Type)
	}
	const mib = 1 << 20
	chunk := make([]byte, mib)
	for i := range chunk {
		chunk[i] = byte(i*7 + 1)
	}
	type write struct{ off, n int64 } // in MiB
	for _, tc := range []struct {
		name   string
		writes []write
		// Bytes allocated after the writes, in MiB: at least min, at
		// most max (file system metadata and rounding aside).
		minAhead, maxAhead int64
	}{
		{"small object", []write{{0, 8}}, 8, 8},
		{"streaming past 16 MiB", []write{{0, 20}}, 20 + 4, 20 + 2*8},
		{"sparse write far ahead", []write{{0, 4}, {200, 17}}, 4 + 17 + 1, 4 + 17 + 2*8},
	} {
		for _, sums := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/checksums=%v", tc.name, sums), func(t *testing.T) {
				dir := t.TempDir()
				l, err := store.NewLocal(dir, store.LocalOptions{Checksums: sums})
				if err != nil {
					t.Fatal(err)
				}
				defer l.Close()
				const ino = 77
				f, err := l.Open(ino, true)
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				var end int64
				for _, w := range tc.writes {
					for i := range w.n {
						if _, err := f.WriteAt(chunk, (w.off+i)*mib); err != nil {
							t.Fatal(err)
						}
					}
					end = (w.off + w.n) * mib
				}
				size, alloc := allocated(t, dir, ino)
				if size != end {
					t.Fatalf("size %d after the writes, want %d", size, end)
				}
				if alloc < tc.minAhead*mib || alloc > tc.maxAhead*mib+mib {
					t.Fatalf("%d MiB allocated after the writes, want %d-%d", alloc/mib, tc.minAhead, tc.maxAhead)
				}
				if err := f.Sync(); err != nil {
					t.Fatal(err)
				}
				written := int64(0)
				for _, w := range tc.writes {
					written += w.n * mib
				}
				if size, alloc = allocated(t, dir, ino); size != end || alloc > written+mib {
					t.Fatalf("after Sync: size %d, %d bytes allocated; want size %d and about %d allocated", size, alloc, end, written)
				}
				got := make([]byte, mib)
				for _, w := range tc.writes {
					for i := range w.n {
						if _, err := f.ReadAt(got, (w.off+i)*mib); err != nil || !bytes.Equal(got, chunk) {
							t.Fatalf("read back MiB %d: %v, equal %v", w.off+i, err, bytes.Equal(got, chunk))
						}
					}
				}
			})
		}
	}
}

// TestPreallocationSyncRace: Syncs (each gives back what was allocated
// past the end, with a truncate to the size it reads) run while four
// writers extend the object; no write is lost to a truncate.
func TestPreallocationSyncRace(t *testing.T) {
	for _, sums := range []bool{false, true} {
		t.Run(fmt.Sprintf("checksums=%v", sums), func(t *testing.T) {
			dir := t.TempDir()
			l, err := store.NewLocal(dir, store.LocalOptions{Checksums: sums})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			const ino, writers, per, piece = 5, 4, 48, 256 << 10
			f, err := l.Open(ino, true)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			data := func(k int) []byte { return bytes.Repeat([]byte{byte(k%251 + 1)}, piece) }
			var wg sync.WaitGroup
			done := make(chan struct{})
			for w := range writers {
				wg.Go(func() {
					for i := range per {
						k := i*writers + w // interleaved: the object grows from all four
						if _, err := f.WriteAt(data(k), int64(k)*piece); err != nil {
							t.Error(err)
							return
						}
					}
				})
			}
			syncs := make(chan error, 1)
			go func() {
				defer close(syncs)
				for range 200 {
					select {
					case <-done:
						return
					default:
					}
					if err := l.Sync(ino); err != nil {
						syncs <- err
						return
					}
				}
			}()
			wg.Wait()
			close(done)
			if err := <-syncs; err != nil {
				t.Fatal(err)
			}
			got := make([]byte, piece)
			for k := range writers * per {
				if _, err := f.ReadAt(got, int64(k)*piece); err != nil {
					t.Fatalf("read piece %d: %v", k, err)
				}
				if !bytes.Equal(got, data(k)) {
					t.Fatalf("piece %d lost or damaged", k)
				}
			}
		})
	}
}
