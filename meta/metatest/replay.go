package metatest

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/shoalfs/shoal/meta"
)

// runReplays runs the replay record cases (meta.WithReplay): a record is
// written with the change that asked for it, and only then.
func runReplays(t *testing.T, open Opener, ctx context.Context) {
	tests := []struct {
		name string
		fn   func(t *testing.T, v *env)
	}{
		{"WrittenWithChange", testReplayWritten},
		{"NotWrittenOnFailure", testReplayFailed},
		{"DropPiggybacked", testReplayDrop},
		{"LargestChangeWithDrops", testReplayLargest},
		{"ListDeleteExpire", testReplayListExpire},
		{"Persistence", testReplayPersistence},
	}
	for _, tc := range tests {
		t.Run("Replays/"+tc.name, func(t *testing.T) {
			tc.fn(t, newEnv(t, open, ctx))
		})
	}
}

// replayID makes a distinct ID from small numbers.
func replayID(owner, digest byte, writer uint32, seq uint64) meta.ReplayID {
	var id meta.ReplayID
	id.Key.Owner[0] = owner
	id.Key.Digest[0] = digest
	id.Writer, id.Seq = writer, seq
	return id
}

// withRecord returns a context asking for a record with id and op.
func withRecord(ctx context.Context, id meta.ReplayID, op uint32, drop ...meta.ReplayID) (context.Context, *meta.ReplayWrite) {
	w := &meta.ReplayWrite{Record: meta.ReplayRecord{ReplayID: id, Op: op}, Drop: drop}
	return meta.WithReplay(ctx, w), w
}

// replays returns the records under key.
func (v *env) replays(key meta.ReplayKey) []meta.ReplayRecord {
	v.t.Helper()
	rs, err := v.e.Replays(v.ctx, key)
	if err != nil {
		v.t.Fatalf("replays: %v", err)
	}
	return rs
}

// allReplays lists every record, a page of 3 at a time.
func (v *env) allReplays() []meta.ReplayRecord {
	v.t.Helper()
	var out []meta.ReplayRecord
	var after *meta.ReplayID
	for range 1000 {
		page, err := v.e.ListReplays(v.ctx, after, 3)
		if err != nil {
			v.t.Fatalf("list replays: %v", err)
		}
		out = append(out, page...)
		if len(page) < 3 {
			return out
		}
		after = &page[len(page)-1].ReplayID
	}
	v.t.Fatal("list replays did not end")
	return nil
}

// wantRecord checks that exactly one record is under id's key: id, about
// ino, written at now, with op.
func (v *env) wantRecord(id meta.ReplayID, op uint32, ino meta.Ino, now time.Time) {
	v.t.Helper()
	rs := v.replays(id.Key)
	if len(rs) != 1 {
		v.t.Fatalf("records under %x: %d, want 1: %+v", id.Key.Digest[:1], len(rs), rs)
	}
	r := rs[0]
	if r.ReplayID != id || r.Op != op || r.Ino != ino || !r.Time.Equal(now) {
		v.t.Fatalf("record = %+v, want id %+v op %d ino %d time %v", r, id, op, ino, now)
	}
}

func testReplayWritten(t *testing.T, v *env) {
	dir := v.create(meta.RootIno, "d", meta.TypeDirectory)
	f := v.create(dir.Ino, "f", meta.TypeRegular)

	// CREATE: the new inode.
	id := replayID(1, 1, 7, 1)
	ctx, w := withRecord(v.ctx, id, 6)
	now := v.tick()
	nd, _, err := v.e.Create(ctx, dir.Ino, "sub", meta.CreateArgs{Type: meta.TypeDirectory, Mode: 0o755}, now)
	if err != nil {
		t.Fatal(err)
	}
	v.wantRecord(id, 6, nd.Ino, now)
	if w.Record.Ino != nd.Ino || !w.Record.Time.Equal(now) {
		t.Fatalf("ReplayWrite not filled in: %+v", w.Record)
	}

	// LINK: the linked inode.
	id = replayID(1, 2, 7, 2)
	ctx, _ = withRecord(v.ctx, id, 11)
	now = v.tick()
	if _, _, err := v.e.Link(ctx, f.Ino, dir.Ino, "g", now); err != nil {
		t.Fatal(err)
	}
	v.wantRecord(id, 11, f.Ino, now)

	// RENAME: the inode moved.
	id = replayID(1, 3, 7, 3)
	ctx, _ = withRecord(v.ctx, id, 29)
	now = v.tick()
	if _, err := v.e.Rename(ctx, dir.Ino, "g", meta.RootIno, "h", now); err != nil {
		t.Fatal(err)
	}
	v.wantRecord(id, 29, f.Ino, now)

	// REMOVE: the inode removed, also when it is gone afterwards.
	id = replayID(1, 4, 7, 4)
	ctx, _ = withRecord(v.ctx, id, 28)
	now = v.tick()
	if _, _, err := v.e.Remove(ctx, dir.Ino, "sub", now); err != nil {
		t.Fatal(err)
	}
	v.wantRecord(id, 28, nd.Ino, now)

	// A second record under the same key (the same request carried out
	// twice) is kept apart.
	id2 := replayID(1, 4, 8, 1)
	ctx, _ = withRecord(v.ctx, id2, 28)
	if _, _, err := v.e.Remove(ctx, meta.RootIno, "h", v.tick()); err != nil {
		t.Fatal(err)
	}
	rs := v.replays(id.Key)
	if len(rs) != 2 || rs[0].ReplayID != id || rs[1].ReplayID != id2 || rs[1].Ino != f.Ino {
		t.Fatalf("records under one key: %+v", rs)
	}
	// Other methods called with the context write nothing.
	ctx, _ = withRecord(v.ctx, replayID(1, 9, 7, 9), 34)
	if _, err := v.e.SetAttr(ctx, f.Ino, meta.SetAttr{Mask: meta.SetMode, Mode: 0o600}, v.tick()); err != nil {
		t.Fatal(err)
	}
	if rs := v.replays(replayID(1, 9, 0, 0).Key); len(rs) != 0 {
		t.Fatalf("SetAttr wrote a record: %+v", rs)
	}
}

