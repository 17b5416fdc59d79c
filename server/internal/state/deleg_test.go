package state

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/shoalfs/shoal/pnfs"
)

// delegClient is a client with a back channel bound, so it may get
// delegations.
func (h *harness) delegClient(owner string) (ClientID, *Session) {
	h.t.Helper()
	id, s := h.client(owner)
	return h.backChannel(id, s)
}

// backChannel binds a connection to both channels of s.
func (h *harness) backChannel(id ClientID, s *Session) (ClientID, *Session) {
	h.t.Helper()
	conn := new(int)
	if _, err := h.m.BindConnToSession(s.ID(), conn, ChannelBoth); err != nil {
		h.t.Fatalf("BindConnToSession: %v", err)
	}
	return id, s
}

// seq sends a SEQUENCE on slot 0 of s (renewing the lease) and completes it.
func (h *harness) seq(s *Session) SequenceResult {
	h.t.Helper()
	s.mu.Lock()
	next := s.slots[0].seq + 1
	s.mu.Unlock()
	res, err := h.m.Sequence(SequenceArgs{SessionID: s.ID(), SequenceID: next})
	if err != nil {
		h.t.Fatalf("Sequence: %v", err)
	}
	res.Slot.Complete(nil, false)
	return res
}

func (h *harness) delegate(c ClientID, f FileID, t DelegType, fallback bool) (DelegGrant, NoDelegReason) {
	h.t.Helper()
	g, why, err := h.m.Delegate(DelegArgs{ClientID: c, File: f, FH: []byte{byte(f)}, Type: t, Fallback: fallback})
	if err != nil {
		h.t.Fatalf("Delegate: %v", err)
	}
	return g, why
}

func TestDelegateRules(t *testing.T) {
	for _, tc := range []struct {
		name string
		// setup runs with client a (the one asking) and b (another).
		setup    func(h *harness, a, b ClientID)
		typ      DelegType
		fallback bool
		wantType DelegType
		why      NoDelegReason
	}{
		{"read, file unused", nil, DelegRead, false, DelegRead, 0},
		{"write, file unused", nil, DelegWrite, false, DelegWrite, 0},
		{"read, other reader", func(h *harness, a, b ClientID) { h.open(b, "o", 1, AccessRead, 0) }, DelegRead, false, DelegRead, 0},
		{"read, other writer", func(h *harness, a, b ClientID) { h.open(b, "o", 1, AccessWrite, 0) }, DelegRead, false, 0, NoDelegContention},
		{"read, own writer", func(h *harness, a, b ClientID) { h.open(a, "o", 1, AccessBoth, 0) }, DelegRead, false, DelegRead, 0},
		{"write, other reader", func(h *harness, a, b ClientID) { h.open(b, "o", 1, AccessRead, 0) }, DelegWrite, false, 0, NoDelegContention},
		{"write falls back to read", func(h *harness, a, b ClientID) { h.open(b, "o", 1, AccessRead, 0) }, DelegWrite, true, DelegRead, 0},
		{"read, other read deleg", func(h *harness, a, b ClientID) { h.delegate(b, 1, DelegRead, false) }, DelegRead, false, DelegRead, 0},
		{"write, other read deleg", func(h *harness, a, b ClientID) { h.delegate(b, 1, DelegRead, false) }, DelegWrite, false, 0, NoDelegContention},
		{"read, other write deleg", func(h *harness, a, b ClientID) { h.delegate(b, 1, DelegWrite, false) }, DelegRead, false, 0, NoDelegContention},
		{"upgrade", func(h *harness, a, b ClientID) { h.delegate(a, 1, DelegRead, false) }, DelegWrite, false, 0, NoDelegUpgrade},
		{"write held covers read", func(h *harness, a, b ClientID) { h.delegate(a, 1, DelegWrite, false) }, DelegRead, false, DelegWrite, 0},
		{"recall in progress", func(h *harness, a, b ClientID) {
			h.delegate(b, 1, DelegRead, false)
			if _, err := h.m.BreakDelegations(0, 1, true); !errors.Is(err, ErrDelay) {
				h.t.Fatalf("BreakDelegations: %v", err)
			}
		}, DelegRead, false, 0, NoDelegContention},
		{"operation under way", func(h *harness, a, b ClientID) {
			if _, err := h.m.BreakDelegations(b, 1, true); err != nil {
				h.t.Fatalf("BreakDelegations: %v", err)
			}
		}, DelegRead, false, 0, NoDelegContention},
		{"operation done", func(h *harness, a, b ClientID) {
			release, err := h.m.BreakDelegations(b, 1, true)
			if err != nil {
				h.t.Fatalf("BreakDelegations: %v", err)
			}
			release()
			release() // idempotent
		}, DelegRead, false, DelegRead, 0},
		{"recently recalled", func(h *harness, a, b ClientID) {
			g, _ := h.delegate(a, 1, DelegRead, false)
			_, _ = h.m.BreakDelegations(b, 1, true)
			wantErr(h.t, "DelegReturn", h.m.DelegReturn(a, g.Stateid, 1), nil)
		}, DelegRead, false, 0, NoDelegContention},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			a, _ := h.delegClient("a")
			b, _ := h.delegClient("b")
			if tc.setup != nil {
				tc.setup(h, a, b)
			}
			g, why := h.delegate(a, 1, tc.typ, tc.fallback)
			if g.Type != tc.wantType || why != tc.why {
				t.Fatalf("Delegate: %v (why %d), want %v (why %d)", g.Type, why, tc.wantType, tc.why)
			}
		})
	}
}

