package meta

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shoalfs/shoal/internal/faultfs"
)

func isWAL(name string) bool { return strings.Contains(name, "-wal") }

// TestWALBackPressureOnSlowDisk runs the bbolt engine with its log on a
// disk whose fdatasyncs do not finish (faultfs holds them) and an hour's
// commit interval, and makes changes the way an async export does
// (Deferred: answered once written). The writer must stop being answered
// once maxPending records wait for durability, so that what a machine
// crash can lose stays bounded however slow the disk; once the disk
// catches up, everything is durable and survives a reopen.
func TestWALBackPressureOnSlowDisk(t *testing.T) {
	ffs := faultfs.ForTest(t)
	path := filepath.Join(ffs.Dir, "meta.db")
	// fallocateLog: a cold log file's early switch to a pre-written
	// spare (wal_spare.go) syncs the log once, a few hundred changes in;
	// this test counts the changes answered before the first sync.
	e, err := OpenBolt(path, BoltOptions{WAL: true, CommitInterval: time.Hour, fallocateLog: true})
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		// Before faultfs unmounts: let held syncs go, then close.
		ffs.Release()
		if !closed {
			e.Close()
		}
	})
	ctx := Deferred(context.Background())
	now := time.Unix(1_700_000_000, 0)
	// A first change and a sync, so that the log's own start-up syncs are
	// behind us and the count below starts from a durable log.
	if _, _, err := e.Create(context.Background(), RootIno, "warm", CreateArgs{Type: TypeRegular, Mode: 0o644}, now); err != nil {
		t.Fatal(err)
	}
	ffs.HoldSyncs(isWAL)

	const total = maxPending + 200
	var acked atomic.Int64
	done := make(chan error, 1)
	go func() {
		for i := range total {
			if _, _, err := e.Create(ctx, RootIno, fmt.Sprintf("f%05d", i), CreateArgs{Type: TypeRegular, Mode: 0o644}, now); err != nil {
				done <- err
				return
			}
			acked.Add(1)
		}
		done <- nil
	}()

	select {
	case name := <-ffs.Held():
		// The writer now waits in that fdatasync; nothing it asked for
		// after it has been answered.
		n := acked.Load()
		if n > maxPending {
			t.Fatalf("%d changes answered before the first fdatasync of %s: more than the %d a machine crash may lose", n, name, maxPending)
		}
		if n < maxPending/2 {
			t.Fatalf("the writer waited for an fdatasync after only %d changes: the commit interval is an hour, so the back-pressure bound (%d) came too early", n, maxPending)
		}
		t.Logf("writer held after %d answered changes (bound %d)", n, maxPending)
	case err := <-done:
		t.Fatalf("all %d changes were answered (err %v) without any fdatasync: nothing bounds what a machine crash loses", total, err)
	case <-time.After(2 * time.Minute):
		t.Fatalf("no fdatasync and the writer not done after 2 min (%d answered)", acked.Load())
	}

	ffs.Release()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatalf("the writer did not finish after the disk caught up (%d answered)", acked.Load())
	}
	closed = true
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	e, err = OpenBolt(path, BoltOptions{WAL: true})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	for _, i := range []int{0, maxPending - 1, maxPending, total - 1} {
		if _, err := e.Lookup(context.Background(), RootIno, fmt.Sprintf("f%05d", i)); err != nil {
			t.Fatalf("f%05d after reopen: %v", i, err)
		}
	}
}

// TestWALFailedSync runs the engine on a disk whose fdatasyncs of the log
// fail (EIO, as a failing disk or a lost network volume gives): the change
// that waited for it fails, and so does every later one, durable or
// deferred, because after a failed fdatasync nobody can say what the log
// holds (the kernel may have dropped the dirty pages). Reads go on.
func TestWALFailedSync(t *testing.T) {
	ffs := faultfs.ForTest(t)
	path := filepath.Join(ffs.Dir, "meta.db")
	e, err := OpenBolt(path, BoltOptions{WAL: true, CommitInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ctx := context.Background()
	now := time.Unix(1_700_000_000, 0)
	if _, _, err := e.Create(ctx, RootIno, "before", CreateArgs{Type: TypeRegular, Mode: 0o644}, now); err != nil {
		t.Fatal(err)
	}
	ffs.FailSyncs(isWAL)
	for _, tc := range []struct {
		name string
		ctx  context.Context
	}{
		{"durable change", ctx},
		{"change after the failure", ctx},
		{"deferred change after the failure", Deferred(ctx)},
	} {
		_, _, err := e.Create(tc.ctx, RootIno, strings.ReplaceAll(tc.name, " ", "-"), CreateArgs{Type: TypeRegular, Mode: 0o644}, now)
		if err == nil {
			t.Fatalf("%s: answered success on a log that could not be made durable", tc.name)
		}
		t.Logf("%s: %v", tc.name, err)
	}
	if ffs.Syncs(isWAL) == 0 {
		t.Fatal("no fdatasync of the log reached the disk")
	}
	if _, err := e.Lookup(ctx, RootIno, "before"); err != nil {
		t.Fatalf("read after the failure: %v", err)
	}
}
