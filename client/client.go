package client

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/rpc"
	"github.com/shoalfs/shoal/internal/xdr"
)

// Options configures Dial. The zero value is usable: it connects as uid 0
// with NFSv4.2 and 64 session slots.
type Options struct {
	// UID, GID and GIDs are sent in every AUTH_SYS credential.
	UID, GID uint32
	GIDs     []uint32
	// MachineName goes into AUTH_SYS credentials. Default: the host name.
	MachineName string
	// OwnerID is the client owner presented in EXCHANGE_ID. Two Clients
	// with the same OwnerID are the same client to the server, so the
	// default is the host name plus a random suffix chosen per Client.
	OwnerID string
	// MinorVersion is the NFSv4 minor version to speak. Default 2; while
	// the server answers NFS4ERR_MINOR_VERS_MISMATCH the client steps down,
	// to 1 at the lowest.
	MinorVersion uint32
	// MaxInFlight is the number of fore-channel session slots asked for,
	// i.e. how many COMPOUNDs may be outstanding at once. Default 64.
	MaxInFlight int
	// Root is the directory of the server's pseudo file system that paths
	// are relative to, like a mount's remote path ("/export"). Default "/".
	Root string
	// Logger receives diagnostics. Default: discard.
	Logger *slog.Logger
	// DialTimeout bounds the TCP connect and session setup. Default 15s.
	DialTimeout time.Duration
	// PNFSOff turns pNFS off: all I/O goes through the server Dial
	// connected to (the metadata server), exactly as with a server without
	// pNFS. By default (false) pNFS is on whenever the server offers a
	// layout type the client has a driver for (see package layout); with
	// any other server it is off by itself.
	PNFSOff bool
	// MaxPerDS bounds the requests in flight to each data server, shared
	// by all Files of the Client. Default 8. Policy.MaxPerDS, when set,
	// takes precedence.
	MaxPerDS int
	// NoDelegations makes every OPEN ask for no delegation
	// (OPEN4_SHARE_ACCESS_WANT_NO_DELEG) and returns any granted anyway.
	// By default read-only opens take the read delegations a server
	// offers and skip revalidation while they hold them (see deleg.go).
	NoDelegations bool
	// Policy holds the I/O tunables: access method, block size, layout
	// handling, readahead, cache size. The zero value means the defaults
	// documented on Policy.
	Policy Policy
}

// Client is one NFSv4.1+ client: one client ID, one session, one TCP
// connection carrying both the fore channel and the backchannel. It is safe
// for concurrent use.
type Client struct {
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
	root  []string // Options.Root split into components

	maxRead, maxWrite uint32
	maxOps            int
	lease             time.Duration

	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup

	recMu sync.Mutex // serializes reconnects and session recovery

	mu     sync.Mutex
	conn   *rpc.Conn
	sess   *session
	files  map[*File]struct{} // open files, reclaimed after a server restart
	closed bool

	lastUse  atomic.Int64 // unix nanos of the last COMPOUND sent
	ownerSeq atomic.Uint64
	stats    struct {
		reconnects, recoveries, retries                  atomic.Uint64
		layoutGets, layoutReturns, layoutRecalls         atomic.Uint64
		failovers, dsReadBytes, dsWriteBytes, mdsIOBytes atomic.Uint64
		resentBytes                                      atomic.Uint64
		deleg                                            delegStats
	}
	ops opCounter // operations sent, for OpCounts
	// ignoreRecalls is a test hook (IgnoreRecalls): recalls are answered
	// and then not acted on.
	ignoreRecalls atomic.Bool
	delegs        delegTable // read delegations held

	// dsRole makes this Client a session with a pNFS data server, owned by
	// a metadata-server Client: EXCHANGE_ID asks for USE_PNFS_DS, Dial
	// reads no file system attributes, and a broken connection fails the
	// calls on it instead of redialling (the owner fails over to the MDS).
	dsRole bool
	pnfs   *pnfsClient // nil when pNFS is off or the server has none

	pol   Policy     // Options.Policy with the defaults filled in
	cache *dataCache // AccessCached's cache and AccessODirect's buffers
}

// Policy returns the policy in effect, with defaults and the server's
// block size suggestion applied.
func (c *Client) Policy() Policy { return c.pol }

// Stats counts the client's recovery and pNFS events since Dial.
type Stats struct {
	Reconnects uint64 // connections re-established after a failure
	Recoveries uint64 // sessions re-created because the server lost them
	Retries    uint64 // COMPOUNDs resent after NFS4ERR_DELAY or NFS4ERR_GRACE

	LayoutGets    uint64 // layouts obtained with LAYOUTGET
	LayoutReturns uint64 // layouts returned with LAYOUTRETURN
	LayoutRecalls uint64 // CB_LAYOUTRECALLs that matched a layout
	Failovers     uint64 // data-server requests redone through the MDS
	DSReadBytes   uint64 // bytes read from data servers
	DSWriteBytes  uint64 // bytes written to data servers
	MDSIOBytes    uint64 // READ and WRITE payload bytes through the MDS
	// ResentBytes counts data written again through the MDS because no
	// COMMIT vouched for it: the server it was written to UNSTABLE could
	// not be reached or changed its write verifier before the COMMIT, or
	// the size it reached could not be published with LAYOUTCOMMIT.
	ResentBytes uint64

	DelegationsKept    uint64 // read delegations granted and kept
	DelegationReturns  uint64 // DELEGRETURNs that succeeded
	DelegationRecalls  uint64 // CB_RECALLs of a delegation held
	DelegationsRevoked uint64 // delegations found revoked (TEST_STATEID)
	LocalOpens         uint64 // opens satisfied under a delegation, without OPEN
	DelegatedAttrHits  uint64 // attributes answered from a delegation, without GETATTR
}