func TestDelegateNeedsCallbackPath(t *testing.T) {
	h := newHarness(t)
	a, _ := h.client("a") // no back channel
	if g, why := h.delegate(a, 1, DelegRead, false); g.Type != 0 || why != NoDelegResource {
		t.Fatalf("no back channel: %v %d", g.Type, why)
	}
	b, s := h.delegClient("b")
	s.SetCallbackFailed(true)
	if g, why := h.delegate(b, 1, DelegRead, false); g.Type != 0 || why != NoDelegResource {
		t.Fatalf("failed back channel: %v %d", g.Type, why)
	}
}

// TestDelegRecallRevoke: a conflict starts the recall, the conflicting
// operation is held back, and Sweep revokes the delegation a lease later.
func TestDelegRecallRevoke(t *testing.T) {
	h := newHarness(t)
	var revoked []DelegHolder
	h.m.onRevokeDeleg = func(d DelegHolder) { revoked = append(revoked, d) }
	a, sa := h.delegClient("a")
	b, sb := h.delegClient("b")
	h.open(a, "o", 1, AccessRead, 0)
	g, _ := h.delegate(a, 1, DelegRead, false)
	// A reader from b does not conflict.
	h.open(b, "r", 1, AccessRead, 0)
	_, err := h.m.Open(OpenArgs{ClientID: b, Owner: []byte("w"), File: 1, Access: AccessWrite})
	var re *RecallError
	if !errors.As(err, &re) || len(re.Holders) != 1 || re.Holders[0].Stateid != g.Stateid || re.Holders[0].ClientID != a {
		t.Fatalf("Open for write: %v, want a recall of %v", err, g.Stateid)
	}
	// Retried within a second: still held back, no resend.
	_, err = h.m.Open(OpenArgs{ClientID: b, Owner: []byte("w"), File: 1, Access: AccessWrite})
	if !errors.As(err, &re) || len(re.Holders) != 0 {
		t.Fatalf("retry: %v", err)
	}
	// The holder may still read under it while it is being recalled.
	wantErr(t, "CheckIO", h.m.CheckIO(a, g.Stateid, 1, false), nil)
	for range 5 {
		h.clock.Advance(testLease / 4)
		h.seq(sa)
		h.seq(sb)
		h.m.Sweep(context.Background())
	}
	if len(revoked) != 1 {
		t.Fatalf("revoked %v", revoked)
	}
	h.open(b, "w", 1, AccessWrite, 0)
	wantErr(t, "CheckIO", h.m.CheckIO(a, g.Stateid, 1, false), ErrDelegRevoked)
	wantErr(t, "DelegReturn", h.m.DelegReturn(a, g.Stateid, 1), ErrDelegRevoked)
	if errs := h.m.TestStateid(a, []Stateid{g.Stateid}); !errors.Is(errs[0], ErrDelegRevoked) {
		t.Fatalf("TestStateid: %v", errs)
	}
	if res := h.seq(sa); !res.DelegRevoked {
		t.Fatalf("Sequence: %+v, want DelegRevoked", res)
	}
	wantErr(t, "DestroyClientID", h.m.DestroyClientID(context.Background(), a), ErrClientidBusy)
	wantErr(t, "FreeStateid", h.m.FreeStateid(a, g.Stateid), nil)
	if h.seq(sa).DelegRevoked {
		t.Fatal("DelegRevoked after FREE_STATEID")
	}
	if n := h.m.Delegations(); n != 0 {
		t.Fatalf("%d delegations outstanding", n)
	}
}

