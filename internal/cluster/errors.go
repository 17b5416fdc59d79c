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
	"github.com/shoalfs/shoal/pnfs"
	"github.com/shoalfs/shoal/store"
)

// The stateid verdicts (pnfs.ErrBadStateid, ErrOldStateid,
// ErrStaleStateid, ErrExpired, ErrOpenMode, ErrFenced) and the
// availability errors (pnfs.ErrUnavailable, ErrMDSUnreachable,
// ErrDataServerDown, ErrNoDataServers, ErrNotMember, ErrDataLost) are
// package pnfs's: the one vocabulary of the MDS/DS seam, which package
// server maps to NFS4ERR_*. The MDS's RegistryConfig.CheckStateid returns
// the verdicts (wrapped or not), statusOf and errOf carry them over the
// wire, and Agent.CheckStateid returns them to the DS server.
var (
	// ErrNotLeader: the MDS is not the elected leader, or no longer, or
	// (on a data server) the call came over a connection registered
	// under an older term than the data server has seen since. A data
	// server moves on to the next MDS address.
	ErrNotLeader = errors.New("cluster: not the leading MDS")
)

// Errors about cluster membership.
var (
	// ErrRemoved is returned by StartAgent (and reported by Agent.Err) when
	// the MDS has removed this data server from the cluster.
	ErrRemoved = errors.New("cluster: data server removed from the cluster")
	// ErrWrongCluster: the data server's directory belongs to another
	// cluster than the MDS's.
	ErrWrongCluster = errors.New("cluster: data server directory belongs to another cluster")
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
)

// statusOf maps a verdict or storage error to the status sent on the wire.
func statusOf(err error) ctlproto.CtlStatus {
	switch {
	case err == nil:
		return ctlproto.CTL_OK
	case errors.Is(err, pnfs.ErrBadStateid):
		return ctlproto.CTL_ERR_BAD_STATEID
	case errors.Is(err, pnfs.ErrOldStateid):
		return ctlproto.CTL_ERR_OLD_STATEID
	case errors.Is(err, pnfs.ErrStaleStateid):
		return ctlproto.CTL_ERR_STALE_STATEID
	case errors.Is(err, pnfs.ErrExpired):
		return ctlproto.CTL_ERR_EXPIRED
	case errors.Is(err, pnfs.ErrOpenMode):
		return ctlproto.CTL_ERR_OPENMODE
	case errors.Is(err, pnfs.ErrFenced):
		return ctlproto.CTL_ERR_FENCED
	case errors.Is(err, pnfs.ErrUnavailable), errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return ctlproto.CTL_ERR_DELAY
	case errors.Is(err, ErrNotLeader):
		return ctlproto.CTL_ERR_NOT_LEADER
	case errors.Is(err, ErrBusy):
		return ctlproto.CTL_ERR_BUSY
	case errors.Is(err, pnfs.ErrNotMember):
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
		return pnfs.ErrBadStateid
	case ctlproto.CTL_ERR_OLD_STATEID:
		return pnfs.ErrOldStateid
	case ctlproto.CTL_ERR_STALE_STATEID:
		return pnfs.ErrStaleStateid
	case ctlproto.CTL_ERR_EXPIRED:
		return pnfs.ErrExpired
	case ctlproto.CTL_ERR_OPENMODE:
		return pnfs.ErrOpenMode
	case ctlproto.CTL_ERR_FENCED:
		return pnfs.ErrFenced
	case ctlproto.CTL_ERR_DELAY, ctlproto.CTL_ERR_STALE_GEN, ctlproto.CTL_ERR_NOTREG:
		return fmt.Errorf("%w (%v)", pnfs.ErrUnavailable, st)
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
		return pnfs.ErrNotMember
	case ctlproto.CTL_ERR_NOT_LEADER:
		return ErrNotLeader
	}
	return fmt.Errorf("cluster: %v: %w", st, syscall.EIO)
}

// call sends one SHOAL_CONTROL call on c and decodes its result. Transport
// failures are wrapped in pnfs.ErrUnavailable as well as kept in the chain.
func call(ctx context.Context, c *rpc.Conn, proc uint32, args xdr.Marshaler, res xdr.Unmarshaler) error {
	b, err := c.Call(ctx, ctlproto.SHOAL_CONTROL, ctlproto.SHOAL_CONTROL_V1, proc, rpc.OpaqueAuth{}, args)
	if err != nil {
		return fmt.Errorf("%w: %w", pnfs.ErrUnavailable, err)
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
		return nil, fmt.Errorf("%w: %w", pnfs.ErrUnavailable, err)
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