// Stats returns the client's counters.
func (c *Client) Stats() Stats {
	return Stats{
		Reconnects: c.stats.reconnects.Load(),
		Recoveries: c.stats.recoveries.Load(),
		Retries:    c.stats.retries.Load(),

		LayoutGets:    c.stats.layoutGets.Load(),
		LayoutReturns: c.stats.layoutReturns.Load(),
		LayoutRecalls: c.stats.layoutRecalls.Load(),
		Failovers:     c.stats.failovers.Load(),
		DSReadBytes:   c.stats.dsReadBytes.Load(),
		DSWriteBytes:  c.stats.dsWriteBytes.Load(),
		MDSIOBytes:    c.stats.mdsIOBytes.Load(),
		ResentBytes:   c.stats.resentBytes.Load(),

		DelegationsKept:    c.stats.deleg.granted.Load(),
		DelegationReturns:  c.stats.deleg.returned.Load(),
		DelegationRecalls:  c.stats.deleg.recalls.Load(),
		DelegationsRevoked: c.stats.deleg.revoked.Load(),
		LocalOpens:         c.stats.deleg.localOpens.Load(),
		DelegatedAttrHits:  c.stats.deleg.cachedAttrs.Load(),
	}
}

// session is one NFSv4.1 session. A server restart replaces it as a whole.
type session struct {
	id       nfs4.Sessionid4
	clientID nfs4.Clientid4
	slots    *slotTable
	gen      uint64
}

var errSessionGone = errors.New("nfs: session replaced")

const (
	defaultMaxInFlight = 64
	// maxRecord is the largest RPC record the client accepts; READ replies
	// must fit, so it bounds the negotiated response size.
	maxRecord = 4<<20 + 64<<10
	// ioOverhead is what a COMPOUND around a READ or WRITE payload needs
	// besides the data: RPC header, SEQUENCE, PUTFH, the op itself.
	ioOverhead = 4 << 10
	// maxIOSize caps one READ or WRITE even when the server allows more:
	// several 1 MiB requests in flight keep the pipe fuller than one big one.
	maxIOSize = 1 << 20
	// maxGraceRetries bounds NFS4ERR_GRACE retries (one a second).
	maxGraceRetries = 180
	// defaultLease stands in for the server's lease_time until it is known
	// (and when the server reports none).
	defaultLease = 90 * time.Second
	// delayMargin is what delayBudget adds to two leases: the server's
	// lease sweep runs a fraction of a lease late, and the caller's retry
	// backoff (up to a second) may land just after the revocation.
	delayMargin = 10 * time.Second
	// defaultMaxPerDS is Options.MaxPerDS's default.
	defaultMaxPerDS = 8
)

