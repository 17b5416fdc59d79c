package meta

import (
	"context"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// TestSweepMarkAfterPowerCut: the rule the sweep of unowned data objects
// rests on (sweep.go). After a power cut took back a create answered
// early, the open sets the sweep mark above the lost inode number (so
// the lost file's data object is in the sweep's range), every number the
// new run hands out is at or above the mark (so no create in flight is
// ever in range), Unowned names the lost number and not the files that
// survived (orphans included), and the mark stays until cleared with its
// own value; a clean Close and open set none.
func TestSweepMarkAfterPowerCut(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "meta.db")
	opts := BoltOptions{WAL: true, CommitInterval: time.Hour}
	open := func() *kvEngine {
		e, err := OpenBolt(path, opts)
		if err != nil {
			t.Fatal(err)
		}
		return e.(*kvEngine)
	}
	create := func(e *kvEngine, ctx context.Context, name string) Ino {
		n, _, err := e.Create(ctx, RootIno, name, CreateArgs{Type: TypeRegular, Mode: 0o644}, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		return n.Ino
	}
	mark := func(e *kvEngine) (Ino, bool) {
		below, ok, err := SweepMark(ctx, e)
		if err != nil {
			t.Fatal(err)
		}
		return below, ok
	}

	e := open()
	if _, ok := mark(e); ok {
		t.Fatal("a new database has a sweep mark")
	}
	kept := create(e, ctx, "kept")
	orphan := create(e, ctx, "orphan")
	if _, _, err := e.Remove(ctx, RootIno, "orphan", time.Time{}); err != nil {
		t.Fatal(err)
	}
	lost := create(e, Deferred(ctx), "lost")
	s := &walTestStore{t: t, path: path, opts: opts, kv: e.kv.(*walKV)}
	s.powerCut(func(uint64) bool { return false })

	e = open()
	below, ok := mark(e)
	if !ok || below <= lost {
		t.Fatalf("after the power cut: mark %d (set %v), lost create had inode %d", below, ok, lost)
	}
	fresh := create(e, ctx, "fresh")
	if fresh < below {
		t.Fatalf("inode %d handed out below the sweep mark %d", fresh, below)
	}
	got, err := Unowned(ctx, e, []Ino{kept, orphan, lost, RootIno, fresh, below + 5})
	if err != nil {
		t.Fatal(err)
	}
	// The root is a directory, which owns no data; below+5 was never
	// allocated (the caller never asks about it: it is not below the
	// mark, but Unowned itself only reads).
	if want := []Ino{lost, RootIno, below + 5}; !slices.Equal(got, want) {
		t.Fatalf("Unowned = %v, want %v (kept %d, orphan %d, fresh %d)", got, want, kept, orphan, fresh)
	}

	if err := ClearSweepMark(ctx, e, below+1); err != nil {
		t.Fatal(err)
	}
	if _, ok := mark(e); !ok {
		t.Fatal("ClearSweepMark with another value removed the mark")
	}
	if err := ClearSweepMark(ctx, e, below); err != nil {
		t.Fatal(err)
	}
	if _, ok := mark(e); ok {
		t.Fatal("the mark survived ClearSweepMark")
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	e = open()
	defer e.Close()
	if b, ok := mark(e); ok {
		t.Fatalf("a clean Close and open set the mark %d", b)
	}
}

// TestSweepMarkRaisedByLaterCrash: a mark not cleared (the sweep did not
// finish) is raised by the next unclean open, so it covers both crashes.
func TestSweepMarkRaisedByLaterCrash(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "meta.db")
	opts := BoltOptions{WAL: true, CommitInterval: time.Hour}
	var marks []Ino
	for range 2 {
		e, err := OpenBolt(path, opts)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := e.Create(Deferred(ctx), RootIno, "f"+string(rune('a'+len(marks))), CreateArgs{Type: TypeRegular}, time.Time{}); err != nil {
			t.Fatal(err)
		}
		if below, ok, err := SweepMark(ctx, e); err != nil {
			t.Fatal(err)
		} else if ok {
			marks = append(marks, below)
		}
		s := &walTestStore{t: t, path: path, opts: opts, kv: e.(*kvEngine).kv.(*walKV)}
		s.powerCut(func(uint64) bool { return false })
	}
	e, err := OpenBolt(path, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	below, ok, err := SweepMark(ctx, e)
	if err != nil || !ok {
		t.Fatalf("no mark after two power cuts: %v", err)
	}
	if len(marks) != 1 || below <= marks[0] {
		t.Fatalf("marks seen %v, now %d: not raised", marks, below)
	}
}
