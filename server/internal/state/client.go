package state

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"time"
)

// client is one client record (an incarnation of a client owner).
type client struct {
	id        ClientID
	owner     []byte
	verifier  [8]byte
	principal string
	confirmed bool
	lastRenew atomic.Int64 // unix nanoseconds of the last lease renewal

	// CREATE_SESSION single-slot replay cache (RFC 8881 section 18.36.4).
	csSeq   uint32
	csReply *CreateSessionResult

	sessions   map[SessionID]*Session
	opens      map[openKey]*openState
	lockOwners map[string]*lockOwner
	layouts    map[FileID]*layoutState
	delegs     map[FileID]*delegState // live delegations
	// revokedDelegs counts revoked delegations not yet freed; SEQUENCE
	// reads it without Manager.mu (SEQ4_STATUS_RECALLABLE_STATE_REVOKED).
	revokedDelegs atomic.Int32

	reclaimable bool // existed before the restart: may reclaim in grace
	reclaimDone bool // sent a global RECLAIM_COMPLETE

	// When CREATE_SESSION confirmed the record and when its global
	// RECLAIM_COMPLETE came (Recovery).
	confirmedAt, reclaimedAt time.Time
}

func (c *client) hasState() bool {
	return len(c.opens) > 0 || len(c.lockOwners) > 0 || len(c.delegs) > 0 || c.revokedDelegs.Load() > 0
}

// callbackUp reports whether the server can call the client back: one of
// its sessions has a connection bound to the back channel, and no
// callback on it has failed since. Caller holds Manager.mu.
func (c *client) callbackUp() bool {
	for _, s := range c.sessions {
		if s.callbackUp() {
			return true
		}
	}
	return false
}

func (c *client) renew(now time.Time) { c.lastRenew.Store(now.UnixNano()) }

func (c *client) expired(now time.Time, lease time.Duration) bool {
	return now.UnixNano()-c.lastRenew.Load() > int64(lease)
}

// ExchangeIDArgs are the inputs of EXCHANGE_ID that matter to state.
type ExchangeIDArgs struct {
	// OwnerID is co_ownerid; Verifier is co_verifier.
	OwnerID  []byte
	Verifier [8]byte
	// Principal identifies the caller's RPC credential (for example
	// "sys:0@host" or a Kerberos principal); compared for equality only.
	Principal string
	// Update is EXCHGID4_FLAG_UPD_CONFIRMED_REC_A.
	Update bool
}

// ExchangeIDResult is what EXCHANGE_ID returns to the client.
type ExchangeIDResult struct {
	ClientID ClientID
	// SequenceID is eir_sequenceid: the csa_sequence the next
	// CREATE_SESSION must carry.
	SequenceID uint32
	// Confirmed maps to EXCHGID4_FLAG_CONFIRMED_R.
	Confirmed bool
}

// maxOwnerLen bounds co_ownerid (NFS4_OPAQUE_LIMIT).
const maxOwnerLen = 1024

// ExchangeID implements the EXCHANGE_ID case analysis of RFC 8881
// section 18.35.5:
//
//   - update, no confirmed record: ErrNoEnt; verifier differs: ErrNotSame;
//     principal differs: ErrPerm; otherwise the confirmed record.
//   - confirmed record, same verifier and principal: that record (case 2).
//   - confirmed record, other principal: ErrClidInUse while the record
//     holds unexpired state, otherwise it is replaced (case 3).
//   - confirmed record, other verifier: client reboot; a new unconfirmed
//     record is made and the old one is purged when CREATE_SESSION
//     confirms the new one (case 5).
//   - only an unconfirmed record: it is replaced (case 4).
//   - nothing: a new unconfirmed record (case 1).
func (m *Manager) ExchangeID(ctx context.Context, a ExchangeIDArgs) (ExchangeIDResult, error) {
	if len(a.OwnerID) == 0 || len(a.OwnerID) > maxOwnerLen {
		return ExchangeIDResult{}, fmt.Errorf("%w: owner ID length %d", ErrInval, len(a.OwnerID))
	}
	now := m.clock.Now()
	var purged []PurgeInfo
	m.mu.Lock()
	res, err := m.exchangeIDLocked(ctx, a, now, &purged)
	m.mu.Unlock()
	m.notify(purged)
	return res, err
}

