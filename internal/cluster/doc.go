// Package cluster ties Shoal's pNFS metadata server (MDS) to its data
// servers (DS): it implements both ends of the SHOAL_CONTROL protocol
// (spec/control.x), keeps the MDS's registry of data servers, and provides
// Striped, the MDS's store.Backend that keeps file data on the data servers.
//
// # Roles
//
// On the MDS, a [Registry] serves the calls DSes make (REGISTER, HEARTBEAT,
// CHECK_STATEID, FILE_SIZE, ADMIN) and tracks the data servers; [Striped] reads and
// writes file data on them with OBJ_* calls. On each DS, an [Agent] keeps
// the DS registered, serves the MDS's OBJ_*, FENCE, UNFENCE and RETIRE calls
// from the DS's local store, and answers the DS's NFS server when it asks
// whether a client's stateid allows I/O ([Agent.CheckStateid]).
//
// # One connection per DS
//
// A DS dials the MDS once and the MDS calls it back over the same TCP
// connection (internal/rpc connections are full duplex). That means:
//
//   - the MDS needs no address book or dialer for DSes and works through
//     NAT and firewalls that only let DSes reach the MDS;
//   - "registered" and "connected" are the same fact: a registration is
//     bound to the connection it arrived on, so a dead connection takes the
//     DS out of service at once, and a stale DS cannot act for a newer
//     registration of the same ID (its HEARTBEATs get CTL_ERR_STALE_GEN);
//   - nothing has to be configured or secured twice: one port, one
//     peer, one place where the DS's liveness is decided.
//
// # Protocol
//
//	proc           dir       args → result
//	REGISTER       DS→MDS    revision, join secret, cluster id, id, addrs, space, boot verifier
//	                         → data filehandle key, cluster id, heartbeat interval, liveness window, registration no., fenced client ids
//	HEARTBEAT      DS→MDS    registration no., space, bytes read and written → status
//	CHECK_STATEID  DS→MDS    ino, stateid[16], write → status, client id
//	FILE_SIZE      DS→MDS    ino → the file's size (a READ past the DS's object)
//	ADMIN          admin→MDS join secret, command, JSON request → status, message, JSON body
//	OBJ_READ       MDS→DS    ino, offset, count → eof, object size, data
//	OBJ_WRITE      MDS→DS    ino, offset, stable, data → count, committed, boot verifier
//	OBJ_COMMIT     MDS→DS    ino → boot verifier
//	OBJ_TRUNCATE   MDS→DS    ino, size → status
//	OBJ_REMOVE     MDS→DS    ino → status
//	OBJ_GETSIZE    MDS→DS    ino → object size
//	FENCE/UNFENCE  MDS→DS    client id → status
//	RETIRE         MDS→DS    void → status (the DS was removed)
//	OBJ_PUNCH      MDS→DS    ino, offset, length → status
//	OBJ_ALLOCATE   MDS→DS    ino, offset, length, one position's extents → status
//	OBJ_SEEK       MDS→DS    ino, offset, data or hole, one position's extents → found, offset
//	OBJ_COPY       MDS→DS    source and destination ino and offset, length, stable, one position's extents → status
//	OBJ_LIST       MDS→DS    after, count → a page of the DS's object names, eof (the sweep of objects no file owns)
//	MAP            DS→MDS    ino → the file's stripe map and its members' addresses
//	MAP_CHANGED    MDS→DS    ino → status (drop the cached map)
//	REPLICA_FAILED DS→MDS    ino, gen, id → the map with id marked stale
//	OBJ_SUM        MDS→DS    ino, offset, length → SHA-256, object size (scrub)
//	REPLICA_WRITE  DS→DS     mac, ino, gen, offset, stable, data → count, verifier
//	REPLICA_COMMIT DS→DS     mac, ino, gen → verifier
//
// Objects are named by inode number and use sparse packing: file offset X is
// object offset X on whichever DS holds that stripe unit, so the MDS, the
// kernel client and Shoal's client address DSes with plain file offsets.
// OBJ_WRITE data is spliced into the outgoing record without copying and
// OBJ_READ data is sent from a pooled buffer released after the reply is
// written; each call carries at most 1 MiB so it always fits one record.
//
// # Versioning
//
// Incompatible wire changes get a new RPC program version; the current one
// is 1 and other versions are answered PROG_MISMATCH. Within version 1,
// REGISTER carries the DS's protocol revision and the MDS answers a revision
// it does not speak with CTL_ERR_VERSION and the range it does; the agent
// then stops (ErrVersion) rather than retrying forever. The current
// revision is 8 (spec/control.x lists what each brought) and the MDS
// speaks only it, so MDS and DSes must be upgraded together.
//
// # Membership and stripe maps
//
// A data server is known by a persistent identity that it keeps in its
// directory, never by a position: the registry's record (cluster id, every
// DS's id, last addresses and State) lives in the MDS's metadata engine
// (StateStore), so it survives MDS restarts and moves with an etcd-backed
// MDS. A DS's directory is bound to the cluster it first joined: REGISTER
// carries that cluster id and another cluster's MDS refuses it
// (ErrWrongCluster).
//
// Each regular file's striping is its stripe map (meta.StripeMap): the
// stripe unit, the ordered ids of its data servers and the position of
// stripe unit 0. Striped records it in the metadata engine when the file's
// data is first placed, over Registry.Placement (the Active DSes in
// service), and layouts, reads and writes all follow it. So:
//
//   - adding a DS changes nothing for existing files; new files use it;
//   - a DS that is down makes exactly the files whose maps name it
//     unavailable: their I/O is retried (pnfs.ErrUnavailable, NFS4ERR_DELAY) for
//     RegistryConfig.DownAfter and then fails (pnfs.ErrDataServerDown,
//     NFS4ERR_IO), and they get no layout; every other file is untouched;
//   - DSes re-registering after an MDS restart, in any order, find the
//     same placement.
//
// A DS's State is Active, Draining, Drained or Removed. Admin (admin.go)
// drains a DS online by moving each of its files (Striped.Move: recall and
// hold the file's layouts, copy the units that move, commit, read back and
// compare, switch the map with a compare-and-swap on its generation, remove
// the old objects), rebalances files onto DSes added later with the same
// machinery, and removes a drained DS, or with force a dead one, listing
// the files that lose stripes. A Removed DS is refused at REGISTER.
//
// # Replicated stripes
//
// A stripe map may keep up to three copies of each stripe unit
// (meta.StripeMap.Replicas): position p's units live on every member of
// p. The number comes from the file's policy (copied from its directory
// when it was created; `shoal admin policy`) or the cluster default
// (`shoal mds --mirrors`). The rules, each in one place:
//
//   - Writes through the MDS (Striped) go to every good member of the
//     unit's position; a member that cannot be reached is marked stale in
//     the map (markStale, before the write is acknowledged), and stale
//     copies are never read, written or named in a layout until healed.
//     Reads try the good members in order and fail over on unreachable
//     members and on checksum failures (store.ErrCorrupt).
//   - A layout names, for each position, its first good member in service.
//   - A client's WRITE to a data server lands in its ReplicaStore, which
//     writes locally and hands the same bytes to the position's other good
//     members with REPLICA_WRITE, in parallel (fan-out from the data server
//     the client chose: with striping each data server is that server for
//     1/n of the units, so each byte crosses the network once per extra
//     copy and the links stay balanced). A peer it cannot reach is
//     reported with REPLICA_FAILED and marked stale; the write succeeds.
//     COMMIT commits the peers too, and a peer whose verifier changed
//     (it restarted and may have lost UNSTABLE writes) makes the data
//     server change its own write verifier, so clients resend.
//   - Every map change goes through replaceMap: a compare-and-swap on the
//     map's generation, MAP_CHANGED to the data servers (they cache maps),
//     and a recall of the file's layouts.
//   - The healer (heal.go) resyncs stale copies on data servers in
//     service and replaces members that have been down for DownAfter or
//     were removed, per position, copying from a good member under the
//     file's layout hold, at a bounded rate. `shoal admin scrub` compares
//     the copies' checksums (OBJ_SUM) and repairs a damaged copy from a
//     good one.
//
// Data servers keep per-block CRC-32C checksums (store.LocalOptions
// .Checksums) and never return a block that fails them. Peers trust each
// other through the data filehandle key: REPLICA_WRITE and REPLICA_COMMIT
// carry an HMAC of their header with it (not of the data, which TCP's
// checksum and the block checksums cover).
//
// # Failure handling
//
// The registry's handler can share the MDS's NFS listener (route calls whose
// program is SHOAL_CONTROL to Registry.Handler) or have a listener of its
// own (Registry.Serve).
//
// A DS heartbeats every interval (from REGISTER, default 1 s); the MDS closes
// the connection of a DS that missed 3 intervals (RegistryConfig.MissedBeats),
// and a closed connection takes the DS out of service (a Left event, a new
// Generation). The agent waits for a slow heartbeat answer up to the same
// window since the last answer, rather than closing a live connection, and
// with it the MDS's object calls in flight, over one slow reply; only when
// the MDS has been silent for the whole window does it give up. The window
// is the MDS's, so REGISTER's reply carries it and the agent adopts it. The
// MDS's monitor in turn judges no DS when it ran late itself, since
// heartbeats may then be waiting unread. The agent reconnects with capped
// exponential backoff and re-registers, getting the current fence list in
// the REGISTER reply. Striped surfaces a down or failing DS as an error
// wrapping pnfs.ErrUnavailable, pnfs.ErrDataServerDown (a *DownError naming it) or
// the DS's storage error; it never substitutes zeros for a DS it could not
// reach. Striped compares the boot verifiers in OBJ_WRITE and OBJ_COMMIT
// replies and reports pnfs.ErrDataLost from Sync when a DS restarted with
// uncommitted writes.
//
// # Stateids and fencing
//
// The DS asks the MDS whether (stateid, ino, write) allows I/O and caches a
// positive answer for 2 s keyed by the stateid's "other" field, ino and
// write. FENCE drops the cached answers of a client and refuses its I/O with
// pnfs.ErrFenced until UNFENCE. A fence racing with a check in flight wins
// whichever is processed first: the answer is cached only if the client is
// not fenced at that moment, and a later FENCE drops it. Registry.Fence
// returns once every connected DS has applied the fence, so the server's own
// checker refusing fenced clients closes the window.
//
// While the MDS is away (restarting, failing over, or just unreachable),
// the DS keeps a positive answer for the MDS's lease (lease_ms in the
// REGISTER reply) and keeps its cached stripe maps: a client's layout
// stays valid until it is recalled or the client's lease runs out, and
// neither happens without the MDS. I/O the DS cannot vouch for then, a
// stateid it has no answer for or a file whose map it lacks, gets
// pnfs.ErrMDSUnreachable or pnfs.ErrNotMember, which send the client to the MDS
// (NFS4ERR_PNFS_NO_LAYOUT), never pnfs.ErrUnavailable, whose NFS4ERR_DELAY the
// Linux client answers with a 15 s pause. Registering again, with the same
// MDS or another, drops both caches: the new MDS's fence list and boot
// epoch decide from then on.
//
// # Several MDSes
//
// With failover, several MDSes share one metadata store and one of them
// leads in a term, a number that grows with every election
// (RegistryConfig.Leader; term 0 is an MDS that is not elected). A DS is
// given every MDS's address (AgentConfig.MDS) and registers with the one
// that accepts it, trying each for a few seconds from the last that
// worked: a standby does not listen, and an MDS that does not lead answers
// REGISTER and HEARTBEAT with CTL_ERR_NOT_LEADER (ErrNotLeader), which sends
// the DS on, as does a HEARTBEAT of a registration from an earlier term.
// The DS remembers the highest nonzero term it registered in, refuses a
// REGISTER reply of a lower one (a deposed leader that has not noticed),
// and answers the MDS's calls on a connection registered in a lower term
// with CTL_ERR_NOT_LEADER; it closes the old connection when it registers
// anyway.
//
// # Trust
//
// The control protocol uses AUTH_NONE; the credential is the cluster's join
// secret (LoadOrCreateJoinSecret: `shoal mds` creates DIR/join-secret on
// first start, mode 0600), which a DS presents in REGISTER and an operator
// in ADMIN. Without it nothing is handed out. A registered DS gets the data
// filehandle key, derived from the MDS's filehandle secret: it verifies and
// mints data filehandles only, never the MDS's own. CHECK_STATEID and
// FILE_SIZE are answered only on registered connections. The join secret
// travels in clear text: on an untrusted network, put the MDS's port
// behind a VPN or TLS tunnel.
package cluster
