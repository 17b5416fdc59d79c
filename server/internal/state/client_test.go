package state

import (
	"context"
	"slices"
	"testing"

	"github.com/shoalfs/shoal/pnfs"
)

func TestExchangeIDCases(t *testing.T) {
	ctx := context.Background()
	v1, v2 := [8]byte{1}, [8]byte{2}
	type step struct {
		args ExchangeIDArgs
		// confirm runs CREATE_SESSION after this step.
		confirm bool
		// withState opens a file after confirming.
		withState bool
		// expire lets the lease run out after this step.
		expire  bool
		wantErr error
		// sameAs: index of an earlier step whose client ID must be returned
		// (-1: must be new).
		sameAs        int
		wantConfirmed bool
	}
	ex := func(owner string, v [8]byte, p string) ExchangeIDArgs {
		return ExchangeIDArgs{OwnerID: []byte(owner), Verifier: v, Principal: p}
	}
	upd := func(a ExchangeIDArgs) ExchangeIDArgs { a.Update = true; return a }
	tests := []struct {
		name  string
		steps []step
	}{
		{"case1 new owner", []step{{args: ex("a", v1, "p"), sameAs: -1}}},
		{"case2 same owner verifier principal", []step{
			{args: ex("a", v1, "p"), confirm: true, sameAs: -1},
			{args: ex("a", v1, "p"), sameAs: 0, wantConfirmed: true},
		}},
		{"case3 collision with state", []step{
			{args: ex("a", v1, "p"), confirm: true, withState: true, sameAs: -1},
			{args: ex("a", v1, "q"), wantErr: ErrClidInUse},
		}},
		{"case3 collision with session", []step{
			{args: ex("a", v1, "p"), confirm: true, sameAs: -1},
			{args: ex("a", v1, "q"), wantErr: ErrClidInUse},
		}},
		{"case3 collision with expired state", []step{
			{args: ex("a", v1, "p"), confirm: true, withState: true, expire: true, sameAs: -1},
			{args: ex("a", v1, "q"), sameAs: -1},
		}},
		{"case4 replace unconfirmed", []step{
			{args: ex("a", v1, "p"), sameAs: -1},
			{args: ex("a", v2, "p"), sameAs: -1},
		}},
		{"case5 client restart", []step{
			{args: ex("a", v1, "p"), confirm: true, sameAs: -1},
			{args: ex("a", v2, "p"), sameAs: -1},
		}},
		{"update confirmed", []step{
			{args: ex("a", v1, "p"), confirm: true, sameAs: -1},
			{args: upd(ex("a", v1, "p")), sameAs: 0, wantConfirmed: true},
		}},
		{"update no record", []step{{args: upd(ex("a", v1, "p")), wantErr: ErrNoEnt}}},
		{"update unconfirmed only", []step{
			{args: ex("a", v1, "p"), sameAs: -1},
			{args: upd(ex("a", v1, "p")), wantErr: ErrNoEnt},
		}},
		{"update verifier differs", []step{
			{args: ex("a", v1, "p"), confirm: true, sameAs: -1},
			{args: upd(ex("a", v2, "p")), wantErr: ErrNotSame},
		}},
		{"update principal differs", []step{
			{args: ex("a", v1, "p"), confirm: true, sameAs: -1},
			{args: upd(ex("a", v1, "q")), wantErr: ErrPerm},
		}},
		{"empty owner", []step{{args: ex("", v1, "p"), wantErr: ErrInval}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			var ids []ClientID
			for i, st := range tc.steps {
				r, err := h.m.ExchangeID(ctx, st.args)
				wantErr(t, "ExchangeID", err, st.wantErr)
				ids = append(ids, r.ClientID)
				if err != nil {
					continue
				}
				if r.Confirmed != st.wantConfirmed {
					t.Fatalf("step %d: confirmed = %v, want %v", i, r.Confirmed, st.wantConfirmed)
				}
				if st.sameAs >= 0 && r.ClientID != ids[st.sameAs] {
					t.Fatalf("step %d: client ID %#x, want %#x", i, r.ClientID, ids[st.sameAs])
				}
				if st.sameAs < 0 {
					for j := 0; j < i; j++ {
						if ids[j] == r.ClientID {
							t.Fatalf("step %d: reused client ID of step %d", i, j)
						}
					}
				}
				if r.ClientID.Epoch() != 1 {
					t.Fatalf("client ID epoch %d", r.ClientID.Epoch())
				}
				if st.confirm {
					if _, err := h.m.CreateSession(ctx, CreateSessionArgs{ClientID: r.ClientID, Sequence: r.SequenceID, Principal: st.args.Principal}); err != nil {
						t.Fatalf("CreateSession: %v", err)
					}
					if err := h.m.ReclaimComplete(r.ClientID, false); err != nil {
						t.Fatalf("ReclaimComplete: %v", err)
					}
				}
				if st.withState {
					h.open(r.ClientID, "o", 1, AccessRead, DenyNone)
				}
				if st.expire {
					h.clock.Advance(2 * testLease)
				}
			}
		})
	}
}

