package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/rpc"
	"github.com/shoalfs/shoal/internal/xdr"
)

// The session layer: one connection, client ID and session with a server,
// and the COMPOUND machinery on top of them (SEQUENCE on a slot, retries
// of NFS4ERR_DELAY and NFS4ERR_GRACE, reconnects, recovery of a session
// the server lost). The Client embeds the one with the metadata server;
// each pNFS data server gets one of its own (pnfs.go).

// endpoint is the session layer with one server. The Client embeds the
// metadata server's, whose holder it is; a data server's (dsRole) has no
// holder: it carries no state to reclaim, serves no callbacks, and fails
// the calls on a broken connection instead of redialling (its owner fails
// over to the metadata server).
//
// Locks: recMu (reconnects and recoveries) is taken before mu.
type endpoint struct {
	// addrs are the server's addresses (Dial's list), tried in turn from
	// the last one that answered (good) when the connection must be
	// replaced.
	addrs []string
	good  atomic.Int32
	opts  Options
	log   *slog.Logger
	cred  rpc.OpaqueAuth
	minor atomic.Uint32 // may drop to 1 at EXCHANGE_ID
	owner nfs4.ClientOwner4
	// holder is told of every COMPOUND and of a new session replacing a
	// lost one; nil for a data server.
	holder stateHolder
	// callbacks serves the backchannel; nil answers CB_NULL only.
	callbacks rpc.Handler
	// dsRole makes EXCHANGE_ID ask for USE_PNFS_DS, and a broken
	// connection fail the calls on it.
	dsRole bool

	maxRead, maxWrite uint32
	maxOps            int
	lease             time.Duration

	ctx    context.Context // cancelled by close
	cancel context.CancelFunc
	wg     sync.WaitGroup // background goroutines of the endpoint and its holder

	recMu sync.Mutex // serializes reconnects and session recovery

	mu     sync.Mutex // guards conn, sess, closed
	conn   *rpc.Conn
	sess   *session
	closed bool

	lastUse atomic.Int64 // unix nanos of the last COMPOUND sent
	// waiting counts the COMPOUNDs waiting for their reply, and
	// lastReply is when the last reply came (unix nanos): the watchdog
	// of an endpoint with several addresses reads them.
	waiting   atomic.Int64
	lastReply atomic.Int64
	sstats    struct {
		reconnects, recoveries, retries atomic.Uint64
	}
	ops opCounter // operations sent, for OpCounts

	// rebinding is set while rebindBack runs; lastRebind is when it last
	// started (unix nanos).
	rebinding  atomic.Bool
	lastRebind atomic.Int64
}

// stateHolder is what holds state on a session: the Client, on the
// metadata server's.
type stateHolder interface {
	// reclaimOn re-establishes the holder's state on s, which replaces
	// a session the server lost with the client ID, before
	// RECLAIM_COMPLETE; what it
	// returns, if not nil, runs after RECLAIM_COMPLETE (new opens of
	// files the server would not let it reclaim).
	reclaimOn(ctx context.Context, s *session) func(context.Context)
	// mutating is called with every COMPOUND's operations before and
	// after its round trip.
	mutating(ops []nfs4.NfsArgop4)
	// stateRevoked gets the status flags of every successful SEQUENCE.
	stateRevoked(flags uint32)
}

var _ stateHolder = (*Client)(nil)

// close destroys the session and the client ID (best effort), cancels the
// endpoint's context, runs then (if not nil), closes the connection and
// waits for the background goroutines. It reports whether this call
// closed the endpoint, and the connection's Close error.
func (c *endpoint) close(then func()) (bool, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return false, nil
	}
	c.closed = true
	conn, sess := c.conn, c.sess
	c.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if sess != nil && conn != nil {
		_, _ = c.plain(ctx, conn, []nfs4.NfsArgop4{{Argop: nfs4.OP_DESTROY_SESSION,
			OpdestroySession: &nfs4.DESTROYSESSION4args{DsaSessionid: sess.id}}})
		_, _ = c.plain(ctx, conn, []nfs4.NfsArgop4{{Argop: nfs4.OP_DESTROY_CLIENTID,
			OpdestroyClientid: &nfs4.DESTROYCLIENTID4args{DcaClientid: sess.clientID}}})
		sess.slots.kill()
	}
	c.cancel()
	if then != nil {
		then()
	}
	var err error
	if conn != nil {
		err = conn.Close()
		if errors.Is(err, rpc.ErrConnClosed) {
			err = nil
		}
	}
	c.wg.Wait()
	return true, err
}

