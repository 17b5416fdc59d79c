package server

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/rpc"
	"github.com/shoalfs/shoal/meta"
	"github.com/shoalfs/shoal/server/internal/state"
)

// stateGlue connects the protocol-independent state manager to the server:
// persistence of client records in the metadata engine, the boot epoch,
// lease sweeping, and the per-session callback credentials.
type stateGlue struct {
	s      *Server
	m      *state.Manager
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}

	// mu guards the per-session maps below. It may be held while calling
	// into the Manager (which never calls back with its locks held), never
	// the other way round.
	mu     sync.Mutex
	cbCred map[state.SessionID]rpc.OpaqueAuth
	// cbMinor is the minor version each session was created with; the
	// client only accepts CB_COMPOUNDs of that minor version.
	cbMinor map[state.SessionID]uint32
	// pins holds the unpin function of each connection pinned (kept from
	// idle close) because it is bound to a session's back channel: the
	// server could not call back on a closed one. At most one pin per
	// session and connection.
	pins map[state.SessionID]map[*rpc.Conn]func()

	// cbChanges is the change attribute each write delegation holder
	// last reported by CB_GETATTR, by file (deleg.go).
	cbChanges map[meta.Ino]uint64

	// orphans are the unlinked files kept for their opens (orphans.go);
	// nil on a data server, which has no namespace.
	orphans *orphanSet
}

// metaClients adapts the metadata engine to state.ClientStore.
type metaClients struct{ e meta.Engine }

// Client records are durable when stored, whatever the COMPOUND's
// durability (durability.go): a client whose record a crash took back
// could not reclaim its opens and locks.
func (m metaClients) PutClient(ctx context.Context, key, rec []byte) error {
	return m.e.PutClient(durableCtx(ctx), key, rec)
}
func (m metaClients) DeleteClient(ctx context.Context, key []byte) error {
	return m.e.DeleteClient(durableCtx(ctx), key)
}
func (m metaClients) Clients(ctx context.Context, fn func(key, rec []byte) error) error {
	recs, err := m.e.Clients(ctx)
	if err != nil {
		return err
	}
	for _, r := range recs {
		if err := fn(r.Key, r.Rec); err != nil {
			return err
		}
	}
	return nil
}

var _ state.ClientStore = metaClients{}

// nextEpoch increments and persists the boot epoch, which the state manager
// embeds in client IDs and stateids to recognise those of earlier boots.
func nextEpoch(ctx context.Context, e meta.Engine) (uint32, error) {
	var epoch uint32
	b, err := e.GetConfig(ctx, "boot-epoch")
	switch {
	case err == nil && len(b) == 4:
		epoch = binary.BigEndian.Uint32(b)
	case err != nil && !errors.Is(err, meta.ErrNotFound):
		return 0, err
	}
	epoch++
	if epoch == 0 {
		epoch = 1
	}
	if err := e.PutConfig(ctx, "boot-epoch", binary.BigEndian.AppendUint32(nil, epoch)); err != nil {
		return 0, err
	}
	return epoch, nil
}

