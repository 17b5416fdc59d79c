package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shoalfs/shoal/internal/rpc"
	"github.com/shoalfs/shoal/meta"
	"github.com/shoalfs/shoal/pnfs"
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
	return 0, pnfs.ErrBadStateid
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

// testSecret is the join secret of the test registries; their agents
// present it.
var testSecret = []byte("test-join-secret")

// testDataKey is the data filehandle key the test registries hand out.
var testDataKey = []byte("test-data-key")

// testClock is a registry clock that runs with the real one, shifted by
// an offset the test sets: it ages an out-of-service data server past
// DownAfter without waiting.
type testClock struct{ offset atomic.Int64 }

func (c *testClock) now() time.Time { return time.Now().Add(time.Duration(c.offset.Load())) }

// advance moves the clock d forward.
func (c *testClock) advance(d time.Duration) { c.offset.Add(int64(d)) }

// metaRecord keeps a registry's record in a metadata engine, as the MDS
// does, so it survives a registry restart.
type metaRecord struct{ e meta.Engine }

func (r metaRecord) Load(ctx context.Context) ([]byte, error) {
	b, err := r.e.GetConfig(ctx, "cluster/registry")
	if errors.Is(err, meta.ErrNotFound) {
		return nil, nil
	}
	return b, err
}

func (r metaRecord) Save(ctx context.Context, b []byte) error {
	return r.e.PutConfig(ctx, "cluster/registry", b)
}

