package cluster

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shoalfs/shoal/internal/ctlproto"
	"github.com/shoalfs/shoal/internal/rpc"
	"github.com/shoalfs/shoal/internal/xdr"
	"github.com/shoalfs/shoal/pnfs"
	"github.com/shoalfs/shoal/store"
)

// AgentConfig configures the DS side of the control protocol.
type AgentConfig struct {
	// MDS lists the host:port of the MDS control listeners: the one MDS,
	// or every MDS of a cluster with failover, in any order. The agent
	// registers with the one that leads (Agent.connect).
	MDS   []string
	ID    string   // persistent identity of this DS; stripe maps name it
	Addrs []string // advertised host:port of this DS's NFS listener
	// PeerAddrs is where the other data servers reach this one, if not
	// at Addrs (which clients use).
	PeerAddrs []string
	// ClusterID is the cluster this DS's directory joined before, empty
	// for a new directory; the MDS refuses a DS of another cluster
	// (ErrWrongCluster). After registering, Agent.ClusterID has the
	// MDS's, for the caller to keep.
	ClusterID []byte
	// Store holds this DS's objects; the DS's NFS server must use the same
	// one so that MDS-through and direct I/O see the same bytes.
	Store store.Backend
	// Capacity reports space for REGISTER and HEARTBEAT; nil uses
	// Store.StatFS.
	Capacity func() (total, free uint64)
	// JoinSecret is presented in REGISTER (RegistryConfig.JoinSecret).
	JoinSecret []byte
	// MissedBeats, if positive, overrides how many heartbeat intervals the
	// agent waits for an answer from the MDS before it gives up on the
	// connection and re-registers; it is for tests and for an operator who
	// wants the DS to be more patient than the MDS. Leave it zero: the
	// window is the MDS's (RegistryConfig.MissedBeats), and the agent
	// learns it from every REGISTER reply, so the two cannot disagree. An
	// override below the MDS's makes the agent drop connections the MDS
	// still counts as live.
	MissedBeats int
	// Lease is how long a stateid the MDS accepted stays good while the
	// MDS cannot be asked (Agent.CheckStateid), for an MDS that does not
	// tell its own lease at REGISTER. Zero: defaultLease.
	Lease  time.Duration
	Logger *slog.Logger
	// registerTimeout replaces registerTimeout, for tests.
	registerTimeout time.Duration
}

// AgentStats counts the MDS-through object operations a DS served.
type AgentStats struct {
	ReadOps, ReadBytes   uint64
	WriteOps, WriteBytes uint64
	CommitOps            uint64
	TruncateOps          uint64
	RemoveOps            uint64
	GetSizeOps           uint64
	// StateidChecks counts Agent.CheckStateid calls; StateidCacheHits those
	// answered from the cache without asking the MDS; StateidStaleHits
	// those answered from an answer older than the cache's TTL, within
	// the lease, because the MDS could not be asked.
	StateidChecks, StateidCacheHits, StateidStaleHits uint64
	Registrations                                     uint64
	// MapFetches counts MAP calls to the MDS (Agent.Map cache misses).
	MapFetches uint64
	// ReplicaWriteOps and ReplicaWriteBytes count the REPLICA_WRITEs this
	// DS served for its peers, ReplicaCommitOps their REPLICA_COMMITs.
	ReplicaWriteOps, ReplicaWriteBytes, ReplicaCommitOps uint64
	// ReplicaFailed counts the peers this DS reported unreachable to the
	// MDS (REPLICA_FAILED).
	ReplicaFailed uint64
	// SumOps counts OBJ_SUM calls served.
	SumOps uint64
	// CopyOps counts OBJ_COPY calls served, CopyBytes the bytes they
	// copied from one object to another (neither read nor written over
	// the network).
	CopyOps, CopyBytes uint64
	// ClientReadBytes and ClientWriteBytes count what the DS's own
	// clients read and wrote through its ReplicaStore.
	ClientReadBytes, ClientWriteBytes uint64
}

// IO returns the bytes this DS read from and wrote to its store so far,
// for everyone: its clients, the MDS (OBJ_READ, OBJ_WRITE) and its peers
// (REPLICA_WRITE). HEARTBEAT reports them, so the MDS can show throughput.
func (s AgentStats) IO() (read, written uint64) {
	return s.ReadBytes + s.ClientReadBytes, s.WriteBytes + s.ReplicaWriteBytes + s.ClientWriteBytes
}

// stateidTTL is how long a positive CHECK_STATEID answer is reused while
// the MDS can be asked.
const stateidTTL = 2 * time.Second

// defaultLease is how long a positive CHECK_STATEID answer is reused while
// the MDS cannot be asked, if neither the MDS nor AgentConfig.Lease says:
// the NFS server's default lease (server.Config.Lease).
const defaultLease = 90 * time.Second

