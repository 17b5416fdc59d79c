package server

import (
	"context"
	"errors"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/meta"
	"github.com/shoalfs/shoal/pnfs"
	"github.com/shoalfs/shoal/store"
)

// errTable maps internal sentinel errors to NFSv4 status codes. It is the one
// place where such errors become wire values. Every exported Err* sentinel
// of packages pnfs, meta and store is in it (TestErrTableComplete), except
// pnfs.ErrDataLost, which Server.dataLost turns into a new write verifier
// and never into a status; stateErrs (state.go) maps the state manager's
// own errors.
var errTable = []struct {
	err error
	st  nfs4.Nfsstat4
}{
	{meta.ErrNotFound, nfs4.NFS4ERR_NOENT},
	{meta.ErrStale, nfs4.NFS4ERR_STALE},
	{meta.ErrNotSymlink, nfs4.NFS4ERR_INVAL},
	{meta.ErrTooManyLinks, nfs4.NFS4ERR_MLINK},
	{meta.ErrClosed, nfs4.NFS4ERR_DELAY},
	// A deposed leader: the client retries, at the new leader.
	{meta.ErrFenced, nfs4.NFS4ERR_DELAY},
	// etcd without quorum: never a wrong answer, and it resumes by itself.
	{meta.ErrUnavailable, nfs4.NFS4ERR_DELAY},
	{meta.ErrExist, nfs4.NFS4ERR_EXIST},
	{meta.ErrNotDir, nfs4.NFS4ERR_NOTDIR},
	{meta.ErrIsDir, nfs4.NFS4ERR_ISDIR},
	{meta.ErrNotEmpty, nfs4.NFS4ERR_NOTEMPTY},
	{meta.ErrInval, nfs4.NFS4ERR_INVAL},
	{meta.ErrNameTooLong, nfs4.NFS4ERR_NAMETOOLONG},
	{meta.ErrNoXattr, nfs4.NFS4ERR_NOXATTR},
	{meta.ErrXattrTooBig, nfs4.NFS4ERR_XATTR2BIG},
	{meta.ErrNoSpace, nfs4.NFS4ERR_NOSPC},
	{errBadHandle, nfs4.NFS4ERR_BADHANDLE},
	// A data server that cannot ask its MDS (restarting or failing over)
	// for what the I/O needs, such as the stripe map of a mirrored
	// write, sends the client to the MDS, as dsCheckIO does for a
	// stateid: NFS4ERR_DELAY from a data server pauses the Linux files
	// layout driver's I/O for 15 s (FILELAYOUT_POLL_RETRY_MAX). Listed
	// before pnfs.ErrUnavailable, which such errors also wrap.
	{pnfs.ErrMDSUnreachable, nfs4.NFS4ERR_PNFS_NO_LAYOUT},
	// A data server that cannot be reached now (restarting, or not yet
	// registered) is transient: the client retries, as it would for a
	// server that is busy. NFS4ERR_SERVERFAULT would be a hard I/O error.
	{pnfs.ErrUnavailable, nfs4.NFS4ERR_DELAY},
	// A data server that holds stripes of the file and has been out of
	// service longer than the registry's DownAfter (or was removed) is a
	// hard error: retrying would hang the application for as long as the
	// server stays down. The client's read or write fails with EIO.
	{pnfs.ErrDataServerDown, nfs4.NFS4ERR_IO},
	{pnfs.ErrNoDataServers, nfs4.NFS4ERR_DELAY},
	{pnfs.ErrLayoutHeld, nfs4.NFS4ERR_LAYOUTTRYLATER},
	// A data server asked for a range it holds no current copy of (not a
	// member of the range's position, its copy stale, or a block of it
	// failing its checksum: cluster.ReplicaStore wraps store.ErrCorrupt
	// in pnfs.ErrNotMember) tells the client to do the I/O through the
	// metadata server, which reads a good copy. Listed before
	// store.ErrCorrupt so that a data server's corrupt copy maps here.
	{pnfs.ErrNotMember, nfs4.NFS4ERR_PNFS_NO_LAYOUT},
	// Data that fails its checksum anywhere else (a server's own local
	// store; the metadata server when no copy is good) is an I/O error.
	{store.ErrCorrupt, nfs4.NFS4ERR_IO},
	// A metadata record (inline data) failing its checksum, as its doc
	// says: never bytes nobody can vouch for (found by TestErrTableComplete).
	{meta.ErrCorrupt, nfs4.NFS4ERR_IO},
	// A metadata engine whose log could not be written or made durable
	// refuses changes until restarted (TestFailedLogSyncAnswersIO).
	{meta.ErrStoreFailed, nfs4.NFS4ERR_IO},
	// The stateid verdicts: the state manager's for the MDS's own
	// clients, and the same ones as a data server hears them from its
	// metadata server (CheckDataIO makes them there).
	{pnfs.ErrBadStateid, nfs4.NFS4ERR_BAD_STATEID},
	{pnfs.ErrOldStateid, nfs4.NFS4ERR_OLD_STATEID},
	{pnfs.ErrStaleStateid, nfs4.NFS4ERR_STALE_STATEID},
	{pnfs.ErrExpired, nfs4.NFS4ERR_EXPIRED},
	{pnfs.ErrOpenMode, nfs4.NFS4ERR_OPENMODE},
	// A client whose layouts the MDS revoked must get a new layout, or go
	// through the MDS, before a data server does its I/O (RFC 8881
	// §12.5.5). dsCheckIO answers it before consulting this table; the
	// entry keeps every pnfs sentinel mapped here, with the same status.
	{pnfs.ErrFenced, nfs4.NFS4ERR_PNFS_NO_LAYOUT},
	{context.Canceled, nfs4.NFS4ERR_DELAY},
	{context.DeadlineExceeded, nfs4.NFS4ERR_DELAY},
}

// statusOf maps an error to an NFSv4 status. Unknown errors are server faults.
func statusOf(err error) nfs4.Nfsstat4 {
	if err == nil {
		return nfs4.NFS4_OK
	}
	var se statusError
	if errors.As(err, &se) {
		return se.st
	}
	for _, m := range errTable {
		if errors.Is(err, m.err) {
			return m.st
		}
	}
	if st, ok := stateStatus(err); ok {
		return st
	}
	return nfs4.NFS4ERR_SERVERFAULT
}

// statusError carries an explicit status through error-returning code.
type statusError struct{ st nfs4.Nfsstat4 }

func (e statusError) Error() string { return e.st.String() }
