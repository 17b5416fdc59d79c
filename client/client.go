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
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shoalfs/shoal/client/layout"
	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/rpc"
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
	// Dial, if set, opens the client's TCP connections (to the server and
	// to data servers) instead of net.Dialer: for a client that must
	// reach servers from another network namespace, or through a proxy.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// DialTimeout bounds the TCP connect and session setup. Default 15s.
	// With several server addresses (see Dial) it bounds Dial as a whole,
	// and each address gets at most 5 s to connect and 3 s to answer.
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
	// endpoint is the session with the server (the metadata server, with
	// pNFS): connection, client ID, session, COMPOUNDs (session.go).
	endpoint

	root []string // Options.Root split into components

	filesMu sync.Mutex
	files   map[*File]struct{} // open files, reclaimed after a server restart

	ownerSeq atomic.Uint64
	stats    struct {
		layoutGets, layoutReturns, layoutRecalls         atomic.Uint64
		layoutErrors, returnedErrors                     atomic.Uint64
		failovers, dsReadBytes, dsWriteBytes, mdsIOBytes atomic.Uint64
		resentBytes, earlyCommits                        atomic.Uint64
		deleg                                            delegStats
	}
	// ignoreRecalls is a test hook (IgnoreRecalls): recalls are answered
	// and then not acted on.
	ignoreRecalls atomic.Bool
	delegs        delegTable // read delegations held

	pnfs *pnfsClient // nil when pNFS is off or the server has none

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
	// LayoutErrors counts data-server failures reported with LAYOUTERROR
	// and accepted by the MDS (flexfiles); ReturnedErrors those reported
	// in a LAYOUTRETURN's error report instead (NFSv4.1, or LAYOUTERROR
	// refused).
	LayoutErrors, ReturnedErrors uint64
	Failovers                    uint64 // data-server requests redone through the MDS
	DSReadBytes                  uint64 // bytes read from data servers
	DSWriteBytes                 uint64 // bytes written to data servers (every copy of a mirrored write)
	MDSIOBytes                   uint64 // READ and WRITE payload bytes through the MDS
	// ResentBytes counts data written again through the MDS because no
	// COMMIT vouched for it: the server it was written to UNSTABLE could
	// not be reached or changed its write verifier before the COMMIT, or
	// the size it reached could not be published with LAYOUTCOMMIT.
	ResentBytes uint64
	// EarlyCommits counts the commits a File started in the background
	// because what it keeps of its UNSTABLE writes passed half of
	// Policy.UnstableLimit.
	EarlyCommits uint64

	DelegationsKept    uint64 // read delegations granted and kept
	DelegationReturns  uint64 // DELEGRETURNs that succeeded
	DelegationRecalls  uint64 // CB_RECALLs of a delegation held
	DelegationsRevoked uint64 // delegations found revoked (TEST_STATEID)
	// StateRevoked counts open and lock stateids found revoked
	// (TEST_STATEID) and mended: freed, locks reported lost, the file
	// opened again.
	StateRevoked      uint64
	LocalOpens        uint64 // opens satisfied under a delegation, without OPEN
	DelegatedAttrHits uint64 // attributes answered from a delegation, without GETATTR
}

// Stats returns the client's counters.
func (c *Client) Stats() Stats {
	return Stats{
		Reconnects: c.sstats.reconnects.Load(),
		Recoveries: c.sstats.recoveries.Load(),
		Retries:    c.sstats.retries.Load(),

		LayoutGets:     c.stats.layoutGets.Load(),
		LayoutReturns:  c.stats.layoutReturns.Load(),
		LayoutRecalls:  c.stats.layoutRecalls.Load(),
		LayoutErrors:   c.stats.layoutErrors.Load(),
		ReturnedErrors: c.stats.returnedErrors.Load(),
		Failovers:      c.stats.failovers.Load(),
		DSReadBytes:    c.stats.dsReadBytes.Load(),
		DSWriteBytes:   c.stats.dsWriteBytes.Load(),
		MDSIOBytes:     c.stats.mdsIOBytes.Load(),
		ResentBytes:    c.stats.resentBytes.Load(),
		EarlyCommits:   c.stats.earlyCommits.Load(),

		DelegationsKept:    c.stats.deleg.granted.Load(),
		DelegationReturns:  c.stats.deleg.returned.Load(),
		DelegationRecalls:  c.stats.deleg.recalls.Load(),
		DelegationsRevoked: c.stats.deleg.revoked.Load(),
		StateRevoked:       c.stats.deleg.opensRevoked.Load(),
		LocalOpens:         c.stats.deleg.localOpens.Load(),
		DelegatedAttrHits:  c.stats.deleg.cachedAttrs.Load(),
	}
}

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
		endpoint: endpoint{
			addrs: addrs,
			opts:  opts,
			log:   opts.Logger.With("server", addr),
			cred: rpc.AuthSysCred(rpc.AuthSysParams{
				Stamp: uint32(time.Now().Unix()), Machine: opts.MachineName,
				UID: opts.UID, GID: opts.GID, GIDs: opts.GIDs,
			}),
		},
		root:  splitPath(opts.Root),
		files: make(map[*File]struct{}),
	}
	c.holder = c
	c.callbacks = rpc.HandlerFunc(c.serveCallback)
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
	if len(c.addrs) > 1 {
		c.wg.Add(1)
		go c.watchdog()
	}
	return c, nil
}

