package cluster

import (
	"bytes"
	"context"
	"errors"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/shoalfs/shoal/pnfs"
)

func TestRegistration(t *testing.T) {
	tc := newCluster(t, 4)
	dss := tc.reg.DataServers()
	if len(dss) != 4 {
		t.Fatalf("DataServers: %d, want 4", len(dss))
	}
	want := []string{"ds0", "ds1", "ds2", "ds3"} // join order
	for i, ds := range dss {
		if ds.ID != want[i] || !ds.Up || ds.State != Active || ds.LastBeat.IsZero() || ds.Since.IsZero() {
			t.Errorf("DataServers()[%d] = %+v", i, ds)
		}
		if !slices.Equal(ds.Addrs, []string{"127.0.0.1:2049"}) || ds.Capacity != 1<<40 || ds.Free != 1<<39 {
			t.Errorf("DataServers()[%d] = %+v", i, ds)
		}
		if got, ok := tc.reg.DataServer(ds.ID); !ok || got.ID != ds.ID || !got.Up {
			t.Errorf("DataServer(%q) = %+v, %v", ds.ID, got, ok)
		}
	}
	if _, ok := tc.reg.DataServer("nosuch"); ok {
		t.Error("DataServer of an unknown id found")
	}
	if p := tc.reg.Placement(); !slices.Equal(p, want) {
		t.Errorf("Placement = %v, want %v", p, want)
	}
	cid := tc.reg.ClusterID()
	if len(cid) != 16 || bytes.Equal(cid, make([]byte, 16)) {
		t.Errorf("ClusterID = %x", cid)
	}
	for _, a := range tc.agents {
		if !bytes.Equal(a.DataKey(), testDataKey) {
			t.Errorf("agent %s data key %q", a.ID(), a.DataKey())
		}
		if !bytes.Equal(a.ClusterID(), cid) {
			t.Errorf("agent %s cluster id %x, registry's %x", a.ID(), a.ClusterID(), cid)
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
	if total, free, _, _ := tc.striped(0).StatFS(); total != 4<<40 || free != 4<<39 {
		t.Errorf("StatFS = %d, %d", total, free)
	}
	// The record names every DS, so a registry started on it again knows
	// them all before any registers.
	other := newTestRegistry(t, RegistryConfig{JoinSecret: testSecret, Store: metaRecord{tc.meta}})
	if !bytes.Equal(other.ClusterID(), cid) {
		t.Errorf("registry on the same record: cluster id %x, want %x", other.ClusterID(), cid)
	}
	var ids []string
	for _, ds := range other.DataServers() {
		if ds.Up || ds.State != Active {
			t.Errorf("before registering again: %+v", ds)
		}
		ids = append(ids, ds.ID)
	}
	if !slices.Equal(ids, want) {
		t.Errorf("registry on the same record knows %v, want %v", ids, want)
	}
}

// TestRegisterRefusals: a DS is refused for good without the join secret,
// with a directory of another cluster, or once removed; none of the
// refused ones joins.
func TestRegisterRefusals(t *testing.T) {
	tc := newCluster(t, 1)
	removed := tc.addAgent("removed")
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	if err := tc.reg.setState(ctx, "removed", Removed); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the removed agent to give up", func() bool { return errors.Is(removed.Err(), ErrRemoved) })
	otherCluster := bytes.Repeat([]byte{0xC1}, 16)
	for _, tt := range []struct {
		name    string
		id      string
		secret  []byte
		cluster []byte
		want    error
	}{
		{"wrong secret", "x", []byte("nope"), nil, ErrAuth},
		{"no secret", "x", nil, nil, ErrAuth},
		{"secret prefix", "x", testSecret[:len(testSecret)-1], nil, ErrAuth},
		{"another cluster's directory", "x", testSecret, otherCluster, ErrWrongCluster},
		{"known DS with another cluster's id", "ds0", testSecret, otherCluster, ErrWrongCluster},
		{"removed", "removed", testSecret, nil, ErrRemoved},
		{"removed, this cluster's id", "removed", testSecret, tc.reg.ClusterID(), ErrRemoved},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := tc.agentConfig(tt.id, tc.newStore())
			cfg.JoinSecret, cfg.ClusterID = tt.secret, tt.cluster
			a, err := StartAgent(ctx, cfg)
			if err == nil {
				a.Close()
			}
			if !errors.Is(err, tt.want) {
				t.Fatalf("StartAgent: %v, want %v", err, tt.want)
			}
		})
	}
	if _, err := StartAgent(ctx, AgentConfig{MDS: []string{tc.addr}, ID: "x", JoinSecret: testSecret}); err == nil {
		t.Error("StartAgent without a store succeeded")
	}
	var ids []string
	for _, ds := range tc.reg.DataServers() {
		ids = append(ids, ds.ID)
	}
	if !slices.Equal(ids, []string{"ds0", "removed"}) {
		t.Errorf("data servers after refusals: %v", ids)
	}
	if p := tc.reg.Placement(); !slices.Equal(p, []string{"ds0"}) {
		t.Errorf("Placement after refusals: %v", p)
	}
	// ds0 is still in service: the refused REGISTER with its id did not
	// displace it.
	if ds, _ := tc.reg.DataServer("ds0"); !ds.Up {
		t.Errorf("ds0 after a refused REGISTER with its id: %+v", ds)
	}

	// A registry without a join secret refuses everyone, even a DS that
	// presents none.
	open := newTestRegistry(t, RegistryConfig{DataKey: testDataKey})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go open.Serve(ln)
	for _, secret := range [][]byte{nil, testSecret} {
		_, err := StartAgent(ctx, AgentConfig{MDS: []string{ln.Addr().String()}, ID: "y", Store: tc.newStore(), JoinSecret: secret})
		if !errors.Is(err, ErrAuth) {
			t.Errorf("registry without a secret, agent secret %q: %v, want ErrAuth", secret, err)
		}
	}
	if n := len(open.DataServers()); n != 0 {
		t.Errorf("registry without a secret took %d data servers", n)
	}
}

