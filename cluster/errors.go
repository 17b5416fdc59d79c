package cluster

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"syscall"

	"github.com/shoalfs/shoal/internal/ctlproto"
	"github.com/shoalfs/shoal/internal/rpc"
	"github.com/shoalfs/shoal/internal/xdr"
	"github.com/shoalfs/shoal/store"
)

// Stateid verdicts. The MDS's RegistryConfig.CheckStateid returns them
// (wrapped or not) and Agent.CheckStateid returns them to the DS server,
// which maps them to the NFS4ERR_* of the same name.
var (
	ErrBadStateid   = errors.New("cluster: bad stateid")
	ErrOldStateid   = errors.New("cluster: old stateid")
	ErrStaleStateid = errors.New("cluster: stale stateid")
	ErrExpired      = errors.New("cluster: client lease expired")
	ErrOpenMode     = errors.New("cluster: stateid does not allow this access")
	// ErrFenced: the stateid belongs to a client the MDS has fenced.
	ErrFenced = errors.New("cluster: client fenced")
	// ErrUnavailable: the peer (MDS, or a data server) cannot be reached
	// or asked the caller to retry; callers map it to NFS4ERR_DELAY.
	ErrUnavailable = errors.New("cluster: unavailable")
	// ErrMDSUnreachable: the data server could not ask the MDS what a
	// client's I/O needs (the data server is not registered with a
	// leading MDS, or the question got no answer). Agent.CheckStateid
	// returns it, and not ErrUnavailable, when it has no recent answer
	// about the stateid to go by; Agent.Map and the replicated write's
	// REPLICA_FAILED wrap both (their callers among the data servers
	// treat it as a peer that cannot answer). Either way the data server
	// sends the client to the MDS at once (NFS4ERR_PNFS_NO_LAYOUT)
	// instead of asking it to retry (NFS4ERR_DELAY), which the Linux
	// client answers by pausing its I/O to the data server for 15 s.
	ErrMDSUnreachable = errors.New("cluster: MDS unreachable, stateid unknown")
	// ErrNotLeader: the MDS is not the elected leader, or no longer, or
	// (on a data server) the call came over a connection registered
	// under an older term than the data server has seen since. A data
	// server moves on to the next MDS address.
	ErrNotLeader = errors.New("cluster: not the leading MDS")
)

// Errors about cluster membership.
var (
	// ErrNoDataServers is returned by Striped when no data server ever
	// registered.
	ErrNoDataServers = errors.New("cluster: no data servers")
	// ErrRemoved is returned by StartAgent (and reported by Agent.Err) when
	// the MDS has removed this data server from the cluster.
	ErrRemoved = errors.New("cluster: data server removed from the cluster")
	// ErrWrongCluster: the data server's directory belongs to another
	// cluster than the MDS's.
	ErrWrongCluster = errors.New("cluster: data server directory belongs to another cluster")
	// ErrDataServerDown: a data server that holds stripes of the file is
	// out of service for longer than RegistryConfig.DownAfter, or was
	// removed. Clients get NFS4ERR_IO; see DownError for which one.
	ErrDataServerDown = errors.New("cluster: data server down")
	// ErrBusy: an admin job (drain, rebalance) is already running.
	ErrBusy = errors.New("cluster: another job is running")
	// ErrVersion: MDS and DS speak no common protocol revision.
	ErrVersion = errors.New("cluster: protocol version not supported")
	// ErrAuth: the MDS refused the join secret.
	ErrAuth = errors.New("cluster: join secret refused")
	// ErrClusterFull: the cluster has no room for another data server.
	ErrClusterFull = errors.New("cluster: cluster full")
	// ErrUnknownDataServer: no data server has this id.
	ErrUnknownDataServer = errors.New("cluster: unknown data server")
	// ErrDataLost is returned by Striped's Sync when a data server's boot
	// verifier changed since data was written to it without being
	// committed: the server must change its own write verifier so that
	// clients resend their uncommitted writes.
	ErrDataLost = errors.New("cluster: data server restarted, uncommitted data may be lost")
)

// statusOf maps a verdict or storage error to the status sent on the wire.
func statusOf(err error) ctlproto.CtlStatus {
	switch {
	case err == nil:
		return ctlproto.CTL_OK
	case errors.Is(err, ErrBadStateid):
		return ctlproto.CTL_ERR_BAD_STATEID
	case errors.Is(err, ErrOldStateid):
		return ctlproto.CTL_ERR_OLD_STATEID
	case errors.Is(err, ErrStaleStateid):
		return ctlproto.CTL_ERR_STALE_STATEID
	case errors.Is(err, ErrExpired):
		return ctlproto.CTL_ERR_EXPIRED
	case errors.Is(err, ErrOpenMode):
		return ctlproto.CTL_ERR_OPENMODE
	case errors.Is(err, ErrFenced):
		return ctlproto.CTL_ERR_FENCED
	case errors.Is(err, ErrUnavailable), errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return ctlproto.CTL_ERR_DELAY
	case errors.Is(err, ErrNotLeader):
		return ctlproto.CTL_ERR_NOT_LEADER
	case errors.Is(err, ErrBusy):
		return ctlproto.CTL_ERR_BUSY
	case errors.Is(err, ErrNotMember):
		return ctlproto.CTL_ERR_NOTMEMBER
	case errors.Is(err, store.ErrCorrupt):
		return ctlproto.CTL_ERR_CORRUPT
	case errors.Is(err, store.ErrNotSupported):
		return ctlproto.CTL_ERR_NOTSUPP
	case errors.Is(err, ErrUnknownDataServer), errors.Is(err, fs.ErrNotExist):
		return ctlproto.CTL_ERR_NOENT
	case errors.Is(err, ErrAuth):
		return ctlproto.CTL_ERR_AUTH
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return ctlproto.CTL_ERR_NOSPC
	case errors.Is(err, syscall.EFBIG):
		return ctlproto.CTL_ERR_FBIG
	case errors.Is(err, syscall.EINVAL):
		return ctlproto.CTL_ERR_INVAL
	}
	return ctlproto.CTL_ERR_IO
}