// registerTimeout bounds one attempt to register at one MDS address, dial
// and REGISTER together: a paused MDS (a deposed leader in a stopped VM)
// may accept the connection and never answer, while the next address
// leads.
const registerTimeout = 5 * time.Second

// maxCache bounds the stateid cache.
const maxCache = 1 << 16

// defaultMissedBeats is the liveness window the agent uses if a REGISTER
// reply carries none (zero), which a conforming MDS never sends; it is
// RegistryConfig.MissedBeats's default.
const defaultMissedBeats = 3

// Reconnect backoff bounds.
const (
	minBackoff = 50 * time.Millisecond
	maxBackoff = 2 * time.Second
)

// maxIO bounds the data of one OBJ_READ or OBJ_WRITE so that a call always
// fits in an RPC record (rpc.DefaultMaxRecord).
const maxIO = 1 << 20

type cacheKey struct {
	other [12]byte
	ino   uint64
	write bool
}

type cacheEntry struct {
	client uint64
	at     time.Time // when the MDS gave the answer
}

// connTerm is the rpc.Conn value under which the agent keeps the term a
// connection registered in.
type connTerm struct{}

// Agent is the DS side of the control protocol: it keeps the DS registered
// with the MDS, serves the MDS's object calls from the local store, and
// validates stateids for the DS's NFS server.
type Agent struct {
	cfg      AgentConfig
	log      *slog.Logger
	verifier [8]byte       // boot verifier, returned by OBJ_WRITE and OBJ_COMMIT
	ttl      time.Duration // of positive stateid answers; stateidTTL

	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}

	mu   sync.Mutex
	conn *rpc.Conn // registered connection, nil while reconnecting
	// mds is the address conn goes to; next the index in cfg.MDS of
	// the address that last accepted the DS, tried first next time.
	mds  string
	next int
	// term is the highest nonzero term the DS registered in: a REGISTER
	// reply of a lower one, and the MDS's calls on a connection
	// registered in a lower one, come from a deposed leader.
	term uint64
	// lease is the MDS's lease from the last REGISTER, zero if it gave
	// none (staleLimit).
	lease     time.Duration
	dataKey   []byte
	clusterID []byte
	interval  time.Duration
	missed    int // liveness window in intervals, from REGISTER or the override
	reg       uint64
	err       error // terminal error (removed, version, auth, wrong cluster)
	fenced    map[uint64]struct{}
	// cache holds the MDS's positive CHECK_STATEID answers. It is
	// cleared when the DS registers, with whichever MDS, and survives the
	// time in between: see CheckStateid.
	cache     map[cacheKey]cacheEntry
	removed   bool
	removedCh chan struct{}
	// maps caches stripe maps by inode (Map, replica.go): dropped
	// wholesale when the DS registers again, entry by entry on
	// MAP_CHANGED; kept while the MDS is away (run).
	maps map[uint64]*mapEntry
	// peerAddrs are the advertised addresses of the data servers named
	// by the maps fetched, by id, from the MAP replies.
	peerAddrs map[string][]string

	peers *peerPool // connections to other data servers (peer.go)

	stats struct {
		readOps, readBytes, writeOps, writeBytes       atomic.Uint64
		commitOps, truncateOps, removeOps, getSizeOps  atomic.Uint64
		stateidChecks, stateidCacheHits, registrations atomic.Uint64
		stateidStaleHits                               atomic.Uint64
		mapFetches, sumOps                             atomic.Uint64
		copyOps, copyBytes                             atomic.Uint64
		replicaWriteOps, replicaWriteBytes             atomic.Uint64
		replicaCommitOps, replicaFailed                atomic.Uint64
		clientReadBytes, clientWriteBytes              atomic.Uint64
	}
}

// StartAgent connects to the MDS and registers, retrying with bounded
// backoff until it succeeds, ctx is done, or the MDS refuses the DS for
// good (ErrVersion, ErrAuth, ErrRemoved, ErrClusterFull, ErrWrongCluster). Afterwards the agent heartbeats,
// serves the MDS's calls, and reconnects and re-registers whenever the
// connection drops, until Close.
func StartAgent(ctx context.Context, cfg AgentConfig) (*Agent, error) {
	if len(cfg.MDS) == 0 || slices.Contains(cfg.MDS, "") || cfg.ID == "" || cfg.Store == nil {
		return nil, errors.New("cluster: AgentConfig needs MDS addresses, ID and Store")
	}
	if len(cfg.ID) > ctlproto.CTL_MAX_ID || len(cfg.Addrs) > ctlproto.CTL_MAX_ADDRS || len(cfg.PeerAddrs) > ctlproto.CTL_MAX_ADDRS {
		return nil, errors.New("cluster: AgentConfig ID or Addrs too long")
	}
	a := &Agent{
		cfg:       cfg,
		log:       cfg.Logger,
		clusterID: slices.Clone(cfg.ClusterID),
		ttl:       stateidTTL,
		fenced:    map[uint64]struct{}{},
		cache:     map[cacheKey]cacheEntry{},
		maps:      map[uint64]*mapEntry{},
		peerAddrs: map[string][]string{},
		done:      make(chan struct{}),
		removedCh: make(chan struct{}),
	}
	a.peers = newPeerPool(a)
	if a.log == nil {
		a.log = slog.New(slog.DiscardHandler)
	}
	a.log = a.log.With("ds", cfg.ID)
	if _, err := io.ReadFull(rand.Reader, a.verifier[:]); err != nil {
		return nil, fmt.Errorf("cluster: boot verifier: %w", err)
	}
	a.ctx, a.cancel = context.WithCancel(context.Background())
	if err := a.connectRetry(ctx); err != nil {
		a.cancel()
		return nil, err
	}
	go a.run()
	return a, nil
}

