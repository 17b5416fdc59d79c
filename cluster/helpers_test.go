package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shoalfs/shoal/internal/rpc"
	"github.com/shoalfs/shoal/store"
)

// waitBound bounds every wait in these tests; it is a hang guard, not a
// timing assertion.
const waitBound = 20 * time.Second

// fakeChecker stands in for the server's stateid table.
type fakeChecker struct {
	mu      sync.Mutex
	valid   map[[16]byte]uint64 // stateid -> client id
	verdict map[[16]byte]error  // stateid -> refusal
	calls   atomic.Int64
}

func newFakeChecker() *fakeChecker {
	return &fakeChecker{valid: map[[16]byte]uint64{}, verdict: map[[16]byte]error{}}
}

func (f *fakeChecker) check(_ context.Context, ino uint64, sid [16]byte, write bool) (uint64, error) {
	f.calls.Add(1)
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.verdict[sid]; err != nil {
		return 0, fmt.Errorf("fake: %w", err)
	}
	if id, ok := f.valid[sid]; ok {
		return id, nil
	}
	return 0, ErrBadStateid
}

func (f *fakeChecker) set(sid [16]byte, client uint64, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err != nil {
		f.verdict[sid] = err
		return
	}
	f.valid[sid] = client
}

// testCluster is a registry listening on 127.0.0.1 and n agents, each with
// its own store.Local.
type testCluster struct {
	t       testing.TB
	reg     *Registry
	addr    string
	serveCh chan error
	checker *fakeChecker
	events  chan Event
	agents  []*Agent
	stores  []*store.Local

	width     int    // RegistryConfig.Width
	stateFile string // OpenRegistry if set
}

// testMissedBeats is the liveness window of the test registries, in
// heartbeat intervals; their agents learn it at REGISTER. Generous:
// heartbeats are not under test except through closed connections (and
// heartbeat_test.go), and -race slows everything down.
const testMissedBeats = 200

func testRegistryConfig(c *fakeChecker) RegistryConfig {
	return RegistryConfig{
		Secret:            []byte("cluster-secret"),
		JoinToken:         []byte("join"),
		HeartbeatInterval: 100 * time.Millisecond,
		MissedBeats:       testMissedBeats,
		CheckStateid:      c.check,
	}
}

func newCluster(t testing.TB, n int) *testCluster {
	t.Helper()
	return newClusterWith(t, n, &testCluster{})
}

// newClusterWith starts a cluster configured by the width and stateFile
// of tc.
func newClusterWith(t testing.TB, n int, tc *testCluster) *testCluster {
	t.Helper()
	tc.t, tc.checker, tc.events = t, newFakeChecker(), make(chan Event, 1000)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tc.addr = ln.Addr().String()
	tc.startRegistry(ln)
	t.Cleanup(func() {
		for _, a := range tc.agents {
			a.Close()
		}
		tc.reg.Close()
		for _, s := range tc.stores {
			s.Close()
		}
	})
	// Stores are slow to create (256 directories each): make them in
	// parallel, then register in order so that agent i gets index i.
	stores := make([]*store.Local, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { stores[i], _ = store.NewLocal(t.TempDir(), store.LocalOptions{}) })
	}
	wg.Wait()
	for i := range n {
		if stores[i] == nil {
			t.Fatal("store.NewLocal failed")
		}
		tc.startAgent(fmt.Sprintf("ds%d", i), stores[i])
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	if err := tc.reg.WaitFor(ctx, n); err != nil {
		t.Fatal(err)
	}
	return tc
}

func (tc *testCluster) startRegistry(ln net.Listener) {
	cfg := testRegistryConfig(tc.checker)
	cfg.Width = tc.width
	if tc.stateFile == "" {
		tc.reg = NewRegistry(cfg)
	} else {
		var err error
		if tc.reg, err = OpenRegistry(cfg, tc.stateFile); err != nil {
			tc.t.Fatal(err)
		}
	}
	tc.reg.Subscribe(func(ev Event) { tc.events <- ev })
	tc.serveCh = make(chan error, 1)
	reg := tc.reg
	go func() { tc.serveCh <- reg.Serve(ln) }()
}

