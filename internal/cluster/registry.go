package cluster

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/shoalfs/shoal/internal/ctlproto"
	"github.com/shoalfs/shoal/internal/rpc"
	"github.com/shoalfs/shoal/internal/xdr"
	"github.com/shoalfs/shoal/meta"
	"github.com/shoalfs/shoal/pnfs"
)

// State is a data server's place in the cluster's life cycle. It is
// persistent; whether the DS is reachable right now is DataServer.Up.
type State string

// States. Only Active DSes receive new files; Draining and Drained ones
// still serve the data they hold; Removed ones are refused at REGISTER.
const (
	Active   State = "active"
	Draining State = "draining" // `shoal admin drain` is moving its stripes away
	Drained  State = "drained"  // holds no stripes; ready for `shoal admin remove`
	Removed  State = "removed"
)

// DataServer describes one data server as the MDS sees it.
type DataServer struct {
	// ID is the DS's persistent identity (kept in its directory); stripe
	// maps name DSes by it.
	ID    string
	Addrs []string // advertised host:port, for GETDEVICEINFO; the last known while down
	// PeerAddrs is where other data servers reach it (REPLICA_WRITE);
	// empty means Addrs.
	PeerAddrs []string `json:",omitempty"`
	State     State
	// Capacity and Free are the DS's space in bytes, from its last
	// REGISTER or HEARTBEAT.
	Capacity, Free uint64
	// Up reports whether the DS is in service: registered over a live
	// connection and heartbeating.
	Up bool
	// Since is when Up last changed (for a DS not seen since the MDS
	// started: the MDS's start).
	Since time.Time
	// LastBeat is the last REGISTER or HEARTBEAT; zero if none since the
	// MDS started.
	LastBeat time.Time
	// ReadBytes and WrittenBytes are the DS's I/O counters from its last
	// HEARTBEAT: bytes it read from and wrote to its store since it
	// started. ReadRate and WriteRate are bytes per second between two
	// recent heartbeats; zero while the DS is out of service.
	ReadBytes, WrittenBytes uint64  `json:",omitempty"`
	ReadRate, WriteRate     float64 `json:",omitempty"`
}

// EventKind says what happened to a data server.
type EventKind int

// Event kinds.
const (
	Joined  EventKind = iota + 1 // entered service
	Left                         // left service (connection lost, heartbeats missed)
	Changed                      // its State changed (drain, remove)
)

func (k EventKind) String() string {
	switch k {
	case Joined:
		return "joined"
	case Left:
		return "left"
	case Changed:
		return "changed"
	}
	return fmt.Sprintf("EventKind(%d)", int(k))
}

// Event reports a change of the data-server set.
type Event struct {
	Kind       EventKind
	DS         DataServer
	Generation uint64 // Registry.Generation right after the change
}

// StateStore keeps the registry's persistent record: the cluster id and
// every data server's identity, last addresses and State. The MDS keeps it
// in its metadata engine, so it moves with an etcd-backed MDS.
type StateStore interface {
	// Load returns the record last saved, or nil if there is none.
	Load(ctx context.Context) ([]byte, error)
	Save(ctx context.Context, rec []byte) error
}

// AdminHandler serves `shoal admin` commands that arrive at the registry
// (ADMIN calls that presented the join secret). request and the returned
// body are JSON documents defined per command (admin.go).
type AdminHandler interface {
	Admin(ctx context.Context, command string, request []byte) (body []byte, err error)
}

// MapHandler answers the data servers' stripe-map calls (MAP,
// REPLICA_FAILED); Striped implements it.
type MapHandler interface {
	// FileMap returns file ino's current stripe map; ok is false if its
	// data was never placed.
	FileMap(ctx context.Context, ino uint64) (m meta.StripeMap, ok bool, err error)
	// ReplicaFailed records that data server from could not reach data
	// server id to copy a change of file ino, whose map it had at
	// generation gen, and returns the map now current.
	ReplicaFailed(ctx context.Context, ino, gen uint64, from, id string) (meta.StripeMap, error)
}

// DefaultDownAfter is RegistryConfig.DownAfter's default.
const DefaultDownAfter = 10 * time.Second

