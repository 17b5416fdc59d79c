// Package state is the NFSv4.1 server state machine of Shoal: client
// records, sessions with their slot tables and reply cache, stateids,
// opens with share reservations, byte-range locks, leases and the grace
// period after a restart. It knows nothing about XDR; the COMPOUND
// dispatcher decodes arguments, calls the Manager and maps the returned
// errors to NFS4ERR codes (see the table on the error variables).
//
// # Model
//
// A client owner (co_ownerid) has at most one confirmed and one
// unconfirmed client record. EXCHANGE_ID creates unconfirmed records; the
// first CREATE_SESSION confirms one, persists it through ClientStore and
// discards the previous incarnation of the same owner together with all of
// its state. Client IDs and stateids embed the boot epoch, so anything
// minted by a previous boot is recognised as stale rather than unknown.
//
// State hangs off the client: sessions, opens keyed by (open-owner, file)
// and lock-owners, each with one lock stateid per file. A lock stateid
// remembers the open it was derived from, which is how CLOSE knows whether
// locks are still held. Per file, the Manager keeps the set of opens (for
// share reservation checks across all clients) and the sorted list of
// held byte ranges (for lock conflicts). Locks are POSIX-style and
// advisory: READ and WRITE do not consult them.
//
// Leases are renewed by every SEQUENCE. Nothing expires by itself: Sweep
// (or Run, which calls it periodically) purges clients whose lease has
// run out and reports them through Config.OnPurge, so the server can
// release whatever it associated with them. Time comes from a Clock so
// tests move it explicitly.
//
// After a restart with persisted clients, the Manager is in grace for one
// lease period: only reclaims (CLAIM_PREVIOUS opens, reclaim locks) from
// clients that existed before the restart are accepted; other OPEN, LOCK
// and LOCKT requests get ErrGrace. Grace ends early when every previous
// client has sent RECLAIM_COMPLETE. In or out of grace, a client ID that
// has not sent its global RECLAIM_COMPLETE gets ErrGrace for them (RFC 8881
// §18.51.3): every client sends it once after CREATE_SESSION.
//
// The reply cache is bounded: one reply per slot, each at most the
// negotiated ca_maxresponsesize_cached bytes, so a session costs at most
// slots × that size. Slot.Complete copies the reply.
//
// Layout stateids (layout.go) track each client's layouts per file, with
// recall, return and revocation of clients that do not return in time.
// They are not persisted: after a restart a layout stateid reads as
// stale (of an earlier boot), which the server tells apart from one
// returned or revoked in this boot.
//
// Delegation stateids (deleg.go) are granted by Delegate and recalled
// through BreakDelegations (and inside Open, atomically with the share
// check): the rules of when a delegation is safe and which operations
// conflict with it are all in deleg.go. Revoked delegations stay in the
// table until FREE_STATEID so that their use reads as revoked, and
// SEQUENCE reports them (SequenceResult.DelegRevoked). Like layouts,
// they are not persisted: no new delegation is granted during grace, but
// a client reclaiming its open with the delegation it held gets it back
// (ReclaimDelegation).
//
// # Locking
//
// One RWMutex (Manager.mu) guards clients, stateids, opens and locks:
// state operations are short, and CheckIO, the per-I/O path, only takes
// the read side. Each Session has its own mutex for its slot table and
// connection bindings, so SEQUENCE and Slot.Complete run concurrently
// across sessions under the Manager read lock at most. Lease timestamps
// are atomics. The order is Manager.mu before Session.mu; Session methods
// never take Manager.mu. ClientStore calls happen under Manager.mu (they
// are rare: confirmation and removal of clients), and the OnPurge hook is
// called with no lock held.
package state
