package state

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/shoalfs/shoal/pnfs"
)

// Delegations (RFC 8881 §10.4). A client holds at most one delegation per
// file, read or write, named by a delegation stateid kept in its own
// table next to opens and layouts. This file is the one place that says
// when a delegation may be granted and which operations conflict with it:
//
//   - A read delegation needs no open for writing of the file by another
//     client and no write delegation elsewhere; a write delegation needs
//     no open and no delegation of the file by another client at all.
//     Neither is granted during grace (except the one a client reclaims,
//     ReclaimDelegation), to a client whose callback path is
//     down, while a delegation of the file is being recalled, or to a
//     client that had one of the file recalled within the last
//     recallCooloff (so a file two clients take turns on does not bounce
//     between them).
//   - Another client's OPEN (checked inside Open), and the server's
//     BreakDelegations for SETATTR, REMOVE, RENAME, LINK and I/O under
//     special stateids, conflict with a write delegation whatever they
//     do, and with a read delegation when they write. The first conflict
//     starts the recall (deadline: one lease) and returns a *RecallError,
//     which the server answers with NFS4ERR_DELAY after sending CB_RECALL
//     to the holders it lists; the client retries until DELEGRETURN
//     removed the delegation. A holder's own operations never conflict.
//   - A delegation not returned within a lease of its recall is revoked
//     by Sweep: it stays in the table, marked revoked, so that its use
//     yields ErrDelegRevoked and SEQUENCE raises
//     SEQ4_STATUS_RECALLABLE_STATE_REVOKED, until the client frees it
//     with FREE_STATEID.
//   - A purged client's delegations go with it (as expired stateids when
//     its lease ran out).

// DelegType is the kind of a delegation.
type DelegType uint8

const (
	DelegRead  DelegType = 1
	DelegWrite DelegType = 2
)

func (t DelegType) String() string {
	switch t {
	case DelegRead:
		return "read"
	case DelegWrite:
		return "write"
	}
	return fmt.Sprintf("DelegType(%d)", uint8(t))
}

// NoDelegReason says why Delegate granted nothing; the server maps it to
// a WND4_* value for a client that expressed a want.
type NoDelegReason int

const (
	// NoDelegContention: conflicting opens or delegations of other
	// clients, a recall of the file in progress, or a recent recall from
	// this client (WND4_CONTENTION).
	NoDelegContention NoDelegReason = iota + 1
	// NoDelegResource: the callback path is down, or the server is in
	// grace (WND4_RESOURCE).
	NoDelegResource
	// NoDelegUpgrade: the client holds a read delegation and wants a
	// write one (WND4_NOT_SUPP_UPGRADE).
	NoDelegUpgrade
)

var (
	// ErrDelegRevoked is NFS4ERR_DELEG_REVOKED (10087): the delegation was
	// revoked after its recall went unanswered.
	ErrDelegRevoked = errors.New("nfs4 state: delegation revoked")
)

// RecallError is the answer to an operation that conflicts with other
// clients' delegations: the caller answers NFS4ERR_DELAY (it matches
// ErrDelay) and sends CB_RECALL to Holders, which lists the delegations
// whose recall should be sent now (new recalls, and old ones last sent
// more than recallResend ago). An empty Holders means every recall was
// sent recently.
type RecallError struct {
	Holders []DelegHolder
}

func (e *RecallError) Error() string {
	return fmt.Sprintf("nfs4 state: %d conflicting delegations being recalled", len(e.Holders))
}

// Is makes errors.Is(err, ErrDelay) true.
func (e *RecallError) Is(target error) bool { return target == ErrDelay }

// DelegHolder describes one delegation, for a recall or CB_GETATTR.
type DelegHolder struct {
	ClientID ClientID
	Stateid  Stateid
	File     FileID
	Type     DelegType
	// FH is the filehandle the client opened the file by, for CB_RECALL.
	FH []byte
	// Sessions of the client, to send the callback on.
	Sessions []SessionID
}

const (
	// recallResend paces CB_RECALL resends while a conflicting operation
	// is retried.
	recallResend = time.Second
	// recallCooloffMax bounds how long a client that had a delegation of
	// a file recalled gets none of that file again.
	recallCooloffMax = 5 * time.Second
	// maxRecent bounds the recent-recall memory.
	maxRecent = 1 << 14
)

type delegState struct {
	sid       Stateid
	client    *client
	file      FileID
	fh        []byte
	typ       DelegType
	recalling bool
	deadline  time.Time // recall must be answered by then
	lastSent  time.Time // last CB_RECALL handed out
	revoked   bool
}

