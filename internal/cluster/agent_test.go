package cluster

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"syscall"
	"testing"
	"time"

	"github.com/shoalfs/shoal/pnfs"
)

func sid(seq uint32, other byte) [16]byte {
	var s [16]byte
	s[0], s[1], s[2], s[3] = byte(seq>>24), byte(seq>>16), byte(seq>>8), byte(seq)
	for i := 4; i < 16; i++ {
		s[i] = other
	}
	return s
}

func TestCheckStateid(t *testing.T) {
	tc := newCluster(t, 2)
	a := tc.agents[0]
	a.mu.Lock()
	a.ttl = time.Hour // caching must not depend on the test's speed
	a.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()

	good, other := sid(1, 0xA1), sid(1, 0xB2)
	tc.checker.set(good, 100, nil)
	tc.checker.set(other, 200, nil)
	tc.checker.set(sid(1, 0xC3), 0, pnfs.ErrExpired)
	tc.checker.set(sid(1, 0xC4), 0, pnfs.ErrOpenMode)
	tc.checker.set(sid(1, 0xC5), 0, pnfs.ErrOldStateid)
	tc.checker.set(sid(1, 0xC6), 0, pnfs.ErrStaleStateid)
	tc.checker.set(sid(1, 0xC7), 0, errors.New("checker broke"))

	for _, tt := range []struct {
		name string
		sid  [16]byte
		want error
	}{
		{"valid", good, nil},
		{"unknown", sid(1, 0xFF), pnfs.ErrBadStateid},
		{"expired", sid(1, 0xC3), pnfs.ErrExpired},
		{"open mode", sid(1, 0xC4), pnfs.ErrOpenMode},
		{"old", sid(1, 0xC5), pnfs.ErrOldStateid},
		{"stale", sid(1, 0xC6), pnfs.ErrStaleStateid},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if err := a.CheckStateid(ctx, 9, tt.sid, true); !errors.Is(err, tt.want) {
				t.Errorf("CheckStateid = %v, want %v", err, tt.want)
			}
		})
	}
	if err := a.CheckStateid(ctx, 9, sid(1, 0xC7), true); err == nil {
		t.Error("a checker failure was reported as success")
	}

	// Caching: the same (other, ino, write) does not ask again, even with
	// another seqid; a different ino or access mode does.
	calls := tc.checker.calls.Load()
	for range 3 {
		if err := a.CheckStateid(ctx, 9, sid(2, 0xA1), true); err != nil {
			t.Fatal(err)
		}
	}
	if got := tc.checker.calls.Load(); got != calls {
		t.Errorf("cached answer asked the MDS %d more times", got-calls)
	}
	if err := a.CheckStateid(ctx, 9, good, false); err != nil {
		t.Fatal(err)
	}
	if err := a.CheckStateid(ctx, 10, good, true); err != nil {
		t.Fatal(err)
	}
	if got := tc.checker.calls.Load(); got != calls+2 {
		t.Errorf("MDS asked %d times for two new keys", got-calls)
	}
	if st := a.Stats(); st.StateidCacheHits != 3 {
		t.Errorf("stats %+v", st)
	}
	// Negative answers are not cached.
	calls = tc.checker.calls.Load()
	a.CheckStateid(ctx, 9, sid(1, 0xFF), true)
	a.CheckStateid(ctx, 9, sid(1, 0xFF), true)
	if got := tc.checker.calls.Load(); got != calls+2 {
		t.Errorf("negative answer cached")
	}

	// Fence: cached entries of client 100 go, its I/O is refused on every
	// DS; client 200 is unaffected.
	if err := a.CheckStateid(ctx, 9, other, true); err != nil {
		t.Fatal(err)
	}
	if err := tc.reg.Fence(ctx, 100); err != nil {
		t.Fatal(err)
	}
	for _, ag := range tc.agents {
		if err := ag.CheckStateid(ctx, 9, good, true); !errors.Is(err, pnfs.ErrFenced) {
			t.Errorf("%s: fenced client's check = %v", ag.cfg.ID, err)
		}
	}
	calls = tc.checker.calls.Load()
	if err := a.CheckStateid(ctx, 9, other, true); err != nil {
		t.Errorf("other client after fence: %v", err)
	}
	if got := tc.checker.calls.Load(); got != calls {
		t.Errorf("fence dropped another client's cache entry")
	}

	// A DS that registers while the fence is up learns of it.
	late := tc.addAgent("late")
	if err := late.CheckStateid(ctx, 9, good, false); !errors.Is(err, pnfs.ErrFenced) {
		t.Errorf("late DS: fenced client's check = %v", err)
	}
	// So does a DS that re-registers.
	b := tc.agents[1]
	agentConn(b).Close()
	tc.nextEvent(Left, b.cfg.ID)
	tc.nextEvent(Joined, b.cfg.ID)
	eventually(t, "re-registered agent to be connected", func() bool { return agentConn(b) != nil })
	if err := b.CheckStateid(ctx, 9, good, false); !errors.Is(err, pnfs.ErrFenced) {
		t.Errorf("re-registered DS: fenced client's check = %v", err)
	}

	if err := tc.reg.Unfence(ctx, 100); err != nil {
		t.Fatal(err)
	}
	for _, ag := range tc.agents {
		if err := ag.CheckStateid(ctx, 9, good, true); err != nil {
			t.Errorf("%s: unfenced client's check = %v", ag.cfg.ID, err)
		}
	}
}

