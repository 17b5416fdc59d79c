package cluster

import (
	"bytes"
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/shoalfs/shoal/internal/ctlproto"
	"github.com/shoalfs/shoal/internal/rpc"
	"github.com/shoalfs/shoal/internal/xdr"
)

// heartbeatGate serves a registry over a real connection and can hold
// the first heartbeat arriving after arm, injecting a slow MDS answer.
type heartbeatGate struct {
	reg *Registry

	mu      sync.Mutex
	armed   bool
	held    chan struct{} // closed when the held heartbeat arrives
	release chan struct{} // closing it lets the held heartbeat be answered
	heldOn  *rpc.Conn
	beats   map[*rpc.Conn]int // heartbeats answered, per connection
}

func (g *heartbeatGate) serveRPC(ctx context.Context, c *rpc.Call, res *xdr.Encoder) rpc.AcceptStat {
	if c.Prog == ctlproto.SHOAL_CONTROL && c.Proc == ctlproto.CTLPROC_HEARTBEAT {
		g.mu.Lock()
		hold := g.armed
		if hold {
			g.armed = false
			g.heldOn = c.Conn
			close(g.held)
		}
		release := g.release
		g.mu.Unlock()
		if hold {
			select {
			case <-release:
			case <-ctx.Done():
			}
		}
		defer func() {
			g.mu.Lock()
			g.beats[c.Conn]++
			g.mu.Unlock()
		}()
	}
	return g.reg.serveRPC(ctx, c, res)
}

// arm holds the next heartbeat until the returned release is called.
func (g *heartbeatGate) arm() (held <-chan struct{}, release func()) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.armed = true
	g.held = make(chan struct{})
	g.release = make(chan struct{})
	var once sync.Once
	rel := g.release
	return g.held, func() { once.Do(func() { close(rel) }) }
}

// holdNext arms the gate and waits until a heartbeat is held; the returned
// func releases it.
func (g *heartbeatGate) holdNext(t *testing.T) (release func()) {
	t.Helper()
	held, release := g.arm()
	select {
	case <-held:
	case <-time.After(waitBound):
		release()
		t.Fatal("no heartbeat arrived")
	}
	return release
}

func (g *heartbeatGate) beatsOn(c *rpc.Conn) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.beats[c]
}

