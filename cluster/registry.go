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
)

// DataServer describes one data server as the MDS sees it.
type DataServer struct {
	ID    string
	Index int      // stripe index, stable for the life of ID
	Addrs []string // advertised host:port, for GETDEVICEINFO
	// Capacity and Free are the DS's space in bytes, from its last
	// REGISTER or HEARTBEAT.
	Capacity, Free uint64
	// Up reports whether the DS is in service: registered over a live
	// connection, heartbeating, and not drained.
	Up bool
}

// EventKind says what happened to a data server.
type EventKind int

// Event kinds.
const (
	Joined EventKind = iota + 1 // entered service
	Left                        // left service (connection lost, heartbeats missed, drained)
)

func (k EventKind) String() string {
	switch k {
	case Joined:
		return "joined"
	case Left:
		return "left"
	}
	return fmt.Sprintf("EventKind(%d)", int(k))
}

// Event reports a change of the in-service set.
type Event struct {
	Kind       EventKind
	DS         DataServer
	Generation uint64 // Registry.Generation right after the change
}

// RegistryConfig configures a Registry.
type RegistryConfig struct {
	// Secret is the cluster secret handed to every DS at REGISTER; the
	// server signs data filehandles with it.
	Secret []byte
	// JoinToken, if set, must be presented by a DS in REGISTER
	// (AgentConfig.JoinToken). Without it any peer that can reach the
	// control port can join and learn Secret.
	JoinToken []byte
	// Width, if positive, fixes the stripe width: Members always has Width
	// entries, a new DS takes the lowest free index, and a DS that finds
	// every index taken is refused (ErrClusterFull). Zero lets the width
	// grow as new DSes register, which remaps every file already written:
	// grow a cluster only before it holds data.
	Width int
	// HeartbeatInterval is how often DSes heartbeat (default 1s).
	HeartbeatInterval time.Duration
	// MissedBeats is how many intervals without a heartbeat take a DS out
	// of service (default 3). It is sent to every DS in the REGISTER reply,
	// and the DS waits as long for a heartbeat answer before it gives up on
	// the connection: the liveness window is decided here, once, so a
	// larger window set on the MDS needs no matching setting on the DSes.
	MissedBeats int
	// CheckStateid answers CHECK_STATEID: it returns the client id owning
	// stateid if it is valid for I/O (write or read) on ino, or one of
	// ErrBadStateid, ErrOldStateid, ErrStaleStateid, ErrExpired,
	// ErrOpenMode, ErrFenced, ErrUnavailable (possibly wrapped). Any other
	// error is reported to the DS as an I/O error. Nil: every check is
	// answered "retry later".
	CheckStateid func(ctx context.Context, ino uint64, stateid [16]byte, write bool) (clientID uint64, err error)
	Logger       *slog.Logger
}

// Registry is the MDS's view of its data servers. It serves the DS→MDS half
// of SHOAL_CONTROL and calls DSes back over the connections they
// registered on.
type Registry struct {
	cfg       RegistryConfig
	log       *slog.Logger
	stateFile string
	interval  time.Duration
	missed    int

	mu      sync.Mutex
	byID    map[string]*member
	byIndex []*member // stripe index -> member; nil for a hole
	gen     uint64
	nextReg uint64
	fenced  map[uint64]struct{}
	changed chan struct{} // closed and replaced on every membership change
	subs    map[int]func(Event)
	nextSub int
	servers []*rpc.Server
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
	ds       DataServer
	conn     *rpc.Conn // registered connection; nil while disconnected
	reg      uint64    // registration number of conn
	lastBeat time.Time
	drained  bool
}

// connKey finds a connection's member; per registry, so two registries may
// share a listener's connections.
type connKey struct{ r *Registry }

// NewRegistry returns a registry that keeps its ID→stripe index map in
// memory, and starts its heartbeat monitor. Mount Handler on a listener (or
// call Serve) to let DSes register. After an MDS restart DSes ask for their
// old indexes back; OpenRegistry also survives DSes restarting at the same
// time.
func NewRegistry(cfg RegistryConfig) *Registry {
	r := newRegistry(cfg)
	r.start()
	return r
}

