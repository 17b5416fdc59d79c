// Package cluster ties Shoal's pNFS metadata server (MDS) to its data
// servers (DS): it implements both ends of the SHOAL_CONTROL protocol
// (spec/control.x), keeps the MDS's registry of data servers, and provides
// Striped, the MDS's store.Backend that keeps file data on the data servers.
//
// # Roles
//
// On the MDS, a [Registry] serves the calls DSes make (REGISTER, HEARTBEAT,
// CHECK_STATEID) and tracks which DSes are in service; [Striped] reads and
// writes file data on them with OBJ_* calls. On each DS, an [Agent] keeps
// the DS registered, serves the MDS's OBJ_*, FENCE, UNFENCE and DRAIN calls
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
//	REGISTER       DS→MDS    revision, join token, id, addrs, space, preferred index, boot verifier
//	                         → secret, stripe index, heartbeat interval, liveness window, registration no., fenced client ids
//	HEARTBEAT      DS→MDS    registration no., space → status
//	CHECK_STATEID  DS→MDS    ino, stateid[16], write → status, client id
//	OBJ_READ       MDS→DS    ino, offset, count → eof, object size, data
//	OBJ_WRITE      MDS→DS    ino, offset, stable, data → count, committed, boot verifier
//	OBJ_COMMIT     MDS→DS    ino → boot verifier
//	OBJ_TRUNCATE   MDS→DS    ino, size → status
//	OBJ_REMOVE     MDS→DS    ino → status
//	OBJ_GETSIZE    MDS→DS    ino → object size
//	FENCE/UNFENCE  MDS→DS    client id → status
//	DRAIN          MDS→DS    void → status
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
// revision is 2 (the REGISTER reply gained the liveness window) and the
// MDS speaks only it, so MDS and DSes must be upgraded together.
//
// # Stripe indexes
//
// Stripe unit k of inode ino lives on stripe index (k + ino) mod n, so a
// DS's index must never change while it holds data. The registry gives each
// DS ID an index for its lifetime: a DS that loses its connection keeps it;
// a DS re-registering after an MDS restart asks for it back (REGISTER's
// preferred index); and OpenRegistry records the ID→index map in a state
// file, so placement survives even the MDS and every DS restarting at once,
// when DSes come back in any order and remember nothing. DSes without an
// index are appended, never put in a hole that may belong to a DS yet to
// come back.
//
// n counts every index ever claimed (or is fixed by RegistryConfig.Width),
// so a DS being down makes its stripe units unavailable (ErrUnavailable)
// instead of silently remapping every file. Growing n remaps files already
// written; no data is rebalanced, so a cluster must reach its final width
// (Registry.WaitFor, or a fixed Width) before it stores data.
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
// is the MDS's, so REGISTER's reply carries it and the agent adopts it: an
// operator who widens it on the MDS does not also have to find every DS
// (AgentConfig.MissedBeats only overrides it, for tests or a DS meant to
// be more patient). The MDS's monitor in turn judges no DS when it ran late itself,
// since heartbeats may then be waiting unread. The agent reconnects with
// capped exponential backoff and re-registers, getting the current fence
// list in the REGISTER reply. Striped surfaces a down or failing DS as an
// error wrapping ErrUnavailable (or the DS's storage error); it never
// substitutes zeros for a DS it could not reach. Striped compares the boot
// verifiers in OBJ_WRITE and OBJ_COMMIT replies and reports ErrDataLost from
// Sync when a DS restarted with uncommitted writes.
//
// # Stateids and fencing
//
// The DS asks the MDS whether (stateid, ino, write) allows I/O and caches a
// positive answer for 2 s keyed by the stateid's "other" field, ino and
// write. FENCE drops the cached answers of a client and refuses its I/O with
// ErrFenced until UNFENCE. A fence racing with a check in flight wins
// whichever is processed first: the answer is cached only if the client is
// not fenced at that moment, and a later FENCE drops it. Registry.Fence
// returns once every connected DS has applied the fence, so the server's own
// checker refusing fenced clients closes the window.
//
// # Trust
//
// The control protocol uses AUTH_NONE. The MDS hands the cluster secret to
// any peer that registers, so either the control port must only be
// reachable from the cluster network or RegistryConfig.JoinToken must be
// set. CHECK_STATEID is answered only on registered connections.
package cluster