type recentKey struct {
	client ClientID
	file   FileID
}

func (d *delegState) holder() DelegHolder {
	h := DelegHolder{ClientID: d.client.id, Stateid: d.sid, File: d.file, Type: d.typ, FH: d.fh}
	for id := range d.client.sessions {
		h.Sessions = append(h.Sessions, id)
	}
	return h
}

// recallCooloff is how long a client gets no delegation of a file after
// one was recalled from it.
func (m *Manager) recallCooloff() time.Duration { return min(m.lease/2, recallCooloffMax) }

// DelegArgs are the inputs of Delegate.
type DelegArgs struct {
	ClientID ClientID
	File     FileID
	// FH is the filehandle the client knows the file by.
	FH []byte
	// Type is the delegation wanted; Fallback allows a read delegation
	// when a write one cannot be granted (OPEN4_SHARE_ACCESS_WANT_ANY_DELEG).
	Type     DelegType
	Fallback bool
	// Since is what BreakSeq returned before the operation looked the
	// file up (0: no check). A conflicting operation of another client
	// that began since then, such as a REMOVE that ran between the
	// lookup and the grant, may have changed the file under the
	// attributes the reply carries, so no delegation is granted.
	Since uint64
}

// breakMark is when a conflicting operation on a file last began.
type breakMark struct {
	seq uint64
	at  time.Time
}

// breakMemory is how long lastBreak remembers a file: far longer than an
// OPEN takes from its lookup to its grant.
const breakMemory = time.Minute

// minBreakPrune is the size of lastBreak below which it is never pruned.
const minBreakPrune = 4096

// BreakSeq returns the number of the last conflicting operation begun, to
// pass as DelegArgs.Since.
// It costs one atomic load, so every COMPOUND can take it.
func (m *Manager) BreakSeq() uint64 {
	return m.breakSeq.Load() + 1 // never 0, which means "no check"
}

// DelegGrant is a granted delegation.
type DelegGrant struct {
	Stateid Stateid
	Type    DelegType
}

// Delegate grants client a.ClientID a delegation of a.File when it is safe
// (see the rules above), or tells why not. A client that holds a
// delegation of the file already gets the same one again if it covers
// what it asks for.
func (m *Manager) Delegate(a DelegArgs) (DelegGrant, NoDelegReason, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	c, err := m.confirmedClient(a.ClientID)
	if err != nil {
		return DelegGrant{}, 0, err
	}
	now := m.clock.Now()
	m.maybeEndGraceLocked(now)
	if m.grace || !c.callbackUp() {
		return DelegGrant{}, NoDelegResource, nil
	}
	if d := c.delegs[a.File]; d != nil {
		switch {
		case d.revoked || d.recalling:
			return DelegGrant{}, NoDelegContention, nil
		case d.typ == DelegWrite || a.Type == DelegRead:
			return DelegGrant{Stateid: d.sid, Type: d.typ}, 0, nil
		case a.Fallback:
			return DelegGrant{Stateid: d.sid, Type: d.typ}, 0, nil
		}
		return DelegGrant{}, NoDelegUpgrade, nil
	}
	if t, ok := m.recent[recentKey{c.id, a.File}]; ok && now.Sub(t) < m.recallCooloff() {
		return DelegGrant{}, NoDelegContention, nil
	}
	if b, ok := m.lastBreak[a.File]; ok && a.Since != 0 && b.seq >= a.Since {
		return DelegGrant{}, NoDelegContention, nil
	}
	for id := range m.holds[a.File] {
		if id != c.id {
			// Another client's operation that changes the file is
			// under way.
			return DelegGrant{}, NoDelegContention, nil
		}
	}
	typ := a.Type
	if !m.delegAllowedLocked(c, a.File, typ) {
		if typ != DelegWrite || !a.Fallback || !m.delegAllowedLocked(c, a.File, DelegRead) {
			return DelegGrant{}, NoDelegContention, nil
		}
		typ = DelegRead
	}
	d := m.addDelegLocked(c, a.File, a.FH, typ)
	return DelegGrant{Stateid: d.sid, Type: typ}, 0, nil
}