// startGatedRegistry runs a registry with the given heartbeat settings
// behind a heartbeatGate, and one agent registered with it.
func startGatedRegistry(t *testing.T, interval time.Duration, mdsMissed, agentMissed int) (*heartbeatGate, *Agent, chan Event) {
	t.Helper()
	cfg := testRegistryConfig(newFakeChecker())
	cfg.HeartbeatInterval, cfg.MissedBeats = interval, mdsMissed
	reg, err := NewRegistry(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	events := make(chan Event, 100)
	reg.Subscribe(func(ev Event) { events <- ev })
	g := &heartbeatGate{reg: reg, beats: map[*rpc.Conn]int{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &rpc.Server{Handler: rpc.HandlerFunc(g.serveRPC), IdleTimeout: -1, Logger: discardLogger()}
	served := make(chan struct{})
	go func() { defer close(served); srv.Serve(ln) }()
	tc := &testCluster{t: t}
	st := tc.newStore()
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	a, err := StartAgent(ctx, AgentConfig{
		MDS: []string{ln.Addr().String()}, ID: "ds0", Addrs: []string{"127.0.0.1:2049"},
		Store: st, JoinSecret: testSecret, MissedBeats: agentMissed,
		Capacity: func() (uint64, uint64) { return 1 << 40, 1 << 39 },
	})
	if err != nil {
		srv.Close()
		reg.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		a.Close()
		srv.Close()
		<-served
		reg.Close()
	})
	if err := reg.WaitFor(ctx, 1); err != nil {
		t.Fatal(err)
	}
	return g, a, events
}

// TestSlowHeartbeatAnswer holds the MDS's answer to one heartbeat for
// many heartbeat intervals, though within the liveness window, while the
// MDS reads and writes through the DS: the agent must keep its connection
// and registration, the MDS's object calls must succeed, and heartbeats
// must go on afterwards on the same connection.
func TestSlowHeartbeatAnswer(t *testing.T) {
	const interval = 50 * time.Millisecond
	// A 10 s window on both sides; the answer is held for 10 intervals,
	// five times what the agent used to wait before closing.
	g, a, events := startGatedRegistry(t, interval, 200, 200)
	conn := agentConn(a)
	e := newMeta(t)
	s := NewStriped(g.reg, e, 64<<10)
	ino := newFile(t, e)
	data := pattern(3<<20, 9)

	release := g.holdNext(t)
	defer release()
	start := time.Now()
	// The DS serves the MDS's OBJ_WRITE and OBJ_READ while its heartbeat
	// waits for an answer.
	writeAll(t, s, ino, data, 0)
	f, err := s.Open(ino, false)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got := make([]byte, len(data))
	if n, err := f.ReadAt(got, 0); n != len(data) || err != nil || !bytes.Equal(got, data) {
		t.Fatalf("ReadAt while a heartbeat is held = %d, %v (equal %v)", n, err, bytes.Equal(got, data))
	}
	time.Sleep(time.Until(start.Add(10 * interval))) // the injected delay
	release()

	// The held heartbeat is answered, and two more follow on the same
	// connection (heldOn is the MDS's end of it, conn the agent's).
	g.mu.Lock()
	heldOn := g.heldOn
	g.mu.Unlock()
	before := g.beatsOn(heldOn)
	eventually(t, "heartbeats after the slow answer", func() bool { return g.beatsOn(heldOn) >= before+3 })
	for _, c := range []*rpc.Conn{conn, heldOn} {
		select {
		case <-c.Done():
			t.Fatal("the control connection closed after a slow heartbeat answer")
		default:
		}
	}
	if c := agentConn(a); c != conn {
		t.Errorf("agent connection changed from %p to %p", conn, c)
	}
	if n := a.Stats().Registrations; n != 1 {
		t.Errorf("agent registered %d times; a slow answer must not make it re-register", n)
	}
	for len(events) > 0 {
		if ev := <-events; ev.Kind == Left {
			t.Errorf("DS left service after a slow heartbeat answer: %+v", ev)
		}
	}
	if ds := g.reg.DataServers(); len(ds) != 1 || !ds[0].Up {
		t.Errorf("data servers: %+v", ds)
	}
	if n, err := f.ReadAt(got, 0); n != len(data) || !bytes.Equal(got, data) {
		t.Fatalf("ReadAt after the slow heartbeat = %d, %v", n, err)
	}
}

// TestSilentMDS holds a heartbeat answer past the agent's liveness
// window (the MDS's own window is far longer, so the agent acts first):
// the agent must give up on the connection and register again, not wait
// forever.
func TestSilentMDS(t *testing.T) {
	g, a, events := startGatedRegistry(t, 20*time.Millisecond, 100_000, 5)
	conn := agentConn(a)
	defer g.holdNext(t)()
	select {
	case <-conn.Done():
	case <-time.After(waitBound):
		t.Fatal("the agent kept a connection the MDS never answered on")
	}
	eventually(t, "the agent to register again", func() bool { return a.Stats().Registrations >= 2 })
	var left, joined bool
	timeout := time.After(waitBound)
	for !left || !joined {
		select {
		case ev := <-events:
			left = left || ev.Kind == Left
			joined = joined || (left && ev.Kind == Joined)
		case <-timeout:
			t.Fatalf("events after the silent connection: left %v, joined again %v", left, joined)
		}
	}
}

// TestMonitorJudgement checks the MDS's liveness verdicts on a registered
// DS at chosen instants: late heartbeats drop it when the monitor looks on
// time, but not when the monitor itself ran late (the MDS was stalled and
// may not have read the heartbeats that arrived meanwhile).
func TestMonitorJudgement(t *testing.T) {
	// The registry's own monitor looks every interval: make that long
	// enough that it never looks while the test runs; the test is the
	// clock.
	const interval = time.Hour
	cfg := testRegistryConfig(newFakeChecker())
	cfg.HeartbeatInterval, cfg.MissedBeats = interval, 3
	reg := newTestRegistry(t, cfg)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go reg.Serve(ln)
	_, stop := registerBareAgent(t, ln.Addr().String(), "judged")
	defer stop()
	reg.mu.Lock()
	last := reg.byID["judged"].ds.LastBeat
	reg.mu.Unlock()
	for _, tt := range []struct {
		name     string
		after    time.Duration // since the last heartbeat
		since    time.Duration // since the monitor's previous look
		wantDead bool
	}{
		{"fresh", interval, interval, false},
		{"at the window", 3 * interval, interval, false},
		{"missed, monitor on time", 3*interval + time.Millisecond, interval, true},
		{"missed long ago, monitor on time", 30 * interval, 2 * interval, true},
		{"missed, monitor stalled", 10 * interval, 10 * interval, false},
		{"missed, monitor just late", 10 * interval, 2*interval + time.Millisecond, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dead := reg.expired(last.Add(tt.after), tt.since)
			if got := len(dead) == 1; got != tt.wantDead || len(dead) > 1 {
				t.Errorf("expired(+%v, since %v) = %d connections, want dead %v", tt.after, tt.since, len(dead), tt.wantDead)
			}
		})
	}
}

// TestAgentAdoptsMDSWindow runs a registry whose liveness window is 6
// intervals, twice the default, and holds one heartbeat answer for 4
// intervals: past any window of 3 (counted from the answer before, which
// came before the held heartbeat was sent), within one of 6. An agent left
// unconfigured learns 6 from REGISTER and keeps its connection, where the
// fixed 3 it used to assume makes it drop the connection and re-register,
// as an explicit override of 3 still does.
func TestAgentAdoptsMDSWindow(t *testing.T) {
	const (
		interval  = 250 * time.Millisecond
		mdsMissed = 12 // a 3 s window: the 1 s hold below stays well inside it on a loaded machine
		hold      = 4 * interval
	)
	for _, tt := range []struct {
		name        string
		agentMissed int // AgentConfig.MissedBeats
		wantMissed  int // the window the agent uses
		wantDrop    bool
	}{
		{"learnt from REGISTER", 0, mdsMissed, false},
		{"override of 3", 3, 3, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			g, a, events := startGatedRegistry(t, interval, mdsMissed, tt.agentMissed)
			a.mu.Lock()
			missed := a.missed
			a.mu.Unlock()
			if missed != tt.wantMissed {
				t.Fatalf("agent's liveness window is %d intervals, want %d", missed, tt.wantMissed)
			}
			conn := agentConn(a)
			release := g.holdNext(t)
			defer release()
			if tt.wantDrop {
				// The agent gives up on the unanswered heartbeat by itself.
				select {
				case <-conn.Done():
				case <-time.After(waitBound):
					t.Fatal("the agent with a 3-interval window kept a connection unanswered for 4")
				}
				release()
				eventually(t, "the agent to register again", func() bool { return a.Stats().Registrations >= 2 })
				return
			}
			time.Sleep(hold) // the injected delay, as in TestSlowHeartbeatAnswer
			release()
			g.mu.Lock()
			heldOn := g.heldOn
			g.mu.Unlock()
			closed := func() bool {
				for _, c := range []*rpc.Conn{conn, heldOn} {
					select {
					case <-c.Done():
						return true
					default:
					}
				}
				return false
			}
			before := g.beatsOn(heldOn)
			eventually(t, "heartbeats after the held answer", func() bool { return closed() || g.beatsOn(heldOn) >= before+2 })
			if closed() {
				t.Fatal("the control connection closed within the MDS's liveness window")
			}
			if n := a.Stats().Registrations; n != 1 {
				t.Errorf("agent registered %d times; it must wait out the MDS's window", n)
			}
			for len(events) > 0 {
				if ev := <-events; ev.Kind == Left {
					t.Errorf("DS left service within the MDS's liveness window: %+v", ev)
				}
			}
		})
	}
}

