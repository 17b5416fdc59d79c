package state

import (
	"errors"
	"testing"
	"time"

	"github.com/shoalfs/shoal/pnfs"
)

func TestLayoutLifecycle(t *testing.T) {
	h := newHarness(t)
	m := h.m
	c, _ := h.client("c1")
	o := h.open(c, "o1", 7, AccessBoth, DenyNone)
	ls, err := m.LayoutGet(c, o, 7, IOModeRW)
	if err != nil || ls.Seqid != 1 || ls.Type() != TypeLayout {
		t.Fatalf("first LayoutGet = %v, %v", ls, err)
	}
	ls2, err := m.LayoutGet(c, ls, 7, IOModeRW)
	if err != nil || ls2.Seqid != 2 || ls2.Other != ls.Other {
		t.Fatalf("second LayoutGet = %v, %v", ls2, err)
	}
	// A LAYOUTGET sent in parallel with the second carries the seqid
	// both started from: it is processed too (RFC 8881 §12.5.3).
	ls3, err := m.LayoutGet(c, ls, 7, IOModeRW)
	if err != nil || ls3.Seqid != 3 || ls3.Other != ls.Other {
		t.Fatalf("LayoutGet with an older seqid = %v, %v", ls3, err)
	}
	future := ls3
	future.Seqid++
	if _, err := m.LayoutGet(c, future, 7, IOModeRW); !errors.Is(err, pnfs.ErrBadStateid) {
		t.Fatalf("layout seqid not issued yet: %v", err)
	}
	if errs := m.TestStateid(c, []Stateid{ls3}); errs[0] != nil {
		t.Fatalf("TestStateid(layout) = %v", errs[0])
	}
	holders := m.BeginRecall(7)
	if len(holders) != 1 || holders[0].ClientID != c || holders[0].Stateid.Seqid != 4 {
		t.Fatalf("BeginRecall = %+v", holders)
	}
	if _, err := m.LayoutGet(c, o, 7, IOModeRW); !errors.Is(err, ErrRecallConflict) {
		t.Fatalf("LayoutGet during own recall: %v", err)
	}
	c2, _ := h.client("c2")
	o2 := h.open(c2, "o2", 7, AccessRead, DenyNone)
	if _, err := m.LayoutGet(c2, o2, 7, IOModeRead); !errors.Is(err, ErrLayoutTryLater) {
		t.Fatalf("LayoutGet during other's recall: %v", err)
	}
	if m.Recalled(7) {
		t.Fatal("recalled before return")
	}
	if _, present, err := m.LayoutReturnFile(c, holders[0].Stateid, 7); err != nil || present {
		t.Fatalf("LayoutReturnFile = %v, %v", present, err)
	}
	if !m.Recalled(7) {
		t.Fatal("layout still outstanding after return")
	}
	if _, err := m.LayoutGet(c2, o2, 7, IOModeRead); err != nil {
		t.Fatalf("LayoutGet after recall: %v", err)
	}
}

func TestLayoutRecallTimeoutRevokes(t *testing.T) {
	h := newHarness(t)
	m := h.m
	c, _ := h.client("c1")
	o := h.open(c, "o1", 9, AccessRead, DenyNone)
	if _, err := m.LayoutGet(c, o, 9, IOModeRead); err != nil {
		t.Fatal(err)
	}
	m.BeginRecall(9)
	h.clock.Advance(m.LeaseTime() / 2)
	m.Renew(c)
	m.Sweep(t.Context())
	if m.Recalled(9) || len(h.revoked) != 0 {
		t.Fatal("revoked before the deadline")
	}
	h.clock.Advance(m.LeaseTime()/2 + time.Second)
	m.Renew(c)
	m.Sweep(t.Context())
	if !m.Recalled(9) || len(h.revoked) != 1 || h.revoked[0] != c {
		t.Fatalf("after deadline: recalled=%v revoked=%v", m.Recalled(9), h.revoked)
	}
}

func TestCheckIOAny(t *testing.T) {
	h := newHarness(t)
	c, _ := h.client("c1")
	o := h.open(c, "o1", 5, AccessRead, DenyNone)
	if id, err := h.m.CheckIOAny(o, 5, false); err != nil || id != c {
		t.Fatalf("CheckIOAny read = %v, %v", id, err)
	}
	if _, err := h.m.CheckIOAny(o, 5, true); !errors.Is(err, pnfs.ErrOpenMode) {
		t.Fatalf("CheckIOAny write on read open: %v", err)
	}
	if _, err := h.m.CheckIOAny(AnonymousStateid, 5, false); !errors.Is(err, pnfs.ErrBadStateid) {
		t.Fatalf("anonymous: %v", err)
	}
}

