// Package client is Shoal's NFSv4.1/4.2 client library: a Go API over the
// wire protocol, with no kernel mount involved. Shoal's CLI, benchmarks and
// tests use it, and it speaks to any NFSv4.1+ server (it is tested against
// NFS-Ganesha as well as Shoal's own server).
//
// # Connection model
//
// A [Client] owns one TCP connection, one client ID and one session. The
// connection is full-duplex: COMPOUNDs go out and replies come back matched
// by xid, and the server's callbacks (CB_COMPOUND on the NFSv4.1
// backchannel) arrive on the same socket, bound at CREATE_SESSION with
// CREATE_SESSION4_FLAG_CONN_BACK_CHAN. The client serves CB_NULL,
// CB_SEQUENCE, CB_RECALL and CB_GETATTR (see Delegations below) and
// CB_LAYOUTRECALL (see pNFS below).
//
// Dial runs EXCHANGE_ID (SP4_NONE), CREATE_SESSION and RECLAIM_COMPLETE,
// then reads the lease time and maxread/maxwrite of the root. It speaks
// minor version 2 unless told otherwise and steps down one minor version at
// a time, to 1 at the lowest, while the server answers
// NFS4ERR_MINOR_VERS_MISMATCH. A background goroutine renews the
// lease with a SEQUENCE-only COMPOUND when the client has been idle for a
// third of the lease.
//
// Paths are slash-separated and relative to the server's pseudo-root, or
// to [Options].Root when set (like the remote path of a mount). Each call
// resolves its path afresh in the same COMPOUND as the operation itself
// (PUTROOTFH, one LOOKUP per component, then the operation), so there is no
// client-side name cache to go stale. LOOKUP never follows symbolic links:
// a symlink in the middle of a path fails (syscall.ELOOP), and a final one
// is acted on itself, so [Client.Stat] has lstat semantics.
//
// A caller that keeps file handles (the FUSE mount does, per node) can
// skip the walk: [Client.StatHandle], [Client.LookupAt], [Client.OpenAt],
// [Client.RemoveAt], [Client.MkdirAt] and the other handle calls start
// from a handle with PUTFH, the creating ones return the new object's
// handle and attributes in the same COMPOUND, and [Client.ReadDirHandle]
// returns each entry's handle with its attributes. A handle of an object
// another client removed fails with NFS4ERR_STALE ([IsStale]); the
// caller resolves the path again.
//
// # Sessions and slots
//
// Every COMPOUND starts with SEQUENCE on a slot of the session's slot
// table. The table has as many slots as [Options].MaxInFlight asked for and
// the server granted; that is how many COMPOUNDs may be outstanding at
// once, from any number of goroutines. The client honours the server's
// sr_target_highest_slotid, shrinking or growing the usable part of the
// table. A slot's sequence id advances only when the server has processed
// the request; a request abandoned by its caller (context cancelled) keeps
// its slot until the reply arrives, so sequence ids never go out of step.
//
// NFS4ERR_DELAY is retried with exponential backoff (10 ms doubling to 1 s)
// for up to two of the server's leases plus a margin after the first one:
// long enough for the server to revoke a dead client it is waiting for
// (say, to return a recalled layout before a REMOVE). That is 3 min 10 s
// with the usual 90 s lease, too long for I/O: READ, WRITE and COMMIT, to
// the metadata server or to a data server, retry NFS4ERR_DELAY for
// [Policy].IORetryTimeout instead (default 30 s; see "Data server
// failures" below). NFS4ERR_GRACE is retried once a second (up to 3
// minutes). Callers see neither unless the wait runs out or their context
// is cancelled.
//
// An error of SEQUENCE itself leaves the slot as it was (the server ran
// nothing), so NFS4ERR_DELAY there is resent under the same sequence id;
// NFS4ERR_SEQ_MISORDERED, a slot the server and the client disagree on,
// replaces the session. A SEQUENCE reply saying the server has no back
// channel for the session (SEQ4_STATUS_CB_PATH_DOWN, _SESSION) makes the
// client bind its connection for the back channel again
// (BIND_CONN_TO_SESSION).
//
// # Failures and recovery
//
// When the connection breaks, the calls in flight redial (with backoff, for
// up to three minutes), bind the new connection to the session with
// BIND_CONN_TO_SESSION (CDFC4_FORE_OR_BOTH), and resend their requests with
// the same slot and sequence id; a request the server had already executed
// is answered from its reply cache, so non-idempotent operations (RENAME,
// REMOVE, exclusive OPEN) are not executed twice.
//
// A server may have several addresses, of which one answers at a time:
// a Shoal cluster with automatic metadata-server failover runs several
// metadata servers on one etcd cluster, and only the elected leader
// listens. [Dial] takes them as a list ("mds1:2049,mds2:2049"); a redial
// tries them in turn, starting with the one that answered last, each for
// a bounded time (5 s to connect, 3 s to answer the NULL procedure, the
// DialTimeout for BIND_CONN_TO_SESSION), so an address where nothing
// listens is passed at once, and one that accepts connections but does not
// answer (a leader that was paused and deposed) after a few seconds. Such
// a leader may also keep the established connection open and answer
// nothing on it: with several addresses, when COMPOUNDs have waited 10 s
// with no reply, the Client sends NULL on the connection, and if that is
// not answered within 3 s it closes the connection and reconnects as
// above. The new leader is a new server instance: it does not know the
// session, and the Client recovers as from a restart, described next.
//
// When the server has lost the session (NFS4ERR_BADSESSION,
// NFS4ERR_DEADSESSION, NFS4ERR_STALE_CLIENTID), the client runs
// EXCHANGE_ID under the same client owner and CREATE_SESSION. If the
// server answers with the same client ID, confirmed
// (EXCHGID4_FLAG_CONFIRMED_R), it lost the session only and kept the
// client's state: opens, locks, delegations and layouts carry on, and
// there is nothing to reclaim. Otherwise (it restarted, or expired the
// client ID) the client reclaims the opens of every open [File] with CLAIM_PREVIOUS and their
// byte-range locks with reclaim=true, and sends RECLAIM_COMPLETE. A server
// without a grace period (NFS4ERR_NO_GRACE) gets ordinary opens (CLAIM_FH)
// instead; locks are never taken again outside the grace period, since
// another client may have held them meanwhile: a lock that could not be
// reclaimed is lost, and its File's reads, writes, Unlock and Close say so
// with [ErrLockLost]. Calls that were waiting meanwhile are rebuilt with
// the new stateids and retried. An open the recovery did not reclaim (its
// OPEN was answered by the old server instance only after the recovery
// had collected the Files, or its reclaim failed) is opened again with
// CLAIM_FH when the server refuses its stateid, and the READ, WRITE or
// LOCK is retried.
//
// # Delegations
//
// Read-only opens take the read delegations a server grants (write opens
// ask for none with OPEN4_SHARE_ACCESS_WANT_NO_DELEG, and a write
// delegation granted anyway is returned at once; [Options].NoDelegations
// asks for none at all). While the Client holds a read delegation of a
// file, no other client can change it without a recall first, so the
// Client skips revalidation: [Client.OpenHandle] read-only is satisfied
// without OPEN or GETATTR (and its Close sends no CLOSE; the File reads
// with the delegation stateid), [Client.StatHandle] and [File.Stat]
// answer from the attributes the OPEN returned unless this Client changed
// the file since, and AccessCached keeps its cached data across opens.
// Path opens still send OPEN, since the name may point elsewhere by now.
//
// CB_RECALL is answered at once; in the background the Client writes
// back what its Files hold of the file, opens the Files it opened
// locally on the server (OPEN CLAIM_DELEG_CUR_FH) and sends DELEGRETURN.
// A Lock on such a File opens it on the server the same way. When
// SEQUENCE reports revoked state, the Client tests its delegation,
// open and lock stateids (TEST_STATEID), frees the revoked ones
// (FREE_STATEID), reopens the local Files of a revoked delegation and
// drops the file's cached data, opens a File whose open was revoked
// again (CLAIM_FH), and reports its byte-range locks lost ([ErrLockLost]:
// another client may hold them by now). A new client ID
// (server restart, lease expired) drops all delegations (their local
// Files are reclaimed as ordinary opens);
// Close returns them. [Stats] and [Client.OpCounts] count what this
// saves.
//
// # Access methods and policy
//
// How a File moves data is its access method ([Access]), chosen per
// Client ([Policy].Access in [Options].Policy) and per File
// ([Client.OpenAccess], [File.SetAccess]):
//
//   - AccessDirect (the default) sends each ReadAt and WriteAt to the layout
//     driver or the metadata server with its offset and length untouched,
//     and COMMITs at Sync and Close. Small requests cost one round trip
//     each.
//   - AccessODirect caches no data but gathers contiguous writes into a
//     buffer of one block ([Policy].BlockSize), written out when a write is
//     not contiguous with it, when it is full, and at Sync, Close, Truncate
//     and reads of its range. Sequential small writes become block-size
//     WRITEs; reads go to the server.
//   - AccessCached keeps a data cache of [Policy].CacheSize bytes per
//     Client with write-back: writes land in the cache, a block that a
//     write completes goes out at once in the background (one at a time;
//     while one is in flight the writer sends the next itself), and the
//     rest at Sync, Close, Truncate, Lock/Unlock or under memory
//     pressure. Sequential reads read
//     [Policy].Readahead ahead. Consistency is close-to-open: Close writes
//     back and commits, and Open compares the file's change attribute with
//     the one seen at the last Close by this Client, dropping the cached
//     data if the file changed.
//
// The cache and the gather buffers belong to the Client and are keyed by
// file handle, so all Files of one Client see each other's writes
// whatever method each uses (a direct read first writes back what the
// cache holds for the file; a direct write updates the cached copy). Files
// of different Clients see each other's writes after close and open.
// Files opened with O_SYNC always use the direct method. Stat reports the
// size including data not written back yet.
//
// The other [Policy] settings: BlockSize defaults to the server's
// layout_blksize attribute (Shoal's stripe unit), else 4 MiB; MaxPerDS
// bounds requests per data server; LayoutFetch asks for layouts at open or
// at the first I/O; KeepLayouts keeps a layout after Close for the next
// open of the same file (it can still be recalled); SmallIOThreshold sends
// smaller requests through the metadata server. The shoal command reads a
// Policy from flags and a YAML file (--policy); the library itself reads
// no configuration.
// docs/client-policy.md has the measurements behind the defaults.
//
// # Consistency and durability
//
// With AccessDirect the client caches no data: every ReadAt reads from the
// server, so a read sees every write the server acknowledged. The other
// methods are described above.
//
// Writes are UNSTABLE by default: the server may keep them in memory until
// [File.Sync] or [File.Close] sends COMMIT, and lose them if it restarts
// meanwhile, which it tells by answering the COMMIT with another write
// verifier than the WRITE got. So, as a kernel client's page cache does,
// each File keeps a copy of what it wrote UNSTABLE (one copy of each
// WRITE's payload, in pooled buffers; reads never use it) until a COMMIT
// vouches for it: one that answers the verifier the WRITE got, and for
// data written through a layout also the LAYOUTCOMMIT after it. What no
// COMMIT vouches for (the verifier changed, on a data server or on the
// metadata server, or a data server could not take the COMMIT at all) is
// written again through the metadata server with FILE_SYNC, and Sync
// succeeds ([Stats].ResentBytes counts it). Only if that fails too do
// Sync and Close return an error wrapping [ErrVerifierChanged]; the copy
// is then dropped, and the caller must write again whatever it wrote
// since the last successful Sync. As with a kernel client, a resend
// rewrites the File's own bytes and may overwrite what another client
// wrote to the same range in between; writes of the File itself wait
// while it runs, so it never puts older bytes over newer ones. A truncate
// drops what the Files keep past the new end.
//
// [Policy].UnstableLimit (default 64 MiB) bounds the memory a File uses
// for these copies: once a write takes the File past half of it, the File
// commits what it holds in the background, as Sync does (a failure of
// that commit is reported by the next Sync), and a write that would take
// it past the limit waits for that commit; writes larger than a quarter of it go
// out in parts of that size, each checked the same way. Open with
// os.O_SYNC to make every WRITE FILE_SYNC instead (nothing is kept), at a
// cost in throughput.
//
// Reads and writes larger than the server's maxread/maxwrite (capped at
// 1 MiB) are split into several READs or WRITEs that are in flight at once,
// up to 16 per call. WRITE payloads are spliced into the outgoing record
// without copying.
//
// # pNFS
//
// Against a pNFS metadata server (EXCHANGE_ID with USE_PNFS_MDS, and an
// fs_layout_types attribute naming a layout type that package layout has
// a driver for), READ and WRITE go straight to the data servers. Set
// [Options].PNFSOff to send all I/O through the metadata server instead;
// with servers without pNFS nothing changes either way. Layout drivers
// are pluggable ([github.com/shoalfs/shoal/client/layout.Driver]): the
// client owns sessions, parallelism, commits, recalls and failover, a
// driver only decodes layouts and devices and maps file ranges onto data
// servers. Two are built in: the files layout (RFC 8881 §13) and the
// flexible files layout (RFC 8435, "Mirrors: the flexible files layout"
// below). The Client uses the first type in the server's fs_layout_types
// that has a driver; Shoal's MDS lists one type per export (`layout:
// files | flexfiles`), so the export decides.
//
// A File asks for a layout (LAYOUTGET, iomode RW when opened for writing,
// READ otherwise, with a GETATTR of the size) on its first read or write,
// and resolves its devices with GETDEVICEINFO, cached per device id for
// the Client's lifetime; a new device id, or NFS4ERR_NOENT, fetches again.
// Each data server gets one session of its own (EXCHANGE_ID with
// USE_PNFS_DS), shared by all Files and keyed by its addresses, with at
// most [Options].MaxPerDS requests in flight. ReadAt and WriteAt are split
// at stripe-unit boundaries and at 1 MiB, and all pieces are issued at
// once, to every data server in parallel. Writes are UNSTABLE; Sync and
// Close COMMIT on every data server that got data (in parallel), then send
// LAYOUTCOMMIT with the last write offset and mtime, which the metadata
// server needs even after stable writes because data servers answer
// DATA_SYNC. Data a data server's COMMIT does not vouch for (it could not
// be reached, or its write verifier changed: it restarted, or with
// replicated stripes a copy it forwarded the data to restarted) is written
// again through the metadata server, as described above. Data servers do
// not know the file size and zero-fill past it, so reads are capped at
// the size this File knows (from the metadata server at open or
// LAYOUTGET, and its own writes since), refreshed with GETATTR when a read
// goes past it.
//
// The server keeps one layout stateid per client and file, shared by all
// Files of a Client that hold a layout of the file, and moves its seqid at
// every LAYOUTGET and recall. The Client tracks the newest one it has seen
// (from LAYOUTGET replies and CB_LAYOUTRECALL) and sends it in LAYOUTGET
// (the open stateid only when it holds no layout state of the file),
// LAYOUTCOMMIT and LAYOUTRETURN. A recall moves the seqid before its
// CB_LAYOUTRECALL reaches the client, so a LAYOUTCOMMIT sent in between
// gets NFS4ERR_OLD_STATEID: the client then waits (up to 5 s) for the
// newer stateid and retries. If the server takes no layout stateid the
// Client holds (the layout state was returned or revoked), the range that
// ends the file, which the File still keeps, is written again through the
// metadata server, which records the size itself.
//
// Layouts are returned (LAYOUTRETURN) when the File is closed, unless
// another layout uses the same layout state (a newer layout of the File,
// or one of another File of the Client): the server's LAYOUTRETURN would
// take that away too. A CB_LAYOUTRECALL is answered at once, NFS4_OK for
// a layout held and NFS4ERR_NOMATCHING_LAYOUT otherwise; the layout then
// takes no new I/O, and once the I/O in flight on it is done it is
// committed and returned in the background. The next I/O asks for a new
// layout; while the server refuses one (NFS4ERR_RECALLCONFLICT,
// NFS4ERR_LAYOUTTRYLATER, NFS4ERR_LAYOUTUNAVAILABLE) I/O goes through the
// metadata server and LAYOUTGET is retried with a bounded backoff.
//
// # Data server failures
//
// When a data server fails (connection refused or reset, no answer within
// a minute, or any error status), the failed piece is redone through the
// metadata server, which reaches the data through its own connections to
// the data servers; the layout is invalidated and returned, and the data
// server is left alone for a while (1 s, doubling to 30 s) while its pieces
// go through the metadata server. UNSTABLE data on a data server that
// cannot take a COMMIT any more is written again through the metadata
// server from the copy the File keeps (see "Consistency and durability").
// This needs the metadata server to reach a copy of the data: with one
// copy of each stripe unit (Shoal's default), if a data server is really
// gone its stripe units are unreadable and unwritable through the metadata
// server too and the I/O fails, while files with no stripe unit on it stay
// fully usable; with replicated stripes (`shoal mds --mirrors 2` or 3)
// the metadata server uses the other copies, and the loss of one data
// server costs the application no error.
//
// How long that takes is bounded:
//
//   - Connecting to a data server (TCP and session setup) is tried once per
//     address, for at most 5 s (or [Options].DialTimeout if shorter), and
//     not again for 1 s doubling to 30 s after a failure: a refused
//     connection fails over at once, an unanswered one after 5 s. A request
//     on an established session fails over after a minute without an
//     answer, at once if the connection is reset.
//   - Through the metadata server, NFS4ERR_DELAY on READ, WRITE and COMMIT
//     is retried for [Policy].IORetryTimeout (default 30 s) from the first
//     one. Shoal's metadata server answers NFS4ERR_DELAY for a stripe unit
//     on a data server that has been out of service for less than its
//     --ds-down-after (default 10 s) and NFS4ERR_IO after that, so a read
//     of a dead data server's stripe unit fails about 10 s after it died,
//     at once later on, and never later than IORetryTimeout.
//
// The error is then a [*DataServerError], wrapped in the *fs.PathError of
// the read or write: it names the data server (its address and its stripe
// index in the file's layout), says why it could not be used, and wraps the
// metadata server's error, so errors.Is(err, syscall.EIO) holds for
// NFS4ERR_IO. I/O that went through the metadata server without a layout
// (during the backoff after a failure, or because the metadata server
// refuses layouts of files with a stripe unit on a data server that is out
// of service: NFS4ERR_LAYOUTUNAVAILABLE) names the data server that the
// last layout the Client got for the file put the range on, if that data
// server failed since it last worked or cannot be connected to now (one
// more bounded dial). A Client that never got a layout of the file cannot
// name the data server: its error is the metadata server's, with the
// layout refusal noted.
//
// # Locks
//
// Each File has its own open owner and lock owner, so two Files conflict
// with each other even in one process, like Linux OFD locks and unlike
// POSIX process locks. Waiting locks poll with backoff; the client does not
// rely on CB_NOTIFY_LOCK.
//
// # Inside the package
//
// # Mirrors: the flexible files layout
//
// A flexfiles layout (RFC 8435) names one or more mirrors, each a whole
// copy of the file on its own data servers (striped in the layout's
// stripe unit when a mirror has several), and the client writes every
// copy itself: each piece of a write goes to one data server per mirror,
// all at once, with the stateid the layout gives for that data server.
// Reads go to one copy, the mirror the server rates most efficient, and
// move to the next copy when a data server fails. A data server that
// fails is reported to the metadata server with LAYOUTERROR (NFSv4.2),
// naming the device, the status and the operation; once the metadata
// server has accepted the report it no longer counts that copy (Shoal's
// MDS marks it stale and heals it later), so a write that the other
// mirrors took succeeds, the failed copy is skipped by the rest of the
// layout's I/O and not committed, and the layout is returned for one
// without it. A write never succeeds while a copy the layout named missed
// it and the metadata server does not know: when the report cannot be
// made (NFSv4.1 has no LAYOUTERROR) or is refused, the piece is written
// through the metadata server, which writes the copies it knows good, and
// the failure goes to the metadata server in the LAYOUTRETURN's error
// report (ff_ioerr4). A COMMIT that fails on one mirror is reported the
// same way while another mirror is left to vouch for the data; the data
// kept for a mirrored write is one copy, vouched for only when every copy
// not reported stale has committed it. FF_FLAGS_NO_LAYOUTCOMMIT skips
// the LAYOUTCOMMIT, FF_FLAGS_NO_IO_THRU_MDS makes a failed piece fail
// instead of going through the metadata server, FF_FLAGS_NO_READ_IO sends
// reads through the metadata server. A data server may speak another
// NFSv4 minor version than the metadata server, and a loosely coupled one
// is given the layout's synthetic uid and gid (a session of its own per
// identity). NFSv3 data servers (loose coupling with a plain NFS server,
// such as NFS-Ganesha) are spoken over internal/nfs3 with the layout's
// synthetic ids (dataserver_v3.go): READ, WRITE and COMMIT, their
// errors mapped to the NFSv4 status of the same meaning. The client names itself in EXCHANGE_ID (domain
// shoal.dev), which is how Shoal's MDS knows to give it layouts that
// stripe inside a mirror.
//
// The Client and File types are a façade over parts that each own one
// concern, for whoever works on the library:
//
//   - The session layer (session.go, slots.go, callback.go): an endpoint
//     is one connection, client ID and session with one server, with
//     SEQUENCE, the retries, reconnects (from the address list) and the
//     recovery of a lost session. The Client embeds the metadata server's
//     and is its stateHolder (reclaims, delegation bookkeeping); each data
//     server gets a bare endpoint (dataserver.go).
//   - pNFS: pnfs.go (device cache, layout stateids, recalls, kept
//     layouts), layoutstate.go (a File's layouts from LAYOUTGET to
//     LAYOUTRETURN), layoutio.go (the I/O engine over the extents a
//     layout.Driver maps a range to), mirror.go (the copies of an
//     extent: mirrored writes, read failover, error reports),
//     dataserver.go.
//   - The data path and its state: io.go (ReadAt, WriteAt, Sync), cache.go
//     and writeback.go (AccessCached and AccessODirect), unstable.go
//     (copies of UNSTABLE writes until a COMMIT vouches for them),
//     lock.go, deleg.go.
//
// Methods of those types that act for a File take the File as a
// parameter; the File's mu guards what they change of it.
//
// What the session and pNFS layers send in answer to what a server says
// is pinned down by the contract scripts in testdata/ (TestScripted),
// played against a server whose every answer the script dictates
// (package client/internal/scripted), with RFC 8881's rules in their
// comments.
//
// # Errors
//
// Server statuses come back as [*StatusError] (the operation and the
// nfsstat4), wrapped in *fs.PathError or *os.LinkError naming the path.
// StatusError.Is maps statuses to the standard sentinels and errnos, so
// errors.Is(err, fs.ErrNotExist), errors.Is(err, syscall.ENOTEMPTY) and
// errors.Is(err, syscall.EAGAIN) (a lock conflict) work as they do with the
// os package. Transport failures that outlast the reconnect logic wrap the
// rpc package's connection errors; operations on a closed Client or File
// return [ErrClosed].
package client