// TestRegisterReplyWindow checks that REGISTER's reply carries the
// registry's heartbeat interval and liveness window, defaults applied.
func TestRegisterReplyWindow(t *testing.T) {
	for _, tt := range []struct {
		name       string
		missed     int // RegistryConfig.MissedBeats
		wantMissed uint32
	}{
		{"default", 0, 3},
		{"negative", -1, 3},
		{"wider", 6, 6},
		{"huge", 100_000, 100_000},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testRegistryConfig(newFakeChecker())
			cfg.HeartbeatInterval, cfg.MissedBeats = 250*time.Millisecond, tt.missed
			reg := newTestRegistry(t, cfg)
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			go reg.Serve(ln)
			ctx, cancel := context.WithTimeout(context.Background(), waitBound)
			defer cancel()
			conn, err := rpc.Dial(ctx, "tcp", ln.Addr().String(), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			var res ctlproto.CtlRegisterRes
			err = call(ctx, conn, ctlproto.CTLPROC_REGISTER, &ctlproto.CtlRegisterArgs{
				Revision: ctlproto.CTL_VERSION, Token: testSecret, DsId: "w"}, &res)
			if err != nil {
				t.Fatal(err)
			}
			if res.Status != ctlproto.CTL_OK || res.Ok == nil {
				t.Fatalf("REGISTER: %+v", res)
			}
			if res.Ok.HeartbeatMs != 250 || res.Ok.MissedBeats != tt.wantMissed {
				t.Errorf("REGISTER reply: heartbeat %d ms, %d missed beats; want 250 ms, %d", res.Ok.HeartbeatMs, res.Ok.MissedBeats, tt.wantMissed)
			}
		})
	}
}

