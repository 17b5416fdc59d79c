package state

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"
)

// fakeClock is a Clock moved by hand.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

const testLease = 30 * time.Second

type harness struct {
	t       *testing.T
	clock   *fakeClock
	store   *MemStore
	m       *Manager
	purged  []PurgeInfo
	revoked []ClientID
	mu      sync.Mutex
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	h := &harness{t: t, clock: newFakeClock(), store: NewMemStore()}
	h.restart(1)
	return h
}

// restart builds a new Manager on the same store and clock.
func (h *harness) restart(epoch uint32) {
	h.t.Helper()
	m, err := NewManager(context.Background(), Config{
		Epoch:     epoch,
		LeaseTime: testLease,
		Clock:     h.clock,
		Store:     h.store,
		Logger:    slog.New(slog.DiscardHandler),
		OnRevokeLayout: func(id ClientID) {
			h.mu.Lock()
			h.revoked = append(h.revoked, id)
			h.mu.Unlock()
		},
		OnPurge: func(p PurgeInfo) {
			h.mu.Lock()
			h.purged = append(h.purged, p)
			h.mu.Unlock()
		},
	})
	if err != nil {
		h.t.Fatalf("NewManager: %v", err)
	}
	h.m = m
}

// client runs EXCHANGE_ID, CREATE_SESSION and RECLAIM_COMPLETE, as a
// client mounting does, and returns the client ID and the session.
func (h *harness) client(owner string) (ClientID, *Session) {
	h.t.Helper()
	id, s := h.returning(owner)
	if err := h.m.ReclaimComplete(id, false); err != nil {
		h.t.Fatalf("ReclaimComplete(%s): %v", owner, err)
	}
	return id, s
}

// returning is client without RECLAIM_COMPLETE: a client coming back
// after a restart, before its reclaims.
func (h *harness) returning(owner string) (ClientID, *Session) {
	h.t.Helper()
	ctx := context.Background()
	r, err := h.m.ExchangeID(ctx, ExchangeIDArgs{OwnerID: []byte(owner), Verifier: [8]byte{1}, Principal: "p"})
	if err != nil {
		h.t.Fatalf("ExchangeID(%s): %v", owner, err)
	}
	cs, err := h.m.CreateSession(ctx, CreateSessionArgs{
		ClientID: r.ClientID, Sequence: r.SequenceID, Principal: "p",
		Fore: ChannelAttrs{MaxRequestSize: 1 << 20, MaxResponseSize: 1 << 20, MaxResponseSizeCached: 4096, MaxOperations: 16, MaxRequests: 4},
		Back: ChannelAttrs{MaxRequestSize: 4096, MaxResponseSize: 4096, MaxOperations: 2, MaxRequests: 1},
	})
	if err != nil {
		h.t.Fatalf("CreateSession(%s): %v", owner, err)
	}
	s, err := h.m.Session(cs.SessionID)
	if err != nil {
		h.t.Fatal(err)
	}
	return r.ClientID, s
}

func (h *harness) open(c ClientID, owner string, f FileID, access, deny uint32) Stateid {
	h.t.Helper()
	r, err := h.m.Open(OpenArgs{ClientID: c, Owner: []byte(owner), File: f, Access: access, Deny: deny})
	if err != nil {
		h.t.Fatalf("Open: %v", err)
	}
	return r.Stateid
}

func wantErr(t *testing.T, what string, got, want error) {
	t.Helper()
	if want == nil {
		if got != nil {
			t.Fatalf("%s: unexpected error %v", what, got)
		}
		return
	}
	if !errors.Is(got, want) {
		t.Fatalf("%s: got %v, want %v", what, got, want)
	}
}