func (m *Manager) exchangeIDLocked(ctx context.Context, a ExchangeIDArgs, now time.Time, purged *[]PurgeInfo) (ExchangeIDResult, error) {
	key := string(a.OwnerID)
	e := m.owners[key]
	if e == nil {
		e = &ownerEntry{}
		m.owners[key] = e
	}
	conf := e.confirmed
	if a.Update {
		switch {
		case conf == nil:
			return ExchangeIDResult{}, ErrNoEnt
		case conf.verifier != a.Verifier:
			return ExchangeIDResult{}, ErrNotSame
		case conf.principal != a.Principal:
			return ExchangeIDResult{}, ErrPerm
		}
		conf.renew(now)
		return ExchangeIDResult{ClientID: conf.id, SequenceID: conf.csSeq + 1, Confirmed: true}, nil
	}
	if conf != nil {
		switch {
		case conf.principal != a.Principal:
			if (conf.hasState() || len(conf.sessions) > 0) && !conf.expired(now, m.lease) {
				return ExchangeIDResult{}, ErrClidInUse
			}
			*purged = append(*purged, m.purgeClient(ctx, conf, PurgeDestroyed, true))
			e = m.ownerEntryFor(key)
		case conf.verifier == a.Verifier:
			conf.renew(now)
			return ExchangeIDResult{ClientID: conf.id, SequenceID: conf.csSeq + 1, Confirmed: true}, nil
		}
		// Otherwise a client reboot: fall through and add an unconfirmed
		// record next to the confirmed one.
	}
	if u := e.unconfirmed; u != nil {
		*purged = append(*purged, m.purgeClient(ctx, u, PurgeDestroyed, false))
		e = m.ownerEntryFor(key)
	}
	m.nextClient++
	c := &client{
		id:         ClientID(uint64(m.epoch)<<32 | uint64(m.nextClient)),
		owner:      bytes.Clone(a.OwnerID),
		verifier:   a.Verifier,
		principal:  a.Principal,
		sessions:   make(map[SessionID]*Session),
		opens:      make(map[openKey]*openState),
		lockOwners: make(map[string]*lockOwner),
	}
	c.renew(now)
	m.clients[c.id] = c
	e.unconfirmed = c
	return ExchangeIDResult{ClientID: c.id, SequenceID: c.csSeq + 1}, nil
}

func (m *Manager) ownerEntryFor(key string) *ownerEntry {
	e := m.owners[key]
	if e == nil {
		e = &ownerEntry{}
		m.owners[key] = e
	}
	return e
}

// lookupClient finds a client ID. IDs from another boot and unknown IDs
// are stale. Caller holds mu.
func (m *Manager) lookupClient(id ClientID) (*client, error) {
	c := m.clients[id]
	if c == nil {
		return nil, ErrStaleClientID
	}
	return c, nil
}

// confirmedClient is lookupClient for operations that need a confirmed
// client (anything sent inside a session).
func (m *Manager) confirmedClient(id ClientID) (*client, error) {
	c, err := m.lookupClient(id)
	if err != nil {
		return nil, err
	}
	if !c.confirmed {
		return nil, ErrStaleClientID
	}
	return c, nil
}

// confirmLocked makes c the confirmed record of its owner: it persists the
// record, purges a previous incarnation and grants reclaim rights when the
// owner was known before the restart. Caller holds mu.
func (m *Manager) confirmLocked(ctx context.Context, c *client, purged *[]PurgeInfo) error {
	if m.store != nil {
		rec := clientRecord{ClientID: c.id, Verifier: c.verifier, Owner: c.owner, Principal: c.principal}
		if err := m.store.PutClient(ctx, c.owner, rec.marshal()); err != nil {
			return fmt.Errorf("%w: persisting client %#x: %v", ErrServerFault, uint64(c.id), err)
		}
	}
	key := string(c.owner)
	e := m.ownerEntryFor(key)
	if old := e.confirmed; old != nil && old != c {
		// The new record has replaced the old one in the store already.
		*purged = append(*purged, m.purgeClient(ctx, old, PurgeRebooted, false))
		e = m.ownerEntryFor(key)
	}
	e.confirmed = c
	if e.unconfirmed == c {
		e.unconfirmed = nil
	}
	c.confirmed = true
	c.confirmedAt = m.clock.Now()
	if r := m.reclaim[key]; r != nil && m.grace {
		c.reclaimable = true
	}
	return nil
}

// DestroyClientID implements DESTROY_CLIENTID: the client must have no
// sessions and no opens or locks left (ErrClientidBusy).
func (m *Manager) DestroyClientID(ctx context.Context, id ClientID) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	c, err := m.lookupClient(id)
	if err != nil {
		return err
	}
	if len(c.sessions) > 0 || c.hasState() {
		return ErrClientidBusy
	}
	m.purgeClient(ctx, c, PurgeDestroyed, true)
	return nil
}