// TestMissedBeats checks how the agent picks its liveness window.
func TestMissedBeats(t *testing.T) {
	for _, tt := range []struct {
		name     string
		override int
		fromMDS  uint32
		want     int
	}{
		{"learnt", 0, 6, 6},
		{"learnt default", 0, 3, 3},
		{"override", 10, 6, 10},
		{"override below the MDS's", 2, 6, 2},
		{"negative override ignored", -1, 6, 6},
		{"MDS sent none", 0, 0, defaultMissedBeats},
		{"large", 0, 1_000_000, 1_000_000},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := missedBeats(tt.override, tt.fromMDS); got != tt.want {
				t.Errorf("missedBeats(%d, %d) = %d, want %d", tt.override, tt.fromMDS, got, tt.want)
			}
		})
	}
	// A window too long to represent saturates rather than wrapping to a
	// negative duration, which would make the agent give up at once.
	if w := livenessWindow(1<<30, time.Duration(1<<32-1)*time.Millisecond); w <= 0 {
		t.Errorf("livenessWindow of an absurd window = %v", w)
	}
	if w := livenessWindow(6, time.Second); w != 6*time.Second {
		t.Errorf("livenessWindow(6, 1s) = %v", w)
	}
}

// TestHeartbeatRates follows a data server's I/O counters through
// successive heartbeats: rates come from two heartbeats at least half an
// interval apart, and counters that go backwards, or a data server out of
// service, start over from zero.
func TestHeartbeatRates(t *testing.T) {
	const interval = time.Second
	type beat struct {
		after          time.Duration // since the previous beat
		read, written  uint64
		down           bool // the data server leaves service before this beat
		wantR, wantW   float64
		wantRB, wantWB uint64 // counters recorded
	}
	for _, tt := range []struct {
		name  string
		beats []beat
	}{
		{"first beat is only a base", []beat{
			{after: interval, read: 100, written: 50, wantRB: 100, wantWB: 50},
		}},
		{"steady", []beat{
			{after: interval, read: 100, written: 50, wantRB: 100, wantWB: 50},
			{after: interval, read: 1100, written: 2050, wantR: 1000, wantW: 2000, wantRB: 1100, wantWB: 2050},
			{after: 2 * interval, read: 1100, written: 4050, wantR: 0, wantW: 1000, wantRB: 1100, wantWB: 4050},
		}},
		{"a beat close behind keeps the base and the rate", []beat{
			{after: interval, read: 0, written: 0},
			{after: interval, read: 1000, written: 0, wantR: 1000, wantRB: 1000},
			{after: interval / 10, read: 5000, written: 0, wantR: 1000, wantRB: 1000},
			{after: interval - interval/10, read: 5000, written: 0, wantR: 4000, wantRB: 5000},
		}},
		{"counters going backwards start over", []beat{
			{after: interval, read: 1000, written: 1000, wantRB: 1000, wantWB: 1000},
			{after: interval, read: 10, written: 20, wantRB: 10, wantWB: 20},
			{after: interval, read: 110, written: 20, wantR: 100, wantRB: 110, wantWB: 20},
		}},
		{"out of service", []beat{
			{after: interval, read: 0, written: 0},
			{after: interval, read: 500, written: 0, wantR: 500, wantRB: 500},
			{after: interval, down: true, read: 900, written: 0, wantRB: 900},
			{after: interval, read: 1900, written: 0, wantR: 1000, wantRB: 1900},
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := &Registry{interval: interval, cfg: RegistryConfig{now: time.Now}, log: discardLogger(), changed: make(chan struct{})}
			r.evCond = sync.NewCond(&r.evMu)
			m := &member{ds: DataServer{ID: "ds", Up: true}}
			now := time.Unix(1e9, 0)
			for i, b := range tt.beats {
				now = now.Add(b.after)
				if b.down {
					r.setUpLocked(m, false)
					if m.ds.ReadRate != 0 || m.ds.WriteRate != 0 {
						t.Errorf("beat %d: rates %v, %v out of service", i, m.ds.ReadRate, m.ds.WriteRate)
					}
					r.setUpLocked(m, true)
				}
				r.noteIOLocked(m, now, b.read, b.written)
				if m.ds.ReadRate != b.wantR || m.ds.WriteRate != b.wantW || m.ds.ReadBytes != b.wantRB || m.ds.WrittenBytes != b.wantWB {
					t.Errorf("beat %d: rates %v, %v counters %d, %d; want %v, %v and %d, %d", i,
						m.ds.ReadRate, m.ds.WriteRate, m.ds.ReadBytes, m.ds.WrittenBytes, b.wantR, b.wantW, b.wantRB, b.wantWB)
				}
			}
		})
	}
}

// TestHeartbeatCarriesIO checks that what a data server writes reaches the
// registry through its heartbeats.
func TestHeartbeatCarriesIO(t *testing.T) {
	tc := newCluster(t, 1)
	s := tc.striped(64)
	ino := tc.newFile()
	f, err := s.Open(ino, true)
	if err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte("x"), 4096)
	if _, err := f.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := f.ReadAt(make([]byte, 1024), 0); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(waitBound)
	for {
		ds, _ := tc.reg.DataServer("ds0")
		if ds.WrittenBytes >= uint64(len(data)) && ds.ReadBytes >= 1024 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("registry has %d bytes read, %d written; the agent counted %+v", ds.ReadBytes, ds.WrittenBytes, tc.agents[0].Stats())
		}
		time.Sleep(20 * time.Millisecond)
	}
}
