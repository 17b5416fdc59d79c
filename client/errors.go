package client

import (
	"errors"
	"fmt"
	"io/fs"
	"syscall"

	"github.com/shoalfs/shoal/internal/nfs4"
)

// StatusError is an NFSv4 operation that the server answered with a status
// other than NFS4_OK. Namespace and file methods return it wrapped in an
// *fs.PathError, so both errors.Is(err, fs.ErrNotExist) and
// errors.As(err, &statusErr) work.
//
// NFSStatus is the raw nfsstat4 number (RFC 8881 §15.1, for example 2 for
// NFS4ERR_NOENT and 10008 for NFS4ERR_DELAY); Error names it.
type StatusError struct {
	Op        string // the failing operation, such as "LOOKUP"
	NFSStatus uint32 // the server's nfsstat4
}

var _ error = (*StatusError)(nil)

// Status returns the raw nfsstat4 value.
func (e *StatusError) Status() uint32 { return e.NFSStatus }

// status is NFSStatus as the protocol's type, for comparisons with the
// NFS4ERR_* constants.
func (e *StatusError) status() nfs4.Nfsstat4 { return nfs4.Nfsstat4(e.NFSStatus) }

func (e *StatusError) Error() string {
	if errno := e.Errno(); errno != 0 {
		return fmt.Sprintf("%s: %s (%s)", e.Op, errno.Error(), e.status())
	}
	return fmt.Sprintf("%s: %s", e.Op, e.status())
}

// Errno returns the POSIX errno that corresponds to the status, or 0 when
// there is no natural one.
func (e *StatusError) Errno() syscall.Errno { return statusErrno(e.status()) }

// Is reports whether target is the fs sentinel or syscall.Errno matching the
// status: NFS4ERR_NOENT is fs.ErrNotExist and syscall.ENOENT, NFS4ERR_EXIST
// is fs.ErrExist, NFS4ERR_ACCESS and NFS4ERR_PERM are fs.ErrPermission, and
// so on.
func (e *StatusError) Is(target error) bool {
	if t, ok := target.(*StatusError); ok {
		return t.NFSStatus == e.NFSStatus
	}
	errno := e.Errno()
	if errno == 0 {
		return false
	}
	if t, ok := target.(syscall.Errno); ok {
		return t == errno
	}
	return errno.Is(target)
}

// statusErrno is the one table that maps NFS statuses to errnos.
func statusErrno(s nfs4.Nfsstat4) syscall.Errno {
	switch s {
	case nfs4.NFS4ERR_PERM:
		return syscall.EPERM
	case nfs4.NFS4ERR_NOENT:
		return syscall.ENOENT
	case nfs4.NFS4ERR_IO:
		return syscall.EIO
	case nfs4.NFS4ERR_NXIO:
		return syscall.ENXIO
	case nfs4.NFS4ERR_ACCESS, nfs4.NFS4ERR_WRONGSEC, nfs4.NFS4ERR_WRONG_CRED:
		return syscall.EACCES
	case nfs4.NFS4ERR_EXIST:
		return syscall.EEXIST
	case nfs4.NFS4ERR_XDEV:
		return syscall.EXDEV
	case nfs4.NFS4ERR_NOTDIR:
		return syscall.ENOTDIR
	case nfs4.NFS4ERR_ISDIR:
		return syscall.EISDIR
	case nfs4.NFS4ERR_INVAL, nfs4.NFS4ERR_BADNAME, nfs4.NFS4ERR_BADCHAR, nfs4.NFS4ERR_BADTYPE,
		nfs4.NFS4ERR_BAD_RANGE, nfs4.NFS4ERR_BADOWNER:
		return syscall.EINVAL
	case nfs4.NFS4ERR_FBIG:
		return syscall.EFBIG
	case nfs4.NFS4ERR_NOSPC:
		return syscall.ENOSPC
	case nfs4.NFS4ERR_ROFS:
		return syscall.EROFS
	case nfs4.NFS4ERR_MLINK:
		return syscall.EMLINK
	case nfs4.NFS4ERR_NAMETOOLONG:
		return syscall.ENAMETOOLONG
	case nfs4.NFS4ERR_NOTEMPTY:
		return syscall.ENOTEMPTY
	case nfs4.NFS4ERR_DQUOT:
		return syscall.EDQUOT
	case nfs4.NFS4ERR_STALE, nfs4.NFS4ERR_FHEXPIRED:
		return syscall.ESTALE
	case nfs4.NFS4ERR_NOTSUPP, nfs4.NFS4ERR_ATTRNOTSUPP:
		return syscall.EOPNOTSUPP
	case nfs4.NFS4ERR_DENIED, nfs4.NFS4ERR_LOCKED, nfs4.NFS4ERR_SHARE_DENIED:
		return syscall.EAGAIN
	case nfs4.NFS4ERR_DEADLOCK:
		return syscall.EDEADLK
	case nfs4.NFS4ERR_SYMLINK:
		return syscall.ELOOP
	case nfs4.NFS4ERR_OPENMODE:
		return syscall.EBADF
	case nfs4.NFS4ERR_LOCK_NOTSUPP:
		return syscall.ENOLCK
	case nfs4.NFS4ERR_NOXATTR:
		return syscall.ENODATA
	case nfs4.NFS4ERR_XATTR2BIG:
		return syscall.E2BIG
	}
	return 0
}