// isClosed reports whether close has run.
func (c *endpoint) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// session is one NFSv4.1 session. A server restart replaces it as a whole.
type session struct {
	id       nfs4.Sessionid4
	clientID nfs4.Clientid4
	slots    *slotTable
	// gen counts the sessions of the endpoint: a request resent on a
	// session of another gen found no reply cache of its first send.
	gen uint64
	// state is the gen of the session whose stateids are valid on this
	// one: its own gen after a server restart or an expired client ID,
	// the lost session's state when only the session was lost and the
	// client ID, with all its state, lives on.
	state uint64
}

var errSessionGone = errors.New("nfs: session replaced")

// plain sends a COMPOUND without SEQUENCE (EXCHANGE_ID, CREATE_SESSION,
// BIND_CONN_TO_SESSION, DESTROY_*), which must be alone in their compound.
func (c *endpoint) plain(ctx context.Context, conn *rpc.Conn, ops []nfs4.NfsArgop4) (*nfs4.COMPOUND4res, error) {
	args := &nfs4.COMPOUND4args{Minorversion: c.minor.Load(), Argarray: ops}
	raw, err := conn.Call(ctx, nfs4.NFS4_PROGRAM, nfs4.NFS_V4, nfs4.NFSPROC4_COMPOUND, c.cred, args)
	if err != nil {
		return nil, err
	}
	res := new(nfs4.COMPOUND4res)
	if err := xdr.Unmarshal(raw, res); err != nil {
		return nil, fmt.Errorf("nfs: decoding COMPOUND reply: %w", err)
	}
	if res.Status != nfs4.NFS4_OK {
		op := ops[0].Argop
		if n := len(res.Resarray); n > 0 {
			op = res.Resarray[n-1].Resop
		}
		return res, statusErr(op, res.Status)
	}
	if len(res.Resarray) != len(ops) {
		return nil, fmt.Errorf("nfs: server answered %d of %d operations", len(res.Resarray), len(ops))
	}
	return res, nil
}

// newSession runs EXCHANGE_ID, CREATE_SESSION and RECLAIM_COMPLETE on the
// current connection and installs the session. With old set, it replaces a
// session the server lost: if the server kept the client ID, that is all;
// otherwise it reclaims open files and locks before RECLAIM_COMPLETE.
func (c *endpoint) newSession(ctx context.Context, old *session) error {
	c.mu.Lock()
	conn := c.conn
	c.mu.Unlock()

	var eir *nfs4.EXCHANGEID4resok
	var csr *nfs4.CREATESESSION4resok
	// A CREATE_SESSION refused with NFS4ERR_STALE_CLIENTID found the
	// client ID gone since EXCHANGE_ID (the server restarted, or purged
	// it): a new EXCHANGE_ID gets another (RFC 8881 §18.36).
	for attempt := 0; ; attempt++ {
		var err error
		if eir, err = c.exchangeID(ctx, conn); err != nil {
			return err
		}
		csr, err = c.createSession(ctx, conn, eir)
		var se *StatusError
		if errors.As(err, &se) && se.status() == nfs4.NFS4ERR_STALE_CLIENTID && attempt < 2 {
			c.log.Debug("client ID gone before CREATE_SESSION; exchanging a new one")
			continue
		}
		if err != nil {
			return err
		}
		break
	}
	slots := int(csr.CsrForeChanAttrs.CaMaxrequests)
	if slots > c.opts.MaxInFlight {
		slots = c.opts.MaxInFlight
	}
	gen := uint64(1)
	if old != nil {
		gen = old.gen + 1
	}
	// The server lost the session only: it answers EXCHANGE_ID with the
	// same client ID, confirmed (RFC 8881 §18.35.3:
	// EXCHGID4_FLAG_CONFIRMED_R), whose state it keeps. A server that
	// restarted, or expired the client ID, hands out a new one.
	intact := old != nil && eir.EirClientid == old.clientID && eir.EirFlags&nfs4.EXCHGID4_FLAG_CONFIRMED_R != 0
	s := &session{id: csr.CsrSessionid, clientID: eir.EirClientid, slots: newSlotTable(slots), gen: gen, state: gen}
	if intact {
		s.state = old.state
	}
	c.maxOps = int(csr.CsrForeChanAttrs.CaMaxoperations)
	if c.maxRead == 0 || c.maxRead > csr.CsrForeChanAttrs.CaMaxresponsesize-ioOverhead {
		// Provisional until readFSInfo; always bounded by the channel.
		c.maxRead = csr.CsrForeChanAttrs.CaMaxresponsesize - ioOverhead
	}
	if c.maxWrite == 0 || c.maxWrite > csr.CsrForeChanAttrs.CaMaxrequestsize-ioOverhead {
		c.maxWrite = csr.CsrForeChanAttrs.CaMaxrequestsize - ioOverhead
	}
	c.mu.Lock()
	c.sess = s
	c.mu.Unlock()
	c.log.Debug("session created", "clientid", eir.EirClientid, "slots", slots, "minor", c.minor.Load())
	if intact {
		// Opens, locks, delegations and layouts are as they were:
		// nothing to reclaim (the server has no grace period for it:
		// NFS4ERR_NO_GRACE), and RECLAIM_COMPLETE was sent for this
		// client ID already (§18.51.3). The old session may still exist
		// (NFS4ERR_DEADSESSION, NFS4ERR_SEQ_MISORDERED): destroy it, best
		// effort, so that its slots do not linger and DESTROY_CLIENTID
		// at Close finds no session left but the current one.
		_, _ = c.plain(ctx, conn, []nfs4.NfsArgop4{{Argop: nfs4.OP_DESTROY_SESSION,
			OpdestroySession: &nfs4.DESTROYSESSION4args{DsaSessionid: old.id}}})
		c.log.Info("server lost our session, not our state; new session created")
		return nil
	}

	var after func(context.Context)
	if old != nil && c.holder != nil {
		after = c.holder.reclaimOn(ctx, s)
	}
	_, err := c.exec(ctx, s, false, []nfs4.NfsArgop4{{Argop: nfs4.OP_RECLAIM_COMPLETE,
		OpreclaimComplete: &nfs4.RECLAIMCOMPLETE4args{RcaOneFs: false}}})
	var se *StatusError
	if err != nil && !(errors.As(err, &se) && se.status() == nfs4.NFS4ERR_COMPLETE_ALREADY) {
		return fmt.Errorf("nfs: RECLAIM_COMPLETE: %w", err)
	}
	if after != nil {
		after(ctx)
	}
	return nil
}

