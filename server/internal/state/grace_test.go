package state

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/shoalfs/shoal/pnfs"
)

// reboot simulates a server restart: a new Manager, new epoch, same store.
func TestGraceAfterRestart(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t)
	a, _ := h.client("a")
	b, _ := h.client("b")
	oldOpen := h.open(a, "o", 1, AccessBoth, DenyNone)
	if h.store.Len() != 2 {
		t.Fatalf("persisted %d clients", h.store.Len())
	}

	h.restart(2)
	if !h.m.InGrace() {
		t.Fatal("not in grace after restart with known clients")
	}
	// Everything from the previous boot is stale.
	_, err := h.m.CreateSession(ctx, CreateSessionArgs{ClientID: a, Sequence: 2, Principal: "p"})
	wantErr(t, "old client ID", err, ErrStaleClientID)
	wantErr(t, "old stateid", h.m.CheckIO(a, oldOpen, 1, false), pnfs.ErrStaleStateid)

	a2, _ := h.returning("a")
	b2, _ := h.returning("b")
	c2, _ := h.returning("c") // unknown before the restart
	if a2.Epoch() != 2 {
		t.Fatalf("new client ID epoch %d", a2.Epoch())
	}

	_, err = h.m.Open(OpenArgs{ClientID: a2, Owner: []byte("o"), File: 2, Access: AccessRead})
	wantErr(t, "new open in grace", err, ErrGrace)
	wantErr(t, "LOCKT in grace", h.m.LockTest(LockTestArgs{ClientID: a2, File: 1, Type: ReadLock, Length: 1, LockOwner: []byte("l")}), ErrGrace)
	_, err = h.m.Open(OpenArgs{ClientID: c2, Owner: []byte("o"), File: 1, Access: AccessRead, Reclaim: true})
	wantErr(t, "unknown client reclaim", err, ErrReclaimBad)

	r, err := h.m.Open(OpenArgs{ClientID: a2, Owner: []byte("o"), File: 1, Access: AccessBoth, Reclaim: true})
	wantErr(t, "reclaim open", err, nil)
	_, err = h.m.Lock(LockArgs{ClientID: a2, Type: WriteLock, Length: LengthToEOF, Reclaim: true, NewLockOwner: true, OpenStateid: r.Stateid, LockOwner: []byte("l")})
	wantErr(t, "reclaim lock", err, nil)
	_, err = h.m.Lock(LockArgs{ClientID: a2, Type: WriteLock, Length: LengthToEOF, NewLockOwner: true, OpenStateid: r.Stateid, LockOwner: []byte("l")})
	wantErr(t, "non-reclaim lock in grace", err, ErrGrace)

	wantErr(t, "reclaim complete a", h.m.ReclaimComplete(a2, false), nil)
	wantErr(t, "reclaim complete twice", h.m.ReclaimComplete(a2, false), ErrCompleteAlready)
	wantErr(t, "one-fs reclaim complete", h.m.ReclaimComplete(a2, true), nil)
	_, err = h.m.Open(OpenArgs{ClientID: a2, Owner: []byte("o2"), File: 3, Access: AccessRead, Reclaim: true})
	wantErr(t, "reclaim after own RECLAIM_COMPLETE", err, ErrNoGrace)
	if !h.m.InGrace() {
		t.Fatal("grace ended before b completed")
	}
	wantErr(t, "unknown client complete", h.m.ReclaimComplete(c2, false), nil)
	if !h.m.InGrace() {
		t.Fatal("grace ended by a client that was not known before")
	}
	wantErr(t, "reclaim complete b", h.m.ReclaimComplete(b2, false), nil)
	if h.m.InGrace() {
		t.Fatal("grace did not end after all known clients completed")
	}
	_, err = h.m.Open(OpenArgs{ClientID: b2, Owner: []byte("o"), File: 1, Access: AccessRead, Reclaim: true})
	wantErr(t, "reclaim after grace", err, ErrNoGrace)
	_, err = h.m.Open(OpenArgs{ClientID: b2, Owner: []byte("o"), File: 4, Access: AccessRead})
	wantErr(t, "open after grace", err, nil)
	_ = b
}

func TestGraceEndsAfterLeaseAndPrunesRecords(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t)
	h.client("a")
	h.client("b")
	h.restart(2)
	a2, _ := h.returning("a") // b never comes back
	h.clock.Advance(testLease / 2)
	if !h.m.InGrace() {
		t.Fatal("grace ended early")
	}
	h.m.Renew(a2)
	h.clock.Advance(testLease/2 + 1)
	h.m.Sweep(ctx)
	if h.m.InGrace() {
		t.Fatal("grace did not end after one lease")
	}
	if h.store.Len() != 1 {
		t.Fatalf("store has %d records, want only a", h.store.Len())
	}
	_, err := h.m.Open(OpenArgs{ClientID: a2, Owner: []byte("o"), File: 1, Access: AccessRead, Reclaim: true})
	wantErr(t, "reclaim after grace", err, ErrNoGrace)

	// No persisted clients: no grace.
	h2 := newHarness(t)
	if h2.m.InGrace() {
		t.Fatal("grace without known clients")
	}
}

type failingStore struct{ *MemStore }

func (*failingStore) PutClient(context.Context, []byte, []byte) error {
	return context.DeadlineExceeded
}

func TestConfirmFailsWhenStoreFails(t *testing.T) {
	ctx := context.Background()
	m, err := NewManager(ctx, Config{Epoch: 1, Clock: newFakeClock(), Store: &failingStore{MemStore: NewMemStore()}})
	if err != nil {
		t.Fatal(err)
	}
	r, err := m.ExchangeID(ctx, ExchangeIDArgs{OwnerID: []byte("a")})
	wantErr(t, "exchange", err, nil)
	_, err = m.CreateSession(ctx, CreateSessionArgs{ClientID: r.ClientID, Sequence: r.SequenceID})
	wantErr(t, "create", err, ErrServerFault)
	_, err = m.Open(OpenArgs{ClientID: r.ClientID, Owner: []byte("o"), File: 1, Access: AccessRead})
	wantErr(t, "unconfirmed client", err, ErrStaleClientID)
}

func TestRunStopsOnCancel(t *testing.T) {
	m, err := NewManager(context.Background(), Config{Epoch: 3, LeaseTime: 40 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if m.Epoch() != 3 || m.LeaseTime() != 40*time.Millisecond {
		t.Fatal("config not applied")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}