// Errors the client returns that do not come from a server status.
var (
	// ErrVerifierChanged is wrapped by the error of File.Sync and
	// File.Close when data written UNSTABLE may have been lost and the
	// client could not write it again: a COMMIT did not vouch for it (the
	// server's write verifier changed between the WRITE and the COMMIT, or
	// a data server could not take the COMMIT), and writing the copy the
	// File kept through the metadata server failed too. The caller must
	// write again whatever it wrote since the last successful Sync.
	ErrVerifierChanged = errors.New("nfs: write verifier changed (server restarted); unsynced data may be lost")
	// ErrLockLost is reported by a File's reads, writes, Unlock and Close
	// once a byte-range lock it held is gone: the server lost its state (a
	// restart, or a failover to another metadata server) and the lock
	// could not be reclaimed in the grace period. The lock is not taken
	// again behind the application's back, since another client may have
	// held it meanwhile. Unlock and Close report it once and clear it. A
	// write in flight when the recovery found the loss may complete.
	ErrLockLost = errors.New("nfs: byte-range lock lost: the server lost its state and the lock could not be reclaimed")
	// ErrClosed is returned by operations on a closed Client or File.
	ErrClosed = errors.New("nfs: use of closed client or file")
	// ErrNotNFS is wrapped by Dial's error when something listens at the
	// address but does not answer as an NFSv4 server: it sent bytes that
	// are not an RPC reply (a web server, say), closed the connection,
	// refused the NFSv4 program, or did not answer the NULL procedure
	// within a few seconds. Dial fails then instead of waiting out
	// Options.DialTimeout.
	ErrNotNFS = errors.New("did not answer as an NFSv4 server")
	// ErrDataServer is wrapped by Dial's error when the address is a pNFS
	// data server: it serves only the I/O of layouts its metadata server
	// hands out, so a client must dial the metadata server.
	ErrDataServer = errors.New("a pNFS data server serves only I/O for its metadata server's layouts; dial the metadata server")
)

// DataServerError reports pNFS I/O that failed on a data server and then
// through the metadata server, which the client redid it through. Shoal's
// metadata server cannot serve a stripe unit whose data server is out of
// service either: it answers NFS4ERR_DELAY at first and NFS4ERR_IO once
// the data server has been out for a while (`shoal mds --ds-down-after`),
// so this is the error of I/O on a file with a stripe unit on a dead data
// server. It comes wrapped in the *fs.PathError of the read or write.
//
// Unwrap returns the metadata server's error (Err), so errors.Is(err,
// syscall.EIO) and errors.As(err, &statusErr) see its status. The data
// server's own error (DSErr) is not unwrapped: it is often a dial error,
// which callers must not take for one of the metadata server.
type DataServerError struct {
	Offset  int64  // file offset of the failed piece
	Addr    string // the data server's address (the first, if it has several)
	Stripe  int    // its stripe index in the file's layout, from 0
	Stripes int    // the number of stripe indices in the layout
	// Mirror is the data server's mirror, from 0, of Mirrors (flexfiles;
	// 1 mirror with the files layout).
	Mirror, Mirrors int
	DSErr           error // why the data server could not be used
	Err             error // the metadata server's answer to the I/O redone through it
}

func (e *DataServerError) Error() string {
	what := "unreachable"
	var se *StatusError
	if errors.As(e.DSErr, &se) {
		what = "failed"
	}
	mirror := ""
	if e.Mirrors > 1 {
		mirror = fmt.Sprintf(", mirror %d of %d", e.Mirror, e.Mirrors)
	}
	return fmt.Sprintf("data server %s (stripe index %d of %d%s) %s at offset %d: %v; metadata server: %v",
		e.Addr, e.Stripe, e.Stripes, mirror, what, e.Offset, e.DSErr, e.Err)
}

// Unwrap returns the metadata server's error.
func (e *DataServerError) Unwrap() error { return e.Err }

func statusErr(op nfs4.NfsOpnum4, s nfs4.Nfsstat4) error {
	return &StatusError{Op: opName(op), NFSStatus: uint32(s)}
}

func opName(op nfs4.NfsOpnum4) string {
	s := op.String()
	if len(s) > 3 && s[:3] == "OP_" {
		return s[3:]
	}
	return s
}

func pathErr(op, path string, err error) error {
	if err == nil {
		return nil
	}
	return &fs.PathError{Op: op, Path: path, Err: err}
}