func TestClientRebootPurgesOldState(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t)
	old, _ := h.client("a")
	h.open(old, "o", 7, AccessBoth, DenyWrite)

	r, err := h.m.ExchangeID(ctx, ExchangeIDArgs{OwnerID: []byte("a"), Verifier: [8]byte{9}, Principal: "p"})
	wantErr(t, "ExchangeID", err, nil)
	// Until confirmation the old incarnation keeps its state.
	_, err = h.m.Open(OpenArgs{ClientID: old, Owner: []byte("o2"), File: 7, Access: AccessWrite})
	wantErr(t, "open before confirm", err, ErrShareDenied)
	if _, err := h.m.CreateSession(ctx, CreateSessionArgs{ClientID: r.ClientID, Sequence: r.SequenceID, Principal: "p"}); err != nil {
		t.Fatal(err)
	}
	wantErr(t, "RECLAIM_COMPLETE of the new incarnation", h.m.ReclaimComplete(r.ClientID, false), nil)
	_, err = h.m.Open(OpenArgs{ClientID: old, Owner: []byte("o"), File: 7, Access: AccessRead})
	wantErr(t, "old client after reboot", err, ErrStaleClientID)
	_, err = h.m.Open(OpenArgs{ClientID: r.ClientID, Owner: []byte("o"), File: 7, Access: AccessWrite})
	wantErr(t, "new incarnation opens", err, nil)
	if len(h.purged) != 1 || h.purged[0].ClientID != old || h.purged[0].Reason != PurgeRebooted || len(h.purged[0].Files) != 1 {
		t.Fatalf("purged = %+v", h.purged)
	}
}

func TestCreateSessionSequence(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t)
	r, err := h.m.ExchangeID(ctx, ExchangeIDArgs{OwnerID: []byte("a"), Principal: "p"})
	wantErr(t, "ExchangeID", err, nil)
	args := func(seq uint32, p string) CreateSessionArgs {
		return CreateSessionArgs{ClientID: r.ClientID, Sequence: seq, Principal: p, Fore: ChannelAttrs{MaxRequests: 1000, MaxResponseSizeCached: 1 << 30}}
	}
	_, err = h.m.CreateSession(ctx, args(r.SequenceID, "other"))
	wantErr(t, "wrong principal", err, ErrClidInUse)
	_, err = h.m.CreateSession(ctx, args(r.SequenceID+1, "p"))
	wantErr(t, "skip ahead", err, ErrSeqMisordered)
	_, err = h.m.CreateSession(ctx, args(r.SequenceID-1, "p"))
	wantErr(t, "replay with nothing cached", err, ErrSeqMisordered)

	first, err := h.m.CreateSession(ctx, args(r.SequenceID, "p"))
	wantErr(t, "create", err, nil)
	if first.Fore.MaxRequests != DefaultForeLimits.MaxRequests || first.Fore.MaxResponseSizeCached != DefaultForeLimits.MaxResponseSizeCached {
		t.Fatalf("negotiation not clamped: %+v", first.Fore)
	}
	replay, err := h.m.CreateSession(ctx, args(r.SequenceID, "p"))
	wantErr(t, "replay", err, nil)
	if replay != first {
		t.Fatalf("replay returned %+v, want %+v", replay, first)
	}
	second, err := h.m.CreateSession(ctx, args(r.SequenceID+1, "p"))
	wantErr(t, "second", err, nil)
	if second.SessionID == first.SessionID {
		t.Fatal("second session reused ID")
	}
	_, err = h.m.CreateSession(ctx, args(r.SequenceID+3, "p"))
	wantErr(t, "misordered", err, ErrSeqMisordered)
	// Confirmed: another principal may add a session (RFC 8881 §18.36.4
	// checks the principal only when confirming).
	third, err := h.m.CreateSession(ctx, args(r.SequenceID+2, "other"))
	wantErr(t, "confirmed client ID, other principal", err, nil)
	if third.SessionID == second.SessionID {
		t.Fatal("third session reused ID")
	}
	_, err = h.m.CreateSession(ctx, CreateSessionArgs{ClientID: 12345, Principal: "p"})
	wantErr(t, "unknown client", err, ErrStaleClientID)

	// EXCHANGE_ID on the confirmed record reports the next csa_sequence.
	r2, err := h.m.ExchangeID(ctx, ExchangeIDArgs{OwnerID: []byte("a"), Principal: "p"})
	wantErr(t, "ExchangeID again", err, nil)
	if !r2.Confirmed || r2.SequenceID != r.SequenceID+3 {
		t.Fatalf("ExchangeID on confirmed: %+v", r2)
	}
}