// clientImplID names the client in EXCHANGE_ID (RFC 8881 §18.35.3). A
// server may go by it: Shoal's MDS gives flexfiles layouts that stripe
// inside a mirror only to clients it knows can use them (this one, and
// Linux from 6.18 on).
var clientImplID = []nfs4.NfsImplId4{{NiiDomain: []byte("shoal.dev"), NiiName: []byte("shoal client")}}

// exchangeID runs EXCHANGE_ID on conn, stepping the minor version down
// while the server refuses it.
func (c *endpoint) exchangeID(ctx context.Context, conn *rpc.Conn) (*nfs4.EXCHANGEID4resok, error) {
	var flags uint32
	switch {
	case c.dsRole:
		flags = nfs4.EXCHGID4_FLAG_USE_PNFS_DS
	case !c.opts.PNFSOff:
		flags = nfs4.EXCHGID4_FLAG_USE_PNFS_MDS
	}
	var eir *nfs4.EXCHANGEID4resok
	for {
		res, err := c.plain(ctx, conn, []nfs4.NfsArgop4{{Argop: nfs4.OP_EXCHANGE_ID, OpexchangeId: &nfs4.EXCHANGEID4args{
			EiaClientowner:  c.owner,
			EiaFlags:        nfs4.Uint32T(flags),
			EiaStateProtect: nfs4.StateProtect4A{SpaHow: nfs4.SP4_NONE},
			EiaClientImplId: clientImplID,
		}}})
		var se *StatusError
		if errors.As(err, &se) && se.status() == nfs4.NFS4ERR_MINOR_VERS_MISMATCH && c.minor.Load() > 1 {
			c.log.Debug("server refuses minor version, falling back", "minor", c.minor.Load())
			c.minor.Add(^uint32(0))
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("nfs: EXCHANGE_ID: %w", err)
		}
		eir = res.Resarray[0].OpexchangeId.EirResok4
		break
	}
	if eir == nil {
		return nil, errors.New("nfs: EXCHANGE_ID: empty reply")
	}
	if !c.dsRole && eir.EirFlags&(nfs4.EXCHGID4_FLAG_USE_PNFS_DS|nfs4.EXCHGID4_FLAG_USE_PNFS_MDS|nfs4.EXCHGID4_FLAG_USE_NON_PNFS) == nfs4.EXCHGID4_FLAG_USE_PNFS_DS {
		// A data server only: it has no namespace (PUTROOTFH fails
		// with NFS4ERR_NOTSUPP), which would be a puzzling first error.
		what := "a pNFS data server"
		if len(eir.EirServerImplId) > 0 && string(eir.EirServerImplId[0].NiiName) == "shoal" {
			what = "a Shoal data server"
		}
		return nil, fmt.Errorf("nfs: %s is %s: %w", c.addr(), what, ErrDataServer)
	}
	return eir, nil
}