// DataKey returns the data filehandle key from the last REGISTER.
func (a *Agent) DataKey() []byte {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.dataKey)
}

// ClusterID returns the cluster this DS belongs to: the MDS's, once
// registered.
func (a *Agent) ClusterID() []byte {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.clusterID)
}

// ID returns this DS's identity.
func (a *Agent) ID() string { return a.cfg.ID }

// FileSize asks the MDS for the size of file ino (FILE_SIZE).
// pnfs.ErrMDSUnreachable means the MDS is away (see CheckStateid),
// pnfs.ErrUnavailable that it asked for a retry.
func (a *Agent) FileSize(ctx context.Context, ino uint64) (uint64, error) {
	a.mu.Lock()
	conn := a.conn
	a.mu.Unlock()
	if conn == nil {
		return 0, fmt.Errorf("%w: not registered with an MDS", pnfs.ErrMDSUnreachable)
	}
	var res ctlproto.CtlGetsizeRes
	err := call(ctx, conn, ctlproto.CTLPROC_FILE_SIZE, &ctlproto.CtlInoArgs{Ino: ino}, &res)
	if mdsAway(err, res.Status) {
		return 0, fmt.Errorf("%w: FILE_SIZE of %d: %v", pnfs.ErrMDSUnreachable, ino, cmp.Or(err, errOf(res.Status)))
	}
	if err := errOf(res.Status); err != nil {
		return 0, fmt.Errorf("cluster: FILE_SIZE of %d: %w", ino, err)
	}
	return *res.Size, nil
}

// mdsAway reports whether a call to the MDS, which failed with err or was
// answered with st, shows the MDS away: no answer, or an answer saying
// that the DS's registration is over (the MDS restarted, or no longer
// leads). The heartbeat loop finds out too, and registers again, maybe
// elsewhere.
func mdsAway(err error, st ctlproto.CtlStatus) bool {
	if err != nil {
		return true
	}
	switch st {
	case ctlproto.CTL_ERR_NOTREG, ctlproto.CTL_ERR_STALE_GEN, ctlproto.CTL_ERR_NOT_LEADER:
		return true
	}
	return false
}

// Verifier returns the DS's boot verifier, the write verifier OBJ_WRITE and
// OBJ_COMMIT report; a DS server may use it as its NFS write verifier.
func (a *Agent) Verifier() [8]byte { return a.verifier }

// Removed is closed when the MDS removes this DS from the cluster.
func (a *Agent) Removed() <-chan struct{} { return a.removedCh }

// Err returns why the agent stopped trying to register (ErrRemoved, ErrWrongCluster,
// ErrVersion, ErrAuth, ErrClusterFull), or nil while it is working.
func (a *Agent) Err() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.err
}

// Stats returns counters of the object calls served so far.
func (a *Agent) Stats() AgentStats {
	s := &a.stats
	return AgentStats{
		ReadOps: s.readOps.Load(), ReadBytes: s.readBytes.Load(),
		WriteOps: s.writeOps.Load(), WriteBytes: s.writeBytes.Load(),
		CommitOps: s.commitOps.Load(), TruncateOps: s.truncateOps.Load(),
		RemoveOps: s.removeOps.Load(), GetSizeOps: s.getSizeOps.Load(),
		StateidChecks: s.stateidChecks.Load(), StateidCacheHits: s.stateidCacheHits.Load(),
		StateidStaleHits: s.stateidStaleHits.Load(),
		Registrations:    s.registrations.Load(), MapFetches: s.mapFetches.Load(),
		ReplicaWriteOps: s.replicaWriteOps.Load(), ReplicaWriteBytes: s.replicaWriteBytes.Load(),
		ReplicaCommitOps: s.replicaCommitOps.Load(), ReplicaFailed: s.replicaFailed.Load(),
		SumOps: s.sumOps.Load(), ClientReadBytes: s.clientReadBytes.Load(), ClientWriteBytes: s.clientWriteBytes.Load(),
		CopyOps: s.copyOps.Load(), CopyBytes: s.copyBytes.Load(),
	}
}

