package pnfs

import "errors"

// Stateid verdicts: why a stateid does not allow the I/O asked of it. The
// state manager (server/state) returns them for the MDS's own clients; a
// data server hears them from the MDS (cluster.Agent.CheckStateid) and
// answers its client with the NFS4ERR_* of the same name.
var (
	// ErrBadStateid: the stateid is unknown, has a seqid from the future,
	// or belongs to another client or file (NFS4ERR_BAD_STATEID).
	ErrBadStateid = errors.New("pnfs: bad stateid")
	// ErrOldStateid: the stateid's seqid is older than the current one
	// (NFS4ERR_OLD_STATEID).
	ErrOldStateid = errors.New("pnfs: old stateid")
	// ErrStaleStateid: the stateid is from a previous instance of the
	// server (NFS4ERR_STALE_STATEID).
	ErrStaleStateid = errors.New("pnfs: stale stateid")
	// ErrExpired: the stateid's client let its lease expire and its state
	// was revoked (NFS4ERR_EXPIRED).
	ErrExpired = errors.New("pnfs: stateid expired")
	// ErrOpenMode: the open's access (or a lock's type) does not allow the
	// I/O (NFS4ERR_OPENMODE).
	ErrOpenMode = errors.New("pnfs: stateid does not allow this access")
	// ErrFenced: the stateid belongs to a client the MDS has fenced (its
	// layouts were revoked): the client must get a new layout or do its
	// I/O through the MDS (NFS4ERR_PNFS_NO_LAYOUT).
	ErrFenced = errors.New("pnfs: client fenced")
)

// Availability: a server, or the data on it, cannot serve the I/O now.
var (
	// ErrUnavailable: the peer (MDS, or a data server) cannot be reached
	// or asked the caller to retry; callers map it to NFS4ERR_DELAY.
	ErrUnavailable = errors.New("pnfs: unavailable")
	// ErrMDSUnreachable: the data server could not ask the MDS what a
	// client's I/O needs (the data server is not registered with a
	// leading MDS, or the question got no answer). cluster.Agent's
	// CheckStateid returns it, and not ErrUnavailable, when it has no
	// recent answer about the stateid to go by; cluster.Agent.Map and the
	// replicated write's REPLICA_FAILED wrap both (their callers among the
	// data servers treat it as a peer that cannot answer). Either way the
	// data server sends the client to the MDS at once
	// (NFS4ERR_PNFS_NO_LAYOUT) instead of asking it to retry
	// (NFS4ERR_DELAY), which the Linux client answers by pausing its I/O
	// to the data server for 15 s.
	ErrMDSUnreachable = errors.New("pnfs: MDS unreachable, stateid unknown")
	// ErrDataServerDown: a data server that holds stripes of the file is
	// out of service for longer than cluster.RegistryConfig.DownAfter, or
	// was removed. Clients get NFS4ERR_IO; see cluster.DownError for which
	// one.
	ErrDataServerDown = errors.New("pnfs: data server down")
	// ErrNoDataServers: no data server ever registered, so a new file has
	// nowhere to go (NFS4ERR_DELAY; LAYOUTGET answers
	// NFS4ERR_LAYOUTUNAVAILABLE).
	ErrNoDataServers = errors.New("pnfs: no data servers")
	// ErrNotMember: this data server holds no current copy of the range
	// asked for (not a member of its position, its copy stale, or a block
	// failing its checksum). The client does the I/O through the MDS
	// (NFS4ERR_PNFS_NO_LAYOUT).
	ErrNotMember = errors.New("pnfs: this data server holds no current copy")
	// ErrDataLost: a sync found that a data server restarted (its boot
	// verifier changed) while holding data written to it and not yet
	// committed. What the sync covers is stable; the server must change
	// its own write verifier so that clients resend their uncommitted
	// writes (server.Server turns it into that, never into a status).
	ErrDataLost = errors.New("pnfs: data server restarted, uncommitted data may be lost")
	// ErrLayoutHeld: the file's layouts are held back while its data is
	// repaired (a stale copy healed on loosely coupled data servers):
	// LAYOUTGET answers NFS4ERR_LAYOUTTRYLATER, and the client does its
	// I/O through the MDS meanwhile.
	ErrLayoutHeld = errors.New("pnfs: the file's layouts are held back")
)