// TestHasWriteOpen pins the query LAYOUTCOMMIT relies on to accept a layout
// stateid of an earlier boot: only an open with write access, of this
// client, of this file counts.
func TestHasWriteOpen(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(h *harness, c, other ClientID)
		want  bool
	}{
		{"no open", func(*harness, ClientID, ClientID) {}, false},
		{"read open", func(h *harness, c, _ ClientID) { h.open(c, "o", 1, AccessRead, DenyNone) }, false},
		{"write open", func(h *harness, c, _ ClientID) { h.open(c, "o", 1, AccessWrite, DenyNone) }, true},
		{"read and write open", func(h *harness, c, _ ClientID) { h.open(c, "o", 1, AccessBoth, DenyNone) }, true},
		{"write open by a second owner", func(h *harness, c, _ ClientID) {
			h.open(c, "r", 1, AccessRead, DenyNone)
			h.open(c, "w", 1, AccessWrite, DenyNone)
		}, true},
		{"write open of another file", func(h *harness, c, _ ClientID) { h.open(c, "o", 2, AccessBoth, DenyNone) }, false},
		{"write open of another client", func(h *harness, _, other ClientID) { h.open(other, "o", 1, AccessBoth, DenyNone) }, false},
		{"downgraded to read", func(h *harness, c, _ ClientID) {
			h.open(c, "o", 1, AccessRead, DenyNone)
			sid := h.open(c, "o", 1, AccessWrite, DenyNone)
			if _, err := h.m.OpenDowngrade(c, sid, AccessRead, DenyNone); err != nil {
				h.t.Fatalf("OpenDowngrade: %v", err)
			}
		}, false},
		{"closed", func(h *harness, c, _ ClientID) {
			sid := h.open(c, "o", 1, AccessBoth, DenyNone)
			if _, err := h.m.Close(c, sid); err != nil {
				h.t.Fatalf("Close: %v", err)
			}
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			c, _ := h.client("c")
			other, _ := h.client("other")
			tc.setup(h, c, other)
			if got := h.m.HasWriteOpen(c, 1); got != tc.want {
				t.Fatalf("HasWriteOpen = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestLayoutOfEarlierBootAndReclaimedOpen follows the state of a client
// whose layout outlived a restart: the old layout stateid is stale (not
// bad), and once the client reclaims its open it holds a write open again.
func TestLayoutOfEarlierBootAndReclaimedOpen(t *testing.T) {
	h := newHarness(t)
	c, _ := h.client("c")
	o := h.open(c, "o", 7, AccessBoth, DenyNone)
	ls, err := h.m.LayoutGet(c, o, 7, IOModeRW)
	if err != nil {
		t.Fatal(err)
	}
	h.restart(2)
	c2, _ := h.returning("c")
	wantErr(t, "layout stateid of the previous boot", h.m.TestStateid(c2, []Stateid{ls})[0], pnfs.ErrStaleStateid)
	if h.m.HasWriteOpen(c2, 7) {
		t.Fatal("write open before the reclaim")
	}
	r, err := h.m.Open(OpenArgs{ClientID: c2, Owner: []byte("o"), File: 7, Access: AccessBoth, Reclaim: true})
	if err != nil {
		t.Fatalf("reclaim: %v", err)
	}
	if !h.m.HasWriteOpen(c2, 7) {
		t.Fatal("no write open after the reclaim")
	}
	// A layout of this boot that was returned is unknown, not stale.
	ls2, err := h.m.LayoutGet(c2, r.Stateid, 7, IOModeRW)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := h.m.LayoutReturnFile(c2, ls2, 7); err != nil {
		t.Fatal(err)
	}
	wantErr(t, "returned layout stateid", h.m.TestStateid(c2, []Stateid{ls2})[0], pnfs.ErrBadStateid)
}

// TestCheckLayoutCommit pins which stateids may grow a file through
// LAYOUTCOMMIT: only the client's own layout stateid of that file, granted
// for read/write, with a current (or zero) seqid.
func TestCheckLayoutCommit(t *testing.T) {
	const file, other FileID = 1, 2
	// setup returns the stateid to commit with on file.
	for _, tc := range []struct {
		name  string
		setup func(h *harness, c, c2 ClientID) Stateid
		want  error
	}{
		{"rw layout", func(h *harness, c, _ ClientID) Stateid {
			return h.layout(c, h.open(c, "o", file, AccessBoth, DenyNone), file, IOModeRW)
		}, nil},
		{"rw layout, seqid 0", func(h *harness, c, _ ClientID) Stateid {
			ls := h.layout(c, h.open(c, "o", file, AccessBoth, DenyNone), file, IOModeRW)
			ls.Seqid = 0
			return ls
		}, nil},
		{"read layout upgraded to rw", func(h *harness, c, _ ClientID) Stateid {
			ls := h.layout(c, h.open(c, "o", file, AccessBoth, DenyNone), file, IOModeRead)
			return h.layout(c, ls, file, IOModeRW)
		}, nil},
		{"rw layout being recalled", func(h *harness, c, _ ClientID) Stateid {
			h.layout(c, h.open(c, "o", file, AccessBoth, DenyNone), file, IOModeRW)
			return h.m.BeginRecall(file)[0].Stateid
		}, nil},
		// An older seqid names the same layout (checkLayoutSeqid: the
		// Linux client may not have seen a LAYOUTGET's).
		{"old seqid", func(h *harness, c, _ ClientID) Stateid {
			ls := h.layout(c, h.open(c, "o", file, AccessBoth, DenyNone), file, IOModeRW)
			h.layout(c, ls, file, IOModeRW)
			return ls
		}, nil},
		{"seqid never issued", func(h *harness, c, _ ClientID) Stateid {
			ls := h.layout(c, h.open(c, "o", file, AccessBoth, DenyNone), file, IOModeRW)
			ls.Seqid++
			return ls
		}, pnfs.ErrBadStateid},
		{"open stateid", func(h *harness, c, _ ClientID) Stateid {
			o := h.open(c, "o", file, AccessBoth, DenyNone)
			h.layout(c, o, file, IOModeRW)
			return o
		}, ErrBadLayout},
		{"lock stateid", func(h *harness, c, _ ClientID) Stateid {
			o := h.open(c, "o", file, AccessBoth, DenyNone)
			h.layout(c, o, file, IOModeRW)
			lk, err := h.m.Lock(LockArgs{ClientID: c, Type: WriteLock, Length: LengthToEOF,
				NewLockOwner: true, OpenStateid: o, LockOwner: []byte("lo")})
			if err != nil {
				h.t.Fatalf("Lock: %v", err)
			}
			return lk
		}, ErrBadLayout},
		{"delegation-type stateid", func(h *harness, c, _ ClientID) Stateid {
			o := h.open(c, "o", file, AccessBoth, DenyNone)
			h.layout(c, o, file, IOModeRW)
			o.Other[4] = byte(TypeDeleg)
			return o
		}, ErrBadLayout},
		{"anonymous stateid", func(h *harness, c, _ ClientID) Stateid {
			h.layout(c, h.open(c, "o", file, AccessBoth, DenyNone), file, IOModeRW)
			return AnonymousStateid
		}, ErrBadLayout},
		{"read bypass stateid", func(h *harness, c, _ ClientID) Stateid {
			h.layout(c, h.open(c, "o", file, AccessBoth, DenyNone), file, IOModeRW)
			return ReadBypassStateid
		}, ErrBadLayout},
		{"layout of another file", func(h *harness, c, _ ClientID) Stateid {
			h.layout(c, h.open(c, "o", file, AccessBoth, DenyNone), file, IOModeRW)
			return h.layout(c, h.open(c, "o", other, AccessBoth, DenyNone), other, IOModeRW)
		}, ErrBadLayout},
		{"layout of another client", func(h *harness, c, c2 ClientID) Stateid {
			h.layout(c, h.open(c, "o", file, AccessBoth, DenyNone), file, IOModeRW)
			return h.layout(c2, h.open(c2, "o", file, AccessBoth, DenyNone), file, IOModeRW)
		}, ErrBadLayout},
		{"read-only layout", func(h *harness, c, _ ClientID) Stateid {
			return h.layout(c, h.open(c, "o", file, AccessBoth, DenyNone), file, IOModeRead)
		}, ErrBadLayout},
		{"rw layout asked under a read open", func(h *harness, c, _ ClientID) Stateid {
			return h.layout(c, h.open(c, "o", file, AccessRead, DenyNone), file, IOModeRW)
		}, ErrBadLayout},
		{"returned layout", func(h *harness, c, _ ClientID) Stateid {
			ls := h.layout(c, h.open(c, "o", file, AccessBoth, DenyNone), file, IOModeRW)
			if _, _, err := h.m.LayoutReturnFile(c, ls, file); err != nil {
				h.t.Fatalf("LayoutReturnFile: %v", err)
			}
			return ls
		}, ErrBadLayout},
		{"returned with LAYOUTRETURN4_ALL", func(h *harness, c, _ ClientID) Stateid {
			ls := h.layout(c, h.open(c, "o", file, AccessBoth, DenyNone), file, IOModeRW)
			if err := h.m.LayoutReturnAll(c); err != nil {
				h.t.Fatalf("LayoutReturnAll: %v", err)
			}
			return ls
		}, ErrBadLayout},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			c, _ := h.client("c")
			c2, _ := h.client("c2")
			sid := tc.setup(h, c, c2)
			wantErr(t, "CheckLayoutCommit", h.m.CheckLayoutCommit(c, sid, file), tc.want)
		})
	}
}

// TestCheckLayoutCommitEarlierBoot: any stateid of an earlier boot is stale
// (not bad), so the server can apply its restart policy to layout stateids.
func TestCheckLayoutCommitEarlierBoot(t *testing.T) {
	h := newHarness(t)
	c, _ := h.client("c")
	o := h.open(c, "o", 7, AccessBoth, DenyNone)
	ls := h.layout(c, o, 7, IOModeRW)
	h.restart(2)
	c2, _ := h.client("c")
	wantErr(t, "layout stateid of the previous boot", h.m.CheckLayoutCommit(c2, ls, 7), pnfs.ErrStaleStateid)
	wantErr(t, "open stateid of the previous boot", h.m.CheckLayoutCommit(c2, o, 7), pnfs.ErrStaleStateid)
	wantErr(t, "anonymous stateid", h.m.CheckLayoutCommit(c2, AnonymousStateid, 7), ErrBadLayout)
}

// layout runs LayoutGet and fails the test on error.
func (h *harness) layout(c ClientID, sid Stateid, f FileID, iomode uint32) Stateid {
	h.t.Helper()
	ls, err := h.m.LayoutGet(c, sid, f, iomode)
	if err != nil {
		h.t.Fatalf("LayoutGet: %v", err)
	}
	return ls
}

// TestRecallAllKeepsSeqid: a LAYOUTRECALL4_ALL carries no stateid, so the
// client keeps using the seqid it has; the recall must not move it, or the
// client's LAYOUTCOMMIT and LAYOUTRETURN get NFS4ERR_OLD_STATEID.
func TestRecallAllKeepsSeqid(t *testing.T) {
	h := newHarness(t)
	m := h.m
	c, _ := h.client("c1")
	o := h.open(c, "o1", 7, AccessBoth, DenyNone)
	ls, err := m.LayoutGet(c, o, 7, IOModeRW)
	if err != nil {
		t.Fatal(err)
	}
	holders := m.BeginRecallAll()
	if len(holders) != 1 || holders[0].Stateid != ls {
		t.Fatalf("BeginRecallAll = %+v, want the layout stateid %v unchanged", holders, ls)
	}
	if err := m.CheckLayoutCommit(c, ls, 7); err != nil {
		t.Fatalf("LAYOUTCOMMIT under the client's seqid during a recall of all layouts: %v", err)
	}
	if _, _, err := m.LayoutReturnFile(c, ls, 7); err != nil {
		t.Fatalf("LAYOUTRETURN under the client's seqid: %v", err)
	}
	if !m.Recalled(7) {
		t.Fatal("layout outstanding after its return")
	}
}

// TestLayoutsGone: the channel is closed at once when no layout of the
// file is out, and otherwise when the last one goes, however it goes.
func TestLayoutsGone(t *testing.T) {
	closed := func(ch <-chan struct{}) bool {
		select {
		case <-ch:
			return true
		default:
			return false
		}
	}
	for _, tc := range []struct {
		name string
		drop func(m *Manager, c ClientID, ls Stateid)
	}{
		{"returned", func(m *Manager, c ClientID, ls Stateid) {
			if _, _, err := m.LayoutReturnFile(c, ls, 7); err != nil {
				t.Fatal(err)
			}
		}},
		{"no-matching-layout", func(m *Manager, c ClientID, _ Stateid) { m.RecallNoMatch(c, 7) }},
		{"return-all", func(m *Manager, c ClientID, _ Stateid) {
			if err := m.LayoutReturnAll(c); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			m := h.m
			if !closed(m.LayoutsGone(7)) {
				t.Fatal("open channel for a file without layouts")
			}
			c1, _ := h.client("c1")
			c2, _ := h.client("c2")
			ls1, err := m.LayoutGet(c1, h.open(c1, "o1", 7, AccessRead, DenyNone), 7, IOModeRead)
			if err != nil {
				t.Fatal(err)
			}
			ls2, err := m.LayoutGet(c2, h.open(c2, "o2", 7, AccessRead, DenyNone), 7, IOModeRead)
			if err != nil {
				t.Fatal(err)
			}
			gone := m.LayoutsGone(7)
			if closed(gone) {
				t.Fatal("closed with two layouts out")
			}
			tc.drop(m, c1, ls1)
			if closed(gone) {
				t.Fatal("closed with one layout still out")
			}
			tc.drop(m, c2, ls2)
			if !closed(gone) {
				t.Fatal("not closed after the last layout went")
			}
		})
	}
}
