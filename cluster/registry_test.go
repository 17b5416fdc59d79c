package cluster

import (
	"bytes"
	"context"
	"errors"
	"net"
	"slices"
	"testing"
	"time"
)

func TestRegistration(t *testing.T) {
	tc := newCluster(t, 4)
	dss := tc.reg.DataServers()
	if len(dss) != 4 {
		t.Fatalf("DataServers: %d, want 4", len(dss))
	}
	seen := map[string]bool{}
	for i, ds := range dss {
		if ds.Index != i || !ds.Up || seen[ds.ID] {
			t.Errorf("DataServers()[%d] = %+v", i, ds)
		}
		seen[ds.ID] = true
		if !slices.Equal(ds.Addrs, []string{"127.0.0.1:2049"}) || ds.Capacity != 1<<40 || ds.Free != 1<<39 {
			t.Errorf("DataServers()[%d] = %+v", i, ds)
		}
	}
	for _, a := range tc.agents {
		if !bytes.Equal(a.Secret(), []byte("cluster-secret")) {
			t.Errorf("agent secret %q", a.Secret())
		}
		if got := dss[a.Index()].ID; got != a.cfg.ID {
			t.Errorf("agent %s has index %d, which the registry gives to %s", a.cfg.ID, a.Index(), got)
		}
	}
	if g := tc.reg.Generation(); g != 4 {
		t.Errorf("Generation %d after 4 joins", g)
	}
	for range 4 {
		select {
		case ev := <-tc.events:
			if ev.Kind != Joined {
				t.Errorf("event %+v", ev)
			}
		case <-time.After(waitBound):
			t.Fatal("missing Joined events")
		}
	}
	if total, free, _, _ := NewStriped(tc.reg, 0).StatFS(); total != 4<<40 || free != 4<<39 {
		t.Errorf("StatFS = %d, %d", total, free)
	}
}

func TestRegisterRefusals(t *testing.T) {
	tc := newCluster(t, 0)
	for _, tt := range []struct {
		name  string
		token string
		want  error
	}{
		{"wrong token", "nope", ErrAuth},
		{"no token", "", ErrAuth},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), waitBound)
			defer cancel()
			_, err := StartAgent(ctx, AgentConfig{MDS: tc.addr, ID: "x", Store: nil})
			if err == nil {
				t.Fatal("StartAgent without a store succeeded")
			}
			st := tc.newStore()
			_, err = StartAgent(ctx, AgentConfig{MDS: tc.addr, ID: "x", Store: st, JoinToken: []byte(tt.token)})
			if !errors.Is(err, tt.want) {
				t.Fatalf("StartAgent: %v, want %v", err, tt.want)
			}
		})
	}
	if n := len(tc.reg.Members()); n != 0 {
		t.Errorf("%d members after refusals", n)
	}
}

