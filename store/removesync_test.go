//go:build linux

package store

import (
	"os"
	"testing"
)

// TestSyncRemoved removes objects in one folder and in two, syncs the
// removals, and sees a folder that cannot be opened reported.
func TestSyncRemoved(t *testing.T) {
	dir := t.TempDir()
	l, err := NewLocal(dir, LocalOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	inos := []uint64{1, 257, 2}
	for _, ino := range inos {
		f, err := l.Open(ino, true)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt([]byte("x"), 0); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	for _, ino := range inos {
		if err := l.Remove(ino); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.SyncRemoved(inos); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(l.subdir(3)); err != nil {
		t.Fatal(err)
	}
	if err := l.SyncRemoved([]uint64{3}); err == nil {
		t.Fatal("SyncRemoved of a missing folder: no error")
	}
}
