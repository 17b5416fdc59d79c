package state

import (
	"errors"
	"fmt"
)

// Sentinel errors. Each maps to exactly one NFSv4.1 status code; the
// COMPOUND dispatcher translates them with errors.Is (the state layer never
// sees wire types). Errors returned by this package may wrap these sentinels
// with context, and *LockDeniedError matches ErrDenied.
//
// The stateid verdicts that a data server also hears from the metadata
// server (pnfs.ErrBadStateid, ErrOldStateid, ErrStaleStateid, ErrExpired,
// ErrOpenMode) are package pnfs's, declared there once for both sides of
// the MDS/DS seam; this package returns them as they are.
//
//	Error                    NFS4ERR_*                  Produced by
//	-----------------------  -------------------------  ----------------------------------
//	ErrStaleClientID         STALE_CLIENTID   (10022)   unknown/previous-boot client ID
//	ErrClidInUse             CLID_INUSE       (10017)   EXCHANGE_ID/CREATE_SESSION principal clash
//	ErrClientidBusy          CLIENTID_BUSY    (10074)   DESTROY_CLIENTID with sessions/state
//	ErrNoEnt                 NOENT            (2)       EXCHANGE_ID update of unknown owner
//	ErrNotSame               NOT_SAME         (10027)   EXCHANGE_ID update with other verifier
//	ErrPerm                  PERM             (1)       EXCHANGE_ID update with other principal
//	ErrBadSession            BADSESSION       (10052)   unknown session ID
//	ErrBadSlot               BADSLOT          (10053)   slot ID beyond the slot table
//	ErrSeqMisordered         SEQ_MISORDERED   (10063)   SEQUENCE/CREATE_SESSION seqid gap
//	ErrRetryUncachedRep      RETRY_UNCACHED_REP (10068) retry of a reply that was not cached
//	ErrSeqFalseRetry         SEQ_FALSE_RETRY  (10076)   retry whose request differs
//	ErrRepTooBigToCache      REP_TOO_BIG_TO_CACHE (10066) Slot.Complete over ca_maxresponsesize_cached
//	ErrDelay                 DELAY            (10008)   retry of a request still in progress
//	ErrConnNotBound          CONN_NOT_BOUND_TO_SESSION (10055) reserved for the dispatcher
//	pnfs.ErrBadStateid       BAD_STATEID      (10025)   unknown stateid, future seqid, wrong client/file
//	pnfs.ErrOldStateid       OLD_STATEID      (10024)   seqid older than current
//	pnfs.ErrStaleStateid     STALE_STATEID    (10023)   stateid from a previous boot
//	pnfs.ErrExpired          EXPIRED          (10011)   stateid revoked by lease expiry
//	ErrShareDenied           SHARE_DENIED     (10015)   OPEN share reservation conflict
//	ErrLocked                LOCKED           (10012)   special-stateid I/O blocked by a deny mode
//	ErrDenied                DENIED           (10010)   LOCK/LOCKT conflict (see *LockDeniedError)
//	ErrLocksHeld             LOCKS_HELD       (10037)   CLOSE/FREE_STATEID while locks remain
//	pnfs.ErrOpenMode         OPENMODE         (10038)   I/O or lock not allowed by the open's access
//	ErrInval                 INVAL            (22)      bad share bits, bad range, non-subset downgrade
//	ErrGrace                 GRACE            (10013)   non-reclaim OPEN/LOCK/LOCKT during grace
//	ErrNoGrace               NO_GRACE         (10033)   reclaim outside grace / after RECLAIM_COMPLETE
//	ErrReclaimBad            RECLAIM_BAD      (10034)   reclaim by a client unknown before restart
//	ErrCompleteAlready       COMPLETE_ALREADY (10054)   second global RECLAIM_COMPLETE
//	ErrServerFault           SERVERFAULT      (10006)   ClientStore failure
var (
	ErrStaleClientID    = errors.New("nfs4 state: stale client ID")
	ErrClidInUse        = errors.New("nfs4 state: client ID in use by another principal")
	ErrClientidBusy     = errors.New("nfs4 state: client ID still has sessions or state")
	ErrNoEnt            = errors.New("nfs4 state: no confirmed client record to update")
	ErrNotSame          = errors.New("nfs4 state: verifier does not match confirmed record")
	ErrPerm             = errors.New("nfs4 state: principal does not match confirmed record")
	ErrBadSession       = errors.New("nfs4 state: bad session")
	ErrBadSlot          = errors.New("nfs4 state: bad slot")
	ErrSeqMisordered    = errors.New("nfs4 state: sequence ID misordered")
	ErrRetryUncachedRep = errors.New("nfs4 state: retry of uncached reply")
	ErrSeqFalseRetry    = errors.New("nfs4 state: false retry")
	ErrRepTooBigToCache = errors.New("nfs4 state: reply too big to cache")
	ErrDelay            = errors.New("nfs4 state: request in progress, retry later")
	ErrConnNotBound     = errors.New("nfs4 state: connection not bound to session")
	ErrShareDenied      = errors.New("nfs4 state: share reservation denied")
	ErrLocked           = errors.New("nfs4 state: I/O conflicts with a share reservation")
	ErrDenied           = errors.New("nfs4 state: lock denied")
	ErrLocksHeld        = errors.New("nfs4 state: locks held")
	ErrInval            = errors.New("nfs4 state: invalid argument")
	ErrGrace            = errors.New("nfs4 state: server in grace period")
	ErrNoGrace          = errors.New("nfs4 state: reclaim outside grace period")
	ErrReclaimBad       = errors.New("nfs4 state: reclaim not allowed for this client")
	ErrCompleteAlready  = errors.New("nfs4 state: RECLAIM_COMPLETE already done")
	ErrServerFault      = errors.New("nfs4 state: server fault")
)

// LockDeniedError reports the conflicting lock for LOCK and LOCKT
// (the LOCK4denied result). It matches ErrDenied under errors.Is.
type LockDeniedError struct {
	Offset uint64
	// Length is the conflicting range length; LengthToEOF means "to EOF".
	Length uint64
	Type   LockType
	Owner  LockOwner
}

func (e *LockDeniedError) Error() string {
	return fmt.Sprintf("nfs4 state: lock denied: conflicts with %v lock [%d, +%d) held by client %#x", e.Type, e.Offset, e.Length, uint64(e.Owner.ClientID))
}

// Is makes errors.Is(err, ErrDenied) true.
func (e *LockDeniedError) Is(target error) bool { return target == ErrDenied }
