//go:build linux

package store

import (
	"os"
	"testing"
)

// TestSyncRemoved removes objects in one folder and in two, syncs the
// removals, sees a folder with no unlink since its last sync skipped and
// a folder that cannot be opened reported.
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
	// A folder is synced only if something was unlinked in it since its
	// last sync: a Remove that found no file leaves it alone, which a
	// folder that cannot be opened shows.
	if err := os.RemoveAll(l.subdir(3)); err != nil {
		t.Fatal(err)
	}
	if err := l.Remove(3); err != nil {
		t.Fatal(err)
	}
	if err := l.SyncRemoved([]uint64{3}); err != nil {
		t.Fatalf("SyncRemoved with nothing unlinked in the folder: %v", err)
	}
	if err := os.RemoveAll(l.subdir(1)); err != nil {
		t.Fatal(err)
	}
	if err := l.SyncRemoved([]uint64{1}); err != nil {
		t.Fatalf("SyncRemoved of a folder already synced: %v", err)
	}
	// An unlink in a folder since its sync: synced again, and a folder
	// that cannot be opened is reported.
	f, err := l.Open(514, true) // folder 02
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := l.Remove(514); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(l.subdir(2)); err != nil {
		t.Fatal(err)
	}
	if err := l.SyncRemoved([]uint64{514}); err == nil {
		t.Fatal("SyncRemoved of a missing folder with an unlink in it: no error")
	}
}