// Renew renews the lease of a client. SEQUENCE renews implicitly; this is
// for callers that learn of client activity some other way.
func (m *Manager) Renew(id ClientID) error {
	m.mu.RLock()
	defer m.mu.RUnlock()
	c, err := m.lookupClient(id)
	if err != nil {
		return err
	}
	c.renew(m.clock.Now())
	return nil
}

// ReclaimComplete implements RECLAIM_COMPLETE. With oneFS set it only
// acknowledges (Shoal exports one file system). A second global
// RECLAIM_COMPLETE yields ErrCompleteAlready. When every client known
// before the restart has completed, the grace period ends early.
func (m *Manager) ReclaimComplete(id ClientID, oneFS bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	c, err := m.confirmedClient(id)
	if err != nil {
		return err
	}
	if oneFS {
		return nil
	}
	if c.reclaimDone {
		return ErrCompleteAlready
	}
	c.reclaimDone = true
	now := m.clock.Now()
	c.reclaimedAt = now
	if r := m.reclaim[string(c.owner)]; r != nil && c.reclaimable {
		r.done = true
	}
	m.maybeEndGraceLocked(now)
	return nil
}

// Recovery is where a confirmed client stands in its recovery with this
// server: the server answers a request the previous server carried out
// from its replay records only shortly after the client came back.
type Recovery struct {
	// Owner is co_ownerid, stable across the client's recoveries; it
	// must not be modified.
	Owner []byte
	// Confirmed is when CREATE_SESSION confirmed the client ID;
	// Reclaimed when its global RECLAIM_COMPLETE came, zero before.
	Confirmed, Reclaimed time.Time
}

// Recovery returns the recovery of the confirmed client id.
func (m *Manager) Recovery(id ClientID) (Recovery, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	c, err := m.confirmedClient(id)
	if err != nil {
		return Recovery{}, err
	}
	return Recovery{Owner: c.owner, Confirmed: c.confirmedAt, Reclaimed: c.reclaimedAt}, nil
}

// InGrace reports whether the server is in its post-restart grace period.
func (m *Manager) InGrace() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.maybeEndGraceLocked(m.clock.Now())
	return m.grace
}

func (m *Manager) maybeEndGraceLocked(now time.Time) {
	if !m.grace {
		return
	}
	if now.Before(m.graceEnd) {
		for _, r := range m.reclaim {
			if !r.done {
				return
			}
		}
	}
	m.grace = false
	m.log.Info("nfs4 state: grace period ended", "epoch", m.epoch)
}

// CheckNonReclaim reports whether client id may now do a non-reclaim
// locking operation (an OPEN other than CLAIM_PREVIOUS, LOCK, LOCKT): nil,
// or ErrGrace. Callers ask before a side effect (OPEN4_CREATE) that the
// refusal must not leave behind; Open and Lock check again.
func (m *Manager) CheckNonReclaim(id ClientID) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	c, err := m.lookupClient(id)
	if err != nil {
		return err
	}
	return m.checkGraceLocked(c, false)
}

// checkGraceLocked decides whether a reclaim (or non-reclaim) OPEN/LOCK
// may proceed now. Caller holds mu.
//
// Non-reclaim requests are refused with ErrGrace during the grace period
// (RFC 8881 §8.4.2.1), and always from a client ID that has not sent its
// global RECLAIM_COMPLETE yet, in or out of a grace period. RFC 8881
// §18.51.3 leaves no window for it: "Whenever a client establishes a new
// client ID and before it does the first non-reclaim operation that
// obtains a lock, it MUST send a RECLAIM_COMPLETE with rca_one_fs set to
// FALSE, even if there are no locks to reclaim. If non-reclaim locking
// operations are done before the RECLAIM_COMPLETE, an NFS4ERR_GRACE error
// will be returned." (pynfs RECC3; Linux nfsd and NFS-Ganesha refuse such
// OPENs the same way.) It matters most after an MDS failover: a client
// that comes back to the new leader takes no new state until it says it
// has reclaimed what it will.
func (m *Manager) checkGraceLocked(c *client, reclaim bool) error {
	now := m.clock.Now()
	m.maybeEndGraceLocked(now)
	if !reclaim {
		if m.grace || !c.reclaimDone {
			return ErrGrace
		}
		return nil
	}
	switch {
	case !m.grace:
		return ErrNoGrace
	case !c.reclaimable:
		return ErrReclaimBad
	case c.reclaimDone:
		return ErrNoGrace
	}
	return nil
}