func testReplayFailed(t *testing.T, v *env) {
	dir := v.create(meta.RootIno, "d", meta.TypeDirectory)
	f := v.create(dir.Ino, "f", meta.TypeRegular)
	full := v.create(dir.Ino, "full", meta.TypeDirectory)
	v.create(full.Ino, "x", meta.TypeRegular)
	keep := replayID(2, 99, 7, 1)
	ctx0, _ := withRecord(v.ctx, keep, 6)
	if _, _, err := v.e.Create(ctx0, dir.Ino, "kept", meta.CreateArgs{Type: meta.TypeFIFO}, v.tick()); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		run  func(ctx context.Context) error
		want error
	}{
		{"CreateExists", func(ctx context.Context) error {
			_, _, err := v.e.Create(ctx, dir.Ino, "f", meta.CreateArgs{Type: meta.TypeRegular}, v.tick())
			return err
		}, meta.ErrExist},
		{"LinkExists", func(ctx context.Context) error {
			_, _, err := v.e.Link(ctx, f.Ino, dir.Ino, "f", v.tick())
			return err
		}, meta.ErrExist},
		{"RemoveMissing", func(ctx context.Context) error {
			_, _, err := v.e.Remove(ctx, dir.Ino, "nope", v.tick())
			return err
		}, meta.ErrNotFound},
		{"RemoveNotEmpty", func(ctx context.Context) error {
			_, _, err := v.e.Remove(ctx, dir.Ino, "full", v.tick())
			return err
		}, meta.ErrNotEmpty},
		{"RenameMissing", func(ctx context.Context) error {
			_, err := v.e.Rename(ctx, dir.Ino, "nope", dir.Ino, "x", v.tick())
			return err
		}, meta.ErrNotFound},
	}
	for i, tc := range tests {
		id := replayID(2, byte(i+1), 7, uint64(i+1))
		// A failed change deletes nothing either.
		ctx, _ := withRecord(v.ctx, id, 1, keep)
		wantErr(t, tc.name, tc.run(ctx), tc.want)
		if rs := v.replays(id.Key); len(rs) != 0 {
			t.Fatalf("%s: record written by a failed change: %+v", tc.name, rs)
		}
		if rs := v.replays(keep.Key); len(rs) != 1 {
			t.Fatalf("%s: a failed change dropped a record: %+v", tc.name, rs)
		}
	}
}

func testReplayDrop(t *testing.T, v *env) {
	var ids []meta.ReplayID
	for i := range 4 {
		id := replayID(3, byte(i), 7, uint64(i))
		ctx, _ := withRecord(v.ctx, id, 6)
		v.createCtx(ctx, meta.RootIno, fmt.Sprintf("f%d", i))
		ids = append(ids, id)
	}
	// A change with Op zero writes no record but drops the ones listed,
	// missing ones included.
	ctx := meta.WithReplay(v.ctx, &meta.ReplayWrite{Drop: []meta.ReplayID{ids[0], ids[2], replayID(9, 9, 9, 9)}})
	if _, _, err := v.e.Remove(ctx, meta.RootIno, "f3", v.tick()); err != nil {
		t.Fatal(err)
	}
	got := v.allReplays()
	if len(got) != 2 || got[0].ReplayID != ids[1] || got[1].ReplayID != ids[3] {
		t.Fatalf("after drop: %+v", got)
	}
}