// createSession runs CREATE_SESSION on conn for the client ID eir
// returned, with conn as the back channel too.
func (c *endpoint) createSession(ctx context.Context, conn *rpc.Conn, eir *nfs4.EXCHANGEID4resok) (*nfs4.CREATESESSION4resok, error) {
	fore := nfs4.ChannelAttrs4{
		CaMaxrequestsize:        maxRecord,
		CaMaxresponsesize:       maxRecord,
		CaMaxresponsesizeCached: 64 << 10,
		CaMaxoperations:         64,
		CaMaxrequests:           uint32(c.opts.MaxInFlight),
	}
	back := nfs4.ChannelAttrs4{
		CaMaxrequestsize:        16 << 10,
		CaMaxresponsesize:       16 << 10,
		CaMaxresponsesizeCached: 0,
		CaMaxoperations:         8,
		CaMaxrequests:           1,
	}
	res, err := c.plain(ctx, conn, []nfs4.NfsArgop4{{Argop: nfs4.OP_CREATE_SESSION, OpcreateSession: &nfs4.CREATESESSION4args{
		CsaClientid:      eir.EirClientid,
		CsaSequence:      eir.EirSequenceid,
		CsaFlags:         nfs4.CREATE_SESSION4_FLAG_CONN_BACK_CHAN,
		CsaForeChanAttrs: fore,
		CsaBackChanAttrs: back,
		CsaCbProgram:     nfs4.NFS4_CALLBACK,
		CsaSecParms: []nfs4.CallbackSecParms4{{CbSecflavor: rpc.AuthSys, CbspSysCred: &nfs4.AuthsysParms{
			Stamp: uint32(time.Now().Unix()), Machinename: c.opts.MachineName, Uid: c.opts.UID, Gid: c.opts.GID,
		}}},
	}}})
	if err != nil {
		return nil, fmt.Errorf("nfs: CREATE_SESSION: %w", err)
	}
	csr := res.Resarray[0].OpcreateSession.CsrResok4
	if csr == nil {
		return nil, errors.New("nfs: CREATE_SESSION: empty reply")
	}
	return csr, nil
}

// rebindMinInterval spaces the back channel rebinds of rebindBack: a
// server that keeps reporting its back channel down after a rebind must
// not get one with every COMPOUND.
const rebindMinInterval = 10 * time.Second

// rebindBack gives the server a back channel on sess again after a
// SEQUENCE reply said it has none (SEQ4_STATUS_CB_PATH_DOWN,
// SEQ4_STATUS_CB_PATH_DOWN_SESSION: RFC 8881 §18.46.3): without one it
// cannot recall delegations or layouts. It binds the current connection
// for both directions with BIND_CONN_TO_SESSION, in the background, one
// at a time. An endpoint that serves no callbacks (a data server's) has
// nothing to rebind.
func (c *endpoint) rebindBack(sess *session) {
	if c.callbacks == nil {
		return
	}
	if last := c.lastRebind.Load(); last != 0 && time.Since(time.Unix(0, last)) < rebindMinInterval {
		return
	}
	if !c.rebinding.CompareAndSwap(false, true) {
		return
	}
	c.lastRebind.Store(time.Now().UnixNano())
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		defer c.rebinding.Store(false)
		conn, cur, err := c.current()
		if err != nil || cur != sess {
			return // closed, or a new session came with its own back channel
		}
		ctx, cancel := context.WithTimeout(c.ctx, c.opts.DialTimeout)
		defer cancel()
		_, err = c.plain(ctx, conn, []nfs4.NfsArgop4{{Argop: nfs4.OP_BIND_CONN_TO_SESSION,
			OpbindConnToSession: &nfs4.BINDCONNTOSESSION4args{BctsaSessid: sess.id, BctsaDir: nfs4.CDFC4_BACK_OR_BOTH}}})
		if err != nil && c.ctx.Err() == nil {
			c.log.Warn("rebinding the back channel failed", "err", err)
		}
	}()
}

// renewLoop keeps the lease alive with a SEQUENCE-only COMPOUND when the
// client has been idle for a third of the lease.
func (c *endpoint) renewLoop() {
	defer c.wg.Done()
	period := c.lease / 3
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-t.C:
		}
		if time.Since(time.Unix(0, c.lastUse.Load())) < period {
			continue
		}
		ctx, cancel := context.WithTimeout(c.ctx, c.lease)
		if _, err := c.call(ctx, func() []nfs4.NfsArgop4 { return nil }); err != nil && c.ctx.Err() == nil {
			c.log.Warn("lease renewal failed", "err", err)
		}
		cancel()
	}
}

func (c *endpoint) current() (*rpc.Conn, *session, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, nil, ErrClosed
	}
	return c.conn, c.sess, nil
}

// call runs ops in a COMPOUND behind SEQUENCE and returns the results of ops
// (without SEQUENCE's). build is called for every attempt, so ops that
// carry state (stateids) pick up state renewed by recovery. It retries
// NFS4ERR_DELAY and NFS4ERR_GRACE with bounded backoff and recovers from
// connection loss and server restarts. On an operation error the results
// so far are returned together with a *StatusError.
func (c *endpoint) call(ctx context.Context, build func() []nfs4.NfsArgop4) ([]nfs4.NfsResop4, error) {
	return c.callRetry(ctx, delayBudget(c.lease), build)
}