// Close stops the agent and closes its connections, to the MDS and to
// peers. The store is not closed.
func (a *Agent) Close() error {
	a.cancel()
	<-a.done
	a.peers.close()
	return nil
}

// CheckStateid reports whether stateid allows I/O (write or read) on ino.
// Fenced clients get pnfs.ErrFenced; the MDS's refusals come back as
// pnfs.ErrBadStateid, ErrOldStateid, ErrStaleStateid, ErrExpired or
// ErrOpenMode.
//
// Positive answers are cached per (stateid.other, ino, write). While the
// MDS can be asked, an answer is reused for two seconds (stateidTTL).
// While it cannot (the DS is not registered, or the question gets no
// answer: the connection broke, the MDS no longer leads), an answer from
// within the last lease (staleLimit) is still good: the client's layout
// stays valid until the MDS recalls it or the client's lease runs out, and
// neither happens without an MDS, so clients keep doing I/O through an MDS
// restart or failover. A FENCE always wins: it drops the fenced client's
// answers. Registering, with the same MDS or another, drops every answer;
// from then on the leader's own state decides (a new leader refuses the
// stateids of its predecessor as stale, and clients recover).
//
// A stateid with no usable answer while the MDS cannot be asked is
// pnfs.ErrMDSUnreachable, which sends the client to the MDS; pnfs.ErrUnavailable
// means the MDS answered and asked for a retry.
func (a *Agent) CheckStateid(ctx context.Context, ino uint64, stateid [16]byte, write bool) error {
	a.stats.stateidChecks.Add(1)
	key := cacheKey{ino: ino, write: write}
	copy(key.other[:], stateid[4:])
	now := time.Now()
	a.mu.Lock()
	conn, stale := a.conn, a.staleLimitLocked()
	e, cached := a.cache[key]
	if cached {
		age := now.Sub(e.at)
		switch {
		case age < a.ttl:
			a.mu.Unlock()
			a.stats.stateidCacheHits.Add(1)
			return nil
		case conn == nil && age < stale:
			a.mu.Unlock()
			a.stats.stateidStaleHits.Add(1)
			return nil
		case age >= stale:
			delete(a.cache, key)
			cached = false
		}
	}
	a.mu.Unlock()
	if conn == nil {
		return fmt.Errorf("%w: not registered with an MDS", pnfs.ErrMDSUnreachable)
	}
	var res ctlproto.CtlCheckStateidRes
	err := call(ctx, conn, ctlproto.CTLPROC_CHECK_STATEID,
		&ctlproto.CtlCheckStateidArgs{Ino: ino, Stateid: stateid, Write: write}, &res)
	unreachable := mdsAway(err, res.Status)
	if err == nil {
		err = errOf(res.Status)
	}
	switch {
	case err == nil:
	case ctx.Err() != nil:
		return err // the client's request is gone
	case unreachable || errors.Is(err, pnfs.ErrUnavailable):
		if cached && a.staleAnswer(key, now) {
			a.stats.stateidStaleHits.Add(1)
			return nil
		}
		if unreachable {
			// %v: this is not pnfs.ErrUnavailable, whose callers answer
			// "retry".
			return fmt.Errorf("%w: %v", pnfs.ErrMDSUnreachable, err)
		}
		return err
	default:
		if cached {
			a.mu.Lock()
			delete(a.cache, key)
			a.mu.Unlock()
		}
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	// A FENCE that arrived while the question was in flight wins.
	if _, f := a.fenced[res.Clientid]; f {
		return pnfs.ErrFenced
	}
	if len(a.cache) >= maxCache {
		for k, e := range a.cache {
			if now.Sub(e.at) >= stale {
				delete(a.cache, k)
			}
		}
		if len(a.cache) >= maxCache {
			clear(a.cache)
		}
	}
	a.cache[key] = cacheEntry{client: res.Clientid, at: now}
	return nil
}

// staleAnswer reports whether the cache still holds an answer for key
// from within the lease at now, for a question the MDS did not answer. A
// registration or FENCE meanwhile has dropped it.
func (a *Agent) staleAnswer(key cacheKey, now time.Time) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	e, ok := a.cache[key]
	if !ok || now.Sub(e.at) >= a.staleLimitLocked() {
		return false
	}
	_, fenced := a.fenced[e.client]
	return !fenced
}

// staleLimitLocked is how old a positive stateid answer may be and still
// be used while the MDS cannot be asked: the MDS's lease from REGISTER,
// else AgentConfig.Lease, else defaultLease; never less than the TTL.
func (a *Agent) staleLimitLocked() time.Duration {
	lease := a.lease
	if lease <= 0 {
		lease = a.cfg.Lease
	}
	if lease <= 0 {
		lease = defaultLease
	}
	return max(lease, a.ttl)
}

// refusedForGood reports whether a REGISTER failure is final: retrying,
// here or at another MDS of the cluster, cannot help.
func refusedForGood(err error) bool {
	return errors.Is(err, ErrRemoved) || errors.Is(err, ErrVersion) || errors.Is(err, ErrAuth) ||
		errors.Is(err, ErrClusterFull) || errors.Is(err, ErrWrongCluster)
}