// errOf maps a wire status back to an error; nil for CTL_OK.
func errOf(st ctlproto.CtlStatus) error {
	switch st {
	case ctlproto.CTL_OK:
		return nil
	case ctlproto.CTL_ERR_BAD_STATEID:
		return ErrBadStateid
	case ctlproto.CTL_ERR_OLD_STATEID:
		return ErrOldStateid
	case ctlproto.CTL_ERR_STALE_STATEID:
		return ErrStaleStateid
	case ctlproto.CTL_ERR_EXPIRED:
		return ErrExpired
	case ctlproto.CTL_ERR_OPENMODE:
		return ErrOpenMode
	case ctlproto.CTL_ERR_FENCED:
		return ErrFenced
	case ctlproto.CTL_ERR_DELAY, ctlproto.CTL_ERR_STALE_GEN, ctlproto.CTL_ERR_NOTREG:
		return fmt.Errorf("%w (%v)", ErrUnavailable, st)
	case ctlproto.CTL_ERR_NOENT:
		return fs.ErrNotExist
	case ctlproto.CTL_ERR_NOSPC:
		return syscall.ENOSPC
	case ctlproto.CTL_ERR_FBIG:
		return syscall.EFBIG
	case ctlproto.CTL_ERR_INVAL:
		return syscall.EINVAL
	case ctlproto.CTL_ERR_VERSION:
		return ErrVersion
	case ctlproto.CTL_ERR_AUTH:
		return ErrAuth
	case ctlproto.CTL_ERR_REMOVED:
		return ErrRemoved
	case ctlproto.CTL_ERR_FULL:
		return ErrClusterFull
	case ctlproto.CTL_ERR_WRONG_CLUSTER:
		return ErrWrongCluster
	case ctlproto.CTL_ERR_BUSY:
		return ErrBusy
	case ctlproto.CTL_ERR_CORRUPT:
		return ErrCorrupt
	case ctlproto.CTL_ERR_NOTSUPP:
		return store.ErrNotSupported
	case ctlproto.CTL_ERR_NOTMEMBER:
		return ErrNotMember
	case ctlproto.CTL_ERR_NOT_LEADER:
		return ErrNotLeader
	}
	return fmt.Errorf("cluster: %v: %w", st, syscall.EIO)
}

// call sends one SHOAL_CONTROL call on c and decodes its result. Transport
// failures are wrapped in ErrUnavailable as well as kept in the chain.
func call(ctx context.Context, c *rpc.Conn, proc uint32, args xdr.Marshaler, res xdr.Unmarshaler) error {
	b, err := c.Call(ctx, ctlproto.SHOAL_CONTROL, ctlproto.SHOAL_CONTROL_V1, proc, rpc.OpaqueAuth{}, args)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	if err := xdr.Unmarshal(b, res); err != nil {
		return fmt.Errorf("cluster: proc %d: %w: %w", proc, rpc.ErrBadReply, err)
	}
	return nil
}

// callRelease is call for results the caller is done with at a known
// point: on success it returns the function that lets the connection
// reuse the reply's buffer (rpc.Conn.CallRelease), which opaques decoded
// into res alias. The caller must call it once nothing references them.
func callRelease(ctx context.Context, c *rpc.Conn, proc uint32, args xdr.Marshaler, res xdr.Unmarshaler) (release func(), err error) {
	b, release, err := c.CallRelease(ctx, ctlproto.SHOAL_CONTROL, ctlproto.SHOAL_CONTROL_V1, proc, rpc.OpaqueAuth{}, args)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	if err := xdr.Unmarshal(b, res); err != nil {
		release()
		return nil, fmt.Errorf("cluster: proc %d: %w: %w", proc, rpc.ErrBadReply, err)
	}
	return release, nil
}

// decodeArgs decodes a call's arguments, requiring that all are consumed.
func decodeArgs(c *rpc.Call, v xdr.Unmarshaler) bool {
	return xdr.Unmarshal(c.Args, v) == nil
}

// checkProgram answers calls to other programs or versions. It returns
// false when the call must not be served.
func checkProgram(c *rpc.Call, res *xdr.Encoder) (rpc.AcceptStat, bool) {
	if c.Prog != ctlproto.SHOAL_CONTROL {
		return rpc.ProgUnavail, false
	}
	if c.Vers != ctlproto.SHOAL_CONTROL_V1 {
		res.Uint32(ctlproto.SHOAL_CONTROL_V1)
		res.Uint32(ctlproto.SHOAL_CONTROL_V1)
		return rpc.ProgMismatch, false
	}
	return rpc.Success, true
}