// ReclaimDelegation gives back, during grace, the delegation a client
// held before the server restarted and names in its OPEN with
// CLAIM_PREVIOUS (RFC 8881 §10.2.1): the Linux client keeps locks under a
// delegation without telling the server, and reclaims none of them when
// it does not get the delegation back. Delegations are not persisted, so
// the claim is trusted, as open reclaims are. recall says the client
// must return it at once (the reply's recall flag): it conflicts with
// what other clients reclaimed, its callback path is down, or force is
// set (the server grants no delegations now); the client then sends its
// locks and returns it, and if it does not, the delegation is revoked a
// lease later as after any recall.
func (m *Manager) ReclaimDelegation(a DelegArgs, force bool) (g DelegGrant, recall bool, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	c, err := m.confirmedClient(a.ClientID)
	if err != nil {
		return DelegGrant{}, false, err
	}
	if err := m.checkGraceLocked(c, true); err != nil {
		return DelegGrant{}, false, err
	}
	if d := c.delegs[a.File]; d != nil {
		return DelegGrant{Stateid: d.sid, Type: d.typ}, d.recalling, nil
	}
	recall = force || !c.callbackUp() || !m.delegAllowedLocked(c, a.File, a.Type)
	d := m.addDelegLocked(c, a.File, a.FH, a.Type)
	if recall {
		now := m.clock.Now()
		d.recalling = true
		d.deadline = now.Add(m.lease)
		d.lastSent = now // the reply's recall flag is the recall
	}
	return DelegGrant{Stateid: d.sid, Type: d.typ}, recall, nil
}

// addDelegLocked records a new delegation. Caller holds mu.
func (m *Manager) addDelegLocked(c *client, file FileID, fh []byte, typ DelegType) *delegState {
	d := &delegState{sid: m.newStateid(TypeDeleg), client: c, file: file, fh: append([]byte(nil), fh...), typ: typ}
	if m.delegs == nil {
		m.delegs = make(map[FileID]map[*delegState]struct{})
		m.delegIDs = make(map[[12]byte]*delegState)
	}
	set := m.delegs[file]
	if set == nil {
		set = make(map[*delegState]struct{})
		m.delegs[file] = set
	}
	set[d] = struct{}{}
	m.delegIDs[d.sid.Other] = d
	if c.delegs == nil {
		c.delegs = make(map[FileID]*delegState)
	}
	c.delegs[file] = d
	return d
}

// delegAllowedLocked applies the conflict rules of a new delegation of
// type t of file to client c. Caller holds mu.
func (m *Manager) delegAllowedLocked(c *client, file FileID, t DelegType) bool {
	for d := range m.delegs[file] {
		if d.recalling {
			return false
		}
		if d.client != c && (t == DelegWrite || d.typ == DelegWrite) {
			return false
		}
	}
	if f := m.files[file]; f != nil {
		for o := range f.opens {
			if o.client == c {
				continue
			}
			if t == DelegWrite || o.access&AccessWrite != 0 {
				return false
			}
		}
	}
	return true
}

// BreakDelegations checks an operation of client id on file against the
// delegations other clients hold: write says whether it changes the file
// (a SETATTR, REMOVE, RENAME, LINK or WRITE), which conflicts with read
// delegations too. It returns nil when nothing conflicts, else a
// *RecallError after starting the recall of the conflicting delegations.
// id 0 conflicts with every client's delegations.
//
// When nothing conflicts, it holds back new delegations of file to other
// clients until release is called, after the operation is done: a
// delegation granted between the check and the operation's change would
// miss its recall.
func (m *Manager) BreakDelegations(id ClientID, file FileID, write bool) (release func(), err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.markBreakLocked(file)
	if err := m.breakLocked(id, file, write); err != nil {
		return nil, err
	}
	if m.holds == nil {
		m.holds = make(map[FileID]map[ClientID]int)
	}
	if m.holds[file] == nil {
		m.holds[file] = make(map[ClientID]int)
	}
	m.holds[file][id]++
	var once sync.Once
	return func() {
		once.Do(func() {
			m.mu.Lock()
			defer m.mu.Unlock()
			h := m.holds[file]
			if h[id]--; h[id] <= 0 {
				delete(h, id)
			}
			if len(h) == 0 {
				delete(m.holds, file)
			}
		})
	}, nil
}

// markBreakLocked notes that a conflicting operation on file begins.
func (m *Manager) markBreakLocked(file FileID) {
	now := m.clock.Now()
	if m.lastBreak == nil {
		m.lastBreak = make(map[FileID]breakMark)
	}
	// Pruning scans the whole map, so it runs only when the map has
	// doubled since the last prune left it: amortized O(1) per mark even
	// when every entry is recent (a burst of creates and removes marks
	// thousands of files within breakMemory).
	if len(m.lastBreak) >= max(minBreakPrune, m.breakPruneAt) {
		for f, b := range m.lastBreak {
			if now.Sub(b.at) > breakMemory {
				delete(m.lastBreak, f)
			}
		}
		m.breakPruneAt = 2 * len(m.lastBreak)
	}
	m.lastBreak[file] = breakMark{seq: m.breakSeq.Add(1), at: now}
}