// connectRetry registers, retrying transient failures with backoff.
func (a *Agent) connectRetry(ctx context.Context) error {
	backoff := minBackoff
	for {
		err := a.connect(ctx)
		if err == nil {
			return nil
		}
		if refusedForGood(err) {
			a.mu.Lock()
			a.err = err
			a.mu.Unlock()
			return err
		}
		a.log.Warn("cluster: cannot register with the MDS; retrying", "mds", a.cfg.MDS, "err", err, "backoff", backoff)
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("cluster: registering with %v: %w (last error: %w)", a.cfg.MDS, ctx.Err(), err)
		case <-a.ctx.Done():
			t.Stop()
			return fmt.Errorf("cluster: agent closed: %w", pnfs.ErrUnavailable)
		case <-t.C:
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// connect registers once with the leading MDS: it tries the MDS addresses
// in turn, from the last one that accepted the DS, each for at most
// registerTimeout. An MDS that does not lead is not listening (a standby),
// refuses REGISTER with ErrNotLeader, or is a deposed leader whose reply
// carries an older term than the DS has seen (refused here); each sends
// the DS on to the next address. A final refusal (refusedForGood) ends the
// round.
func (a *Agent) connect(ctx context.Context) error {
	a.mu.Lock()
	first := a.next
	a.mu.Unlock()
	n := len(a.cfg.MDS)
	var errs []error
	for i := range n {
		idx := (first + i) % n
		err := a.connectTo(ctx, a.cfg.MDS[idx])
		if err == nil {
			a.mu.Lock()
			a.next = idx
			a.mu.Unlock()
			return nil
		}
		if refusedForGood(err) || ctx.Err() != nil {
			return err
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// connectTo dials the MDS at addr and registers once.
func (a *Agent) connectTo(ctx context.Context, addr string) error {
	timeout := registerTimeout
	if a.cfg.registerTimeout > 0 {
		timeout = a.cfg.registerTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	conn, err := rpc.Dial(ctx, "tcp", addr, rpc.HandlerFunc(a.serveRPC), rpc.WithLogger(a.log))
	if err != nil {
		return fmt.Errorf("cluster: dial %s: %w", addr, err)
	}
	total, free := a.space()
	a.mu.Lock()
	args := &ctlproto.CtlRegisterArgs{
		Revision:     ctlproto.CTL_VERSION,
		Token:        a.cfg.JoinSecret,
		ClusterId:    a.clusterID,
		DsId:         a.cfg.ID,
		Addrs:        a.cfg.Addrs,
		PeerAddrs:    a.cfg.PeerAddrs,
		Capacity:     total,
		Free:         free,
		BootVerifier: a.verifier,
	}
	a.mu.Unlock()
	var res ctlproto.CtlRegisterRes
	if err := call(ctx, conn, ctlproto.CTLPROC_REGISTER, args, &res); err != nil {
		conn.Close()
		return fmt.Errorf("cluster: REGISTER with %s: %w", addr, err)
	}
	if err := errOf(res.Status); err != nil {
		conn.Close()
		if v := res.Versions; v != nil {
			return fmt.Errorf("cluster: REGISTER with %s: %w (MDS speaks %d..%d, we speak %d)", addr, err, v.Low, v.High, ctlproto.CTL_VERSION)
		}
		return fmt.Errorf("cluster: REGISTER with %s: %w", addr, err)
	}
	ok := res.Ok
	a.mu.Lock()
	if ok.Term != 0 && ok.Term < a.term {
		highest := a.term
		a.mu.Unlock()
		conn.Close()
		a.log.Warn("cluster: refusing the registration of an MDS of an older term: a deposed leader",
			"mds", addr, "term", ok.Term, "highest_term", highest)
		return fmt.Errorf("cluster: REGISTER with %s: term %d is older than term %d: %w", addr, ok.Term, highest, ErrNotLeader)
	}
	a.term = max(a.term, ok.Term)
	conn.SetValue(connTerm{}, ok.Term)
	old := a.conn
	a.conn = conn
	a.mds = addr
	a.dataKey = slices.Clone(ok.DataKey)
	a.clusterID = slices.Clone(ok.ClusterId)
	a.reg = ok.Registration
	a.lease = time.Duration(ok.LeaseMs) * time.Millisecond
	a.interval = time.Duration(ok.HeartbeatMs) * time.Millisecond
	if a.interval <= 0 {
		a.interval = time.Second
	}
	a.missed = missedBeats(a.cfg.MissedBeats, ok.MissedBeats)
	// The MDS's fence list is authoritative; cached answers predate it,
	// and from now on this MDS's state decides.
	clear(a.fenced)
	for _, id := range ok.Fenced {
		a.fenced[id] = struct{}{}
	}
	clear(a.cache)
	// MAP_CHANGEs sent while the DS was away were missed.
	a.dropMapsLocked()
	a.mu.Unlock()
	if old != nil && old != conn {
		// Whatever arrives on it now comes from a registration that is
		// over.
		old.Close()
	}
	a.stats.registrations.Add(1)
	a.log.Info("cluster: registered with the MDS", "mds", addr, "term", ok.Term, "cluster_id", fmt.Sprintf("%x", ok.ClusterId),
		"heartbeat", time.Duration(ok.HeartbeatMs)*time.Millisecond, "missed_beats", ok.MissedBeats)
	return nil
}

// staleTerm reports whether conn registered in an older term than the
// highest the DS has seen: calls arriving on it come from a deposed
// leader. Connections of term 0 (an MDS that is not elected) and those not
// registered yet (the MDS may call as soon as it has answered REGISTER)
// are never stale.
func (a *Agent) staleTerm(conn *rpc.Conn) bool {
	if conn == nil {
		return false
	}
	t, _ := conn.Value(connTerm{}).(uint64)
	if t == 0 {
		return false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return t < a.term
}

// missedBeats returns the agent's liveness window in heartbeat intervals:
// the AgentConfig.MissedBeats override if positive, else the MDS's window
// from the REGISTER reply, else (an MDS that sent none) defaultMissedBeats.
func missedBeats(override int, fromMDS uint32) int {
	switch {
	case override > 0:
		return override
	case fromMDS > 0 && uint64(fromMDS) <= uint64(maxInt):
		return int(fromMDS)
	}
	return defaultMissedBeats
}

// maxInt is the largest int, for checking conversions from uint32 on
// 32-bit platforms.
const maxInt = int(^uint(0) >> 1)

// livenessWindow is missed intervals, saturating instead of overflowing
// for an absurd window from the MDS.
func livenessWindow(missed int, interval time.Duration) time.Duration {
	if missed <= 0 || interval <= 0 {
		return 0
	}
	if time.Duration(missed) > math.MaxInt64/interval {
		return math.MaxInt64
	}
	return time.Duration(missed) * interval
}

func (a *Agent) space() (total, free uint64) {
	if a.cfg.Capacity != nil {
		return a.cfg.Capacity()
	}
	t, f, _, err := a.cfg.Store.StatFS()
	if err != nil {
		return 0, 0
	}
	return t, f
}

// run heartbeats over the registered connection and reconnects when it
// fails, until Close or a terminal refusal.
func (a *Agent) run() {
	defer close(a.done)
	for {
		a.mu.Lock()
		conn, interval, missed, reg := a.conn, a.interval, a.missed, a.reg
		a.mu.Unlock()
		a.heartbeatLoop(conn, interval, missed, reg)
		conn.Close()
		a.mu.Lock()
		if a.conn == conn {
			a.conn = nil
		}
		mds := a.mds
		// The stateid and stripe-map caches stay, and keep clients'
		// I/O going until the DS registers again, which drops both
		// (connectTo). Maps may be used so long: no client does I/O
		// here without a stateid the cache vouches for, which is for a
		// lease at most (CheckStateid), and no map changes without
		// the MDS.
		a.mu.Unlock()
		if a.ctx.Err() != nil {
			return
		}
		a.log.Info("cluster: connection to the MDS lost; reconnecting", "mds", mds, "addresses", a.cfg.MDS)
		if err := a.connectRetry(a.ctx); err != nil {
			if a.ctx.Err() == nil {
				a.log.Error("cluster: giving up registering with the MDS", "err", err)
				<-a.ctx.Done()
			}
			return
		}
	}
}

// heartbeatLoop heartbeats every interval and returns when conn closes, a
// heartbeat is refused, the MDS has answered none for the liveness window
// (missed intervals, the MDS's own window learnt at REGISTER), or the
// agent closes.
//
// A slow answer is not a failure. The MDS judges the DS by when heartbeats
// arrive, and on a loaded machine, or with the connection busy carrying
// OBJ_READ replies ahead of the heartbeat, one answer can take several
// intervals; closing the connection then would take a live DS out of
// service and fail the MDS's object calls in flight on it. So a heartbeat
// waits for its answer until the window since the last answer runs out,
// the next one goes out as soon as it returns, and one that fails without
// closing the connection is retried at the next tick within the window.
func (a *Agent) heartbeatLoop(conn *rpc.Conn, interval time.Duration, missed int, reg uint64) {
	t := time.NewTicker(interval)
	defer t.Stop()
	window := livenessWindow(missed, interval)
	lastAnswer := time.Now() // REGISTER was answered just now
	for {
		select {
		case <-a.ctx.Done():
			return
		case <-conn.Done():
			return
		case <-t.C:
		}
		deadline := lastAnswer.Add(window)
		total, free := a.space()
		read, written := a.Stats().IO()
		ctx, cancel := context.WithDeadline(a.ctx, deadline)
		var res ctlproto.CtlStatusRes
		err := call(ctx, conn, ctlproto.CTLPROC_HEARTBEAT, &ctlproto.CtlHeartbeatArgs{
			Registration: reg, Capacity: total, Free: free, ReadBytes: read, WrittenBytes: written}, &res)
		cancel()
		if err == nil {
			lastAnswer = time.Now()
			if err := errOf(res.Status); err != nil {
				a.log.Warn("cluster: heartbeat refused; registering again", "err", err)
				return
			}
			continue
		}
		switch {
		case a.ctx.Err() != nil, errors.Is(err, rpc.ErrConnClosed):
			return
		case !time.Now().Before(deadline):
			a.log.Warn("cluster: no heartbeat answer from the MDS within its liveness window; reconnecting",
				"window", window, "last_answer", lastAnswer, "err", err)
			return
		default:
			a.log.Warn("cluster: heartbeat failed; retrying", "err", err, "window_left", time.Until(deadline))
		}
	}
}

// serveRPC serves the MDS's calls on this data server (ctlProcs, fromMDS).
func (a *Agent) serveRPC(ctx context.Context, c *rpc.Call, res *xdr.Encoder) rpc.AcceptStat {
	if st, ok := checkProgram(c, res); !ok {
		return st
	}
	p, ok := ctlProc(c.Proc, fromMDS)
	if !ok {
		return rpc.ProcUnavail
	}
	if p.agent != nil && a.staleTerm(c.Conn) {
		// Every result of these procedures is a union or struct led by
		// its status, with nothing else for an error status.
		a.log.Warn("cluster: refusing a call from an MDS of an older term", "proc", c.Proc, "peer", c.Conn.RemoteAddr())
		(&ctlproto.CtlStatusRes{Status: ctlproto.CTL_ERR_NOT_LEADER}).EncodeXDR(res)
		return rpc.Success
	}
	return runProc(a, p, p.agent, ctx, c, res)
}

func (a *Agent) setFenced(client uint64, fenced bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !fenced {
		delete(a.fenced, client)
		return
	}
	a.fenced[client] = struct{}{}
	for k, e := range a.cache {
		if e.client == client {
			delete(a.cache, k)
		}
	}
}

// storeStatus logs a local storage failure and maps it to a status.
func (a *Agent) storeStatus(op string, ino uint64, err error) ctlproto.CtlStatus {
	if errors.Is(err, store.ErrCorrupt) {
		// The MDS reads another copy and has this one healed.
		a.log.Warn("cluster: object "+op+" found a block that fails its checksum", "ino", ino, "err", err)
		return ctlproto.CTL_ERR_CORRUPT
	}
	st := statusOf(err)
	if st == ctlproto.CTL_ERR_IO {
		a.log.Error("cluster: object "+op+" failed", "ino", ino, "err", err)
	}
	return st
}

var readBufs = sync.Pool{New: func() any { b := make([]byte, maxIO); return &b }}

func (a *Agent) objRead(c *rpc.Call, args *ctlproto.CtlReadArgs, res *xdr.Encoder) {
	a.stats.readOps.Add(1)
	fail := func(st ctlproto.CtlStatus) { (&ctlproto.CtlReadRes{Status: st}).EncodeXDR(res) }
	if args.Offset > 1<<63-1 {
		fail(ctlproto.CTL_ERR_INVAL)
		return
	}
	f, err := a.cfg.Store.Open(args.Ino, false)
	if err != nil {
		fail(a.storeStatus("read", args.Ino, err))
		return
	}
	defer f.Close()
	bp := readBufs.Get().(*[]byte)
	buf := (*bp)[:min(int(args.Count), maxIO)]
	n, err := f.ReadAt(buf, int64(args.Offset))
	if err != nil && !errors.Is(err, io.EOF) {
		readBufs.Put(bp)
		fail(a.storeStatus("read", args.Ino, err))
		return
	}
	size, err := f.Size()
	if err != nil {
		readBufs.Put(bp)
		fail(a.storeStatus("read", args.Ino, err))
		return
	}
	a.stats.readBytes.Add(uint64(n))
	c.AfterReply(func() { readBufs.Put(bp) })
	out := ctlproto.CtlReadRes{Status: ctlproto.CTL_OK, Ok: &ctlproto.CtlReadOk{
		Eof:  args.Offset+uint64(n) >= uint64(size),
		Size: uint64(size),
		Data: buf[:n],
	}}
	out.EncodeXDR(res)
}

func (a *Agent) objWrite(args *ctlproto.CtlWriteArgs) ctlproto.CtlWriteRes {
	a.stats.writeOps.Add(1)
	end := args.Offset + uint64(len(args.Data))
	if end < args.Offset || end > 1<<63-1 {
		return ctlproto.CtlWriteRes{Status: ctlproto.CTL_ERR_FBIG}
	}
	f, err := a.cfg.Store.Open(args.Ino, true)
	if err != nil {
		return ctlproto.CtlWriteRes{Status: a.storeStatus("write", args.Ino, err)}
	}
	defer f.Close()
	if _, err := f.WriteAt(args.Data, int64(args.Offset)); err != nil {
		return ctlproto.CtlWriteRes{Status: a.storeStatus("write", args.Ino, err)}
	}
	if args.Stable {
		if err := f.Sync(); err != nil {
			return ctlproto.CtlWriteRes{Status: a.storeStatus("write", args.Ino, err)}
		}
	}
	a.stats.writeBytes.Add(uint64(len(args.Data)))
	return ctlproto.CtlWriteRes{Status: ctlproto.CTL_OK, Ok: &ctlproto.CtlWriteOk{
		Count: uint32(len(args.Data)), Committed: args.Stable, Verifier: a.verifier,
	}}
}

func (a *Agent) objSize(ino uint64) ctlproto.CtlGetsizeRes {
	f, err := a.cfg.Store.Open(ino, false)
	if err != nil {
		return ctlproto.CtlGetsizeRes{Status: a.storeStatus("getsize", ino, err)}
	}
	defer f.Close()
	n, err := f.Size()
	if err != nil {
		return ctlproto.CtlGetsizeRes{Status: a.storeStatus("getsize", ino, err)}
	}
	size := uint64(n)
	return ctlproto.CtlGetsizeRes{Status: ctlproto.CTL_OK, Size: &size}
}

// objPunch deallocates a range of an object. A store that cannot punch
// holes writes zeros instead: the range's old bytes must not survive a
// move in any case, or a later map change could expose them.
func (a *Agent) objPunch(args *ctlproto.CtlPunchArgs) ctlproto.CtlStatus {
	end := args.Offset + args.Length
	if end < args.Offset || end > 1<<63-1 {
		return ctlproto.CTL_ERR_INVAL
	}
	f, err := a.cfg.Store.Open(args.Ino, false)
	if errors.Is(err, fs.ErrNotExist) {
		return ctlproto.CTL_OK
	}
	if err != nil {
		return a.storeStatus("punch", args.Ino, err)
	}
	defer f.Close()
	err = f.PunchHole(int64(args.Offset), int64(args.Length))
	if errors.Is(err, store.ErrNotSupported) {
		// Zeros up to the object's end only: writing past it would grow
		// the object, and make a data server read zeros as the file's
		// bytes past its end.
		var size int64
		size, err = f.Size()
		end = min(end, uint64(max(size, 0)))
		zeros := make([]byte, min(args.Length, maxIO))
		for off := args.Offset; off < end && err == nil; off += uint64(len(zeros)) {
			n := min(uint64(len(zeros)), end-off)
			_, err = f.WriteAt(zeros[:n], int64(off))
		}
	}
	if err != nil {
		return a.storeStatus("punch", args.Ino, err)
	}
	return ctlproto.CTL_OK
}

// maxSum bounds the range of one OBJ_SUM, so that one call holds a read
// buffer and the DS's disk for a bounded time.
const maxSum = 4 << 20

// objSum hashes [offset, offset+length) of an object as stored locally:
// zeros where the object holds nothing (past its end, or no object at
// all), CTL_ERR_CORRUPT if a block fails its checksum.
func (a *Agent) objSum(args *ctlproto.CtlSumArgs) ctlproto.CtlSumRes {
	a.stats.sumOps.Add(1)
	end := args.Offset + args.Length
	if args.Length > maxSum || end < args.Offset || end > 1<<63-1 {
		return ctlproto.CtlSumRes{Status: ctlproto.CTL_ERR_INVAL}
	}
	ok := &ctlproto.CtlSumOk{}
	h := sha256.New()
	f, err := a.cfg.Store.Open(args.Ino, false)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		f = nil
	case err != nil:
		return ctlproto.CtlSumRes{Status: a.storeStatus("sum", args.Ino, err)}
	default:
		defer f.Close()
		size, err := f.Size()
		if err != nil {
			return ctlproto.CtlSumRes{Status: a.storeStatus("sum", args.Ino, err)}
		}
		ok.Size = uint64(size)
	}
	bp := readBufs.Get().(*[]byte)
	defer readBufs.Put(bp)
	for off := args.Offset; off < end; {
		buf := (*bp)[:min(uint64(len(*bp)), end-off)]
		n := 0
		if f != nil && off < ok.Size {
			n, err = f.ReadAt(buf, int64(off))
			if err != nil && !errors.Is(err, io.EOF) {
				return ctlproto.CtlSumRes{Status: a.storeStatus("sum", args.Ino, err)}
			}
		}
		clear(buf[n:])
		h.Write(buf)
		off += uint64(len(buf))
	}
	copy(ok.Sha256[:], h.Sum(nil))
	return ctlproto.CtlSumRes{Status: ctlproto.CTL_OK, Ok: ok}
}