// RegistryConfig configures a Registry.
type RegistryConfig struct {
	// DataKey is handed to every DS at REGISTER; it authenticates data
	// filehandles only (server.Server.DataFHKey).
	DataKey []byte
	// JoinSecret must be presented by a DS in REGISTER and by an operator
	// in ADMIN (LoadOrCreateJoinSecret). Empty refuses every REGISTER and
	// ADMIN: a registry without a secret would hand DataKey to anyone.
	JoinSecret []byte
	// Store keeps the persistent record; nil keeps it in memory (a
	// registry that forgets its cluster at exit).
	Store StateStore
	// HeartbeatInterval is how often DSes heartbeat (default 1s).
	HeartbeatInterval time.Duration
	// MissedBeats is how many intervals without a heartbeat take a DS out
	// of service (default 3). It is sent to every DS in the REGISTER reply,
	// and the DS waits as long for a heartbeat answer before it gives up on
	// the connection: the liveness window is decided here, once.
	MissedBeats int
	// DownAfter is how long a DS may be out of service before I/O on the
	// stripes it holds fails (pnfs.ErrDataServerDown, NFS4ERR_IO to clients)
	// instead of asking clients to retry (pnfs.ErrUnavailable, NFS4ERR_DELAY).
	// It covers a DS restart and, after an MDS restart, the DSes'
	// re-registration. Default DefaultDownAfter.
	DownAfter time.Duration
	// CheckStateid answers CHECK_STATEID: it returns the client id owning
	// stateid if it is valid for I/O (write or read) on ino, or one of
	// pnfs.ErrBadStateid, pnfs.ErrOldStateid, pnfs.ErrStaleStateid, pnfs.ErrExpired,
	// pnfs.ErrOpenMode, pnfs.ErrFenced, pnfs.ErrUnavailable (possibly wrapped). Any other
	// error is reported to the DS as an I/O error. Nil: every check is
	// answered "retry later".
	CheckStateid func(ctx context.Context, ino uint64, stateid [16]byte, write bool) (clientID uint64, err error)
	// FileSize answers FILE_SIZE: the size of file ino as the MDS knows
	// it. Nil: answered "retry later".
	FileSize func(ctx context.Context, ino uint64) (uint64, error)
	// Leader reports whether this MDS is the elected leader, and of
	// which term (growing with every election), when several MDSes share
	// one metadata store. It is asked at every REGISTER and HEARTBEAT
	// and at the data servers' other calls: an MDS that is not leading
	// answers CTL_ERR_NOT_LEADER, and the data server goes on to its next
	// MDS address. A registration made under one term ends with it: the
	// data server's next HEARTBEAT is refused and it registers again,
	// learning the new term. Leader must be cheap and must not block.
	// Nil: always leading, in term 0 (an MDS that is not elected, such as
	// one with a local metadata store).
	Leader func() (term uint64, leading bool)
	// Lease is the MDS's NFSv4 lease, sent to data servers at REGISTER:
	// a data server that cannot reach the MDS keeps accepting a stateid
	// the MDS accepted within the last lease. Zero: the data server uses
	// its own (AgentConfig.Lease).
	Lease  time.Duration
	Logger *slog.Logger
	// now is the clock of DownAfter and DataServer.Since, for tests;
	// heartbeat liveness always uses the wall clock.
	now func() time.Time
}

// Registry is the MDS's view of its data servers. It serves the DS→MDS half
// of SHOAL_CONTROL and calls DSes back over the connections they
// registered on.
type Registry struct {
	cfg       RegistryConfig
	log       *slog.Logger
	interval  time.Duration
	missed    int
	downAfter time.Duration
	started   time.Time
	clusterID []byte

	mu      sync.Mutex
	byID    map[string]*member
	ordered []*member // by first registration
	gen     uint64
	nextReg uint64
	fenced  map[uint64]struct{}
	changed chan struct{} // closed and replaced on every membership change
	subs    map[int]func(Event)
	nextSub int
	servers []*rpc.Server
	admin   AdminHandler
	maps    MapHandler
	closed  bool

	evMu   sync.Mutex
	evCond *sync.Cond
	evQ    []Event
	evStop bool

	stop chan struct{}
	wg   sync.WaitGroup
}

// member is a DS known to the registry. Fields are guarded by Registry.mu.
type member struct {
	ds   DataServer
	conn *rpc.Conn // registered connection; nil while disconnected
	reg  uint64    // registration number of conn
	term uint64    // the leader's term conn registered in
	// ioAt is when the I/O counters in ds were reported, the base of the
	// next rate; zero until the first HEARTBEAT of a registration.
	ioAt time.Time
}

// connKey finds a connection's member; per registry, so two registries may
// share a listener's connections.
type connKey struct{ r *Registry }

// NewRegistry loads the registry's record from cfg.Store (making a new
// cluster id on first start) and starts its heartbeat monitor. Mount
// Handler on a listener (or call Serve) to let DSes register.
func NewRegistry(ctx context.Context, cfg RegistryConfig) (*Registry, error) {
	r := &Registry{
		cfg:       cfg,
		log:       cfg.Logger,
		interval:  cfg.HeartbeatInterval,
		missed:    cfg.MissedBeats,
		downAfter: cfg.DownAfter,
		byID:      map[string]*member{},
		fenced:    map[uint64]struct{}{},
		changed:   make(chan struct{}),
		subs:      map[int]func(Event){},
		stop:      make(chan struct{}),
	}
	if r.cfg.now == nil {
		r.cfg.now = time.Now
	}
	r.started = r.cfg.now()
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	if r.interval <= 0 {
		r.interval = time.Second
	}
	if r.missed <= 0 {
		r.missed = 3
	}
	if r.downAfter <= 0 {
		r.downAfter = DefaultDownAfter
	}
	var b [8]byte
	_, _ = io.ReadFull(rand.Reader, b[:])
	r.nextReg = binary.BigEndian.Uint64(b[:]) | 1
	r.evCond = sync.NewCond(&r.evMu)
	if err := r.load(ctx); err != nil {
		return nil, err
	}
	if r.clusterID == nil {
		r.clusterID = make([]byte, ctlproto.CTL_CLUSTER_ID_SIZE)
		if _, err := io.ReadFull(rand.Reader, r.clusterID); err != nil {
			return nil, fmt.Errorf("cluster: new cluster id: %w", err)
		}
		if err := r.saveLocked(ctx); err != nil {
			return nil, err
		}
		r.log.Info("cluster: new cluster", "cluster_id", fmt.Sprintf("%x", r.clusterID))
	}
	r.wg.Add(2)
	go r.monitor()
	go r.dispatch()
	return r, nil
}