// breakLocked is BreakDelegations with mu held.
func (m *Manager) breakLocked(id ClientID, file FileID, write bool) error {
	var re *RecallError
	now := m.clock.Now()
	for d := range m.delegs[file] {
		if d.client.id == id || !write && d.typ == DelegRead {
			continue
		}
		if re == nil {
			re = &RecallError{}
		}
		if !d.recalling {
			d.recalling = true
			d.deadline = now.Add(m.lease)
			m.noteRecentLocked(d.client.id, file, now)
		}
		if d.lastSent.IsZero() || now.Sub(d.lastSent) >= recallResend {
			d.lastSent = now
			re.Holders = append(re.Holders, d.holder())
		}
	}
	if re == nil {
		return nil
	}
	return re
}

func (m *Manager) noteRecentLocked(id ClientID, file FileID, now time.Time) {
	if m.recent == nil {
		m.recent = make(map[recentKey]time.Time)
	}
	if len(m.recent) >= maxRecent {
		for k, t := range m.recent {
			if now.Sub(t) >= m.recallCooloff() {
				delete(m.recent, k)
			}
		}
		if len(m.recent) >= maxRecent {
			clear(m.recent)
		}
	}
	m.recent[recentKey{id, file}] = now
}

// lookupDelegLocked resolves a delegation stateid sent by client id.
// Caller holds mu.
func (m *Manager) lookupDelegLocked(id ClientID, sid Stateid) (*delegState, error) {
	if m.fromEarlierBoot(sid) {
		return nil, pnfs.ErrStaleStateid
	}
	d := m.delegIDs[sid.Other]
	switch {
	case d == nil && m.expired.has(sid.Other):
		return nil, pnfs.ErrExpired
	case d == nil:
		return nil, fmt.Errorf("%w: unknown delegation stateid", pnfs.ErrBadStateid)
	case d.client.id != id:
		return nil, fmt.Errorf("%w: delegation stateid of another client", pnfs.ErrBadStateid)
	case d.revoked:
		return nil, ErrDelegRevoked
	}
	if err := checkSeqid(sid.Seqid, d.sid.Seqid); err != nil {
		return nil, err
	}
	return d, nil
}