// newStateGlue makes the state of s's client IDs and sessions, with boot
// epoch epoch, persisted in store (nil: not persisted). The MDS adds its
// orphans afterwards (New).
func newStateGlue(s *Server, epoch uint32, store state.ClientStore) (*stateGlue, error) {
	ctx, cancel := context.WithCancel(context.Background())
	g := &stateGlue{
		s: s, ctx: ctx, cancel: cancel, done: make(chan struct{}),
		cbCred:  map[state.SessionID]rpc.OpaqueAuth{},
		cbMinor: map[state.SessionID]uint32{},
		pins:    map[state.SessionID]map[*rpc.Conn]func(){},
	}
	fore := state.DefaultForeLimits
	fore.MaxRequestSize = s.cfg.MaxWrite + 64<<10
	fore.MaxResponseSize = s.cfg.MaxRead + 64<<10
	var err error
	g.m, err = state.NewManager(ctx, state.Config{
		Epoch:          epoch,
		LeaseTime:      s.cfg.Lease,
		Store:          store,
		ForeLimits:     fore,
		Logger:         s.log,
		OnRevokeDeleg:  s.delegRevoked,
		OnRevokeLayout: func(id state.ClientID) { s.pnfs.fence(id) },
		OnPurge: func(p state.PurgeInfo) {
			s.log.Info("client state purged", "clientid", fmt.Sprintf("%#x", uint64(p.ClientID)), "reason", p.Reason.String(), "files", len(p.Files), "sessions", len(p.Sessions))
			g.sessionsGone(p.Sessions...)
			g.orphans.purged(p.Files)
			if p.Reason == state.PurgeExpired {
				s.pnfs.fenceLoose(p.ClientID) // its layouts went with its lease
			}
			s.event(Event{Kind: EventClientPurged, ClientID: uint64(p.ClientID), Reason: p.Reason.String()})
		},
	})
	if err != nil {
		cancel()
		return nil, fmt.Errorf("server: state: %w", err)
	}
	return g, nil
}

// run sweeps expired leases and periodically persists write attributes, so
// that a crash loses at most a few seconds of size updates of data that was
// never committed, until stop. It also frees the orphans nobody holds open
// (orphans.go): at once if there is no grace period, else when it ends,
// and when a purge dropped opens of one; and it runs the freer of the
// orphans doomed by REMOVE and RENAME, which it waits for on the way out
// (the engine and the stores close after stop).
func (g *stateGlue) run() {
	defer close(g.done)
	go g.m.Run(g.ctx)
	if g.orphans != nil {
		freerDone := make(chan struct{})
		go func() {
			defer close(freerDone)
			g.orphans.runFreer()
		}()
		defer func() { <-freerDone }()
	}
	t := time.NewTicker(2 * time.Second)
	defer t.Stop()
	var kick <-chan struct{}
	if g.orphans != nil {
		kick = g.orphans.kick
	}
	replaysDone := make(chan struct{})
	go func() {
		defer close(replaysDone)
		g.s.replays.run(g.ctx)
	}()
	defer func() { <-replaysDone }()
	if g.s.sweep != nil {
		sweepDone := make(chan struct{})
		go func() {
			defer close(sweepDone)
			g.s.sweep.afterStart(g.ctx)
		}()
		defer func() { <-sweepDone }()
	}
	g.orphans.sweep()
	for {
		select {
		case <-g.ctx.Done():
			return
		case <-kick:
			g.orphans.sweep()
		case <-t.C:
			if err := g.s.cache.flushAll(g.ctx); err != nil && g.ctx.Err() == nil {
				g.s.log.Warn("flush write attributes", "err", err)
			}
			g.orphans.sweep()
		}
	}
}

func (g *stateGlue) stop() {
	g.cancel()
	<-g.done
}

// sessionChanged brings what the server keeps for session id in line
// with the Manager after an operation on the session: update, if non-nil,
// records callback parameters (it runs with mu held), and conn, if
// non-nil, is pinned exactly while the Manager has it bound to the
// session's back channel. A session that is gone by now (destroyed or
// purged concurrently) gets nothing recorded: checking under mu orders
// this against sessionsGone, which the Manager's removal precedes.
func (g *stateGlue) sessionChanged(id state.SessionID, conn *rpc.Conn, update func()) {
	var unpin func()
	g.mu.Lock()
	sess, err := g.m.Session(id)
	switch {
	case err != nil:
		unpin = g.forgetLocked(id)
	default:
		if update != nil {
			update()
		}
		if conn != nil {
			unpin = g.syncPinLocked(sess, conn)
		}
	}
	g.mu.Unlock()
	if unpin != nil {
		unpin()
	}
}