// ClusterID returns the cluster's identity.
func (r *Registry) ClusterID() []byte { return slices.Clone(r.clusterID) }

// SetAdmin installs the handler of `shoal admin` commands.
func (r *Registry) SetAdmin(h AdminHandler) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.admin = h
}

// SetMaps installs the handler of the data servers' MAP and REPLICA_FAILED
// calls (the MDS's Striped); until then they are answered "retry later".
func (r *Registry) SetMaps(h MapHandler) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.maps = h
}

// Handler returns the rpc.Handler serving SHOAL_CONTROL calls from DSes
// and operators. The MDS routes calls with Prog == ctlproto.SHOAL_CONTROL
// from its NFS listener to it, or uses Serve on a listener of its own.
func (r *Registry) Handler() rpc.Handler { return rpc.HandlerFunc(r.serveRPC) }

// Serve accepts DS connections on ln until Close. It returns
// rpc.ErrServerClosed after Close.
func (r *Registry) Serve(ln net.Listener) error {
	srv := &rpc.Server{Handler: r.Handler(), IdleTimeout: -1, Logger: r.log}
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		ln.Close()
		return rpc.ErrServerClosed
	}
	r.servers = append(r.servers, srv)
	r.mu.Unlock()
	return srv.Serve(ln)
}

// Close stops the registry: listeners started by Serve and every DS
// connection are closed (DSes reconnect to whoever listens next), and
// subscribers get no more events.
func (r *Registry) Close() error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	r.closed = true
	servers := r.servers
	var conns []*rpc.Conn
	for _, m := range r.byID {
		if m.conn != nil {
			conns = append(conns, m.conn)
		}
		m.conn = nil
		m.ds.Up = false
	}
	r.mu.Unlock()
	close(r.stop)
	var errs []error
	for _, s := range servers {
		errs = append(errs, s.Close())
	}
	for _, c := range conns {
		c.Close()
	}
	r.evMu.Lock()
	r.evStop = true
	r.evCond.Broadcast()
	r.evMu.Unlock()
	r.wg.Wait()
	return errors.Join(errs...)
}

// DataServers returns every data server the cluster knows, removed ones
// included, in the order they first joined.
func (r *Registry) DataServers() []DataServer {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]DataServer, 0, len(r.ordered))
	for _, m := range r.ordered {
		out = append(out, m.snapshot())
	}
	return out
}

// DataServer returns the data server id, if the cluster knows it.
func (r *Registry) DataServer(id string) (DataServer, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.byID[id]
	if m == nil {
		return DataServer{}, false
	}
	return m.snapshot(), true
}

// Placement returns the data servers that new files are striped over: the
// Active ones in service, in the order they joined.
func (r *Registry) Placement() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, m := range r.ordered {
		if m.ds.Up && m.ds.State == Active {
			out = append(out, m.ds.ID)
		}
	}
	return out
}

func (m *member) snapshot() DataServer {
	ds := m.ds
	ds.Addrs = slices.Clone(ds.Addrs)
	ds.PeerAddrs = slices.Clone(ds.PeerAddrs)
	return ds
}

// Generation increases whenever a data server joins, leaves or changes
// state.
func (r *Registry) Generation() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.gen
}

// Subscribe calls fn for every later membership change, in Generation
// order, from a goroutine of the registry's; fn must not block for long.
// cancel stops further calls (one already running may finish).
func (r *Registry) Subscribe(fn func(ev Event)) (cancel func()) {
	r.mu.Lock()
	id := r.nextSub
	r.nextSub++
	r.subs[id] = fn
	r.mu.Unlock()
	return func() {
		r.mu.Lock()
		delete(r.subs, id)
		r.mu.Unlock()
	}
}

// WaitFor blocks until at least n DSes are in service or ctx is done.
func (r *Registry) WaitFor(ctx context.Context, n int) error {
	up := 0
	err := r.waitUntil(ctx, func() bool {
		up = 0
		for _, m := range r.ordered {
			if m.ds.Up {
				up++
			}
		}
		return up >= n
	})
	if err != nil {
		return fmt.Errorf("cluster: waiting for %d data servers (%d up): %w", n, up, err)
	}
	return nil
}

