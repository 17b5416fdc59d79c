package server

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/shoalfs/shoal/meta"
	"github.com/shoalfs/shoal/store"
)

// TestSweepRule: which data objects of a plain server's local store a
// sweep on demand removes. Only objects below the inode counter as the
// sweep starts that no regular file owns: a live file's and an orphan's
// (unlinked, kept for an open) stay, the object of a file that is gone
// and one named by a directory's number go, and an object whose number
// the counter has not reached (a create in flight would own it) stays.
func TestSweepRule(t *testing.T) {
	ts := startServer(t, Config{})
	s := ts.srv
	ctx := context.Background()
	create := func(name string, typ meta.FileType) meta.Ino {
		t.Helper()
		nd, _, err := s.meta.Create(ctx, meta.RootIno, name, meta.CreateArgs{Type: typ, Mode: 0o644}, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		return nd.Ino
	}
	live := create("live", meta.TypeRegular)
	orphan := create("orphan", meta.TypeRegular)
	if _, _, err := s.meta.Remove(ctx, meta.RootIno, "orphan", time.Time{}); err != nil {
		t.Fatal(err)
	}
	gone := create("gone", meta.TypeRegular)
	if _, _, err := s.meta.Remove(ctx, meta.RootIno, "gone", time.Time{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.meta.FreeOrphan(ctx, gone); err != nil {
		t.Fatal(err)
	}
	dir := create("dir", meta.TypeDirectory)
	st, err := s.meta.StatFS(ctx)
	if err != nil {
		t.Fatal(err)
	}
	future := st.NextIno + 10
	local := s.data.(*store.Local)
	for _, ino := range []meta.Ino{live, orphan, gone, dir, future} {
		f, err := local.Open(uint64(ino), true)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt([]byte("data"), 0); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	rep, err := s.SweepUnowned(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Listed != 5 || rep.Unowned != 2 || rep.Removed != 2 || !rep.Complete || rep.Below != st.NextIno {
		t.Fatalf("sweep: %+v; want 5 listed, 2 unowned and removed, below %d", rep, st.NextIno)
	}
	inos, _, err := local.Page(0, 100)
	if err != nil {
		t.Fatal(err)
	}
	want := []uint64{uint64(live), uint64(orphan), uint64(future)}
	slices.Sort(inos)
	if !slices.Equal(inos, want) {
		t.Fatalf("after the sweep: objects %v, want %v (gone %d, dir %d removed)", inos, want, gone, dir)
	}
	if last, ok := s.LastSweep(); !ok || last.Removed != 2 {
		t.Fatalf("LastSweep: %+v, %v", last, ok)
	}
}