func (tc *testCluster) addAgent(id string) *Agent {
	tc.t.Helper()
	st, err := store.NewLocal(tc.t.TempDir(), store.LocalOptions{})
	if err != nil {
		tc.t.Fatal(err)
	}
	return tc.startAgent(id, st)
}

func (tc *testCluster) startAgent(id string, st *store.Local) *Agent {
	tc.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	a, err := StartAgent(ctx, AgentConfig{
		MDS:       tc.addr,
		ID:        id,
		Addrs:     []string{"127.0.0.1:2049"},
		Store:     st,
		JoinToken: []byte("join"),
		Capacity:  func() (uint64, uint64) { return 1 << 40, 1 << 39 },
	})
	if err != nil {
		st.Close()
		tc.t.Fatalf("StartAgent %s: %v", id, err)
	}
	tc.agents = append(tc.agents, a)
	tc.stores = append(tc.stores, st)
	return a
}

// agentAt returns the agent (and its store) holding stripe index i.
func (tc *testCluster) agentAt(i int) (*Agent, *store.Local) {
	tc.t.Helper()
	for j, a := range tc.agents {
		if a.Index() == i {
			return a, tc.stores[j]
		}
	}
	tc.t.Fatalf("no agent has index %d", i)
	return nil, nil
}

// nextEvent waits for an event matching kind and id, skipping others.
func (tc *testCluster) nextEvent(kind EventKind, id string) Event {
	tc.t.Helper()
	timer := time.NewTimer(waitBound)
	defer timer.Stop()
	for {
		select {
		case ev := <-tc.events:
			if ev.Kind == kind && ev.DS.ID == id {
				return ev
			}
		case <-timer.C:
			tc.t.Fatalf("no %v event for %s", kind, id)
		}
	}
}

// agentConn returns the agent's current registered connection.
func agentConn(a *Agent) *rpc.Conn {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.conn
}

// eventually polls cond, bounded in count and time.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for range 2000 {
		if cond() {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("gave up waiting for %s", what)
}

func (tc *testCluster) newStore() *store.Local {
	tc.t.Helper()
	st, err := store.NewLocal(tc.t.TempDir(), store.LocalOptions{})
	if err != nil {
		tc.t.Fatal(err)
	}
	tc.t.Cleanup(func() { st.Close() })
	return st
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// registerBareAgent registers a DS named id with the MDS at mds and runs
// nothing else: no heartbeat loop, no serving, so the test decides when
// (or whether) the DS speaks again. stop closes the control connection and
// cancels the agent; callers defer it so it runs before their registry's
// Close, as an agent that goes away first would.
func registerBareAgent(t *testing.T, mds, id string) (a *Agent, stop func()) {
	t.Helper()
	tc := &testCluster{t: t}
	a = &Agent{cfg: AgentConfig{MDS: mds, ID: id, Store: tc.newStore(), JoinToken: []byte("join")},
		index: -1, fenced: map[uint64]struct{}{}, cache: map[cacheKey]cacheEntry{}, drainedCh: make(chan struct{})}
	a.log = discardLogger()
	a.ctx, a.cancel = context.WithCancel(context.Background())
	if err := a.connect(context.Background()); err != nil {
		a.cancel()
		t.Fatal(err)
	}
	conn := agentConn(a)
	return a, func() {
		conn.Close()
		a.cancel()
	}
}

// pattern returns n bytes that differ with position and seed and contain
// no zero bytes, so misplaced or missing data shows.
func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7+i/4093+int(seed))%251 + 1
	}
	return b
}

func writeAll(t *testing.T, s *Striped, ino uint64, data []byte, off int64) {
	t.Helper()
	f, err := s.Open(ino, true)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if n, err := f.WriteAt(data, off); err != nil || n != len(data) {
		t.Fatalf("WriteAt: %d, %v", n, err)
	}
	if err := f.Sync(); err != nil {
		t.Fatalf("Sync: %v", err)
	}
}

func readAll(t *testing.T, s *Striped, ino uint64, n int, off int64) []byte {
	t.Helper()
	f, err := s.Open(ino, false)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, n)
	got, err := f.ReadAt(buf, off)
	if err != nil && !errors.Is(err, io.EOF) {
		t.Fatalf("ReadAt: %v", err)
	}
	return buf[:got]
}