// waitMembers waits until every data server that is not Removed is in
// service, ctx is done, or max has passed.
func (r *Registry) waitMembers(ctx context.Context, max time.Duration) {
	ctx, cancel := context.WithTimeout(ctx, max)
	defer cancel()
	_ = r.waitUntil(ctx, func() bool {
		for _, m := range r.ordered {
			if m.ds.State != Removed && !m.ds.Up {
				return false
			}
		}
		return true
	})
}

// errRegistryClosed ends waits on a closed registry.
var errRegistryClosed = errors.New("cluster: registry closed")

// waitUntil blocks until cond, called under r.mu after every membership
// change, holds; or until ctx is done or the registry closes.
func (r *Registry) waitUntil(ctx context.Context, cond func() bool) error {
	for {
		r.mu.Lock()
		ok, ch, closed := cond(), r.changed, r.closed
		r.mu.Unlock()
		switch {
		case ok:
			return nil
		case closed:
			return errRegistryClosed
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
		case <-r.stop:
		}
	}
}

// Fence makes every DS refuse I/O by clientID until Unfence, and drops
// their cached stateid answers for it. DSes that are disconnected now learn
// of the fence when they register again. The error joins the failures of
// connected DSes.
func (r *Registry) Fence(ctx context.Context, clientID uint64) error {
	r.mu.Lock()
	r.fenced[clientID] = struct{}{}
	r.mu.Unlock()
	return r.broadcast(ctx, ctlproto.CTLPROC_FENCE, clientID)
}

// Unfence lets every DS serve clientID again.
func (r *Registry) Unfence(ctx context.Context, clientID uint64) error {
	r.mu.Lock()
	delete(r.fenced, clientID)
	r.mu.Unlock()
	return r.broadcast(ctx, ctlproto.CTLPROC_UNFENCE, clientID)
}

