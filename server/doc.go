// Package server is Shoal's NFSv4.1/4.2 server (RFC 8881, RFC 7862): the
// single-node "NFSv4" mode that every pNFS benchmark is compared against, and
// the base the metadata server builds on.
//
// # Structure
//
// A [Server] owns four parts, each behind a small interface:
//
//   - internal/rpc carries ONC RPC over TCP, one goroutine per call, and the
//     NFSv4.1 backchannel on the same connections;
//   - state (server/state) holds client records, sessions and their reply
//     caches, stateids, share reservations, byte-range locks, leases and the
//     grace period, with no knowledge of XDR;
//   - meta.Engine stores the namespace and attributes transactionally (bbolt
//     by default);
//   - store.Backend stores file data in local files.
//
// The COMPOUND evaluator (compound.go) decodes one operation at a time, so an
// undecodable or unknown operation fails at its own position with
// NFS4ERR_BADXDR or NFS4ERR_OP_ILLEGAL, and a retransmitted request is
// answered from the session slot's reply cache before anything else runs.
// Each op family lives in its own file (ops_session.go, ops_fh.go,
// ops_attr.go, ops_ns.go, ops_open.go, ops_io.go, ops_lock.go, ops_42.go,
// ops_xattr.go).
//
// # Roles
//
// A Server plays one role, and its role is its operation table
// (optable.go): [New] makes a plain server (`shoal serve`, plainOps) or,
// with Config.PNFS, a metadata server (mdsOps, which adds the layout
// operations); [NewDataServer] makes a data server (dsOps), configured by
// a DataServerConfig of its own. The tables share a core, coreOps: client
// IDs and sessions, which compound.go and ops_session.go serve alike for
// every role. Each other operation is declared once per role that serves
// it: its handler (or none: NFS4ERR_NOTSUPP), where it may stand relative
// to SEQUENCE, and whether its arguments may be released early
// (argsrelease.go); an operation a role does not declare is
// NFS4ERR_NOTSUPP there, and the minor version that defines an operation
// number is the protocol's (opMinor). The dispatcher reads nothing else,
// so adding an operation is one entry per role. A data server answers
// only what RFC 8881 §13.6 allows it (PUTFH, READ, WRITE, COMMIT and the
// session housekeeping), plus READ_PLUS and RECLAIM_COMPLETE, with
// handlers of its own (ds.go) that share the data path with the MDS's
// (readData, readPlusData, checkWriteRange) but none of its namespace,
// attributes or delegations: the shared handlers have no role branches.
//
// # Session limits
//
// CREATE_SESSION refuses channel attributes too small for the smallest
// request and reply (NFS4ERR_TOOSMALL) and grants at most what Shoal
// enforces; every COMPOUND in the session is then held to them: a request
// over ca_maxrequestsize gets NFS4ERR_REQ_TOO_BIG on SEQUENCE, and the
// operation whose result would take the reply over ca_maxresponsesize (or,
// when the client asked to cache the reply, ca_maxresponsesize_cached)
// gets NFS4ERR_REP_TOO_BIG (NFS4ERR_REP_TOO_BIG_TO_CACHE) instead of its
// result (limits.go).
//
// # Extended attributes
//
// NFSv4.2 clients get RFC 8276's GETXATTR, SETXATTR, LISTXATTRS and
// REMOVEXATTR, the xattr_support attribute and the ACCESS bits XAREAD,
// XAWRITE and XALIST (ops_xattr.go); a 4.1 COMPOUND sees none of them. The
// attributes are Linux's user namespace, sent without the "user." prefix,
// and live in the metadata engine with their inode (meta.Engine.SetXattr),
// with Linux's limits: a name over 255 bytes or a value over 64 KiB is
// NFS4ERR_XATTR2BIG. Reading and listing need read permission, setting and
// removing write permission on a writable export. The plain server and the
// metadata server serve them; data servers do not.
//
// # Sparse files
//
// ALLOCATE, DEALLOCATE, SEEK and READ_PLUS (RFC 7862 §15, ops_42.go) go
// through the store's File (store.File's Allocate, PunchHole and Seek),
// whichever role implements it: on `shoal serve` the local store
// (fallocate, lseek SEEK_DATA/SEEK_HOLE), on a metadata server
// cluster.Striped, which asks the data servers holding each stripe unit
// (OBJ_ALLOCATE, OBJ_PUNCH, OBJ_SEEK). READ_PLUS reports the holes Seek
// finds as hole segments and reads only the data; data servers answer it
// too, over their own objects (dsReadPlus, which shares readPlusData).
//
// # Server-side copy
//
// COPY and CLONE (RFC 7862 §15.2, §15.13; ops_copy.go) copy from the
// saved filehandle's file to the current one's through the store's
// capability store.Copier where the store has it: the local store copies
// in the kernel (copy_file_range, a clone where the file system shares
// blocks), cluster.Striped has every data server copy its own stripe
// units (OBJ_COPY) when the two files' stripe maps line up, as they do
// for a whole file copied into a new one. Otherwise the server copies
// through a buffer, and on a metadata server the bytes pass through it.
// A client asking for an asynchronous copy of at least 256 MiB gets a
// copy stateid and CB_OFFLOAD at the end (copy_async.go); shorter ones
// are synchronous. clone_blksize is the local store's checksum block, or
// the stripe unit on a metadata server.
//
// # Delegations
//
// Read and write delegations (RFC 8881 §10.4; deleg.go here, the rules in
// internal/state/deleg.go) are on unless Config.NoDelegations is set.
//
// When granted: on OPEN, a read delegation for a reader when no other
// client has the file open for writing or holds a write delegation of
// it; a write delegation for a writer (share access WRITE or BOTH) when
// no other client has the file open or delegated at all. The
// OPEN4_SHARE_ACCESS_WANT_* bits override that choice (WANT_ANY_DELEG
// falls back to read), and WANT_DELEGATION asks without an OPEN. Not in
// an OPEN that creates the file unless the client asks for one: Linux
// states no preference, and a delegation of a new file cost it a
// DELEGRETURN per file (before its REMOVE) and saved nothing (tar x and
// rm -r, docs/benchmarks.md). Never for anything but a regular file, during grace, to a client none of
// whose sessions has a back channel connection on which callbacks have
// not failed, while a delegation of the file is being recalled, or to a
// client that had one of the file recalled in the last few seconds (a
// file two clients take turns on does not bounce). A client that wanted
// one and gets none is told why (OPEN_DELEGATE_NONE_EXT).
//
// When recalled: another client's OPEN (any, against a write delegation;
// for writing, against a read one), SETATTR, REMOVE, RENAME (of the file
// or over it), LINK, LAYOUTGET for writing, or READ/WRITE under a special
// stateid (only WRITE against a read delegation). The conflicting
// operation answers NFS4ERR_DELAY and the holder gets CB_RECALL, sent
// from a goroutine of its own (never inside the request: see internal/rpc
// on backchannel deadlock) and resent at most once a second while the
// operation is retried. The holder's own operations conflict with
// nothing. It turns its local opens into server opens with OPEN
// CLAIM_DELEGATE_CUR or CLAIM_DELEG_CUR_FH and returns the delegation with
// DELEGRETURN. CLAIM_DELEGATE_PREV, CLAIM_DELEG_PREV_FH and DELEGPURGE
// are NFS4ERR_NOTSUPP: delegations are not reclaimed across a client's
// restart.
//
// Across the server's restart they are: delegations are not persisted,
// but an OPEN with CLAIM_PREVIOUS that names the delegation the client
// held (delegate_type) gets it back during grace. The Linux client keeps
// locks under a delegation without sending them, and reclaims none of
// them when the delegation is not given back. One that conflicts with
// other clients' reclaims, goes to a client whose callback path is down,
// or comes while delegations are off is given back with the recall flag
// set: the client sends its locks and returns it.
//
// Revocation: a delegation not returned within one lease of its recall
// is revoked, even when the CB_RECALL could not be delivered (the client
// may bind a new back channel and get the resend within the lease;
// revoking at once would punish a brief disconnection). SEQUENCE then
// carries SEQ4_STATUS_RECALLABLE_STATE_REVOKED, and the stateid reads as
// NFS4ERR_DELEG_REVOKED until the client frees it (FREE_STATEID). A
// client whose lease runs out loses its delegations with the rest of its
// state; DESTROY_CLIENTID with delegations held is NFS4ERR_CLIENTID_BUSY.
//
// A delegation stateid allows READ (either kind), WRITE and a SETATTR of
// the size (write delegations), LAYOUTGET, and I/O at the data servers,
// which ask the MDS as for open stateids (Server.CheckDataIO). LOCK needs
// an open stateid. Another client's GETATTR of the size or change of a
// file under a write delegation sends CB_GETATTR to the holder (waiting
// at most two seconds, with no lock held) and reports the holder's size
// with a change attribute moved past the server's when the holder changed
// the file (§10.4.3); a holder that does not answer has the delegation
// recalled instead.
//
// # Layout reports
//
// A metadata server accepts LAYOUTERROR and LAYOUTSTATS under the client's
// layout stateid of the file, attributes them to data servers by device
// and range, logs each error, and exports the counts through the
// collector (layoutstats.go). A server without pNFS answers
// NFS4ERR_NOTSUPP, as for LAYOUTGET.
//
// # Errors
//
// Handlers return an opReply: a status and the result body that follows it.
// Internal errors (meta, state, store) are mapped to NFS4ERR_* values in one
// place, statusOf in errors.go; handlers never invent codes for errors that
// come from below.
//
// # Filehandles and exports
//
// Filehandles are 28 opaque bytes carrying the export id and inode number,
// authenticated with an HMAC under a secret kept in the metadata store (fh.go):
// stable across restarts, and not forgeable into another export. Exports are
// subtrees of one namespace, shown to clients through an NFSv4 pseudo-root
// (export.go); each has its own read-only flag, allowed client networks and
// root/all squashing.
//
// # Data path
//
// WRITE payloads arrive as slices of the RPC record buffer and go to pwrite
// without a copy; READ replies are spliced into the reply with writev. Size,
// mtime and change caused by WRITE are kept in an in-memory overlay
// (inode.go) and persisted when the data is made stable (COMMIT, FILE_SYNC),
// so the metadata store is not on the per-WRITE path.
//
// # Durability and restart
//
// Metadata operations are durable when answered: a COMPOUND's changes are
// written to the metadata engine's log as they are made and the log is
// synced once, at the COMPOUND's end, before the reply (durability.go).
// With sync: false (Config.Async, or Export.Sync for one export; knfsd's
// async export) the reply does not wait, and the log is synced within
// Config.CommitInterval: a crash of the machine may lose the changes of
// that last interval (never the namespace's consistency), a crash of the
// process none; COMMIT, stable WRITEs and LAYOUTCOMMIT still wait. A
// create lost that way can leave the data its client wrote: after an
// unclean start the server sweeps the data objects no file owns
// (sweep.go). Data is durable after
// COMMIT or a FILE_SYNC/DATA_SYNC WRITE; the write verifier changes on every
// start so clients resend UNSTABLE data the server may have lost. Confirmed
// client records are persisted, and after a restart the server is in grace
// for one lease: clients reclaim opens (CLAIM_PREVIOUS) and locks, and new
// state is refused with NFS4ERR_GRACE until every old client sent
// RECLAIM_COMPLETE or the lease ran out. At any time, a client ID that has
// not sent its global RECLAIM_COMPLETE gets NFS4ERR_GRACE for new opens and
// locks (RFC 8881 §18.51.3), so a client must send it after CREATE_SESSION
// even with nothing to reclaim, as the Linux client and Shoal's own do.
//
// # Replies lost with the server
//
// The session reply cache is memory: a REMOVE, RENAME, LINK, CREATE or
// GUARDED4 OPEN committed by a server that died before replying would,
// resent to the next instance (a restart, an MDS takeover), run again and
// fail (NOENT, EXIST). Each such change therefore writes a replay record
// in its own metadata transaction (meta.WithReplay), and a later instance
// answers a resent request that fails with exactly the replay status from
// it, for the same client owner, within two leases of that client's
// recovery. The next SEQUENCE on a slot retires the records of the slot's
// previous request (the client had its reply), and their deletes ride in
// the next change's transaction. The residual hazard: a record whose
// reply did arrive but was not yet known to have (its slot not used
// again, or its delete still pending, when the server died) answers
// success to an identical request the same client sends soon after its
// recovery, if that request fails with the replay status while the names
// still say what the record says (a repeated "mv a b" after the move).
// The full rules are at replayFlushEvery in replay.go.
package server