func TestHeartbeatLossAndReregistration(t *testing.T) {
	tc := newCluster(t, 4)
	a := tc.agents[2]
	id := a.ID()
	g0 := tc.reg.Generation()
	placement := tc.reg.Placement()

	agentConn(a).Close()
	left := tc.nextEvent(Left, id)
	if left.Generation <= g0 || left.DS.Up {
		t.Errorf("Left event %+v after generation %d", left, g0)
	}
	joined := tc.nextEvent(Joined, id)
	if joined.Generation <= left.Generation || joined.DS.ID != id || !joined.DS.Up || joined.DS.State != Active {
		t.Errorf("Joined event %+v after %+v", joined, left)
	}
	eventually(t, "agent to see its re-registration", func() bool { return a.Stats().Registrations >= 2 })
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	if err := tc.reg.WaitFor(ctx, 4); err != nil {
		t.Fatal(err)
	}
	if n := len(tc.reg.DataServers()); n != 4 {
		t.Errorf("%d data servers after re-registration", n)
	}
	// Back in its place: it joined first as third.
	if p := tc.reg.Placement(); !slices.Equal(p, placement) {
		t.Errorf("Placement %v after re-registration, was %v", p, placement)
	}
}

func TestMissedHeartbeats(t *testing.T) {
	checker := newFakeChecker()
	reg := newTestRegistry(t, RegistryConfig{JoinSecret: testSecret, HeartbeatInterval: 20 * time.Millisecond, MissedBeats: 2, CheckStateid: checker.check})
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
	if ds, ok := reg.DataServer("silent"); !ok || ds.Up || ds.State != Active {
		t.Errorf("silent DS after missing heartbeats: %+v, %v (it stays a member, out of service)", ds, ok)
	}
}