// TestFileSize: a data server asks the MDS for a file's size (FILE_SIZE),
// and gets the MDS's errors back as the same kinds.
func TestFileSize(t *testing.T) {
	sizes := map[uint64]uint64{1: 0, 2: 12345, 3: 1<<63 - 1}
	tc := newClusterWith(t, 1, &testCluster{fileSize: func(_ context.Context, ino uint64) (uint64, error) {
		switch ino {
		case 10:
			return 0, fmt.Errorf("no inode %d: %w", ino, fs.ErrNotExist)
		case 11:
			return 0, fmt.Errorf("metadata busy: %w", pnfs.ErrUnavailable)
		case 12:
			return 0, errors.New("metadata broke")
		}
		return sizes[ino], nil
	}})
	a := tc.agents[0]
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	for _, tt := range []struct {
		name string
		ino  uint64
		want uint64
		err  error
	}{
		{"empty", 1, 0, nil},
		{"some", 2, 12345, nil},
		{"largest", 3, 1<<63 - 1, nil},
		{"no such file", 10, 0, fs.ErrNotExist},
		{"retry later", 11, 0, pnfs.ErrUnavailable},
		{"failure", 12, 0, syscall.EIO},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := a.FileSize(ctx, tt.ino)
			if got != tt.want || !errors.Is(err, tt.err) || (tt.err == nil) != (err == nil) {
				t.Errorf("FileSize(%d) = %d, %v; want %d, %v", tt.ino, got, err, tt.want, tt.err)
			}
		})
	}

	// A registry that cannot tell asks the DS to retry.
	noSizes := newCluster(t, 1)
	if _, err := noSizes.agents[0].FileSize(ctx, 1); !errors.Is(err, pnfs.ErrUnavailable) {
		t.Errorf("FileSize from a registry without FileSize = %v", err)
	}
	// An agent without an MDS sends the client to the MDS instead.
	noSizes.reg.Close()
	b := noSizes.agents[0]
	eventually(t, "agent to notice the MDS is gone", func() bool { return agentConn(b) == nil })
	if _, err := b.FileSize(ctx, 1); !errors.Is(err, pnfs.ErrMDSUnreachable) || errors.Is(err, pnfs.ErrUnavailable) {
		t.Errorf("FileSize without an MDS = %v, want pnfs.ErrMDSUnreachable", err)
	}
}