// OpenRegistry is NewRegistry with the ID→stripe index map and the set of
// drained DSes kept in stateFile (created if missing), so stripe placement
// survives any restart and the stripe width is known before any DS has
// registered again.
func OpenRegistry(cfg RegistryConfig, stateFile string) (*Registry, error) {
	r := newRegistry(cfg)
	r.stateFile = stateFile
	if err := r.load(); err != nil {
		return nil, err
	}
	r.start()
	return r, nil
}

func newRegistry(cfg RegistryConfig) *Registry {
	r := &Registry{
		cfg:      cfg,
		log:      cfg.Logger,
		interval: cfg.HeartbeatInterval,
		missed:   cfg.MissedBeats,
		byID:     map[string]*member{},
		fenced:   map[uint64]struct{}{},
		changed:  make(chan struct{}),
		subs:     map[int]func(Event){},
		stop:     make(chan struct{}),
	}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	if r.interval <= 0 {
		r.interval = time.Second
	}
	if r.missed <= 0 {
		r.missed = 3
	}
	var b [8]byte
	_, _ = io.ReadFull(rand.Reader, b[:])
	r.nextReg = binary.BigEndian.Uint64(b[:]) | 1
	r.evCond = sync.NewCond(&r.evMu)
	if cfg.Width > 0 {
		r.byIndex = make([]*member, min(cfg.Width, maxIndex))
	}
	return r
}

func (r *Registry) start() {
	r.wg.Add(2)
	go r.monitor()
	go r.dispatch()
}

// Handler returns the rpc.Handler serving SHOAL_CONTROL calls from DSes.
// The MDS may route calls with Prog == ctlproto.SHOAL_CONTROL from its NFS
// listener to it, or use Serve on a listener of its own.
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

// DataServers returns the in-service DSes ordered by Index.
func (r *Registry) DataServers() []DataServer {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []DataServer
	for _, m := range r.byIndex {
		if m != nil && m.ds.Up {
			out = append(out, m.snapshot())
		}
	}
	return out
}

// Members returns one entry per stripe index 0..n-1, in service or not;
// indexes not (yet) claimed by a DS since the registry started have an
// empty ID. The stripe width used by Striped and Layout is len(Members()),
// and GETDEVICEINFO must list an address for every member so that clients
// address the same DS for a stripe unit as the MDS does.
func (r *Registry) Members() []DataServer {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]DataServer, len(r.byIndex))
	for i, m := range r.byIndex {
		if m == nil {
			out[i] = DataServer{Index: i}
		} else {
			out[i] = m.snapshot()
		}
	}
	return out
}

func (m *member) snapshot() DataServer {
	ds := m.ds
	ds.Addrs = slices.Clone(ds.Addrs)
	return ds
}

