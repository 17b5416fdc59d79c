package cluster

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/shoalfs/shoal/internal/ctlproto"
	"github.com/shoalfs/shoal/internal/xdr"
	"github.com/shoalfs/shoal/pnfs"
)

// leadership stands in for the MDSes' election (RegistryConfig.Leader):
// the test says which registry leads, in which term.
type leadership struct {
	mu      sync.Mutex
	term    uint64
	leading bool
}

func (l *leadership) set(term uint64, leading bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.term, l.leading = term, leading
}

func (l *leadership) get() (uint64, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.term, l.leading
}

// failoverMDS is one of several registries that keep one record, as the
// MDSes of a cluster with failover share their metadata store.
type failoverMDS struct {
	reg     *Registry
	addr    string
	lead    *leadership
	checker *fakeChecker
}

// listen returns a listener on a free loopback port, closed at the end of
// the test.
func listen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// startFailoverMDS starts a registry keeping its record in rec and
// serving ln, leading in term as leading says (changed through lead).
// lease is RegistryConfig.Lease.
func startFailoverMDS(t *testing.T, ln net.Listener, rec StateStore, term uint64, leading bool, lease time.Duration) *failoverMDS {
	t.Helper()
	m := &failoverMDS{addr: ln.Addr().String(), lead: &leadership{term: term, leading: leading}, checker: newFakeChecker()}
	cfg := testRegistryConfig(m.checker)
	cfg.Store, cfg.Leader, cfg.Lease, cfg.Logger = rec, m.lead.get, lease, discardLogger()
	m.reg = newTestRegistry(t, cfg)
	go m.reg.Serve(ln)
	return m
}

// refusedAddr returns a loopback address nobody listens on: a standby MDS.
func refusedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// agentState returns what the agent registered with: the MDS's address and
// the highest term seen.
func agentState(a *Agent) (mds string, term uint64, registered bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.mds, a.term, a.conn != nil
}