// newMeta opens a metadata engine on a temporary directory; it holds the
// stripe maps (and the registry record) of a test cluster.
func newMeta(t testing.TB) meta.Engine {
	t.Helper()
	e, err := meta.OpenBolt(filepath.Join(t.TempDir(), "meta.db"), meta.BoltOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

var fileSeq atomic.Uint64

// newFile creates a regular file in e and returns its inode number: stripe
// maps are kept for regular files only.
func newFile(t testing.TB, e meta.Engine) uint64 {
	t.Helper()
	nd, _, err := e.Create(context.Background(), meta.RootIno, fmt.Sprintf("f%d", fileSeq.Add(1)),
		meta.CreateArgs{Type: meta.TypeRegular, Mode: 0o644}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	return uint64(nd.Ino)
}

// testCluster is a registry listening on 127.0.0.1 and n agents, each with
// its own store.Local, and a metadata engine for stripe maps and the
// registry's record.
type testCluster struct {
	t       testing.TB
	reg     *Registry
	addr    string
	serveCh chan error
	checker *fakeChecker
	events  chan Event
	agents  []*Agent
	stores  []*store.Local
	meta    meta.Engine

	clock    *testClock                                            // the registry's clock, if set
	fileSize func(ctx context.Context, ino uint64) (uint64, error) // RegistryConfig.FileSize, if set
}

// testMissedBeats is the liveness window of the test registries, in
// heartbeat intervals; their agents learn it at REGISTER. Generous:
// heartbeats are not under test except through closed connections (and
// heartbeat_test.go), and -race slows everything down.
const testMissedBeats = 200

func testRegistryConfig(c *fakeChecker) RegistryConfig {
	return RegistryConfig{
		DataKey:           testDataKey,
		JoinSecret:        testSecret,
		HeartbeatInterval: 100 * time.Millisecond,
		MissedBeats:       testMissedBeats,
		CheckStateid:      c.check,
	}
}

// newTestRegistry is NewRegistry failing the test on error, closed at the
// end of the test.
func newTestRegistry(t testing.TB, cfg RegistryConfig) *Registry {
	t.Helper()
	r, err := NewRegistry(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

func newCluster(t testing.TB, n int) *testCluster {
	t.Helper()
	return newClusterWith(t, n, &testCluster{})
}

// newClusterWith starts a cluster configured by the clock and fileSize of
// tc. Agent i is named dsi and joins i-th, so it is i-th in Placement.
func newClusterWith(t testing.TB, n int, tc *testCluster) *testCluster {
	t.Helper()
	tc.t, tc.checker, tc.events = t, newFakeChecker(), make(chan Event, 1000)
	tc.meta = newMeta(t)
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
	// parallel, then register in order so that Placement is ds0..dsn-1.
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

// startRegistry starts a registry on ln keeping its record in tc.meta, so
// a registry started again is the same cluster.
func (tc *testCluster) startRegistry(ln net.Listener) {
	tc.t.Helper()
	cfg := testRegistryConfig(tc.checker)
	cfg.Store = metaRecord{tc.meta}
	cfg.FileSize = tc.fileSize
	if tc.clock != nil {
		cfg.now = tc.clock.now
	}
	var err error
	if tc.reg, err = NewRegistry(context.Background(), cfg); err != nil {
		ln.Close()
		tc.t.Fatal(err)
	}
	tc.reg.Subscribe(func(ev Event) { tc.events <- ev })
	tc.serveCh = make(chan error, 1)
	reg := tc.reg
	go func() { tc.serveCh <- reg.Serve(ln) }()
}

// striped returns a Striped over tc's registry keeping its maps in tc.meta.
func (tc *testCluster) striped(unit uint64) *Striped { return NewStriped(tc.reg, tc.meta, unit) }

// newFile creates a regular file in tc.meta.
func (tc *testCluster) newFile() uint64 {
	tc.t.Helper()
	return newFile(tc.t, tc.meta)
}

func (tc *testCluster) addAgent(id string) *Agent {
	tc.t.Helper()
	st, err := store.NewLocal(tc.t.TempDir(), store.LocalOptions{})
	if err != nil {
		tc.t.Fatal(err)
	}
	return tc.startAgent(id, st)
}

// agentConfig is the configuration of a test agent named id on st.
func (tc *testCluster) agentConfig(id string, st store.Backend) AgentConfig {
	return AgentConfig{
		MDS:        []string{tc.addr},
		ID:         id,
		Addrs:      []string{"127.0.0.1:2049"},
		Store:      st,
		JoinSecret: testSecret,
		Capacity:   func() (uint64, uint64) { return 1 << 40, 1 << 39 },
		Logger:     discardLogger(),
	}
}

func (tc *testCluster) startAgent(id string, st *store.Local) *Agent {
	tc.t.Helper()
	return tc.startAgentWith(tc.agentConfig(id, st), st)
}

// startAgentWith starts an agent on cfg, whose Store is st.
func (tc *testCluster) startAgentWith(cfg AgentConfig, st *store.Local) *Agent {
	tc.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	a, err := StartAgent(ctx, cfg)
	if err != nil {
		st.Close()
		tc.t.Fatalf("StartAgent %s: %v", cfg.ID, err)
	}
	tc.agents = append(tc.agents, a)
	tc.stores = append(tc.stores, st)
	return a
}

// agent returns the (last started) agent of data server id and its store.
func (tc *testCluster) agent(id string) (*Agent, *store.Local) {
	tc.t.Helper()
	for j := len(tc.agents) - 1; j >= 0; j-- {
		if tc.agents[j].ID() == id {
			return tc.agents[j], tc.stores[j]
		}
	}
	tc.t.Fatalf("no agent is data server %q", id)
	return nil, nil
}

// stripeMap returns ino's stripe map, which must exist.
func stripeMap(t testing.TB, s *Striped, ino uint64) meta.StripeMap {
	t.Helper()
	m, ok, err := s.Map(context.Background(), ino)
	if err != nil || !ok {
		t.Fatalf("stripe map of ino %d: %v, %v", ino, ok, err)
	}
	return m
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

// newBareAgent returns an agent for data server id that is not started:
// no registration, heartbeat loop or serving until the test says so.
func newBareAgent(cfg AgentConfig) *Agent {
	a := &Agent{cfg: cfg, log: discardLogger(), ttl: stateidTTL, clusterID: cfg.ClusterID,
		fenced: map[uint64]struct{}{}, cache: map[cacheKey]cacheEntry{},
		done: make(chan struct{}), removedCh: make(chan struct{})}
	a.ctx, a.cancel = context.WithCancel(context.Background())
	return a
}

// registerBareAgent registers a DS named id with the MDS at mds and runs
// nothing else: no heartbeat loop, no serving, so the test decides when
// (or whether) the DS speaks again. stop closes the control connection and
// cancels the agent; callers defer it so it runs before their registry's
// Close, as an agent that goes away first would.
func registerBareAgent(t *testing.T, mds, id string) (a *Agent, stop func()) {
	t.Helper()
	tc := &testCluster{t: t}
	a = newBareAgent(AgentConfig{MDS: []string{mds}, ID: id, Store: tc.newStore(), JoinSecret: testSecret})
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