// Generation increases whenever the in-service set changes.
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
	for {
		r.mu.Lock()
		up := 0
		for _, m := range r.byIndex {
			if m != nil && m.ds.Up {
				up++
			}
		}
		ch, closed := r.changed, r.closed
		r.mu.Unlock()
		if up >= n {
			return nil
		}
		if closed {
			return fmt.Errorf("cluster: registry closed with %d of %d data servers", up, n)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster: waiting for %d data servers (%d up): %w", n, up, ctx.Err())
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
	for _, m := range r.byIndex {
		if m != nil && m.conn != nil {
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

// Drain takes DS id out of service for good: it leaves DataServers (a Left
// event), is told so with DRAIN, and is refused if it registers again while
// this registry lives. Its stripe index stays reserved and, while its
// connection lasts, Striped still reads and writes through it, so data can
// be moved off it; no data is moved here.
func (r *Registry) Drain(ctx context.Context, id string) error {
	r.mu.Lock()
	m := r.byID[id]
	if m == nil {
		r.mu.Unlock()
		return fmt.Errorf("%w: %q", ErrUnknownDataServer, id)
	}
	if m.drained {
		r.mu.Unlock()
		return nil
	}
	m.drained = true
	r.setUpLocked(m, false)
	conn := m.conn
	serr := r.saveLocked()
	r.mu.Unlock()
	if serr != nil {
		return fmt.Errorf("cluster: drain %s: recording it: %w", id, serr)
	}
	if conn == nil {
		return nil
	}
	var res ctlproto.CtlStatusRes
	err := call(ctx, conn, ctlproto.CTLPROC_DRAIN, nil, &res)
	if err == nil {
		err = errOf(res.Status)
	}
	if err != nil {
		return fmt.Errorf("cluster: drain %s: %w", id, err)
	}
	return nil
}

// conn returns the live connection of the DS at index, for Striped.
func (r *Registry) conn(index int) (*rpc.Conn, string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if index < 0 || index >= len(r.byIndex) || r.byIndex[index] == nil {
		return nil, "", fmt.Errorf("%w: no data server has stripe index %d", ErrUnavailable, index)
	}
	m := r.byIndex[index]
	if m.conn == nil {
		return nil, m.ds.ID, fmt.Errorf("%w: data server %s (index %d) is disconnected", ErrUnavailable, m.ds.ID, index)
	}
	return m.conn, m.ds.ID, nil
}

// width is the stripe width: the number of stripe indexes ever claimed.
func (r *Registry) width() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.byIndex)
}

// setUpLocked changes m's service state, bumping the generation and
// queueing an event when it actually changes.
func (r *Registry) setUpLocked(m *member, up bool) {
	if m.ds.Up == up || r.closed {
		return
	}
	m.ds.Up = up
	r.gen++
	close(r.changed)
	r.changed = make(chan struct{})
	kind := Left
	if up {
		kind = Joined
	}
	ev := Event{Kind: kind, DS: m.snapshot(), Generation: r.gen}
	r.log.Info("cluster: data server "+kind.String(), "id", m.ds.ID, "index", m.ds.Index, "generation", r.gen)
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
		if m.conn != nil && now.Sub(m.lastBeat) > window {
			r.log.Warn("cluster: data server missed heartbeats", "id", m.ds.ID, "last", m.lastBeat, "window", window)
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

func (r *Registry) serveRPC(ctx context.Context, c *rpc.Call, res *xdr.Encoder) rpc.AcceptStat {
	if st, ok := checkProgram(c, res); !ok {
		return st
	}
	switch c.Proc {
	case ctlproto.CTLPROC_NULL:
		return rpc.Success
	case ctlproto.CTLPROC_REGISTER:
		var a ctlproto.CtlRegisterArgs
		if !decodeArgs(c, &a) {
			return rpc.GarbageArgs
		}
		out := r.register(c.Conn, &a)
		out.EncodeXDR(res)
	case ctlproto.CTLPROC_HEARTBEAT:
		var a ctlproto.CtlHeartbeatArgs
		if !decodeArgs(c, &a) {
			return rpc.GarbageArgs
		}
		out := ctlproto.CtlStatusRes{Status: r.heartbeat(c.Conn, &a)}
		out.EncodeXDR(res)
	case ctlproto.CTLPROC_CHECK_STATEID:
		var a ctlproto.CtlCheckStateidArgs
		if !decodeArgs(c, &a) {
			return rpc.GarbageArgs
		}
		out := r.checkStateid(ctx, c.Conn, &a)
		out.EncodeXDR(res)
	default:
		return rpc.ProcUnavail
	}
	return rpc.Success
}

// maxIndex bounds preferred stripe indexes so a bogus REGISTER cannot make
// the stripe width huge.
const maxIndex = 4096

func (r *Registry) register(c *rpc.Conn, a *ctlproto.CtlRegisterArgs) ctlproto.CtlRegisterRes {
	// Only the current revision: a revision-1 DS would misread the reply,
	// which gained missed_beats in revision 2.
	if a.Revision != ctlproto.CTL_VERSION {
		return ctlproto.CtlRegisterRes{Status: ctlproto.CTL_ERR_VERSION,
			Versions: &ctlproto.CtlVersionRange{Low: ctlproto.CTL_VERSION, High: ctlproto.CTL_VERSION}}
	}
	if len(r.cfg.JoinToken) > 0 && subtle.ConstantTimeCompare(a.Token, r.cfg.JoinToken) != 1 {
		r.log.Warn("cluster: REGISTER with a wrong join token", "id", a.DsId, "peer", c.RemoteAddr())
		return ctlproto.CtlRegisterRes{Status: ctlproto.CTL_ERR_AUTH}
	}
	if a.DsId == "" {
		return ctlproto.CtlRegisterRes{Status: ctlproto.CTL_ERR_INVAL}
	}
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return ctlproto.CtlRegisterRes{Status: ctlproto.CTL_ERR_DELAY}
	}
	m := r.byID[a.DsId]
	if m != nil && m.drained {
		r.mu.Unlock()
		return ctlproto.CtlRegisterRes{Status: ctlproto.CTL_ERR_DRAINED}
	}
	if prev, _ := c.Value(connKey{r}).(*member); prev != nil && prev != m && prev.conn == c {
		// One connection, one DS.
		r.mu.Unlock()
		return ctlproto.CtlRegisterRes{Status: ctlproto.CTL_ERR_INVAL}
	}
	if m == nil {
		idx := r.freeIndexLocked(int(a.PreferredIndex))
		if idx < 0 {
			r.mu.Unlock()
			r.log.Warn("cluster: no free stripe index", "id", a.DsId)
			return ctlproto.CtlRegisterRes{Status: ctlproto.CTL_ERR_FULL}
		}
		for len(r.byIndex) <= idx {
			r.byIndex = append(r.byIndex, nil)
		}
		m = &member{ds: DataServer{ID: a.DsId, Index: idx}}
		r.byIndex[idx] = m
		r.byID[a.DsId] = m
		if err := r.saveLocked(); err != nil {
			delete(r.byID, a.DsId)
			r.byIndex[idx] = nil
			r.mu.Unlock()
			r.log.Error("cluster: cannot record a new data server", "id", a.DsId, "err", err)
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
	m.lastBeat = time.Now()
	m.ds.Addrs = slices.Clone(a.Addrs)
	m.ds.Capacity, m.ds.Free = a.Capacity, a.Free
	newConn := c.Value(connKey{r}) == nil
	c.SetValue(connKey{r}, m)
	if newConn {
		r.wg.Add(1)
		go r.watch(m, c)
	}
	r.setUpLocked(m, true)
	ok := &ctlproto.CtlRegisterOk{
		Secret:       r.cfg.Secret,
		Index:        uint32(m.ds.Index),
		HeartbeatMs:  uint32(r.interval / time.Millisecond),
		MissedBeats:  uint32(min(int64(r.missed), math.MaxUint32)),
		Registration: m.reg,
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

// freeIndexLocked picks the stripe index of a new DS: the one it asks for
// if free, else (fixed width) the lowest free one or (growing width) a new
// one at the end, never a hole that may belong to a DS yet to return.
// It returns -1 if there is none.
func (r *Registry) freeIndexLocked(preferred int) int {
	limit := maxIndex
	if r.cfg.Width > 0 {
		limit = min(r.cfg.Width, maxIndex)
	}
	if preferred >= 0 && preferred < limit && (preferred >= len(r.byIndex) || r.byIndex[preferred] == nil) {
		return preferred
	}
	if r.cfg.Width > 0 {
		for i, m := range r.byIndex {
			if m == nil {
				return i
			}
		}
		return -1
	}
	if len(r.byIndex) >= limit {
		return -1
	}
	return len(r.byIndex)
}

// registered returns the member registered on c, if any.
func (r *Registry) registered(c *rpc.Conn) *member {
	m, _ := c.Value(connKey{r}).(*member)
	if m == nil || m.conn != c {
		return nil
	}
	return m
}

func (r *Registry) heartbeat(c *rpc.Conn, a *ctlproto.CtlHeartbeatArgs) ctlproto.CtlStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.registered(c)
	if m == nil || m.reg != a.Registration {
		return ctlproto.CTL_ERR_STALE_GEN
	}
	m.lastBeat = time.Now()
	m.ds.Capacity, m.ds.Free = a.Capacity, a.Free
	return ctlproto.CTL_OK
}

func (r *Registry) checkStateid(ctx context.Context, c *rpc.Conn, a *ctlproto.CtlCheckStateidArgs) ctlproto.CtlCheckStateidRes {
	r.mu.Lock()
	m := r.registered(c)
	r.mu.Unlock()
	if m == nil {
		return ctlproto.CtlCheckStateidRes{Status: ctlproto.CTL_ERR_NOTREG}
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