func TestHeartbeatLossAndReregistration(t *testing.T) {
	tc := newCluster(t, 4)
	a := tc.agents[2]
	id, idx := a.cfg.ID, a.Index()
	g0 := tc.reg.Generation()

	agentConn(a).Close()
	left := tc.nextEvent(Left, id)
	if left.Generation <= g0 || left.DS.Up {
		t.Errorf("Left event %+v after generation %d", left, g0)
	}
	joined := tc.nextEvent(Joined, id)
	if joined.Generation <= left.Generation || joined.DS.Index != idx {
		t.Errorf("Joined event %+v after %+v", joined, left)
	}
	eventually(t, "agent to see its re-registration", func() bool { return a.Stats().Registrations >= 2 })
	if a.Index() != idx {
		t.Errorf("index %d after re-registration, want %d", a.Index(), idx)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	if err := tc.reg.WaitFor(ctx, 4); err != nil {
		t.Fatal(err)
	}
	if n := len(tc.reg.Members()); n != 4 {
		t.Errorf("%d members after re-registration", n)
	}
}

func TestMissedHeartbeats(t *testing.T) {
	checker := newFakeChecker()
	reg := NewRegistry(RegistryConfig{HeartbeatInterval: 20 * time.Millisecond, MissedBeats: 2, CheckStateid: checker.check})
	defer reg.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go reg.Serve(ln)
	left := make(chan Event, 10)
	reg.Subscribe(func(ev Event) {
		if ev.Kind == Left {
			left <- ev
		}
	})
	// A DS that registers and then never heartbeats.
	a, stop := registerBareAgent(t, ln.Addr().String(), "silent")
	defer stop()
	select {
	case ev := <-left:
		if ev.DS.ID != "silent" {
			t.Errorf("Left %+v", ev)
		}
	case <-time.After(waitBound):
		t.Fatal("a silent DS was never taken out of service")
	}
	select {
	case <-agentConn(a).Done():
	case <-time.After(waitBound):
		t.Fatal("the MDS kept the silent DS's connection open")
	}
}

func TestDrain(t *testing.T) {
	tc := newCluster(t, 4)
	a := tc.agents[1]
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	if err := tc.reg.Drain(ctx, "nosuch"); !errors.Is(err, ErrUnknownDataServer) {
		t.Errorf("Drain(unknown) = %v", err)
	}
	g := tc.reg.Generation()
	if err := tc.reg.Drain(ctx, a.cfg.ID); err != nil {
		t.Fatal(err)
	}
	ev := tc.nextEvent(Left, a.cfg.ID)
	if ev.Generation != g+1 {
		t.Errorf("Left generation %d, want %d", ev.Generation, g+1)
	}
	select {
	case <-a.Drained():
	case <-time.After(waitBound):
		t.Fatal("agent not told it was drained")
	}
	for _, ds := range tc.reg.DataServers() {
		if ds.ID == a.cfg.ID {
			t.Errorf("drained DS still in service: %+v", ds)
		}
	}
	if n := len(tc.reg.Members()); n != 4 {
		t.Errorf("%d members; a drained DS keeps its index", n)
	}
	// Once its connection drops it may not come back.
	agentConn(a).Close()
	eventually(t, "agent to give up", func() bool { return errors.Is(a.Err(), ErrDrained) })
	if err := tc.reg.Drain(ctx, a.cfg.ID); err != nil {
		t.Errorf("second Drain: %v", err)
	}
}

func TestMDSRestart(t *testing.T) {
	tc := newCluster(t, 4)
	s := NewStriped(tc.reg, 64<<10)
	data := pattern(1<<20, 7)
	writeAll(t, s, 42, data, 1000)

	before := tc.reg.Members()
	tc.reg.Close()
	if err := <-tc.serveCh; err == nil {
		t.Fatal("Serve returned nil after Close")
	}
	ln, err := net.Listen("tcp", tc.addr)
	if err != nil {
		t.Fatalf("listen again on %s: %v", tc.addr, err)
	}
	tc.startRegistry(ln)
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	if err := tc.reg.WaitFor(ctx, 4); err != nil {
		t.Fatal(err)
	}
	after := tc.reg.Members()
	for i := range before {
		if before[i].ID != after[i].ID {
			t.Errorf("index %d: %s before the restart, %s after", i, before[i].ID, after[i].ID)
		}
	}
	s = NewStriped(tc.reg, 64<<10)
	got := readAll(t, s, 42, len(data), 1000)
	if !bytes.Equal(got, data) {
		t.Error("data read after the MDS restart differs")
	}
}

func TestWaitForCancelled(t *testing.T) {
	tc := newCluster(t, 1)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := tc.reg.WaitFor(ctx, 2); !errors.Is(err, context.Canceled) {
		t.Errorf("WaitFor = %v", err)
	}
	if err := tc.reg.WaitFor(ctx, 1); err != nil {
		t.Errorf("WaitFor(1) = %v", err)
	}
}