// TestDelegExpiry: a client whose lease runs out loses its delegations;
// their stateids then read as expired.
func TestDelegExpiry(t *testing.T) {
	h := newHarness(t)
	a, _ := h.delegClient("a")
	g, _ := h.delegate(a, 1, DelegWrite, false)
	h.clock.Advance(testLease + time.Second)
	h.m.Sweep(context.Background())
	if n := h.m.Delegations(); n != 0 {
		t.Fatalf("%d delegations after expiry", n)
	}
	b, _ := h.delegClient("b")
	release, err := h.m.BreakDelegations(b, 1, true)
	wantErr(t, "Break", err, nil)
	release()
	if _, err := h.m.CheckIOAny(g.Stateid, 1, false); !errors.Is(err, pnfs.ErrExpired) {
		t.Fatalf("CheckIOAny: %v, want pnfs.ErrExpired", err)
	}
}

// TestDelegIO: which I/O a delegation stateid allows, on the MDS and on
// data servers (CheckIOAny).
func TestDelegIO(t *testing.T) {
	h := newHarness(t)
	a, _ := h.delegClient("a")
	b, _ := h.delegClient("b")
	r, _ := h.delegate(a, 1, DelegRead, false)
	w, _ := h.delegate(a, 2, DelegWrite, false)
	for _, tc := range []struct {
		name  string
		c     ClientID
		sid   Stateid
		file  FileID
		write bool
		want  error
	}{
		{"read under read", a, r.Stateid, 1, false, nil},
		{"write under read", a, r.Stateid, 1, true, pnfs.ErrOpenMode},
		{"write under write", a, w.Stateid, 2, true, nil},
		{"another file", a, w.Stateid, 1, false, pnfs.ErrBadStateid},
		{"another client", b, w.Stateid, 2, false, pnfs.ErrBadStateid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantErr(t, "CheckIO", h.m.CheckIO(tc.c, tc.sid, tc.file, tc.write), tc.want)
			if tc.c == a {
				owner, err := h.m.CheckIOAny(tc.sid, tc.file, tc.write)
				wantErr(t, "CheckIOAny", err, tc.want)
				if err == nil && owner != a {
					t.Fatalf("CheckIOAny owner %v, want %v", owner, a)
				}
			}
		})
	}
	wantErr(t, "DelegReturn", h.m.DelegReturn(a, w.Stateid, 2), nil)
	if _, err := h.m.CheckIOAny(w.Stateid, 2, true); !errors.Is(err, pnfs.ErrBadStateid) {
		t.Fatalf("CheckIOAny of a returned delegation: %v", err)
	}
}

// TestReclaimDelegation: during grace a previous client gets the
// delegation it names back; one that conflicts with another client's
// reclaimed open comes with the recall flag, and outside grace there is
// nothing to reclaim.
func TestReclaimDelegation(t *testing.T) {
	h := newHarness(t)
	h.delegClient("a")
	h.delegClient("b")
	h.restart(2)
	a, _ := h.backChannel(h.returning("a"))
	b, _ := h.backChannel(h.returning("b"))
	if _, err := h.m.Open(OpenArgs{ClientID: b, Owner: []byte("o"), File: 1, Access: AccessRead, Reclaim: true}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		file       FileID
		typ        DelegType
		force      bool
		wantRecall bool
	}{
		{2, DelegWrite, false, false},
		{3, DelegRead, true, true},   // the server grants no delegations now
		{1, DelegWrite, false, true}, // b reclaimed a read open of file 1
		{1, DelegWrite, false, true}, // asked again: the same one, still being recalled
	} {
		g, recall, err := h.m.ReclaimDelegation(DelegArgs{ClientID: a, File: tc.file, Type: tc.typ}, tc.force)
		if err != nil || g.Type != tc.typ || recall != tc.wantRecall {
			t.Fatalf("file %d: %+v recall=%v %v, want %v recall=%v", tc.file, g, recall, err, tc.typ, tc.wantRecall)
		}
	}
	wantErr(t, "ReclaimComplete", h.m.ReclaimComplete(a, false), nil)
	if _, _, err := h.m.ReclaimDelegation(DelegArgs{ClientID: a, File: 4, Type: DelegRead}, false); !errors.Is(err, ErrNoGrace) {
		t.Fatalf("reclaim after RECLAIM_COMPLETE: %v", err)
	}
}

// BenchmarkBreakDelegations marks conflicting operations on ever new
// files, as a burst of creates and removes does: the per-file marks kept
// for DelegArgs.Since must not make each mark cost a scan of all of them.
func BenchmarkBreakDelegations(b *testing.B) {
	m, err := NewManager(context.Background(), Config{Epoch: 1, LeaseTime: time.Minute, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for i := range b.N {
		release, err := m.BreakDelegations(ClientID(1), FileID(i), true)
		if err != nil {
			b.Fatal(err)
		}
		if release != nil {
			release()
		}
	}
}