// dialDS opens a session with a pNFS data server on behalf of the
// metadata-server Client c: same credentials and client owner, its own
// client ID, session and slot table (MaxPerDS slots).
func (c *Client) dialDS(ctx context.Context, addr string, minor uint32, auth *layout.AuthSys) (*endpoint, error) {
	opts := c.opts
	opts.MaxInFlight = opts.MaxPerDS
	opts.MinorVersion = c.minor.Load()
	if minor != 0 {
		opts.MinorVersion = minor
	}
	cred, owner := c.cred, c.owner
	if auth != nil {
		// A loosely coupled data server sees the synthetic identity
		// (RFC 8435 §2.2). A client owner is bound to the principal that
		// established it (RFC 8881 §18.35.4), so each identity has its own.
		cred = rpc.AuthSysCred(rpc.AuthSysParams{
			Stamp: uint32(time.Now().Unix()), Machine: opts.MachineName, UID: auth.UID, GID: auth.GID,
		})
		owner.CoOwnerid = fmt.Appendf(slices.Clone(owner.CoOwnerid), "/as-%d:%d", auth.UID, auth.GID)
	}
	ds := &endpoint{
		addrs: []string{addr}, opts: opts, log: c.log.With("ds", addr), cred: cred,
		owner: owner, dsRole: true, lease: c.lease,
	}
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
	if c.isClosed() {
		return nil
	}
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
	_, err := c.endpoint.close(func() {
		if c.pnfs != nil {
			c.pnfs.close()
		}
	})
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

// callIO is callIORelease with the Client's I/O budget, leaving the reply
// buffer to the garbage collector.
func (c *Client) callIO(ctx context.Context, build func() []nfs4.NfsArgop4) ([]nfs4.NfsResop4, error) {
	res, _, err := c.callIORelease(ctx, c.ioBudget(), build)
	return res, err
}

// reclaimOn re-establishes the Client's state on s, a new session that
// replaces one the server lost together with the client ID
// (stateHolder). Delegations went with the old client ID: the server
// recalls nothing of them, and Files opened
// locally under them are reclaimed as ordinary opens.
func (c *Client) reclaimOn(ctx context.Context, s *session) func(context.Context) {
	c.dropAllDelegations()
	fresh := c.reclaim(ctx, s)
	if len(fresh) == 0 {
		return nil
	}
	return func(ctx context.Context) {
		for _, f := range fresh {
			if err := f.reclaim(ctx, s, false); err != nil {
				c.log.Warn("reopening file failed", "path", f.path, "err", err)
			}
		}
	}
}

// reclaim re-establishes the opens and locks of all open files on a new
// session, with CLAIM_PREVIOUS and reclaim locks during the server's grace
// period. It returns the files whose reclaim the server refused (no grace
// period, or no record of this client): their locks are lost, and they are
// opened anew after RECLAIM_COMPLETE (RFC 8881 §18.51.3: new state before
// it gets NFS4ERR_GRACE). Other failures are logged; a File's I/O reopens
// it later (Client.recoverOpen).
func (c *Client) reclaim(ctx context.Context, s *session) []*File {
	c.filesMu.Lock()
	files := make([]*File, 0, len(c.files))
	for f := range c.files {
		files = append(files, f)
	}
	c.filesMu.Unlock()
	var fresh []*File
	for _, f := range files {
		err := f.reclaim(ctx, s, true)
		switch {
		case errors.Is(err, errNotReclaimed):
			fresh = append(fresh, f)
		case err != nil:
			c.log.Warn("reclaiming open file failed", "path", f.path, "err", err)
		}
	}
	return fresh
}

func (c *Client) newOwner(kind string) []byte {
	return fmt.Appendf(nil, "%s-%s-%d", c.opts.OwnerID, kind, c.ownerSeq.Add(1))
}