func TestDestroyClientID(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t)
	c, s := h.client("a")
	wantErr(t, "busy with session", h.m.DestroyClientID(ctx, c), ErrClientidBusy)
	wantErr(t, "destroy session", h.m.DestroySession(s.ID()), nil)
	wantErr(t, "destroy session twice", h.m.DestroySession(s.ID()), ErrBadSession)
	sid := h.open(c, "o", 1, AccessRead, DenyNone)
	wantErr(t, "busy with state", h.m.DestroyClientID(ctx, c), ErrClientidBusy)
	if _, err := h.m.Close(c, sid); err != nil {
		t.Fatal(err)
	}
	if h.store.Len() != 1 {
		t.Fatalf("store has %d records", h.store.Len())
	}
	wantErr(t, "destroy", h.m.DestroyClientID(ctx, c), nil)
	wantErr(t, "destroy again", h.m.DestroyClientID(ctx, c), ErrStaleClientID)
	if h.store.Len() != 0 {
		t.Fatalf("store has %d records after destroy", h.store.Len())
	}
}

func TestLeaseExpiry(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t)
	a, sa := h.client("a")
	b, sb := h.client("b")
	osid := h.open(a, "o", 5, AccessBoth, DenyNone)
	lsid, err := h.m.Lock(LockArgs{ClientID: a, Type: WriteLock, Length: LengthToEOF, NewLockOwner: true, OpenStateid: osid, LockOwner: []byte("l")})
	wantErr(t, "lock a", err, nil)
	bo := h.open(b, "o", 5, AccessBoth, DenyNone)
	lockB := LockArgs{ClientID: b, Type: WriteLock, Offset: 10, Length: 1, NewLockOwner: true, OpenStateid: bo, LockOwner: []byte("l")}
	_, err = h.m.Lock(lockB)
	wantErr(t, "b blocked", err, ErrDenied)

	// Only b keeps renewing.
	for range 3 {
		h.clock.Advance(testLease / 2)
		if _, err := h.m.Sequence(SequenceArgs{SessionID: sb.ID(), SequenceID: 0, SlotID: 3}); err == nil {
			t.Fatal("expected misordered")
		}
		wantErr(t, "renew b", h.m.Renew(b), nil)
		h.m.Sweep(ctx)
	}
	if n := len(h.purged); n != 1 || h.purged[0].ClientID != a || h.purged[0].Reason != PurgeExpired || !slices.Equal(h.purged[0].Sessions, []SessionID{sa.ID()}) {
		t.Fatalf("purged %+v", h.purged)
	}
	_, err = h.m.Lock(lockB)
	wantErr(t, "b after a expired", err, nil)
	_, err = h.m.Sequence(SequenceArgs{SessionID: sa.ID(), SequenceID: 1})
	wantErr(t, "expired session", err, ErrBadSession)
	wantErr(t, "expired stateid", h.m.CheckIO(a, lsid, 5, false), pnfs.ErrExpired)
	if h.store.Len() != 1 {
		t.Fatalf("store has %d records", h.store.Len())
	}
}

func TestSequenceRenewsLease(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t)
	_, s := h.client("a")
	for i := range uint32(5) {
		h.clock.Advance(testLease - 1)
		r, err := h.m.Sequence(SequenceArgs{SessionID: s.ID(), SequenceID: i + 1})
		wantErr(t, "sequence", err, nil)
		wantErr(t, "complete", r.Slot.Complete([]byte("ok"), true), nil)
		if n := h.m.Sweep(ctx); n != 0 {
			t.Fatalf("sweep purged %d", n)
		}
	}
}

func TestRecordRoundTrip(t *testing.T) {
	r := clientRecord{ClientID: 1<<32 | 7, Verifier: [8]byte{1, 2, 3}, Owner: []byte("owner"), Principal: "krb5:alice"}
	got, err := unmarshalClientRecord(r.marshal())
	if err != nil {
		t.Fatal(err)
	}
	if got.ClientID != r.ClientID || got.Verifier != r.Verifier || string(got.Owner) != "owner" || got.Principal != r.Principal {
		t.Fatalf("round trip: %+v", got)
	}
	b := r.marshal()
	for i := range len(b) {
		if _, err := unmarshalClientRecord(b[:i]); err == nil {
			t.Fatalf("truncated record of %d bytes accepted", i)
		}
	}
}