// CheckDeleg validates a delegation stateid of client id for file, as
// OPEN with CLAIM_DELEGATE_CUR or CLAIM_DELEG_CUR_FH presents it, and
// returns its type.
func (m *Manager) CheckDeleg(id ClientID, sid Stateid, file FileID) (DelegType, error) {
	if sid.IsSpecial() || sid.Type() != TypeDeleg {
		return 0, fmt.Errorf("%w: %v is not a delegation stateid", pnfs.ErrBadStateid, sid)
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	d, err := m.lookupDelegLocked(id, sid)
	if err != nil {
		return 0, err
	}
	if d.file != file {
		return 0, fmt.Errorf("%w: delegation stateid of another file", pnfs.ErrBadStateid)
	}
	return d.typ, nil
}

// checkDelegIOLocked is CheckIO for a delegation stateid: a read
// delegation allows READ, a write delegation READ and WRITE. A
// delegation being recalled still allows I/O (the holder flushes before
// returning it). Caller holds mu.
func (m *Manager) checkDelegIOLocked(id ClientID, sid Stateid, file FileID, write bool) error {
	d, err := m.lookupDelegLocked(id, sid)
	if err != nil {
		return err
	}
	if d.file != file {
		return fmt.Errorf("%w: delegation stateid is for another file", pnfs.ErrBadStateid)
	}
	if write && d.typ != DelegWrite {
		return pnfs.ErrOpenMode
	}
	return nil
}

// DelegReturn implements DELEGRETURN of sid on file.
func (m *Manager) DelegReturn(id ClientID, sid Stateid, file FileID) error {
	if sid.IsSpecial() || sid.Type() != TypeDeleg {
		if m.fromEarlierBoot(sid) && !sid.IsSpecial() {
			return pnfs.ErrStaleStateid
		}
		return fmt.Errorf("%w: %v is not a delegation stateid", pnfs.ErrBadStateid, sid)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, err := m.confirmedClient(id); err != nil {
		return err
	}
	d, err := m.lookupDelegLocked(id, sid)
	if err != nil {
		return err
	}
	if d.file != file {
		return fmt.Errorf("%w: delegation stateid of another file", pnfs.ErrBadStateid)
	}
	m.dropDelegLocked(d)
	return nil
}

// RecallRefused records a holder's answer to CB_RECALL that it does not
// hold the delegation (NFS4ERR_BAD_STATEID, NFS4ERR_BADHANDLE): it is
// dropped as if returned.
func (m *Manager) RecallRefused(sid Stateid) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if d := m.delegIDs[sid.Other]; d != nil && !d.revoked {
		m.dropDelegLocked(d)
	}
}

// dropDelegLocked forgets a delegation (returned, freed or purged).
func (m *Manager) dropDelegLocked(d *delegState) {
	delete(m.delegIDs, d.sid.Other)
	if d.revoked {
		d.client.revokedDelegs.Add(-1)
	} else {
		m.unlinkDelegLocked(d)
	}
}

// unlinkDelegLocked removes a delegation from its file and client, so it
// no longer conflicts with anything.
func (m *Manager) unlinkDelegLocked(d *delegState) {
	if s := m.delegs[d.file]; s != nil {
		delete(s, d)
		if len(s) == 0 {
			delete(m.delegs, d.file)
		}
	}
	if d.client.delegs[d.file] == d {
		delete(d.client.delegs, d.file)
	}
}

// revokeOverdueDelegsLocked revokes delegations whose recall deadline
// passed and returns them.
func (m *Manager) revokeOverdueDelegsLocked(now time.Time) []DelegHolder {
	var out []DelegHolder
	for _, set := range m.delegs {
		for d := range set {
			if d.recalling && now.After(d.deadline) {
				out = append(out, DelegHolder{ClientID: d.client.id, Stateid: d.sid, File: d.file, Type: d.typ})
				m.unlinkDelegLocked(d)
				d.revoked = true
				d.client.revokedDelegs.Add(1)
			}
		}
	}
	return out
}

// dropClientDelegsLocked forgets a purged client's delegations; expired
// says its lease ran out, so later use of the stateids is pnfs.ErrExpired.
func (m *Manager) dropClientDelegsLocked(c *client, expired bool) []FileID {
	var files []FileID
	for id, d := range m.delegIDs {
		if d.client != c {
			continue
		}
		if expired {
			m.expired.add(id)
		}
		files = append(files, d.file)
		m.dropDelegLocked(d)
	}
	return files
}

// freeDelegLocked is FREE_STATEID of a delegation stateid: a revoked one
// is forgotten; a live one is ErrLocksHeld (RFC 8881 §18.38.3: it must be
// returned with DELEGRETURN).
func (m *Manager) freeDelegLocked(id ClientID, sid Stateid) error {
	if m.fromEarlierBoot(sid) {
		return pnfs.ErrStaleStateid
	}
	d := m.delegIDs[sid.Other]
	if d == nil || d.client.id != id {
		return fmt.Errorf("%w: unknown delegation stateid", pnfs.ErrBadStateid)
	}
	if !d.revoked {
		return ErrLocksHeld
	}
	m.dropDelegLocked(d)
	return nil
}

// testDelegLocked is TEST_STATEID of a delegation stateid.
func (m *Manager) testDelegLocked(id ClientID, sid Stateid) error {
	_, err := m.lookupDelegLocked(id, sid)
	return err
}

// delegOwnerLocked returns the client of a live delegation stateid, for a
// data server's I/O check.
func (m *Manager) delegOwnerLocked(sid Stateid) (ClientID, bool) {
	d := m.delegIDs[sid.Other]
	if d == nil {
		return 0, false
	}
	return d.client.id, true
}

// WriteDelegation returns the write delegation another client than id
// holds of file and is not being recalled, for CB_GETATTR.
func (m *Manager) WriteDelegation(id ClientID, file FileID) (DelegHolder, bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	for d := range m.delegs[file] {
		if d.typ == DelegWrite && d.client.id != id && !d.recalling {
			return d.holder(), true
		}
	}
	return DelegHolder{}, false
}

// HasDelegations reports whether any delegation is outstanding, so that
// operations that would have to look a file up to check it for
// delegations can skip that when there are none.
func (m *Manager) HasDelegations() bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return len(m.delegs) > 0
}

// Delegations returns the number of delegations outstanding (granted and
// neither returned nor revoked).
func (m *Manager) Delegations() int {
	m.mu.RLock()
	defer m.mu.RUnlock()
	n := 0
	for _, s := range m.delegs {
		n += len(s)
	}
	return n
}