// callRelease is call for READ paths that copy the data out: on success,
// release (never nil then) lets the reply's buffer be reused once nothing
// references res or anything in it, such as READ data. Not calling it is
// safe.
func (c *endpoint) callRelease(ctx context.Context, build func() []nfs4.NfsArgop4) (res []nfs4.NfsResop4, release func(), err error) {
	return c.callRetryRelease(ctx, delayBudget(c.lease), build)
}

// callIORelease is callRelease for READ, WRITE and COMMIT: NFS4ERR_DELAY
// is retried for budget (ioBudget) only. An NFS4ERR_DELAY left when it
// runs out is returned wrapped, saying how long it was retried.
func (c *endpoint) callIORelease(ctx context.Context, budget time.Duration, build func() []nfs4.NfsArgop4) ([]nfs4.NfsResop4, func(), error) {
	res, release, err := c.callRetryRelease(ctx, budget, build)
	var se *StatusError
	if errors.As(err, &se) && se.status() == nfs4.NFS4ERR_DELAY {
		err = &delayExhausted{se: se, after: budget}
	}
	return res, release, err
}

// delayExhausted is an NFS4ERR_DELAY that was retried until the I/O budget
// ran out. errors.Is and errors.As see the *StatusError.
type delayExhausted struct {
	se    *StatusError
	after time.Duration
}

func (e *delayExhausted) Error() string {
	return fmt.Sprintf("%v, still after retrying for %v", e.se, e.after)
}

func (e *delayExhausted) Unwrap() error { return e.se }

// delayBudget is how long call keeps retrying NFS4ERR_DELAY, counted from
// the first DELAY, for a server whose lease is lease (0: not known yet).
//
// A server answers DELAY while it waits for another client, for example
// to return a layout it recalled before a REMOVE of the file's last link.
// If that client has died, the server waits until its lease runs out and
// revokes its state (as RFC 8881 allows), which happens at most a lease
// after the holder's last renewal plus the server's sweep delay, so two
// leases and a margin outlast it. A fixed retry count would give up first
// with the usual 90 s lease and turn a dead client into EIO elsewhere.
func delayBudget(lease time.Duration) time.Duration {
	if lease <= 0 {
		lease = defaultLease
	}
	return 2*lease + delayMargin
}

// callRetry is call retrying NFS4ERR_DELAY for up to budget after the
// first one; budget 0 returns the first DELAY at once.
func (c *endpoint) callRetry(ctx context.Context, budget time.Duration, build func() []nfs4.NfsArgop4) ([]nfs4.NfsResop4, error) {
	res, _, err := c.callRetryRelease(ctx, budget, build)
	return res, err // the reply buffer is left to the garbage collector
}

