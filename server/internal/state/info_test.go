package state

import (
	"context"
	"testing"
	"time"
)

func TestClients(t *testing.T) {
	h := newHarness(t)
	m := h.m
	if got := m.Clients(); len(got) != 0 {
		t.Fatalf("clients of a new manager: %+v", got)
	}
	c1, s1 := h.client("c1")
	if _, err := m.BindConnToSession(s1.ID(), "conn-a", ChannelBoth); err != nil {
		t.Fatal(err)
	}
	o := h.open(c1, "o1", 7, AccessBoth, DenyNone)
	if _, err := m.LayoutGet(c1, o, 7, IOModeRW); err != nil {
		t.Fatal(err)
	}
	h.open(c1, "o1", 8, AccessRead, DenyNone)
	c2, _ := h.client("c2")
	h.clock.Advance(testLease / 2)
	if err := m.Renew(c2); err != nil {
		t.Fatal(err)
	}
	m.BeginRecall(7)
	// An EXCHANGE_ID that no CREATE_SESSION followed.
	if _, err := m.ExchangeID(context.Background(), ExchangeIDArgs{OwnerID: []byte("c3"), Principal: "p"}); err != nil {
		t.Fatal(err)
	}

	got := m.Clients()
	if len(got) != 3 {
		t.Fatalf("%d clients, want 3: %+v", len(got), got)
	}
	start := newFakeClock().Now()
	for _, tt := range []struct {
		owner                     string
		id                        ClientID
		confirmed                 bool
		sessions, conns           int
		opens, layouts, recalling int
		expires                   time.Duration // after start
	}{
		{owner: "c1", id: c1, confirmed: true, sessions: 1, conns: 1, opens: 2, layouts: 1, recalling: 1, expires: testLease},
		{owner: "c2", id: c2, confirmed: true, sessions: 1, expires: testLease/2 + testLease},
		{owner: "c3", expires: testLease/2 + testLease},
	} {
		var ci *ClientInfo
		for i := range got {
			if string(got[i].Owner) == tt.owner {
				ci = &got[i]
			}
		}
		if ci == nil {
			t.Errorf("no client %s in %+v", tt.owner, got)
			continue
		}
		conns := 0
		for _, s := range ci.Sessions {
			conns += len(s.Conns)
		}
		if (tt.id != 0 && ci.ID != tt.id) || ci.Confirmed != tt.confirmed || len(ci.Sessions) != tt.sessions || conns != tt.conns ||
			ci.Opens != tt.opens || ci.Layouts != tt.layouts || ci.Recalling != tt.recalling || ci.Principal != "p" {
			t.Errorf("client %s: %+v", tt.owner, *ci)
		}
		if want := start.Add(tt.expires); !ci.LeaseExpires.Equal(want) {
			t.Errorf("client %s: lease expires %v, want %v", tt.owner, ci.LeaseExpires, want)
		}
	}
	for i := 1; i < len(got); i++ {
		if got[i-1].ID >= got[i].ID {
			t.Errorf("clients not sorted by ID: %+v", got)
		}
	}
}