func (r *Registry) broadcast(ctx context.Context, proc uint32, clientID uint64) error {
	type target struct {
		id   string
		conn *rpc.Conn
	}
	var ts []target
	r.mu.Lock()
	for _, m := range r.ordered {
		if m.conn != nil {
			ts = append(ts, target{m.ds.ID, m.conn})
		}
	}
	r.mu.Unlock()
	errs := make([]error, len(ts))
	var wg sync.WaitGroup
	for i, t := range ts {
		wg.Go(func() {
			var res ctlproto.CtlStatusRes
			err := call(ctx, t.conn, proc, &ctlproto.CtlClientArgs{Clientid: clientID}, &res)
			if err == nil {
				err = errOf(res.Status)
			}
			if err != nil {
				errs[i] = fmt.Errorf("cluster: proc %d to %s: %w", proc, t.id, err)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// setState records a data server's new State durably. A Removed DS is told
// so (RETIRE) and disconnected; it is refused if it registers again.
func (r *Registry) setState(ctx context.Context, id string, st State) error {
	r.mu.Lock()
	m := r.byID[id]
	if m == nil {
		r.mu.Unlock()
		return fmt.Errorf("%w: %q", ErrUnknownDataServer, id)
	}
	if m.ds.State == st {
		r.mu.Unlock()
		return nil
	}
	old := m.ds.State
	m.ds.State = st
	if err := r.saveLocked(ctx); err != nil {
		m.ds.State = old
		r.mu.Unlock()
		return fmt.Errorf("cluster: %s %s: recording it: %w", st, id, err)
	}
	r.eventLocked(Changed, m)
	conn := m.conn
	if st == Removed {
		m.conn = nil
		r.setUpLocked(m, false)
	}
	r.mu.Unlock()
	r.log.Info("cluster: data server state", "id", id, "from", old, "to", st)
	if st != Removed || conn == nil {
		return nil
	}
	var res ctlproto.CtlStatusRes
	err := call(ctx, conn, ctlproto.CTLPROC_RETIRE, nil, &res)
	conn.Close()
	if err != nil {
		r.log.Warn("cluster: telling a removed data server", "id", id, "err", err)
	}
	return nil
}

// conn returns the live connection of data server id, for Striped. A DS
// out of service for less than DownAfter is pnfs.ErrUnavailable (retry); one
// out longer, removed, or unknown is pnfs.ErrDataServerDown.
func (r *Registry) conn(id string) (*rpc.Conn, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.byID[id]
	switch {
	case m == nil:
		return nil, &DownError{ID: id, Reason: "not a member of this cluster"}
	case m.ds.State == Removed:
		return nil, &DownError{ID: id, Addrs: slices.Clone(m.ds.Addrs), Reason: "removed from the cluster"}
	case m.conn != nil:
		return m.conn, nil
	}
	out := r.cfg.now().Sub(m.ds.Since)
	if out < r.downAfter {
		return nil, fmt.Errorf("%w: data server %s is out of service (for %v, down after %v)",
			pnfs.ErrUnavailable, id, out.Round(time.Millisecond), r.downAfter)
	}
	return nil, &DownError{ID: id, Addrs: slices.Clone(m.ds.Addrs),
		Reason: fmt.Sprintf("out of service for %v", out.Round(time.Second))}
}

// gone reports whether data server id was removed from the cluster (or is
// not a member at all): whatever it held is lost for good.
func (r *Registry) gone(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.byID[id]
	return m == nil || m.ds.State == Removed
}

// DownError is pnfs.ErrDataServerDown for one data server.
type DownError struct {
	ID     string
	Addrs  []string
	Reason string
}

func (e *DownError) Error() string {
	addr := ""
	if len(e.Addrs) > 0 {
		addr = " (" + e.Addrs[0] + ")"
	}
	return fmt.Sprintf("cluster: data server %s%s is down: %s", e.ID, addr, e.Reason)
}

// Is makes errors.Is(err, pnfs.ErrDataServerDown) hold.
func (e *DownError) Is(target error) bool { return target == pnfs.ErrDataServerDown }

// setUpLocked changes m's service state, bumping the generation and
// queueing an event when it actually changes.
func (r *Registry) setUpLocked(m *member, up bool) {
	if m.ds.Up == up || r.closed {
		return
	}
	m.ds.Up = up
	m.ds.Since = r.cfg.now()
	// Counters restart with the DS, and rates of a DS out of service
	// would only be stale.
	m.ds.ReadRate, m.ds.WriteRate, m.ioAt = 0, 0, time.Time{}
	kind := Left
	if up {
		kind = Joined
	}
	r.eventLocked(kind, m)
}

// eventLocked bumps the generation and queues an event about m.
func (r *Registry) eventLocked(kind EventKind, m *member) {
	r.gen++
	close(r.changed)
	r.changed = make(chan struct{})
	ev := Event{Kind: kind, DS: m.snapshot(), Generation: r.gen}
	r.log.Info("cluster: data server "+kind.String(), "id", m.ds.ID, "state", m.ds.State, "generation", r.gen)
	r.evMu.Lock()
	r.evQ = append(r.evQ, ev)
	r.evCond.Signal()
	r.evMu.Unlock()
}

// dispatch delivers queued events to subscribers in order.
func (r *Registry) dispatch() {
	defer r.wg.Done()
	for {
		r.evMu.Lock()
		for len(r.evQ) == 0 && !r.evStop {
			r.evCond.Wait()
		}
		if r.evStop {
			r.evMu.Unlock()
			return
		}
		ev := r.evQ[0]
		r.evQ = r.evQ[1:]
		r.evMu.Unlock()
		r.mu.Lock()
		fns := make([]func(Event), 0, len(r.subs))
		ids := make([]int, 0, len(r.subs))
		for id := range r.subs {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		for _, id := range ids {
			fns = append(fns, r.subs[id])
		}
		r.mu.Unlock()
		for _, fn := range fns {
			fn(ev)
		}
	}
}

// monitor closes the connections of DSes that stopped heartbeating; the
// connection watcher then takes them out of service.
func (r *Registry) monitor() {
	defer r.wg.Done()
	t := time.NewTicker(r.interval)
	defer t.Stop()
	prev := time.Now()
	for {
		select {
		case <-r.stop:
			return
		case <-t.C:
		}
		now := time.Now()
		dead := r.expired(now, now.Sub(prev))
		prev = now
		for _, c := range dead {
			c.Close()
		}
	}
}

// expired returns the connections of DSes whose last heartbeat is older
// than the liveness window (MissedBeats intervals) at now. since is how
// long ago the monitor last looked. If that is more than two intervals,
// the MDS itself did not run for a while (an overloaded machine, a paused
// VM): heartbeats that arrived meanwhile may still be unread, and judging
// DSes by them would drop live ones, so nobody is judged this time. A DS
// that really died is judged at the next punctual look, and one whose
// connection closed is out of service at once anyway (watch).
func (r *Registry) expired(now time.Time, since time.Duration) []*rpc.Conn {
	if since > 2*r.interval {
		r.log.Warn("cluster: heartbeat monitor ran late; not judging data servers this time", "late", since-r.interval)
		return nil
	}
	window := time.Duration(r.missed) * r.interval
	var dead []*rpc.Conn
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range r.byID {
		if m.conn != nil && now.Sub(m.ds.LastBeat) > window {
			r.log.Warn("cluster: data server missed heartbeats", "id", m.ds.ID, "last", m.ds.LastBeat, "window", window)
			dead = append(dead, m.conn)
		}
	}
	return dead
}

// watch takes m out of service when c, its registered connection, closes.
func (r *Registry) watch(m *member, c *rpc.Conn) {
	defer r.wg.Done()
	select {
	case <-c.Done():
	case <-r.stop:
		return
	}
	r.mu.Lock()
	if m.conn == c {
		m.conn = nil
		r.setUpLocked(m, false)
	}
	r.mu.Unlock()
}

// serveRPC serves the data servers' calls on the MDS (ctlProcs, fromDS).
func (r *Registry) serveRPC(ctx context.Context, c *rpc.Call, res *xdr.Encoder) rpc.AcceptStat {
	if st, ok := checkProgram(c, res); !ok {
		return st
	}
	p, ok := ctlProc(c.Proc, fromDS)
	if !ok {
		return rpc.ProcUnavail
	}
	return runProc(r, p, p.registry, ctx, c, res)
}

// authorized checks a presented join secret in constant time.
func (r *Registry) authorized(token []byte) bool {
	return len(r.cfg.JoinSecret) > 0 && subtle.ConstantTimeCompare(token, r.cfg.JoinSecret) == 1
}

func (r *Registry) register(ctx context.Context, c *rpc.Conn, a *ctlproto.CtlRegisterArgs) ctlproto.CtlRegisterRes {
	if a.Revision != ctlproto.CTL_VERSION {
		return ctlproto.CtlRegisterRes{Status: ctlproto.CTL_ERR_VERSION,
			Versions: &ctlproto.CtlVersionRange{Low: ctlproto.CTL_VERSION, High: ctlproto.CTL_VERSION}}
	}
	if !r.authorized(a.Token) {
		r.log.Warn("cluster: REGISTER refused: missing or wrong join secret", "id", a.DsId, "peer", c.RemoteAddr())
		return ctlproto.CtlRegisterRes{Status: ctlproto.CTL_ERR_AUTH}
	}
	if a.DsId == "" {
		return ctlproto.CtlRegisterRes{Status: ctlproto.CTL_ERR_INVAL}
	}
	// Before anything that reads the registry's record: a registry that
	// does not lead may hold an outdated one.
	term, leading := r.leader()
	if !leading {
		r.log.Info("cluster: REGISTER refused: not the leading MDS", "id", a.DsId, "peer", c.RemoteAddr())
		return ctlproto.CtlRegisterRes{Status: ctlproto.CTL_ERR_NOT_LEADER}
	}
	if len(a.ClusterId) != 0 && subtle.ConstantTimeCompare(a.ClusterId, r.clusterID) != 1 {
		r.log.Warn("cluster: REGISTER refused: the data server's directory belongs to another cluster",
			"id", a.DsId, "its_cluster", fmt.Sprintf("%x", a.ClusterId), "peer", c.RemoteAddr())
		return ctlproto.CtlRegisterRes{Status: ctlproto.CTL_ERR_WRONG_CLUSTER}
	}
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return ctlproto.CtlRegisterRes{Status: ctlproto.CTL_ERR_DELAY}
	}
	m := r.byID[a.DsId]
	if m != nil && m.ds.State == Removed {
		r.mu.Unlock()
		r.log.Warn("cluster: REGISTER refused: data server was removed", "id", a.DsId, "peer", c.RemoteAddr())
		return ctlproto.CtlRegisterRes{Status: ctlproto.CTL_ERR_REMOVED}
	}
	if m == nil && len(a.ClusterId) != 0 {
		// The directory says it joined this cluster, yet the cluster
		// does not know it: its record was lost, or it was forgotten.
		// Taking it back in is safe (no stripe map names it).
		r.log.Warn("cluster: data server of this cluster unknown to the registry; admitting it again", "id", a.DsId)
	}
	if prev, _ := c.Value(connKey{r}).(*member); prev != nil && prev != m && prev.conn == c {
		// One connection, one DS.
		r.mu.Unlock()
		return ctlproto.CtlRegisterRes{Status: ctlproto.CTL_ERR_INVAL}
	}
	isNew := m == nil
	if isNew {
		if len(r.ordered) >= maxDataServers {
			r.mu.Unlock()
			return ctlproto.CtlRegisterRes{Status: ctlproto.CTL_ERR_FULL}
		}
		m = &member{ds: DataServer{ID: a.DsId, State: Active, Since: r.started}}
		r.byID[a.DsId] = m
		r.ordered = append(r.ordered, m)
	}
	addrsChanged := !slices.Equal(m.ds.Addrs, a.Addrs) || !slices.Equal(m.ds.PeerAddrs, a.PeerAddrs)
	oldAddrs, oldPeer := m.ds.Addrs, m.ds.PeerAddrs
	m.ds.Addrs = slices.Clone(a.Addrs)
	m.ds.PeerAddrs = slices.Clone(a.PeerAddrs)
	if isNew || addrsChanged {
		if err := r.saveLocked(ctx); err != nil {
			if isNew {
				delete(r.byID, a.DsId)
				r.ordered = r.ordered[:len(r.ordered)-1]
			} else {
				m.ds.Addrs, m.ds.PeerAddrs = oldAddrs, oldPeer
			}
			r.mu.Unlock()
			r.log.Error("cluster: cannot record a data server", "id", a.DsId, "err", err)
			return ctlproto.CtlRegisterRes{Status: ctlproto.CTL_ERR_IO}
		}
	}
	old := m.conn
	if old != nil && old != c {
		// The DS reconnected before its old connection was noticed dead
		// (or another process claims its ID): report the old connection's
		// end like any other, then the new registration.
		r.setUpLocked(m, false)
	}
	m.conn = c
	r.nextReg++
	m.reg = r.nextReg
	m.term = term
	m.ioAt = time.Time{}       // a new registration may be a new process: new counters
	m.ds.LastBeat = time.Now() // liveness is wall-clock, never the injected clock
	m.ds.Capacity, m.ds.Free = a.Capacity, a.Free
	newConn := c.Value(connKey{r}) == nil
	c.SetValue(connKey{r}, m)
	if newConn {
		r.wg.Add(1)
		go r.watch(m, c)
	}
	r.setUpLocked(m, true)
	ok := &ctlproto.CtlRegisterOk{
		DataKey:      r.cfg.DataKey,
		ClusterId:    r.clusterID,
		HeartbeatMs:  uint32(r.interval / time.Millisecond),
		MissedBeats:  uint32(min(int64(r.missed), math.MaxUint32)),
		Registration: m.reg,
		Term:         term,
		LeaseMs:      uint32(min(r.cfg.Lease.Milliseconds(), math.MaxUint32)),
	}
	for id := range r.fenced {
		ok.Fenced = append(ok.Fenced, id)
	}
	r.mu.Unlock()
	if old != nil && old != c {
		old.Close()
	}
	return ctlproto.CtlRegisterRes{Status: ctlproto.CTL_OK, Ok: ok}
}

// leader reports this MDS's term and whether it leads (RegistryConfig.Leader).
func (r *Registry) leader() (term uint64, leading bool) {
	if r.cfg.Leader == nil {
		return 0, true
	}
	return r.cfg.Leader()
}

// registeredLeading refuses the data servers' questions (CHECK_STATEID,
// FILE_SIZE) on connections with no registration, and, while this MDS
// does not lead or on a registration of an earlier term, on every
// connection: its answers could be out of date.
func (r *Registry) registeredLeading(c *rpc.Conn) ctlproto.CtlStatus {
	term, leading := r.leader()
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.registered(c)
	switch {
	case m == nil:
		return ctlproto.CTL_ERR_NOTREG
	case !leading || m.term != term:
		return ctlproto.CTL_ERR_NOT_LEADER
	}
	return ctlproto.CTL_OK
}

// maxDataServers bounds the cluster's size so a stream of bogus REGISTERs
// with fresh IDs cannot grow the registry without end.
const maxDataServers = 4096

// registered returns the member registered on c, if any.
func (r *Registry) registered(c *rpc.Conn) *member {
	m, _ := c.Value(connKey{r}).(*member)
	if m == nil || m.conn != c {
		return nil
	}
	return m
}

func (r *Registry) heartbeat(c *rpc.Conn, a *ctlproto.CtlHeartbeatArgs) ctlproto.CtlStatus {
	term, leading := r.leader()
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.registered(c)
	switch {
	case !leading:
		return ctlproto.CTL_ERR_NOT_LEADER
	case m == nil || m.reg != a.Registration:
		return ctlproto.CTL_ERR_STALE_GEN
	case m.term != term:
		// Registered under a term that ended (this MDS lost the
		// election and won it again): what the DS learnt then, the
		// fences above all, may be out of date. It registers again.
		return ctlproto.CTL_ERR_NOT_LEADER
	}
	now := time.Now()
	m.ds.LastBeat = now
	m.ds.Capacity, m.ds.Free = a.Capacity, a.Free
	r.noteIOLocked(m, now, a.ReadBytes, a.WrittenBytes)
	return ctlproto.CTL_OK
}

// noteIOLocked records a heartbeat's I/O counters and derives the rates
// from the previous ones. Heartbeats closer than half an interval (one
// sent right after a slow answer) keep the base, so a rate never comes
// from a sliver of time; counters that went backwards (a restarted DS
// whose connection was not yet seen closed) only start a new base.
func (r *Registry) noteIOLocked(m *member, now time.Time, read, written uint64) {
	dt := now.Sub(m.ioAt)
	switch {
	case !m.ioAt.IsZero() && dt < r.interval/2:
		return
	case !m.ioAt.IsZero() && read >= m.ds.ReadBytes && written >= m.ds.WrittenBytes:
		m.ds.ReadRate = float64(read-m.ds.ReadBytes) / dt.Seconds()
		m.ds.WriteRate = float64(written-m.ds.WrittenBytes) / dt.Seconds()
	default:
		m.ds.ReadRate, m.ds.WriteRate = 0, 0
	}
	m.ds.ReadBytes, m.ds.WrittenBytes, m.ioAt = read, written, now
}

func (r *Registry) checkStateid(ctx context.Context, c *rpc.Conn, a *ctlproto.CtlCheckStateidArgs) ctlproto.CtlCheckStateidRes {
	if st := r.registeredLeading(c); st != ctlproto.CTL_OK {
		return ctlproto.CtlCheckStateidRes{Status: st}
	}
	if r.cfg.CheckStateid == nil {
		return ctlproto.CtlCheckStateidRes{Status: ctlproto.CTL_ERR_DELAY}
	}
	id, err := r.cfg.CheckStateid(ctx, a.Ino, a.Stateid, a.Write)
	if err != nil {
		return ctlproto.CtlCheckStateidRes{Status: statusOf(err)}
	}
	return ctlproto.CtlCheckStateidRes{Status: ctlproto.CTL_OK, Clientid: id}
}

func (r *Registry) fileSize(ctx context.Context, c *rpc.Conn, ino uint64) ctlproto.CtlGetsizeRes {
	if st := r.registeredLeading(c); st != ctlproto.CTL_OK {
		return ctlproto.CtlGetsizeRes{Status: st}
	}
	if r.cfg.FileSize == nil {
		return ctlproto.CtlGetsizeRes{Status: ctlproto.CTL_ERR_DELAY}
	}
	size, err := r.cfg.FileSize(ctx, ino)
	if err != nil {
		return ctlproto.CtlGetsizeRes{Status: statusOf(err)}
	}
	return ctlproto.CtlGetsizeRes{Status: ctlproto.CTL_OK, Size: &size}
}

// serveMap answers MAP and REPLICA_FAILED, on registered connections
// only: fn gets the handler and the caller's id, and its map is sent with
// the addresses of the data servers it names. No map is CTL_ERR_NOENT.
func (r *Registry) serveMap(ctx context.Context, c *rpc.Conn, fn func(h MapHandler, from string) (meta.StripeMap, bool, error)) ctlproto.CtlMapRes {
	r.mu.Lock()
	m := r.registered(c)
	var from string
	if m != nil {
		from = m.ds.ID
	}
	h := r.maps
	r.mu.Unlock()
	if m == nil {
		return ctlproto.CtlMapRes{Status: ctlproto.CTL_ERR_NOTREG}
	}
	if st := r.registeredLeading(c); st != ctlproto.CTL_OK {
		return ctlproto.CtlMapRes{Status: st}
	}
	if h == nil {
		return ctlproto.CtlMapRes{Status: ctlproto.CTL_ERR_DELAY}
	}
	sm, ok, err := fn(h, from)
	switch {
	case errors.Is(err, meta.ErrNotFound), errors.Is(err, meta.ErrStale), err == nil && !ok:
		return ctlproto.CtlMapRes{Status: ctlproto.CTL_ERR_NOENT}
	case err != nil:
		st := statusOf(err)
		if st == ctlproto.CTL_ERR_IO {
			r.log.Warn("cluster: stripe map call failed", "ds", from, "err", err)
		}
		return ctlproto.CtlMapRes{Status: st}
	}
	return ctlproto.CtlMapRes{Status: ctlproto.CTL_OK, Map: mapToWire(sm, r.peerAddrsOf)}
}

// peerAddrsOf returns where data servers reach data server id: its peer
// addresses, else its advertised ones (nil if the cluster does not know
// it).
func (r *Registry) peerAddrsOf(id string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if m := r.byID[id]; m != nil {
		if len(m.ds.PeerAddrs) > 0 {
			return slices.Clone(m.ds.PeerAddrs)
		}
		return slices.Clone(m.ds.Addrs)
	}
	return nil
}

func (r *Registry) serveAdmin(ctx context.Context, c *rpc.Conn, a *ctlproto.CtlAdminArgs) ctlproto.CtlAdminRes {
	if !r.authorized(a.Token) {
		r.log.Warn("cluster: ADMIN refused: missing or wrong join secret", "command", a.Command, "peer", c.RemoteAddr())
		return ctlproto.CtlAdminRes{Status: ctlproto.CTL_ERR_AUTH, Message: "wrong or missing join secret"}
	}
	if _, leading := r.leader(); !leading {
		// A deposed leader's view is stale: `shoal admin` asks the next
		// MDS address.
		return ctlproto.CtlAdminRes{Status: ctlproto.CTL_ERR_NOT_LEADER, Message: "this MDS no longer leads"}
	}
	r.mu.Lock()
	h := r.admin
	r.mu.Unlock()
	if h == nil {
		return ctlproto.CtlAdminRes{Status: ctlproto.CTL_ERR_DELAY, Message: "administration is not available yet"}
	}
	body, err := h.Admin(ctx, a.Command, a.Request)
	if err != nil {
		msg := err.Error()
		if len(msg) > ctlproto.CTL_MAX_MESSAGE {
			msg = msg[:ctlproto.CTL_MAX_MESSAGE]
		}
		return ctlproto.CtlAdminRes{Status: statusOf(err), Message: msg}
	}
	return ctlproto.CtlAdminRes{Status: ctlproto.CTL_OK, Body: body}
}