// syncPinLocked pins conn for sess if it is bound to the back channel and
// not pinned yet, or returns the unpin function to call (outside mu) if
// it is pinned but no longer bound there. Caller holds mu.
func (g *stateGlue) syncPinLocked(sess *state.Session, conn *rpc.Conn) (unpin func()) {
	id := sess.ID()
	back := sess.Conns()[conn]&state.ChannelBack != 0
	cur := g.pins[id][conn]
	switch {
	case back && cur == nil:
		if g.pins[id] == nil {
			g.pins[id] = make(map[*rpc.Conn]func())
		}
		g.pins[id][conn] = conn.Pin()
	case !back && cur != nil:
		g.dropPinLocked(id, conn)
		return cur
	}
	return nil
}

func (g *stateGlue) dropPinLocked(id state.SessionID, conn *rpc.Conn) {
	delete(g.pins[id], conn)
	if len(g.pins[id]) == 0 {
		delete(g.pins, id)
	}
}

// forgetLocked drops everything kept for session id and returns a
// function releasing its pins, to call outside mu. Caller holds mu.
func (g *stateGlue) forgetLocked(id state.SessionID) (unpin func()) {
	delete(g.cbCred, id)
	delete(g.cbMinor, id)
	pins := g.pins[id]
	delete(g.pins, id)
	if len(pins) == 0 {
		return nil
	}
	return func() {
		for _, u := range pins {
			u()
		}
	}
}

// sessionsGone is the one place where the server learns that sessions
// ended, by DESTROY_SESSION or with their client (DESTROY_CLIENTID,
// lease expiry, a new incarnation or a replaced record): it drops their
// callback parameters and unpins their back channel connections, which
// may then be closed once idle. Call it after the Manager removed them.
func (g *stateGlue) sessionsGone(ids ...state.SessionID) {
	var unpins []func()
	g.mu.Lock()
	for _, id := range ids {
		if u := g.forgetLocked(id); u != nil {
			unpins = append(unpins, u)
		}
	}
	g.mu.Unlock()
	for _, u := range unpins {
		u()
	}
	g.s.replays.sessionsGone(ids...)
}

// connClosed forgets the pins of a closed connection, whose bindings the
// Manager dropped in ConnClosed, so that sessions outliving many
// back channel connections do not keep them all.
func (g *stateGlue) connClosed(conn *rpc.Conn) {
	var unpins []func()
	g.mu.Lock()
	for id, conns := range g.pins {
		if u, ok := conns[conn]; ok {
			unpins = append(unpins, u)
			g.dropPinLocked(id, conn)
		}
	}
	g.mu.Unlock()
	for _, u := range unpins {
		u()
	}
}

// connState unbinds closed connections from their sessions.
func (s *Server) connState(c *rpc.Conn, st rpc.ConnState) {
	if st == rpc.StateClosed {
		s.st.m.ConnClosed(c)
		s.st.connClosed(c)
	}
}

