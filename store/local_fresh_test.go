//go:build linux

package store_test

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/shoalfs/shoal/store"
)

// TestNoDataFrom: once told that inode numbers from a mark on have no
// data file, Local.Remove skips the unlink for those it never made one
// for, and still removes every file it made and every file below the
// mark. A file planted behind Local's back above the mark shows the
// skip: it stays (the contract NoDataFrom's caller keeps is that no such
// file exists).
func TestNoDataFrom(t *testing.T) {
	const mark = 1000
	for _, tc := range []struct {
		name     string
		ino      uint64
		plant    bool   // a data file made behind Local's back
		make     string // how Local makes the data file: "open", "truncate" or ""
		wantGone bool
	}{
		{name: "below the mark", ino: mark - 1, plant: true, wantGone: true},
		{name: "made by Open", ino: mark, make: "open", wantGone: true},
		{name: "made by Truncate", ino: mark + 70, make: "truncate", wantGone: true},
		{name: "never made", ino: mark + 5, plant: true, wantGone: false},
		{name: "beyond the tracked span", ino: mark + 1<<27, plant: true, wantGone: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			l, err := store.NewLocal(dir, store.LocalOptions{Checksums: true})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			l.NoDataFrom(mark)
			l.NoDataFrom(0) // ignored: the first mark stays
			path := filepath.Join(dir, "data", fmt.Sprintf("%02x", tc.ino&0xff), fmt.Sprint(tc.ino))
			switch {
			case tc.plant:
				if err := os.WriteFile(path, []byte("planted"), 0o600); err != nil {
					t.Fatal(err)
				}
			case tc.make == "open":
				writeData(t, l, tc.ino, "data")
			case tc.make == "truncate":
				if err := l.Truncate(tc.ino, 4096); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := os.Stat(path); err != nil {
				t.Fatalf("data file not where the test looks: %v", err)
			}
			if err := l.Remove(tc.ino); err != nil {
				t.Fatal(err)
			}
			_, err = os.Stat(path)
			if gone := errors.Is(err, fs.ErrNotExist); gone != tc.wantGone {
				t.Fatalf("data file gone after Remove: %v (%v), want %v", gone, err, tc.wantGone)
			}
		})
	}
}