// callRetryRelease is callRetry returning the reply's release function with
// a successful result (see callRelease).
func (c *endpoint) callRetryRelease(ctx context.Context, budget time.Duration, build func() []nfs4.NfsArgop4) ([]nfs4.NfsResop4, func(), error) {
	delay := 10 * time.Millisecond
	var firstDelay time.Time // zero until the first NFS4ERR_DELAY
	graces, recoveries := 0, 0
	for {
		_, sess, err := c.current()
		if err != nil {
			return nil, nil, err
		}
		ops := build()
		res, release, err := c.execRelease(ctx, sess, true, ops)
		if err == nil {
			return res, release, nil
		}
		var se *StatusError // escapes to the heap: not on the success path
		if !errors.As(err, &se) {
			if errors.Is(err, errSessionGone) && recoveries < 5 {
				recoveries++
				// The session is being (or was) replaced: a recovery
				// kills the old session's slots before it creates the
				// new one. recover waits for a recovery in progress and
				// returns at once if the session was already replaced;
				// resending right away would only find the dead session
				// again and use up the retries.
				if rerr := c.recover(ctx, sess); rerr != nil {
					return res, nil, rerr
				}
				continue
			}
			return res, release, err // release is nil on error
		}
		switch se.status() {
		case nfs4.NFS4ERR_BADSESSION, nfs4.NFS4ERR_DEADSESSION, nfs4.NFS4ERR_STALE_CLIENTID:
			if recoveries >= 5 {
				return res, nil, err
			}
			recoveries++
			if rerr := c.recover(ctx, sess); rerr != nil {
				return res, nil, rerr
			}
			continue
		case nfs4.NFS4ERR_BAD_STATEID, nfs4.NFS4ERR_STALE_STATEID:
			// Stateids built before a recovery are stale; rebuild once.
			if _, now, _ := c.current(); now != nil && now != sess && recoveries < 5 {
				recoveries++
				continue
			}
			return res, nil, err
		case nfs4.NFS4ERR_DELAY, nfs4.NFS4ERR_RETRY_UNCACHED_REP:
			// RETRY_UNCACHED_REP: a replayed request whose reply the server
			// did not cache; only idempotent requests go uncached, so
			// sending it again under a new sequence id is safe.
			// The budget is time, not a count: the backoff is capped at a
			// second, and what the server waits for ends after a lease.
			now := time.Now()
			if firstDelay.IsZero() {
				firstDelay = now
			}
			if budget <= 0 || now.Sub(firstDelay) >= budget {
				return res, nil, err
			}
			c.sstats.retries.Add(1)
			if werr := sleep(ctx, delay); werr != nil {
				return res, nil, werr
			}
			delay = min(2*delay, time.Second)
			continue
		case nfs4.NFS4ERR_SEQ_MISORDERED:
			// Refused at SEQUENCE, so not run: the server's slot and
			// the client's disagree, and no sequence ID the client could
			// pick mends that for sure; a slot kept in use would fail
			// every request that lands on it. A new session has new
			// slots; the client ID and its state are unaffected
			// (newSession finds them intact).
			if se.Op != "SEQUENCE" || recoveries >= 5 {
				return res, nil, err
			}
			recoveries++
			c.log.Warn("server and client disagree on a session slot; replacing the session")
			if rerr := c.recover(ctx, sess); rerr != nil {
				return res, nil, rerr
			}
			continue
		case nfs4.NFS4ERR_SEQ_FALSE_RETRY:
			// Refused at SEQUENCE, so not executed; the slot has moved
			// past the lost request (execRelease), and a resend goes out
			// under the next sequence id.
			if recoveries >= 5 {
				return res, nil, err
			}
			recoveries++
			c.sstats.retries.Add(1)
			continue
		case nfs4.NFS4ERR_GRACE:
			if graces >= maxGraceRetries {
				return res, nil, err
			}
			graces++
			c.sstats.retries.Add(1)
			if werr := sleep(ctx, time.Second); werr != nil {
				return res, nil, werr
			}
			continue
		}
		return res, nil, err
	}
}