// Sweep purges clients whose lease has expired, ends the grace period when
// due and, after grace, deletes the persisted records of clients that did
// not come back. It returns the number of clients purged. The OnPurge
// hook runs for each purged client after Manager locks are released.
func (m *Manager) Sweep(ctx context.Context) int {
	now := m.clock.Now()
	var purged []PurgeInfo
	m.mu.Lock()
	m.maybeEndGraceLocked(now)
	var victims []*client
	for _, c := range m.clients {
		if c.expired(now, m.lease) {
			victims = append(victims, c)
		}
	}
	slices.SortFunc(victims, func(a, b *client) int { return cmp.Compare(a.id, b.id) })
	for _, c := range victims {
		m.log.Info("nfs4 state: client lease expired", "clientid", fmt.Sprintf("%#x", uint64(c.id)))
		purged = append(purged, m.purgeClient(ctx, c, PurgeExpired, true))
	}
	if !m.grace && m.pruneRecords {
		m.pruneRecords = false
		for key := range m.reclaim {
			if e := m.owners[key]; e != nil && e.confirmed != nil {
				continue
			}
			if m.store != nil {
				if err := m.store.DeleteClient(ctx, []byte(key)); err != nil {
					m.log.Warn("nfs4 state: deleting stale client record", "err", err)
				}
			}
		}
		clear(m.reclaim)
	}
	revoked := m.revokeOverdueLayoutsLocked(now)
	revokedDelegs := m.revokeOverdueDelegsLocked(now)
	m.mu.Unlock()
	m.notify(purged)
	for _, d := range revokedDelegs {
		m.log.Info("nfs4 state: delegation recall not answered within the lease; delegation revoked",
			"clientid", fmt.Sprintf("%#x", uint64(d.ClientID)), "file", uint64(d.File), "type", d.Type.String())
		if m.onRevokeDeleg != nil {
			m.onRevokeDeleg(d)
		}
	}
	if m.onRevoke != nil {
		for _, id := range revoked {
			m.log.Info("nfs4 state: layout recall not answered within the lease; layouts revoked", "clientid", fmt.Sprintf("%#x", uint64(id)))
			m.onRevoke(id)
		}
	}
	return len(victims)
}

// Run sweeps every quarter lease until ctx is done.
func (m *Manager) Run(ctx context.Context) error {
	t := time.NewTicker(max(m.lease/4, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			m.Sweep(ctx)
		}
	}
}

func (m *Manager) notify(purged []PurgeInfo) {
	if m.onPurge == nil {
		return
	}
	for _, p := range purged {
		m.onPurge(p)
	}
}

// purgeClient discards a client record with all its sessions, opens and
// locks. deleteRecord removes the persisted record too. Caller holds mu.
func (m *Manager) purgeClient(ctx context.Context, c *client, why PurgeReason, deleteRecord bool) PurgeInfo {
	info := PurgeInfo{ClientID: c.id, Reason: why}
	files := make(map[FileID]struct{})
	for id, s := range c.sessions {
		delete(m.sessions, id)
		s.kill()
		info.Sessions = append(info.Sessions, id)
	}
	clear(c.sessions)
	slices.SortFunc(info.Sessions, func(a, b SessionID) int { return bytes.Compare(a[:], b[:]) })
	for _, o := range c.opens {
		files[o.file.id] = struct{}{}
		if why == PurgeExpired {
			m.expired.add(o.sid.Other)
			for ls := range o.locks {
				m.expired.add(ls.sid.Other)
			}
		}
		m.removeOpen(o)
	}
	for _, lo := range c.lockOwners {
		for _, ls := range lo.states {
			files[ls.file.id] = struct{}{}
			m.removeLockState(ls)
		}
	}
	for f := range c.layouts {
		files[f] = struct{}{}
	}
	m.dropClientLayoutsLocked(c)
	for _, f := range m.dropClientDelegsLocked(c, why == PurgeExpired) {
		files[f] = struct{}{}
	}
	for f := range files {
		info.Files = append(info.Files, f)
	}
	slices.Sort(info.Files)
	delete(m.clients, c.id)
	key := string(c.owner)
	if e := m.owners[key]; e != nil {
		if e.confirmed == c {
			e.confirmed = nil
		}
		if e.unconfirmed == c {
			e.unconfirmed = nil
		}
		if e.confirmed == nil && e.unconfirmed == nil {
			delete(m.owners, key)
		}
	}
	if deleteRecord && c.confirmed && m.store != nil {
		if err := m.store.DeleteClient(ctx, c.owner); err != nil {
			m.log.Warn("nfs4 state: deleting client record", "clientid", fmt.Sprintf("%#x", uint64(c.id)), "err", err)
		}
	}
	return info
}