func (v *env) createCtx(ctx context.Context, parent meta.Ino, name string) meta.Node {
	v.t.Helper()
	n, _, err := v.e.Create(ctx, parent, name, meta.CreateArgs{Type: meta.TypeRegular, Mode: 0o644}, v.tick())
	if err != nil {
		v.t.Fatalf("create %q: %v", name, err)
	}
	return n
}

func testReplayListExpire(t *testing.T, v *env) {
	wantErr(t, "list max 0", func() error { _, err := v.e.ListReplays(v.ctx, nil, 0); return err }(), meta.ErrInval)
	var ids []meta.ReplayID
	var times []time.Time
	for i := range 10 {
		// Owners in reverse so that key order differs from write order.
		id := replayID(byte(20-i), 1, 7, uint64(i))
		ctx, w := withRecord(v.ctx, id, 6)
		v.createCtx(ctx, meta.RootIno, fmt.Sprintf("f%d", i))
		ids = append(ids, id)
		times = append(times, w.Record.Time)
	}
	got := v.allReplays()
	if len(got) != 10 {
		t.Fatalf("listed %d records, want 10", len(got))
	}
	for i := range got {
		if got[i].ReplayID != ids[9-i] {
			t.Fatalf("record %d = %+v, want %+v", i, got[i].ReplayID, ids[9-i])
		}
	}
	if err := v.e.DeleteReplays(v.ctx, []meta.ReplayID{ids[0], ids[0], replayID(1, 1, 1, 1)}); err != nil {
		t.Fatal(err)
	}
	if got := v.allReplays(); len(got) != 9 || slices.ContainsFunc(got, func(r meta.ReplayRecord) bool { return r.ReplayID == ids[0] }) {
		t.Fatalf("after delete: %+v", got)
	}
	// Records written before times[5] go: ids 1 to 4.
	n, err := v.e.ExpireReplays(v.ctx, times[5])
	if err != nil || n != 4 {
		t.Fatalf("expire: %d, %v; want 4", n, err)
	}
	got = v.allReplays()
	if len(got) != 5 {
		t.Fatalf("after expiry: %d records, want 5: %+v", len(got), got)
	}
	for _, r := range got {
		if r.Time.Before(times[5]) {
			t.Fatalf("record %+v outlived its expiry", r)
		}
	}
	if n, err := v.e.ExpireReplays(v.ctx, times[5]); err != nil || n != 0 {
		t.Fatalf("second expire: %d, %v", n, err)
	}
}

func testReplayPersistence(t *testing.T, v *env) {
	id := replayID(4, 1, 7, 1)
	ctx, w := withRecord(v.ctx, id, 6)
	nd := v.createCtx(ctx, meta.RootIno, "f")
	v.reopen()
	v.wantRecord(id, 6, nd.Ino, w.Record.Time)
}

// testReplayLargest: the largest change (a RENAME across directories over
// a regular file whose last link it is) with a record and the most drops
// fits one transaction (etcd limits its operations), and a longer drop
// list is cut at meta.MaxReplayDrop.
func testReplayLargest(t *testing.T, v *env) {
	var ids []meta.ReplayID
	for i := range meta.MaxReplayDrop + 2 {
		id := replayID(5, byte(i), 7, uint64(i))
		ctx, _ := withRecord(v.ctx, id, 6)
		v.createCtx(ctx, meta.RootIno, fmt.Sprintf("f%d", i))
		ids = append(ids, id)
	}
	a := v.create(meta.RootIno, "a", meta.TypeDirectory)
	b := v.create(meta.RootIno, "b", meta.TypeDirectory)
	src := v.create(a.Ino, "src", meta.TypeRegular)
	v.create(b.Ino, "dst", meta.TypeRegular)
	rec := replayID(6, 1, 8, 1)
	ctx, _ := withRecord(v.ctx, rec, 29, ids...)
	rr, err := v.e.Rename(ctx, a.Ino, "src", b.Ino, "dst", v.tick())
	if err != nil {
		t.Fatalf("rename with a record and %d drops: %v", len(ids), err)
	}
	if rr.Replaced.Ino == 0 || rr.Replaced.Attr.Nlink != 0 {
		t.Fatalf("rename replaced %+v, want an orphan", rr.Replaced)
	}
	v.wantRecord(rec, 29, src.Ino, v.replays(rec.Key)[0].Time)
	got := v.allReplays()
	// The record, and the ids past MaxReplayDrop, stay.
	if len(got) != 3 {
		t.Fatalf("after the rename: %d records, want 3: %+v", len(got), got)
	}
	for _, r := range got {
		if r.ReplayID != rec && !slices.Contains(ids[meta.MaxReplayDrop:], r.ReplayID) {
			t.Fatalf("record %+v survived its drop", r.ReplayID)
		}
	}
}