// stateErrs maps state-manager errors to statuses (see internal/state/errors.go).
// The stateid verdicts the state manager returns (pnfs.ErrBadStateid and
// the like) are package pnfs's: errTable (errors.go) maps them.
var stateErrs = []struct {
	err error
	st  nfs4.Nfsstat4
}{
	{state.ErrStaleClientID, nfs4.NFS4ERR_STALE_CLIENTID},
	{state.ErrClidInUse, nfs4.NFS4ERR_CLID_INUSE},
	{state.ErrClientidBusy, nfs4.NFS4ERR_CLIENTID_BUSY},
	{state.ErrNoEnt, nfs4.NFS4ERR_NOENT},
	{state.ErrNotSame, nfs4.NFS4ERR_NOT_SAME},
	{state.ErrPerm, nfs4.NFS4ERR_PERM},
	{state.ErrBadSession, nfs4.NFS4ERR_BADSESSION},
	{state.ErrBadSlot, nfs4.NFS4ERR_BADSLOT},
	{state.ErrSeqMisordered, nfs4.NFS4ERR_SEQ_MISORDERED},
	{state.ErrRetryUncachedRep, nfs4.NFS4ERR_RETRY_UNCACHED_REP},
	{state.ErrSeqFalseRetry, nfs4.NFS4ERR_SEQ_FALSE_RETRY},
	{state.ErrRepTooBigToCache, nfs4.NFS4ERR_REP_TOO_BIG_TO_CACHE},
	{state.ErrDelay, nfs4.NFS4ERR_DELAY},
	{state.ErrConnNotBound, nfs4.NFS4ERR_CONN_NOT_BOUND_TO_SESSION},
	{state.ErrShareDenied, nfs4.NFS4ERR_SHARE_DENIED},
	{state.ErrLocked, nfs4.NFS4ERR_LOCKED},
	{state.ErrDenied, nfs4.NFS4ERR_DENIED},
	{state.ErrLocksHeld, nfs4.NFS4ERR_LOCKS_HELD},
	{state.ErrInval, nfs4.NFS4ERR_INVAL},
	{state.ErrGrace, nfs4.NFS4ERR_GRACE},
	{state.ErrNoGrace, nfs4.NFS4ERR_NO_GRACE},
	{state.ErrReclaimBad, nfs4.NFS4ERR_RECLAIM_BAD},
	{state.ErrCompleteAlready, nfs4.NFS4ERR_COMPLETE_ALREADY},
	{state.ErrServerFault, nfs4.NFS4ERR_SERVERFAULT},
	{state.ErrRecallConflict, nfs4.NFS4ERR_RECALLCONFLICT},
	{state.ErrLayoutTryLater, nfs4.NFS4ERR_LAYOUTTRYLATER},
	{state.ErrNoMatchingLayout, nfs4.NFS4ERR_NOMATCHING_LAYOUT},
	{state.ErrDelegRevoked, nfs4.NFS4ERR_DELEG_REVOKED},
}

func stateStatus(err error) (nfs4.Nfsstat4, bool) {
	for _, m := range stateErrs {
		if errors.Is(err, m.err) {
			return m.st, true
		}
	}
	return 0, false
}

func toState(s nfs4.Stateid4) state.Stateid   { return state.Stateid{Seqid: s.Seqid, Other: s.Other} }
func fromState(s state.Stateid) nfs4.Stateid4 { return nfs4.Stateid4{Seqid: s.Seqid, Other: s.Other} }

// stateid resolves the "current stateid" marker (RFC 8881 §16.2.3.1.2).
func (c *compound) stateid(s nfs4.Stateid4) (state.Stateid, nfs4.Nfsstat4) {
	sid := toState(s)
	if sid.IsCurrent() {
		if !c.hasCSID {
			return sid, nfs4.NFS4ERR_BAD_STATEID
		}
		return toState(c.csid), nfs4.NFS4_OK
	}
	return sid, nfs4.NFS4_OK
}

func (c *compound) setStateid(s state.Stateid) {
	c.csid, c.hasCSID = fromState(s), true
}

// clientID returns the client of the COMPOUND's session.
func (c *compound) clientID() (state.ClientID, nfs4.Nfsstat4) {
	if c.seq == nil {
		return 0, nfs4.NFS4ERR_OP_NOT_IN_SESSION
	}
	return c.seq.clientID, nfs4.NFS4_OK
}

// checkIO validates the stateid of a READ, WRITE or size change on o.
func (c *compound) checkIO(s *nfs4.Stateid4, o *object, write bool) nfs4.Nfsstat4 {
	id, st := c.clientID()
	if st != nfs4.NFS4_OK {
		return st
	}
	sid, st := c.stateid(*s)
	if st != nfs4.NFS4_OK {
		return st
	}
	if err := c.s.st.m.CheckIO(id, sid, state.FileID(o.fh.ino), write); err != nil {
		return statusOf(err)
	}
	if sid.IsSpecial() {
		// I/O without an open (anonymous or READ bypass stateid) of a
		// file another client holds a conflicting delegation of: recall
		// it first. A client's own stateids carry its opens, which
		// recalled the conflicting delegations when they were made.
		return c.breakDelegations(o.fh.ino, write)
	}
	return nfs4.NFS4_OK
}