// Dial connects to the NFSv4.1+ server at addr, sets up a client ID and a
// session and reads the file system limits.
//
// addr is "host:port", or a comma-separated list of them naming the
// addresses one server may answer on, such as the metadata servers of a
// Shoal cluster with automatic failover, of which one (the elected leader)
// listens at a time: "mds1:2049,mds2:2049". An address without a port
// takes the port of the next one that has one, so "mds1,mds2:2049" is the
// same list (see [SplitAddrs]). Dial uses the first address, in order,
// that accepts a connection and answers the NULL procedure; each address
// gets at most 5 s for the connection (or DialTimeout if shorter) and 3 s
// for the answer, so a dead or paused one costs a bounded delay, and
// DialTimeout bounds the whole. When the connection is lost later, the
// Client reconnects the same way, starting with the address that answered
// last, and if what answers is another server instance (it lost the
// session: a failover or a restart) it recovers its state there (see
// "Failures and recovery" in the package documentation).
func Dial(ctx context.Context, addr string, opts Options) (*Client, error) {
	addrs, err := SplitAddrs(addr)
	if err != nil {
		return nil, err
	}
	if opts.MaxInFlight <= 0 {
		opts.MaxInFlight = defaultMaxInFlight
	}
	if opts.MinorVersion == 0 {
		opts.MinorVersion = 2
	}
	if opts.DialTimeout <= 0 {
		opts.DialTimeout = 15 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if err := opts.Policy.Validate(); err != nil {
		return nil, err
	}
	if opts.Policy.MaxPerDS > 0 {
		opts.MaxPerDS = opts.Policy.MaxPerDS
	}
	if opts.MaxPerDS <= 0 {
		opts.MaxPerDS = defaultMaxPerDS
	}
	opts.Policy.MaxPerDS = opts.MaxPerDS
	host, _ := os.Hostname()
	if host == "" {
		host = "localhost"
	}
	if opts.MachineName == "" {
		opts.MachineName = host
	}
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	if opts.OwnerID == "" {
		opts.OwnerID = host + "/shoal-client/" + hex.EncodeToString(rnd[:])
	}
	c := &Client{
		addrs: addrs,
		opts:  opts,
		log:   opts.Logger.With("server", addr),
		cred: rpc.AuthSysCred(rpc.AuthSysParams{
			Stamp: uint32(time.Now().Unix()), Machine: opts.MachineName,
			UID: opts.UID, GID: opts.GID, GIDs: opts.GIDs,
		}),
		root:  splitPath(opts.Root),
		files: make(map[*File]struct{}),
	}
	c.delegs.init()
	c.minor.Store(opts.MinorVersion)
	c.owner.CoOwnerid = []byte(opts.OwnerID)
	copy(c.owner.CoVerifier[:], rnd[:])
	c.ctx, c.cancel = context.WithCancel(context.Background())

	dctx, cancel := context.WithTimeout(ctx, opts.DialTimeout)
	defer cancel()
	conn, err := c.dialAny(dctx, true)
	if err != nil {
		c.cancel()
		return nil, err
	}
	c.conn = conn
	if err := c.newSession(dctx, nil); err != nil {
		conn.Close()
		c.cancel()
		return nil, err
	}
	if err := c.readFSInfo(dctx); err != nil {
		c.Close()
		return nil, err
	}
	c.wg.Add(1)
	go c.renewLoop()
	return c, nil
}

// dialDS opens a session with a pNFS data server on behalf of the
// metadata-server Client c: same credentials and client owner, its own
// client ID, session and slot table (MaxPerDS slots).
func (c *Client) dialDS(ctx context.Context, addr string) (*Client, error) {
	opts := c.opts
	opts.MaxInFlight = opts.MaxPerDS
	opts.MinorVersion = c.minor.Load()
	ds := &Client{
		addrs: []string{addr}, opts: opts, log: c.log.With("ds", addr), cred: c.cred,
		owner: c.owner, root: c.root, files: make(map[*File]struct{}), dsRole: true,
		lease: c.lease,
	}
	ds.delegs.init()
	ds.minor.Store(opts.MinorVersion)
	ds.ctx, ds.cancel = context.WithCancel(c.ctx)
	dctx, cancel := context.WithTimeout(ctx, opts.DialTimeout)
	defer cancel()
	conn, err := ds.dialAddr(dctx, addr)
	if err != nil {
		ds.cancel()
		return nil, err
	}
	ds.conn = conn
	if err := ds.newSession(dctx, nil); err != nil {
		conn.Close()
		ds.cancel()
		return nil, err
	}
	ds.maxRead = min(ds.maxRead, maxIOSize)
	ds.maxWrite = min(ds.maxWrite, maxIOSize)
	ds.wg.Add(1)
	go ds.renewLoop()
	return ds, nil
}

// answerTimeout bounds Dial's first call, the NULL procedure: every NFS
// server answers it at once, without touching its disks.
const answerTimeout = 3 * time.Second

// failoverDialTimeout bounds the connection to each address of a list of
// several (or DialTimeout, if shorter): an address that does not even
// refuse the connection must not hold up the next one for long.
const failoverDialTimeout = 5 * time.Second

// dialAny connects to one of the server's addresses: the first, in turn
// from the one that answered last, that accepts a connection and, with
// ping, answers the NULL procedure (see ping). With several addresses the
// answer matters: a metadata server that was paused, and has lost its
// leadership meanwhile, may still accept connections and not answer. ctx
// bounds the whole; each address gets DialTimeout for the connection
// (failoverDialTimeout with several) and answerTimeout for the NULL call.
// The error of a list names every address's failure.
func (c *Client) dialAny(ctx context.Context, ping bool) (*rpc.Conn, error) {
	n := len(c.addrs)
	perAddr := c.opts.DialTimeout
	if n > 1 {
		perAddr = min(perAddr, failoverDialTimeout)
	}
	start := int(c.good.Load())
	errs := make([]error, 0, n)
	for i := range n {
		k := (start + i) % n
		addr := c.addrs[k]
		actx, cancel := context.WithTimeout(ctx, perAddr)
		conn, err := c.dialAddr(actx, addr)
		cancel()
		if err == nil && ping {
			if err = c.ping(ctx, conn, addr); err != nil {
				conn.Close()
			}
		}
		if err == nil {
			if k != start {
				c.log.Info("connected to another address of the server", "addr", addr)
			}
			c.good.Store(int32(k))
			return conn, nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
		c.log.Debug("address did not answer", "addr", addr, "err", err)
	}
	if n == 1 {
		return nil, errs[0]
	}
	return nil, fmt.Errorf("nfs: no address of %s answered: %w", strings.Join(c.addrs, ","), errors.Join(errs...))
}

// ping calls the NULL procedure on a new connection to addr to tell an
// address where something else listens (a web server, a port that accepts
// and says nothing) from an NFS server, in at most answerTimeout (or
// DialTimeout, if shorter) rather than the DialTimeout the session calls
// would wait. ctx is the caller's. The error wraps ErrNotNFS.
func (c *Client) ping(ctx context.Context, conn *rpc.Conn, addr string) error {
	limit := min(answerTimeout, c.opts.DialTimeout)
	pctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	_, err := conn.Call(pctx, nfs4.NFS4_PROGRAM, nfs4.NFS_V4, nfs4.NFSPROC4_NULL, c.cred, nil)
	var ae *rpc.AcceptError
	var re *rpc.RejectError
	var why string
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		// The caller's deadline or cancellation, not the server's fault.
		return fmt.Errorf("nfs: %s: %w", addr, err)
	case errors.As(err, &ae) && (ae.Stat == rpc.ProgUnavail || ae.Stat == rpc.ProgMismatch):
		why = fmt.Sprintf("an RPC server without NFSv4: %s", ae.Stat)
	case errors.As(err, &ae), errors.As(err, &re):
		// An RPC server that knows NFSv4 but not this call, or not
		// these credentials: the session calls will say what is wrong.
		return nil
	case errors.Is(err, context.DeadlineExceeded):
		why = fmt.Sprintf("no answer to the NULL procedure within %s", limit)
	case errors.Is(err, rpc.ErrRecordTooLarge), errors.Is(err, rpc.ErrBadReply):
		why = "it sent something that is not an RPC reply"
	case errors.Is(err, rpc.ErrConnClosed):
		why = "it closed the connection"
	default:
		why = err.Error()
	}
	return fmt.Errorf("nfs: %s %w (%s)", addr, ErrNotNFS, why)
}

func (c *Client) dialAddr(ctx context.Context, addr string) (*rpc.Conn, error) {
	return rpc.Dial(ctx, "tcp", addr, rpc.HandlerFunc(c.serveCallback),
		rpc.WithConfig(rpc.ConnConfig{MaxRecord: maxRecord, Logger: c.log}))
}

// addr is the address that answered last, for messages.
func (c *Client) addr() string { return c.addrs[c.good.Load()] }

// MaxRead is the largest READ the server accepts; larger reads are split.
func (c *Client) MaxRead() uint32 { return c.maxRead }

// MaxWrite is the largest WRITE the server accepts; larger writes are split.
func (c *Client) MaxWrite() uint32 { return c.maxWrite }

// MinorVersion is the NFSv4 minor version in use.
func (c *Client) MinorVersion() uint32 { return c.minor.Load() }

// Close destroys the session and the client ID (best effort) and closes
// the connection. Open Files are not closed on the server; their state goes
// with the client ID.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.mu.Unlock()
	if c.cache != nil {
		// Files left open may hold data only in memory.
		fctx, fcancel := context.WithTimeout(context.Background(), 30*time.Second)
		c.cache.flushOnClose(fctx)
		fcancel()
	}
	if c.delegs.n.Load() > 0 {
		// Unmount: give the delegations back rather than leave the
		// server to recall them from a client that is gone.
		rctx, rcancel := context.WithTimeout(context.Background(), 10*time.Second)
		c.returnAllDelegations(rctx)
		rcancel()
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
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
	if c.pnfs != nil {
		c.pnfs.close()
	}
	var err error
	if conn != nil {
		err = conn.Close()
		if errors.Is(err, rpc.ErrConnClosed) {
			err = nil
		}
	}
	c.wg.Wait()
	return err
}

// TestingCloseConn closes the client's TCP connection abruptly, as a
// network failure would. It exists for tests of the reconnect path: the
// next operation, or any in flight, redials and replays.
func (c *Client) TestingCloseConn() {
	c.mu.Lock()
	conn := c.conn
	c.mu.Unlock()
	if conn != nil {
		conn.Close()
	}
}

// plain sends a COMPOUND without SEQUENCE (EXCHANGE_ID, CREATE_SESSION,
// BIND_CONN_TO_SESSION, DESTROY_*), which must be alone in their compound.
func (c *Client) plain(ctx context.Context, conn *rpc.Conn, ops []nfs4.NfsArgop4) (*nfs4.COMPOUND4res, error) {
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
// session the server lost and reclaims open files and locks first.
func (c *Client) newSession(ctx context.Context, old *session) error {
	c.mu.Lock()
	conn := c.conn
	c.mu.Unlock()

	var eir *nfs4.EXCHANGEID4resok
	var flags uint32
	switch {
	case c.dsRole:
		flags = nfs4.EXCHGID4_FLAG_USE_PNFS_DS
	case !c.opts.PNFSOff:
		flags = nfs4.EXCHGID4_FLAG_USE_PNFS_MDS
	}
	for {
		res, err := c.plain(ctx, conn, []nfs4.NfsArgop4{{Argop: nfs4.OP_EXCHANGE_ID, OpexchangeId: &nfs4.EXCHANGEID4args{
			EiaClientowner:  c.owner,
			EiaFlags:        nfs4.Uint32T(flags),
			EiaStateProtect: nfs4.StateProtect4A{SpaHow: nfs4.SP4_NONE},
		}}})
		var se *StatusError
		if errors.As(err, &se) && se.NFSStatus == nfs4.NFS4ERR_MINOR_VERS_MISMATCH && c.minor.Load() > 1 {
			c.log.Debug("server refuses minor version, falling back", "minor", c.minor.Load())
			c.minor.Add(^uint32(0))
			continue
		}
		if err != nil {
			return fmt.Errorf("nfs: EXCHANGE_ID: %w", err)
		}
		eir = res.Resarray[0].OpexchangeId.EirResok4
		break
	}
	if eir == nil {
		return errors.New("nfs: EXCHANGE_ID: empty reply")
	}
	if !c.dsRole && eir.EirFlags&(nfs4.EXCHGID4_FLAG_USE_PNFS_DS|nfs4.EXCHGID4_FLAG_USE_PNFS_MDS|nfs4.EXCHGID4_FLAG_USE_NON_PNFS) == nfs4.EXCHGID4_FLAG_USE_PNFS_DS {
		// A data server only: it has no namespace (PUTROOTFH fails
		// with NFS4ERR_NOTSUPP), which would be a puzzling first error.
		what := "a pNFS data server"
		if len(eir.EirServerImplId) > 0 && string(eir.EirServerImplId[0].NiiName) == "shoal" {
			what = "a Shoal data server"
		}
		return fmt.Errorf("nfs: %s is %s: %w", c.addr(), what, ErrDataServer)
	}

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
		return fmt.Errorf("nfs: CREATE_SESSION: %w", err)
	}
	csr := res.Resarray[0].OpcreateSession.CsrResok4
	if csr == nil {
		return errors.New("nfs: CREATE_SESSION: empty reply")
	}
	slots := int(csr.CsrForeChanAttrs.CaMaxrequests)
	if slots > c.opts.MaxInFlight {
		slots = c.opts.MaxInFlight
	}
	gen := uint64(1)
	if old != nil {
		gen = old.gen + 1
	}
	s := &session{id: csr.CsrSessionid, clientID: eir.EirClientid, slots: newSlotTable(slots), gen: gen}
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

	if old != nil {
		// Delegations went with the old session: the server recalls
		// nothing of them, and Files opened locally under them are
		// reclaimed as ordinary opens.
		c.dropAllDelegations()
		c.reclaim(ctx, s)
	}
	_, err = c.exec(ctx, s, false, []nfs4.NfsArgop4{{Argop: nfs4.OP_RECLAIM_COMPLETE,
		OpreclaimComplete: &nfs4.RECLAIMCOMPLETE4args{RcaOneFs: false}}})
	var se *StatusError
	if err != nil && !(errors.As(err, &se) && se.NFSStatus == nfs4.NFS4ERR_COMPLETE_ALREADY) {
		return fmt.Errorf("nfs: RECLAIM_COMPLETE: %w", err)
	}
	return nil
}

func (c *Client) readFSInfo(ctx context.Context) error {
	ops := c.walk(nil)
	ops = append(ops, nfs4.NfsArgop4{Argop: nfs4.OP_GETATTR, Opgetattr: &nfs4.GETATTR4args{AttrRequest: fsInfoBits}})
	res, err := c.call(ctx, func() []nfs4.NfsArgop4 { return ops })
	if err != nil {
		return fmt.Errorf("nfs: reading file system limits of %q: %w", "/"+strings.Join(c.root, "/"), err)
	}
	var fi fsInfo
	if err := decodeFattr(&res[len(res)-1].Opgetattr.Resok4.ObjAttributes, nil, &fi); err != nil {
		return err
	}
	if fi.maxRead > 0 && fi.maxRead < uint64(c.maxRead) {
		c.maxRead = uint32(fi.maxRead)
	}
	if fi.maxWrite > 0 && fi.maxWrite < uint64(c.maxWrite) {
		c.maxWrite = uint32(fi.maxWrite)
	}
	c.maxRead = min(c.maxRead, maxIOSize)
	c.maxWrite = min(c.maxWrite, maxIOSize)
	c.pol = c.opts.Policy.withDefaults(fi.layoutBlksize)
	c.cache = newDataCache(c, c.pol)
	c.lease = time.Duration(fi.lease) * time.Second
	if c.lease <= 0 {
		c.lease = defaultLease
	}
	if !c.opts.PNFSOff {
		c.pnfs = newPNFSClient(c, fi.layoutTypes)
	}
	return nil
}

// renewLoop keeps the lease alive with a SEQUENCE-only COMPOUND when the
// client has been idle for a third of the lease.
func (c *Client) renewLoop() {
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

func (c *Client) current() (*rpc.Conn, *session, error) {
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
func (c *Client) call(ctx context.Context, build func() []nfs4.NfsArgop4) ([]nfs4.NfsResop4, error) {
	return c.callRetry(ctx, delayBudget(c.lease), build)
}

// callRelease is call for READ paths that copy the data out: on success,
// release (never nil then) lets the reply's buffer be reused once nothing
// references res or anything in it, such as READ data. Not calling it is
// safe.
func (c *Client) callRelease(ctx context.Context, build func() []nfs4.NfsArgop4) (res []nfs4.NfsResop4, release func(), err error) {
	return c.callRetryRelease(ctx, delayBudget(c.lease), build)
}

// ioBudget is how long READ, WRITE and COMMIT keep retrying NFS4ERR_DELAY
// (Policy.IORetryTimeout). I/O that a server cannot do for now, typically
// because a data server is out of service, must not wait as long as
// delayBudget does for a dead client's state to be revoked.
func (c *Client) ioBudget() time.Duration {
	if c.pol.IORetryTimeout > 0 {
		return c.pol.IORetryTimeout
	}
	return DefaultIORetryTimeout
}

// callIORelease is callRelease for READ, WRITE and COMMIT: NFS4ERR_DELAY
// is retried for budget (ioBudget) only. An NFS4ERR_DELAY left when it
// runs out is returned wrapped, saying how long it was retried.
func (c *Client) callIORelease(ctx context.Context, budget time.Duration, build func() []nfs4.NfsArgop4) ([]nfs4.NfsResop4, func(), error) {
	res, release, err := c.callRetryRelease(ctx, budget, build)
	var se *StatusError
	if errors.As(err, &se) && se.NFSStatus == nfs4.NFS4ERR_DELAY {
		err = &delayExhausted{se: se, after: budget}
	}
	return res, release, err
}

// callIO is callIORelease with the Client's I/O budget, leaving the reply
// buffer to the garbage collector.
func (c *Client) callIO(ctx context.Context, build func() []nfs4.NfsArgop4) ([]nfs4.NfsResop4, error) {
	res, _, err := c.callIORelease(ctx, c.ioBudget(), build)
	return res, err
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
func (c *Client) callRetry(ctx context.Context, budget time.Duration, build func() []nfs4.NfsArgop4) ([]nfs4.NfsResop4, error) {
	res, _, err := c.callRetryRelease(ctx, budget, build)
	return res, err // the reply buffer is left to the garbage collector
}

// callRetryRelease is callRetry returning the reply's release function with
// a successful result (see callRelease).
func (c *Client) callRetryRelease(ctx context.Context, budget time.Duration, build func() []nfs4.NfsArgop4) ([]nfs4.NfsResop4, func(), error) {
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
		var se *StatusError
		if err == nil || !errors.As(err, &se) {
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
		switch se.NFSStatus {
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
			c.stats.retries.Add(1)
			if werr := sleep(ctx, delay); werr != nil {
				return res, nil, werr
			}
			delay = min(2*delay, time.Second)
			continue
		case nfs4.NFS4ERR_SEQ_FALSE_RETRY:
			// Refused at SEQUENCE, so not executed; the slot has moved
			// past the lost request (execRelease), and a resend goes out
			// under the next sequence id.
			if recoveries >= 5 {
				return res, nil, err
			}
			recoveries++
			c.stats.retries.Add(1)
			continue
		case nfs4.NFS4ERR_GRACE:
			if graces >= maxGraceRetries {
				return res, nil, err
			}
			graces++
			c.stats.retries.Add(1)
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
func (c *Client) exec(ctx context.Context, sess *session, reconnect bool, ops []nfs4.NfsArgop4) ([]nfs4.NfsResop4, error) {
	res, _, err := c.execRelease(ctx, sess, reconnect, ops)
	return res, err
}

// execRelease is exec that also returns, with a successful result, the
// function that releases the reply's buffer (see callRelease). It is nil on
// error: results returned with a *StatusError are left to the garbage
// collector.
func (c *Client) execRelease(ctx context.Context, sess *session, reconnect bool, ops []nfs4.NfsArgop4) ([]nfs4.NfsResop4, func(), error) {
	slot, seq, highest, err := sess.slots.acquire(ctx)
	if err != nil {
		return nil, nil, err
	}
	args := &nfs4.COMPOUND4args{Minorversion: c.minor.Load(), Argarray: make([]nfs4.NfsArgop4, 0, 1+len(ops))}
	args.Argarray = append(args.Argarray, nfs4.NfsArgop4{Argop: nfs4.OP_SEQUENCE, Opsequence: &nfs4.SEQUENCE4args{
		SaSessionid: sess.id, SaSequenceid: seq, SaSlotid: uint32(slot), SaHighestSlotid: uint32(highest),
		SaCachethis: needsCache(ops),
	}})
	args.Argarray = append(args.Argarray, ops...)
	c.lastUse.Store(time.Now().UnixNano())
	c.ops.count(args.Argarray)
	// Around the round trip, so that a GETATTR overlapping a change of
	// this Client's never caches attributes from before it.
	c.mutating(ops)
	defer c.mutating(ops)

	type result struct {
		res     *nfs4.COMPOUND4res
		release func()
		err     error
	}
	run := func() result {
		res, release, err := c.roundTrip(sess, reconnect, args)
		advance, target := false, -1
		if res != nil && len(res.Resarray) > 0 && res.Resarray[0].Resop == nfs4.OP_SEQUENCE {
			if sr := res.Resarray[0].Opsequence; sr != nil && sr.SrStatus == nfs4.NFS4_OK && sr.SrResok4 != nil {
				advance = true
				target = int(sr.SrResok4.SrTargetHighestSlotid)
				c.stateRevoked(uint32(sr.SrResok4.SrStatusFlags))
			} else if sr != nil && (sr.SrStatus == nfs4.NFS4ERR_RETRY_UNCACHED_REP || sr.SrStatus == nfs4.NFS4ERR_SEQ_FALSE_RETRY) {
				// The server did execute a request under this sequence
				// id. For SEQ_FALSE_RETRY it was an earlier one whose
				// reply this client never saw (the slot was freed without
				// moving on); this one was not run.
				advance = true
			}
		}
		sess.slots.release(slot, advance, target)
		return result{res, release, err}
	}
	var r result
	if ctx.Done() == nil {
		r = run()
	} else {
		ch := make(chan result, 1)
		go func() { ch <- run() }()
		select {
		case r = <-ch:
		case <-ctx.Done():
			// The abandoned reply, if it comes, is left to the garbage
			// collector.
			return nil, nil, ctx.Err()
		}
	}
	if r.err != nil {
		return nil, nil, r.err
	}
	res := r.res
	if res.Status == nfs4.NFS4_OK && len(res.Resarray) != len(args.Argarray) {
		return nil, nil, fmt.Errorf("nfs: server answered %d of %d operations", len(res.Resarray), len(args.Argarray))
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

// roundTrip sends args and decodes the reply, reconnecting and replaying
// while the connection keeps failing (bounded by the reconnect logic).
//
// On success release (never nil) lets the reply's buffer be reused once
// nothing references res; decoded opaques, such as READ data, alias it.
func (c *Client) roundTrip(sess *session, reconnect bool, args *nfs4.COMPOUND4args) (_ *nfs4.COMPOUND4res, release func(), _ error) {
	for attempt := 0; ; attempt++ {
		conn, cur, err := c.current()
		if err != nil {
			return nil, nil, err
		}
		if cur != sess {
			return nil, nil, errSessionGone
		}
		raw, release, err := conn.CallRelease(c.ctx, nfs4.NFS4_PROGRAM, nfs4.NFS_V4, nfs4.NFSPROC4_COMPOUND, c.cred, args)
		if err != nil {
			if !errors.Is(err, rpc.ErrConnClosed) || !reconnect || c.dsRole || c.ctx.Err() != nil || attempt >= 10 {
				return nil, nil, err
			}
			if rerr := c.reconnect(conn); rerr != nil {
				return nil, nil, rerr
			}
			continue
		}
		res := new(nfs4.COMPOUND4res)
		if err := xdr.Unmarshal(raw, res); err != nil {
			release() // nothing decoded is used
			return nil, nil, fmt.Errorf("nfs: decoding COMPOUND reply: %w", err)
		}
		return res, release, nil
	}
}

// reconnect replaces a broken connection: it redials (with backoff, for a
// server that is restarting) and binds the new connection to the session.
// If the server no longer knows the session, the session is recovered.
// Callers that raced on the same broken connection share one reconnect.
func (c *Client) reconnect(broken *rpc.Conn) error {
	c.recMu.Lock()
	defer c.recMu.Unlock()
	c.mu.Lock()
	if c.conn != broken || c.closed {
		closed := c.closed
		c.mu.Unlock()
		if closed {
			return ErrClosed
		}
		return nil
	}
	sess := c.sess
	c.mu.Unlock()

	ctx, cancel := context.WithTimeout(c.ctx, reconnectBudget)
	defer cancel()
	// With several addresses, each gets bounded time (dialAny) and must
	// answer: the address that answered last may be a metadata server
	// that was paused and lost its leadership, accepting connections
	// without answering, or answering NULL and nothing else.
	failover := len(c.addrs) > 1
	delay := 50 * time.Millisecond
	for {
		conn, err := c.dialAny(ctx, failover)
		if err == nil {
			c.stats.reconnects.Add(1)
			c.log.Info("reconnected", "addr", c.addr(), "local", conn.LocalAddr().String())
			var lost bool
			if lost, err = c.bind(ctx, conn, sess, failover); err == nil {
				c.mu.Lock()
				if c.closed {
					conn.Close() // Close ran meanwhile and will not see this one
				} else {
					c.conn = conn
				}
				c.mu.Unlock()
				if lost {
					// Another server instance (a restart, or a
					// failover to another metadata server).
					return c.recoverLocked(ctx, sess)
				}
				return nil
			}
			conn.Close()
			if !failover {
				return err
			}
			// Answered, then not: the next attempt starts with the next
			// address.
			c.good.Store(int32((int(c.good.Load()) + 1) % len(c.addrs)))
		}
		c.log.Debug("redial failed", "err", err)
		if werr := sleep(ctx, delay); werr != nil {
			return fmt.Errorf("nfs: reconnecting to %s: %w", strings.Join(c.addrs, ","), err)
		}
		delay = min(2*delay, 2*time.Second)
	}
}

// reconnectBudget bounds one reconnect, dials and recovery together.
const reconnectBudget = 3 * time.Minute

// bind binds a new connection to sess with BIND_CONN_TO_SESSION. lost
// reports that the server does not know the session (it is another server
// instance), which the caller recovers from on conn. With bounded set (the
// Client has several addresses) the call gets DialTimeout, so a server
// that stopped answering is left for another address.
func (c *Client) bind(ctx context.Context, conn *rpc.Conn, sess *session, bounded bool) (lost bool, _ error) {
	if bounded {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.opts.DialTimeout)
		defer cancel()
	}
	_, err := c.plain(ctx, conn, []nfs4.NfsArgop4{{Argop: nfs4.OP_BIND_CONN_TO_SESSION,
		OpbindConnToSession: &nfs4.BINDCONNTOSESSION4args{BctsaSessid: sess.id, BctsaDir: nfs4.CDFC4_FORE_OR_BOTH}}})
	var se *StatusError
	if errors.As(err, &se) && (se.NFSStatus == nfs4.NFS4ERR_BADSESSION || se.NFSStatus == nfs4.NFS4ERR_DEADSESSION ||
		se.NFSStatus == nfs4.NFS4ERR_STALE_CLIENTID) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("nfs: BIND_CONN_TO_SESSION: %w", err)
	}
	return false, nil
}

// recover replaces a session the server has lost (it restarted or expired
// our lease).
func (c *Client) recover(ctx context.Context, lost *session) error {
	c.recMu.Lock()
	defer c.recMu.Unlock()
	return c.recoverLocked(ctx, lost)
}

func (c *Client) recoverLocked(ctx context.Context, lost *session) error {
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
	c.stats.recoveries.Add(1)
	if err := c.newSession(ctx, lost); err != nil {
		return fmt.Errorf("nfs: session recovery: %w", err)
	}
	return nil
}

// reclaim re-establishes the opens and locks of all open files on a new
// session, with CLAIM_PREVIOUS and reclaim locks during the server's grace
// period, or as new opens when the server has no grace period
// (NFS4ERR_NO_GRACE), whose locks are then lost (File.reclaim). Failures
// are logged; a File's I/O reopens it later (File.recoverOpen).
func (c *Client) reclaim(ctx context.Context, s *session) {
	c.mu.Lock()
	files := make([]*File, 0, len(c.files))
	for f := range c.files {
		files = append(files, f)
	}
	c.mu.Unlock()
	for _, f := range files {
		if err := f.reclaim(ctx, s); err != nil {
			c.log.Warn("reclaiming open file failed", "path", f.path, "err", err)
		}
	}
}

// serveCallback serves the backchannel: CB_NULL and CB_COMPOUND with
// CB_SEQUENCE, CB_RECALL, CB_GETATTR (deleg.go) and CB_LAYOUTRECALL.
// Every operation is answered at once and whatever takes round trips
// (DELEGRETURN, LAYOUTRETURN) runs in the background: those round trips
// may wait for the very server that waits for this answer.
func (c *Client) serveCallback(ctx context.Context, call *rpc.Call, res *xdr.Encoder) rpc.AcceptStat {
	if call.Prog != nfs4.NFS4_CALLBACK {
		return rpc.ProgUnavail
	}
	switch call.Proc {
	case nfs4.CB_NULL:
		return rpc.Success
	case nfs4.CB_COMPOUND:
	default:
		return rpc.ProcUnavail
	}
	var args nfs4.CBCOMPOUND4args
	if err := xdr.Unmarshal(call.Args, &args); err != nil {
		return rpc.GarbageArgs
	}
	out := nfs4.CBCOMPOUND4res{Tag: args.Tag}
	for i, op := range args.Argarray {
		r := nfs4.NfsCbResop4{Resop: op.Argop}
		var st nfs4.Nfsstat4
		switch op.Argop {
		case nfs4.OP_CB_SEQUENCE:
			a := op.Opcbsequence
			if i != 0 || a == nil {
				st = nfs4.NFS4ERR_SEQUENCE_POS
				r.Opcbsequence = &nfs4.CBSEQUENCE4res{CsrStatus: st}
				break
			}
			r.Opcbsequence = &nfs4.CBSEQUENCE4res{CsrResok4: &nfs4.CBSEQUENCE4resok{
				CsrSessionid: a.CsaSessionid, CsrSequenceid: a.CsaSequenceid, CsrSlotid: a.CsaSlotid,
			}}
		case nfs4.OP_CB_RECALL:
			st = nfs4.NFS4ERR_BADXDR
			if a := op.Opcbrecall; a != nil {
				st = c.cbRecall(a)
			}
			r.Opcbrecall = &nfs4.CBRECALL4res{Status: st}
		case nfs4.OP_CB_GETATTR:
			// The Client holds no write delegations (deleg.go): no
			// file's attributes differ from the server's on its account.
			st = nfs4.NFS4ERR_BADHANDLE
			r.Opcbgetattr = &nfs4.CBGETATTR4res{Status: st}
		case nfs4.OP_CB_LAYOUTRECALL:
			st = nfs4.NFS4ERR_NOMATCHING_LAYOUT
			if a := op.Opcblayoutrecall; a == nil {
				st = nfs4.NFS4ERR_BADXDR
			} else if c.pnfs != nil {
				st = c.pnfs.recall(a)
			}
			r.Opcblayoutrecall = &nfs4.CBLAYOUTRECALL4res{ClorrStatus: st}
		default:
			st = nfs4.NFS4ERR_NOTSUPP
			r = nfs4.NfsCbResop4{Resop: nfs4.OP_CB_ILLEGAL, Opcbillegal: &nfs4.CBILLEGAL4res{Status: st}}
		}
		out.Resarray = append(out.Resarray, r)
		out.Status = st
		if st != nfs4.NFS4_OK {
			break
		}
	}
	out.EncodeXDR(res)
	return rpc.Success
}

func (c *Client) newOwner(kind string) []byte {
	return fmt.Appendf(nil, "%s-%s-%d", c.opts.OwnerID, kind, c.ownerSeq.Add(1))
}

// SplitAddrs splits a server address list, as [Dial] takes it, into
// "host:port" addresses: elements are separated by commas, and one
// without a port takes the port of the next element that has one, so
// "a,b:2049,c:2050" is a:2049, b:2049 and c:2050. An IPv6 address is
// written in brackets, with or without a port ("[::1],[fe80::1]:2049").
// Every address must end up with a port from 1 to 65535.
func SplitAddrs(list string) ([]string, error) {
	parts := strings.Split(list, ",")
	out := make([]string, len(parts))
	port := ""
	for i := len(parts) - 1; i >= 0; i-- {
		p := strings.TrimSpace(parts[i])
		if p == "" {
			return nil, fmt.Errorf("nfs: server address list %q has an empty element", list)
		}
		host, pt, err := net.SplitHostPort(p)
		if err != nil {
			// No port (or not a host:port at all): a host name, an
			// IPv4 address or a bracketed IPv6 one.
			host = p
			if strings.HasPrefix(p, "[") && strings.HasSuffix(p, "]") {
				host = p[1 : len(p)-1]
			}
			if host == "" || strings.ContainsAny(host, "[]") || (strings.Contains(host, ":") && net.ParseIP(host) == nil) {
				return nil, fmt.Errorf("nfs: %q in server address list %q is not host[:port]", p, list)
			}
			if port == "" {
				return nil, fmt.Errorf("nfs: %q in server address list %q has no port, and no address after it has one", p, list)
			}
			pt = port
		} else if n, err := strconv.Atoi(pt); err != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("nfs: port %q of %q is not a number from 1 to 65535", pt, p)
		}
		port = pt
		out[i] = net.JoinHostPort(host, pt)
	}
	return out, nil
}