// needsCache reports whether a COMPOUND must be answered from the reply
// cache if it is retransmitted (sa_cachethis): everything that changes
// state except WRITE, whose re-execution is harmless, and COMMIT.
func needsCache(ops []nfs4.NfsArgop4) bool {
	for _, op := range ops {
		switch op.Argop {
		case nfs4.OP_PUTFH, nfs4.OP_PUTROOTFH, nfs4.OP_LOOKUP, nfs4.OP_GETFH, nfs4.OP_GETATTR,
			nfs4.OP_SAVEFH, nfs4.OP_RESTOREFH, nfs4.OP_READ, nfs4.OP_READDIR, nfs4.OP_READLINK,
			nfs4.OP_ACCESS, nfs4.OP_LOCKT, nfs4.OP_WRITE, nfs4.OP_COMMIT, nfs4.OP_SECINFO_NO_NAME:
		default:
			return true
		}
	}
	return false
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// exec sends one COMPOUND on sess using a session slot. When the
// connection breaks it reconnects (if allowed) and replays the request with
// the same slot and sequence id, so the server answers from its reply cache
// if it had already executed it. The round trip runs on its own goroutine so
// that an abandoned call (ctx cancelled) still completes and frees its slot
// with a known sequence id.
func (c *endpoint) exec(ctx context.Context, sess *session, reconnect bool, ops []nfs4.NfsArgop4) ([]nfs4.NfsResop4, error) {
	res, _, err := c.execRelease(ctx, sess, reconnect, ops)
	return res, err
}

// execRelease is exec that also returns, with a successful result, the
// function that releases the reply's buffer (see callRelease). It is nil on
// error: results returned with a *StatusError are left to the garbage
// collector.
func (c *endpoint) execRelease(ctx context.Context, sess *session, reconnect bool, ops []nfs4.NfsArgop4) ([]nfs4.NfsResop4, func(), error) {
	slot, seq, highest, err := sess.slots.acquire(ctx)
	if err != nil {
		return nil, nil, err
	}
	argarray, box := getArgarray(1 + len(ops))
	args := &nfs4.COMPOUND4args{Minorversion: c.minor.Load(), Argarray: argarray}
	args.Argarray = append(args.Argarray, nfs4.NfsArgop4{Argop: nfs4.OP_SEQUENCE, Opsequence: &nfs4.SEQUENCE4args{
		SaSessionid: sess.id, SaSequenceid: seq, SaSlotid: uint32(slot), SaHighestSlotid: uint32(highest),
		SaCachethis: needsCache(ops),
	}})
	args.Argarray = append(args.Argarray, ops...)
	c.lastUse.Store(time.Now().UnixNano())
	c.ops.count(args.Argarray)
	// Around the round trip, so that a GETATTR overlapping a change of
	// this Client's never caches attributes from before it.
	if c.holder != nil {
		c.holder.mutating(ops)
		defer c.holder.mutating(ops)
	}

	// The round trip runs on this goroutine as long as it only waits
	// for the reply; if ctx ends first, or the connection must be made
	// again, the rest of it goes to a goroutine of its own, so that an
	// abandoned call still completes and frees its slot with a known
	// sequence id.
	r, rest := c.roundTrip(ctx.Done(), sess, reconnect, args)
	if rest == nil {
		c.releaseSlot(sess, slot, r)
	} else {
		ch := make(chan rtResult, 1)
		go func() {
			r := rest()
			c.releaseSlot(sess, slot, r)
			ch <- r
		}()
		select {
		case r = <-ch:
		case <-ctx.Done():
			// The abandoned reply, if it comes, is left to the garbage
			// collector, and so are the arguments the goroutine sends.
			return nil, nil, ctx.Err()
		}
	}
	nargs := len(args.Argarray)
	putArgarray(box) // encoded, and sent for the last time
	if r.err != nil {
		return nil, nil, r.err
	}
	res := r.res
	if res.Status == nfs4.NFS4_OK && len(res.Resarray) != nargs {
		return nil, nil, fmt.Errorf("nfs: server answered %d of %d operations", len(res.Resarray), nargs)
	}
	if len(res.Resarray) == 0 {
		return nil, nil, statusErr(nfs4.OP_SEQUENCE, res.Status)
	}
	out := res.Resarray[1:]
	if res.Status != nfs4.NFS4_OK {
		return out, nil, statusErr(res.Resarray[len(res.Resarray)-1].Resop, res.Status)
	}
	return out, r.release, nil
}

// argarrays recycles the operation lists of COMPOUNDs (execRelease), as
// *[]nfs4.NfsArgop4 of capacity maxPooledOps: an operation is a union of
// about 540 bytes, so the list of a three-operation COMPOUND was a third
// of what the client allocated for a remove.
var argarrays = sync.Pool{New: func() any {
	a := make([]nfs4.NfsArgop4, 0, maxPooledOps)
	return &a
}}

// maxPooledOps is the capacity of the lists argarrays keeps.
const maxPooledOps = 8

// getArgarray returns an empty list with room for n operations and the
// pool's box it came in (nil if it is too long to be pooled), which
// putArgarray takes back.
func getArgarray(n int) ([]nfs4.NfsArgop4, *[]nfs4.NfsArgop4) {
	if n > maxPooledOps {
		return make([]nfs4.NfsArgop4, 0, n), nil
	}
	box := argarrays.Get().(*[]nfs4.NfsArgop4)
	return (*box)[:0], box
}

// putArgarray gives the list of box back once nothing uses it any more.
func putArgarray(box *[]nfs4.NfsArgop4) {
	if box == nil {
		return
	}
	clear((*box)[:maxPooledOps]) // keep no operation's arguments alive
	argarrays.Put(box)
}

// releaseSlot releases the slot a COMPOUND used with what its reply r
// says of it: whether the server processed the request, so the slot's
// sequence id moves on, and the target highest slot.
func (c *endpoint) releaseSlot(sess *session, slot int, r rtResult) {
	res := r.res
	advance, target := false, -1
	if res != nil && len(res.Resarray) > 0 && res.Resarray[0].Resop == nfs4.OP_SEQUENCE {
		if sr := res.Resarray[0].Opsequence; sr != nil && sr.SrStatus == nfs4.NFS4_OK && sr.SrResok4 != nil {
			advance = true
			target = int(sr.SrResok4.SrTargetHighestSlotid)
			if c.holder != nil {
				c.holder.stateRevoked(uint32(sr.SrResok4.SrStatusFlags))
			}
			if uint32(sr.SrResok4.SrStatusFlags)&(nfs4.SEQ4_STATUS_CB_PATH_DOWN|nfs4.SEQ4_STATUS_CB_PATH_DOWN_SESSION) != 0 {
				c.rebindBack(sess)
			}
		} else if sr != nil && (sr.SrStatus == nfs4.NFS4ERR_RETRY_UNCACHED_REP || sr.SrStatus == nfs4.NFS4ERR_SEQ_FALSE_RETRY) {
			// The server did execute a request under this sequence
			// id. For SEQ_FALSE_RETRY it was an earlier one whose
			// reply this client never saw (the slot was freed without
			// moving on); this one was not run.
			advance = true
		}
	}
	sess.slots.release(slot, advance, target)
}

// rtResult is what a COMPOUND's round trip ends with: on success res and
// release (never nil then), which lets the reply's buffer be reused once
// nothing references res (decoded opaques, such as READ data, alias it).
type rtResult struct {
	res     *nfs4.COMPOUND4res
	release func()
	err     error
}

// roundTrip sends args and decodes the reply, reconnecting and replaying
// while the connection keeps failing (bounded by the reconnect logic).
//
// If stop closes while the reply is awaited, or a new connection must be
// made while stop is not nil (which takes a while), roundTrip returns rest,
// not nil, and the round trip is not over: rest runs the rest of it (not
// watching stop) and must be called, on another goroutine if the caller
// wants to return early.
func (c *endpoint) roundTrip(stop <-chan struct{}, sess *session, reconnect bool, args *nfs4.COMPOUND4args) (r rtResult, rest func() rtResult) {
	return c.roundTripAttempts(stop, sess, reconnect, args, 0)
}

// roundTripAttempts is roundTrip from attempt first on.
func (c *endpoint) roundTripAttempts(stop <-chan struct{}, sess *session, reconnect bool, args *nfs4.COMPOUND4args, first int) (r rtResult, rest func() rtResult) {
	for attempt := first; ; attempt++ {
		conn, cur, err := c.current()
		if err != nil {
			return rtResult{err: err}, nil
		}
		if cur != sess {
			return rtResult{err: errSessionGone}, nil
		}
		c.waiting.Add(1)
		p, err := conn.Send(nfs4.NFS4_PROGRAM, nfs4.NFS_V4, nfs4.NFSPROC4_COMPOUND, c.cred, args)
		if err == nil {
			var raw []byte
			var release func()
			raw, release, err = p.Wait(c.ctx, stop)
			if errors.Is(err, rpc.ErrWaitStopped) {
				return rtResult{}, func() rtResult {
					raw, release, err := p.Wait(c.ctx, nil)
					c.waiting.Add(-1)
					if err == nil {
						return c.decodeReply(raw, release)
					}
					return c.roundTripFrom(sess, reconnect, args, attempt, conn, err)
				}
			}
			c.waiting.Add(-1)
			if err == nil {
				return c.decodeReply(raw, release), nil
			}
		} else {
			c.waiting.Add(-1)
		}
		if !c.mayReconnect(err, reconnect, attempt) {
			return rtResult{err: err}, nil
		}
		if stop != nil {
			return rtResult{}, func() rtResult { return c.roundTripFrom(sess, reconnect, args, attempt, conn, err) }
		}
		if rerr := c.reconnect(conn); rerr != nil {
			return rtResult{err: rerr}, nil
		}
	}
}

// roundTripFrom goes on with a round trip whose attempt failed on conn
// with err: it reconnects if it may and sends again, not watching any
// stop channel.
func (c *endpoint) roundTripFrom(sess *session, reconnect bool, args *nfs4.COMPOUND4args, attempt int, conn *rpc.Conn, err error) rtResult {
	if !c.mayReconnect(err, reconnect, attempt) {
		return rtResult{err: err}
	}
	if rerr := c.reconnect(conn); rerr != nil {
		return rtResult{err: rerr}
	}
	r, _ := c.roundTripAttempts(nil, sess, reconnect, args, attempt+1) // no stop: no rest
	return r
}

// mayReconnect reports whether a round trip whose attempt failed with err
// makes a new connection and sends again.
func (c *endpoint) mayReconnect(err error, reconnect bool, attempt int) bool {
	return errors.Is(err, rpc.ErrConnClosed) && reconnect && !c.dsRole && c.ctx.Err() == nil && attempt < 10
}

// decodeReply decodes a COMPOUND reply that release frees.
func (c *endpoint) decodeReply(raw []byte, release func()) rtResult {
	c.lastReply.Store(time.Now().UnixNano())
	res := new(nfs4.COMPOUND4res)
	if err := xdr.Unmarshal(raw, res); err != nil {
		release() // nothing decoded is used
		return rtResult{err: fmt.Errorf("nfs: decoding COMPOUND reply: %w", err)}
	}
	return rtResult{res: res, release: release}
}

// recover replaces a session the server has lost (it restarted or expired
// our lease).
func (c *endpoint) recover(ctx context.Context, lost *session) error {
	c.recMu.Lock()
	defer c.recMu.Unlock()
	return c.recoverLocked(ctx, lost)
}

func (c *endpoint) recoverLocked(ctx context.Context, lost *session) error {
	c.mu.Lock()
	cur, closed := c.sess, c.closed
	c.mu.Unlock()
	if closed {
		return ErrClosed
	}
	if cur != lost {
		return nil // someone else already recovered
	}
	c.log.Info("server lost our session; establishing a new one and reclaiming state")
	lost.slots.kill()
	c.sstats.recoveries.Add(1)
	if err := c.newSession(ctx, lost); err != nil {
		return fmt.Errorf("nfs: session recovery: %w", err)
	}
	return nil
}