// TestAgentFindsLeader: a DS given every MDS address registers with the
// leader, passing over an address nobody listens on, an MDS that accepts
// connections and never answers (a stopped process), and one that does
// not lead; when the lead moves, or the leader's term changes, its
// HEARTBEAT is refused and it registers again, with the new leader or in
// the new term.
func TestAgentFindsLeader(t *testing.T) {
	rec := metaRecord{newMeta(t)}
	refused := refusedAddr(t)
	paused := listen(t) // the kernel accepts; nobody answers
	standby := startFailoverMDS(t, listen(t), rec, 0, false, 0)
	leader := startFailoverMDS(t, listen(t), rec, 5, true, 0)

	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	tc := &testCluster{t: t}
	a, err := StartAgent(ctx, AgentConfig{
		MDS: []string{refused, paused.Addr().String(), standby.addr, leader.addr},
		ID:  "ds0", Addrs: []string{"127.0.0.1:2049"}, Store: tc.newStore(), JoinSecret: testSecret,
		Logger: discardLogger(), registerTimeout: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if mds, term, _ := agentState(a); mds != leader.addr || term != 5 {
		t.Errorf("registered with %s in term %d; want the leader %s in term 5", mds, term, leader.addr)
	}
	if ds, ok := leader.reg.DataServer("ds0"); !ok || !ds.Up {
		t.Errorf("leader's view of the DS: %+v, %v", ds, ok)
	}
	if dss := standby.reg.DataServers(); len(dss) != 0 {
		t.Errorf("the standby admitted %+v", dss)
	}

	// The lead moves: the old leader refuses the next HEARTBEAT, and the
	// DS goes round the addresses to the new one.
	leader.lead.set(5, false)
	standby.lead.set(6, true)
	eventually(t, "the DS to register with the new leader", func() bool {
		mds, term, ok := agentState(a)
		return ok && mds == standby.addr && term == 6
	})
	eventually(t, "the old leader to see the DS leave", func() bool {
		ds, _ := leader.reg.DataServer("ds0")
		return !ds.Up
	})

	// The same MDS leads in a new term: what the DS learnt in the old one
	// may be out of date, so it registers again.
	regs := a.Stats().Registrations
	standby.lead.set(9, true)
	eventually(t, "the DS to register in the new term", func() bool {
		mds, term, ok := agentState(a)
		return ok && mds == standby.addr && term == 9
	})
	if got := a.Stats().Registrations; got <= regs {
		t.Errorf("registrations %d after a new term, %d before", got, regs)
	}
}

// TestStateidsOutliveMDS: while the MDS is away, a stateid it accepted
// within the lease keeps passing, past the cache's TTL; one it never
// accepted, or whose client it fenced, gets pnfs.ErrMDSUnreachable (not
// pnfs.ErrUnavailable, which parks clients); registering again, here with a
// new leader, drops every answer, and the new leader's verdicts rule.
func TestStateidsOutliveMDS(t *testing.T) {
	rec := metaRecord{newMeta(t)}
	first := startFailoverMDS(t, listen(t), rec, 1, true, time.Hour)
	// The next leader's address accepts connections but nobody answers
	// until it is elected.
	nextLn := listen(t)

	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	tc := &testCluster{t: t}
	a, err := StartAgent(ctx, AgentConfig{
		MDS: []string{first.addr, nextLn.Addr().String()},
		ID:  "ds0", Addrs: []string{"127.0.0.1:2049"}, Store: tc.newStore(), JoinSecret: testSecret,
		Logger: discardLogger(), registerTimeout: 500 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	a.mu.Lock()
	a.ttl = time.Nanosecond // every answer is past the TTL by the next check
	lease := a.lease
	a.mu.Unlock()
	if lease != time.Hour {
		t.Errorf("lease from REGISTER %v, want 1h", lease)
	}

	good, aged, fenced, never := sid(1, 0xA1), sid(1, 0xA2), sid(1, 0xA3), sid(1, 0xA4)
	first.checker.set(good, 100, nil)
	first.checker.set(aged, 300, nil)
	first.checker.set(fenced, 200, nil)
	for _, s := range [][16]byte{good, aged, fenced} {
		if err := a.CheckStateid(ctx, 9, s, true); err != nil {
			t.Fatalf("CheckStateid with the MDS up: %v", err)
		}
	}
	// Past the TTL, an MDS that can be asked is asked.
	calls := first.checker.calls.Load()
	if err := a.CheckStateid(ctx, 9, good, true); err != nil {
		t.Fatal(err)
	}
	if got := first.checker.calls.Load(); got != calls+1 {
		t.Errorf("the MDS was asked %d times for an answer past the TTL, want once", got-calls)
	}
	if err := first.reg.Fence(ctx, 200); err != nil {
		t.Fatal(err)
	}

	first.reg.Close()
	eventually(t, "the agent to notice the MDS is gone", func() bool { return agentConn(a) == nil })
	a.mu.Lock()
	for k, e := range a.cache {
		if k.other[0] == 0xA2 {
			e.at = e.at.Add(-2 * time.Hour) // answered longer than a lease ago
			a.cache[k] = e
		}
	}
	a.mu.Unlock()
	stale := a.Stats().StateidStaleHits
	for _, tt := range []struct {
		name string
		sid  [16]byte
		ok   bool
	}{
		{"accepted within the lease", good, true},
		{"accepted longer than a lease ago", aged, false},
		{"fenced", fenced, false},
		{"never asked", never, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := a.CheckStateid(ctx, 9, tt.sid, true)
			switch {
			case tt.ok && err != nil:
				t.Errorf("CheckStateid without an MDS = %v, want nil", err)
			case !tt.ok && (!errors.Is(err, pnfs.ErrMDSUnreachable) || errors.Is(err, pnfs.ErrUnavailable)):
				t.Errorf("CheckStateid without an MDS = %v, want pnfs.ErrMDSUnreachable and not pnfs.ErrUnavailable", err)
			}
		})
	}
	if got := a.Stats().StateidStaleHits; got != stale+1 {
		t.Errorf("StateidStaleHits %d, want %d", got, stale+1)
	}

	// A new leader, of a higher term, at the other address. It knows
	// nothing of its predecessor's stateids.
	next := startFailoverMDS(t, nextLn, rec, 2, true, time.Hour)
	next.checker.set(good, 0, pnfs.ErrStaleStateid)
	eventually(t, "the agent to register with the new leader", func() bool {
		mds, term, ok := agentState(a)
		return ok && mds == next.addr && term == 2
	})
	a.mu.Lock()
	n := len(a.cache)
	a.mu.Unlock()
	if n != 0 {
		t.Errorf("%d stateid answers survived registering with a new leader", n)
	}
	if err := a.CheckStateid(ctx, 9, good, true); !errors.Is(err, pnfs.ErrStaleStateid) {
		t.Errorf("CheckStateid at the new leader = %v, want pnfs.ErrStaleStateid", err)
	}
}

// TestAgentRefusesOlderTerm: once registered in term 5, a DS refuses the
// registration of an MDS that claims to lead in an older term (a deposed
// leader that has not noticed) and goes on to the next address; a newer
// term, the same one, or term 0 (an MDS that is not elected) is accepted,
// and the connection of the earlier registration is closed.
func TestAgentRefusesOlderTerm(t *testing.T) {
	for _, tt := range []struct {
		name   string
		term   uint64
		accept bool
	}{
		{"older", 3, false},
		{"oldest", 1, false},
		{"same", 5, true},
		{"newer", 8, true},
		{"not elected", 0, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			rec := metaRecord{newMeta(t)}
			high := startFailoverMDS(t, listen(t), rec, 5, true, 0)
			other := startFailoverMDS(t, listen(t), rec, tt.term, true, 0)
			tc := &testCluster{t: t}
			a := newBareAgent(AgentConfig{MDS: []string{other.addr, high.addr}, ID: "ds0", Store: tc.newStore(), JoinSecret: testSecret})
			defer a.cancel()
			ctx, cancel := context.WithTimeout(context.Background(), waitBound)
			defer cancel()
			if err := a.connectTo(ctx, high.addr); err != nil {
				t.Fatal(err)
			}
			before := agentConn(a)
			defer before.Close()

			// other is first in the list.
			if err := a.connect(ctx); err != nil {
				t.Fatal(err)
			}
			after := agentConn(a)
			defer after.Close()
			mds, term, _ := agentState(a)
			want, wantTerm := high.addr, uint64(5)
			if tt.accept {
				want, wantTerm = other.addr, max(5, tt.term)
			}
			if mds != want || term != wantTerm {
				t.Errorf("registered with %s in term %d; want %s in term %d", mds, term, want, wantTerm)
			}
			select {
			case <-before.Done():
			case <-time.After(waitBound):
				t.Errorf("the connection of the earlier registration is still open")
			}
			if !tt.accept {
				// The refusal went to the next address; directly, it is
				// ErrNotLeader.
				err := a.connectTo(ctx, other.addr)
				if !errors.Is(err, ErrNotLeader) {
					t.Errorf("registering with term %d after term 5 = %v, want ErrNotLeader", tt.term, err)
				}
				if c := agentConn(a); c != after {
					t.Errorf("a refused registration replaced the connection")
				}
			}
		})
	}
}

// TestAgentRefusesCallsOfOldTerm: the MDS's calls (FENCE, OBJ_*, RETIRE,
// ...) on a connection registered in an older term than the DS has since
// registered in are refused with CTL_ERR_NOT_LEADER, and change nothing;
// the current leader's are served.
func TestAgentRefusesCallsOfOldTerm(t *testing.T) {
	rec := metaRecord{newMeta(t)}
	old := startFailoverMDS(t, listen(t), rec, 1, true, 0)
	cur := startFailoverMDS(t, listen(t), rec, 2, true, 0)
	tc := &testCluster{t: t}
	st := tc.newStore()
	a := newBareAgent(AgentConfig{MDS: []string{old.addr, cur.addr}, ID: "ds0", Store: st, JoinSecret: testSecret})
	defer a.cancel()
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	if err := a.connectTo(ctx, old.addr); err != nil {
		t.Fatal(err)
	}
	// The DS registers in term 2 while its term-1 connection is still
	// open (connectTo closes it; a call may already be on its way).
	oldConn := agentConn(a)
	defer oldConn.Close()
	a.mu.Lock()
	a.conn = nil
	a.mu.Unlock()
	if err := a.connectTo(ctx, cur.addr); err != nil {
		t.Fatal(err)
	}
	defer agentConn(a).Close()

	if err := old.reg.Fence(ctx, 42); !errors.Is(err, ErrNotLeader) {
		t.Errorf("FENCE from the old term = %v, want ErrNotLeader", err)
	}
	toDS, err := old.reg.conn("ds0")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		proc uint32
		args xdr.Marshaler
	}{
		{"UNFENCE", ctlproto.CTLPROC_UNFENCE, &ctlproto.CtlClientArgs{Clientid: 42}},
		{"OBJ_WRITE", ctlproto.CTLPROC_OBJ_WRITE, &ctlproto.CtlWriteArgs{Ino: 7, Data: []byte("stale")}},
		{"OBJ_TRUNCATE", ctlproto.CTLPROC_OBJ_TRUNCATE, &ctlproto.CtlTruncateArgs{Ino: 7, Size: 100}},
		{"OBJ_READ", ctlproto.CTLPROC_OBJ_READ, &ctlproto.CtlReadArgs{Ino: 7, Count: 10}},
		{"OBJ_GETSIZE", ctlproto.CTLPROC_OBJ_GETSIZE, &ctlproto.CtlInoArgs{Ino: 7}},
		{"MAP_CHANGED", ctlproto.CTLPROC_MAP_CHANGED, &ctlproto.CtlInoArgs{Ino: 7}},
		{"RETIRE", ctlproto.CTLPROC_RETIRE, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			var res ctlproto.CtlStatusRes
			if err := call(ctx, toDS, c.proc, c.args, &res); err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
			if res.Status != ctlproto.CTL_ERR_NOT_LEADER {
				t.Errorf("%s from the old term: %v, want CTL_ERR_NOT_LEADER", c.name, res.Status)
			}
		})
	}
	a.mu.Lock()
	_, fenced := a.fenced[42]
	a.mu.Unlock()
	if fenced {
		t.Errorf("the old term's FENCE took effect")
	}
	if _, err := st.Open(7, false); err == nil {
		t.Errorf("the old term's OBJ_WRITE or OBJ_TRUNCATE made an object")
	}
	select {
	case <-a.Removed():
		t.Errorf("the old term's RETIRE removed the DS")
	default:
	}

	// The current leader is served.
	if err := cur.reg.Fence(ctx, 42); err != nil {
		t.Errorf("FENCE from the current term: %v", err)
	}
	a.mu.Lock()
	_, fenced = a.fenced[42]
	a.mu.Unlock()
	if !fenced {
		t.Errorf("the current term's FENCE did not take effect")
	}
	toDS, err = cur.reg.conn("ds0")
	if err != nil {
		t.Fatal(err)
	}
	var res ctlproto.CtlWriteRes
	if err := call(ctx, toDS, ctlproto.CTLPROC_OBJ_WRITE, &ctlproto.CtlWriteArgs{Ino: 7, Data: []byte("fresh")}, &res); err != nil || res.Status != ctlproto.CTL_OK {
		t.Errorf("OBJ_WRITE from the current term: %v, %v", res.Status, err)
	}
}