// TestStates walks a data server through its life-cycle states: only an
// Active one receives new files, a Draining or Drained one stays in
// service for the data it holds, and a Removed one is told so, cut off
// and refused when it comes back. Each state change is an event and is
// recorded.
func TestStates(t *testing.T) {
	tc := newCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	if err := tc.reg.setState(ctx, "nosuch", Draining); !errors.Is(err, ErrUnknownDataServer) {
		t.Errorf("setState(unknown) = %v", err)
	}
	a, _ := tc.agent("ds1")
	for _, tt := range []struct {
		state         State
		wantUp        bool
		wantPlacement []string
	}{
		{Draining, true, []string{"ds0", "ds2"}},
		{Active, true, []string{"ds0", "ds1", "ds2"}},
		{Drained, true, []string{"ds0", "ds2"}},
		{Removed, false, []string{"ds0", "ds2"}},
	} {
		t.Run(string(tt.state), func(t *testing.T) {
			g := tc.reg.Generation()
			if err := tc.reg.setState(ctx, "ds1", tt.state); err != nil {
				t.Fatal(err)
			}
			ev := tc.nextEvent(Changed, "ds1")
			if ev.DS.State != tt.state || ev.Generation <= g {
				t.Errorf("Changed event %+v after generation %d", ev, g)
			}
			if ds, _ := tc.reg.DataServer("ds1"); ds.State != tt.state || ds.Up != tt.wantUp {
				t.Errorf("DataServer = %+v, want state %s, up %v", ds, tt.state, tt.wantUp)
			}
			if p := tc.reg.Placement(); !slices.Equal(p, tt.wantPlacement) {
				t.Errorf("Placement = %v, want %v", p, tt.wantPlacement)
			}
			// The state is recorded: a registry on the same record sees it.
			again := newTestRegistry(t, RegistryConfig{JoinSecret: testSecret, Store: metaRecord{tc.meta}})
			if ds, ok := again.DataServer("ds1"); !ok || ds.State != tt.state {
				t.Errorf("recorded: %+v, %v; want state %s", ds, ok, tt.state)
			}
			again.Close()
			// Setting the same state again changes nothing.
			g = tc.reg.Generation()
			if err := tc.reg.setState(ctx, "ds1", tt.state); err != nil || tc.reg.Generation() != g {
				t.Errorf("setting %s again: %v, generation %d -> %d", tt.state, err, g, tc.reg.Generation())
			}
		})
	}
	select {
	case <-a.Removed():
	case <-time.After(waitBound):
		t.Fatal("agent not told it was removed")
	}
	eventually(t, "the removed agent to give up", func() bool { return errors.Is(a.Err(), ErrRemoved) })
	if _, err := tc.reg.conn("ds1"); !errors.Is(err, pnfs.ErrDataServerDown) {
		t.Errorf("conn of a removed DS = %v, want pnfs.ErrDataServerDown", err)
	}
	if err := tc.reg.WaitFor(ctx, 2); err != nil {
		t.Fatal(err)
	}
	// Its directory is still refused, however it comes back.
	cfg := tc.agentConfig("ds1", tc.newStore())
	cfg.ClusterID = tc.reg.ClusterID()
	if _, err := StartAgent(ctx, cfg); !errors.Is(err, ErrRemoved) {
		t.Errorf("removed DS registering again: %v", err)
	}
	if total, _, _, _ := tc.striped(0).StatFS(); total != 2<<40 {
		t.Errorf("StatFS total %d: a removed DS's space counts", total)
	}
}

func TestMDSRestart(t *testing.T) {
	tc := newCluster(t, 4)
	s := tc.striped(64 << 10)
	ino := tc.newFile()
	data := pattern(1<<20, 7)
	writeAll(t, s, ino, data, 1000)
	m := stripeMap(t, s, ino)

	before, cid := tc.reg.DataServers(), tc.reg.ClusterID()
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
	if !bytes.Equal(tc.reg.ClusterID(), cid) {
		t.Errorf("cluster id %x after the restart, %x before", tc.reg.ClusterID(), cid)
	}
	after := tc.reg.DataServers()
	if len(after) != len(before) {
		t.Fatalf("%d data servers after the restart, %d before", len(after), len(before))
	}
	for i := range before {
		if before[i].ID != after[i].ID || !after[i].Up {
			t.Errorf("data server %d: %+v before the restart, %+v after", i, before[i], after[i])
		}
	}
	s = tc.striped(64 << 10)
	if got := stripeMap(t, s, ino); !got.Equal(m) || got.Gen != m.Gen {
		t.Errorf("stripe map %+v after the restart, %+v before", got, m)
	}
	got := readAll(t, s, ino, len(data), 1000)
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
