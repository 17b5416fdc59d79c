package state

import (
	"fmt"

	"github.com/shoalfs/shoal/pnfs"
)

// Share access and deny bits (OPEN4_SHARE_ACCESS_*, OPEN4_SHARE_DENY_*).
const (
	AccessRead  uint32 = 1
	AccessWrite uint32 = 2
	AccessBoth  uint32 = 3

	DenyNone  uint32 = 0
	DenyRead  uint32 = 1
	DenyWrite uint32 = 2
	DenyBoth  uint32 = 3
)

// fileState is everything known about one file: its opens (share
// reservations) and its byte-range locks.
type fileState struct {
	id    FileID
	opens map[*openState]struct{}
	locks []*lockRange // sorted by first
}

func (m *Manager) file(id FileID) *fileState {
	f := m.files[id]
	if f == nil {
		f = &fileState{id: id, opens: make(map[*openState]struct{})}
		m.files[id] = f
	}
	return f
}

func (m *Manager) maybeDropFile(f *fileState) {
	if len(f.opens) == 0 && len(f.locks) == 0 {
		delete(m.files, f.id)
	}
}

type openKey struct {
	owner string
	file  FileID
}

// openState is the state of one (client, open-owner, file).
type openState struct {
	sid    Stateid
	client *client
	owner  string
	file   *fileState
	access uint32
	deny   uint32
	locks  map[*lockState]struct{} // lock stateids derived from this open
}

// stateRef is what a stateid names: exactly one field is set.
type stateRef struct {
	open *openState
	lock *lockState
}

// OpenArgs are the inputs of OPEN once the file is resolved.
type OpenArgs struct {
	ClientID ClientID
	Owner    []byte // open-owner
	File     FileID
	Access   uint32 // AccessRead|AccessWrite, want/deleg bits masked off
	Deny     uint32
	// Reclaim is CLAIM_PREVIOUS: re-establish an open held before a
	// server restart (only during grace).
	Reclaim bool
}

// OpenResult is the state granted by OPEN.
type OpenResult struct {
	Stateid Stateid
	// Access and Deny are the open's accumulated modes after this OPEN.
	Access, Deny uint32
}

func validShare(access, deny uint32) error {
	if access == 0 || access&^AccessBoth != 0 || deny&^DenyBoth != 0 {
		return fmt.Errorf("%w: share access %#x deny %#x", ErrInval, access, deny)
	}
	return nil
}

// Open implements the state part of OPEN. A second OPEN by the same
// open-owner of the same file upgrades the existing open: the modes are
// OR-ed and the stateid seqid is bumped. The combined modes are checked
// against every other open of the file, of any client (RFC 8881 section
// 9.7): a requested access that another open denies, or a requested deny
// of an access another open holds, yields ErrShareDenied. During grace,
// only reclaims are allowed (ErrGrace); see also ErrNoGrace, ErrReclaimBad.
func (m *Manager) Open(a OpenArgs) (OpenResult, error) {
	if err := validShare(a.Access, a.Deny); err != nil {
		return OpenResult{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	c, err := m.confirmedClient(a.ClientID)
	if err != nil {
		return OpenResult{}, err
	}
	if err := m.checkGraceLocked(c, a.Reclaim); err != nil {
		return OpenResult{}, err
	}
	// Other clients' delegations go first (deleg.go): any open conflicts
	// with a write delegation; an open for writing, or one that denies
	// anything (the holder's opens under a delegation are not on the
	// server to be checked against), with a read one.
	if err := m.breakLocked(c.id, a.File, a.Access&AccessWrite != 0 || a.Deny != DenyNone); err != nil {
		return OpenResult{}, err
	}
	f := m.file(a.File)
	key := openKey{owner: string(a.Owner), file: a.File}
	o := c.opens[key]
	access, deny := a.Access, a.Deny
	if o != nil {
		access |= o.access
		deny |= o.deny
	}
	for other := range f.opens {
		if other == o {
			continue
		}
		if access&other.deny != 0 || deny&other.access != 0 {
			m.maybeDropFile(f)
			return OpenResult{}, ErrShareDenied
		}
	}
	if o == nil {
		o = &openState{
			sid:    m.newStateid(TypeOpen),
			client: c,
			owner:  key.owner,
			file:   f,
			locks:  make(map[*lockState]struct{}),
		}
		c.opens[key] = o
		f.opens[o] = struct{}{}
		m.states[o.sid.Other] = stateRef{open: o}
	} else {
		o.sid.Seqid = nextSeqid(o.sid.Seqid)
	}
	o.access, o.deny = access, deny
	return OpenResult{Stateid: o.sid, Access: access, Deny: deny}, nil
}

// OpenDowngrade implements OPEN_DOWNGRADE: the new modes must be a subset
// of the current ones (else ErrInval).
func (m *Manager) OpenDowngrade(id ClientID, sid Stateid, access, deny uint32) (Stateid, error) {
	if err := validShare(access, deny); err != nil {
		return Stateid{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	o, err := m.lookupOpen(id, sid)
	if err != nil {
		return Stateid{}, err
	}
	if access&^o.access != 0 || deny&^o.deny != 0 {
		return Stateid{}, fmt.Errorf("%w: downgrade to %#x/%#x from %#x/%#x is not a subset", ErrInval, access, deny, o.access, o.deny)
	}
	o.access, o.deny = access, deny
	o.sid.Seqid = nextSeqid(o.sid.Seqid)
	return o.sid, nil
}

// Close implements CLOSE. If any lock stateid derived from the open still
// holds locks, it fails with ErrLocksHeld; lock stateids without locks are
// freed with the open. It returns the final stateid (seqid bumped).
func (m *Manager) Close(id ClientID, sid Stateid) (Stateid, error) {
	s, _, err := m.CloseOpen(id, sid)
	return s, err
}

// CloseOpen is Close that also returns the file the open was of, so the
// server can free an unlinked file once its last open is gone (HasOpen).
func (m *Manager) CloseOpen(id ClientID, sid Stateid) (Stateid, FileID, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	o, err := m.lookupOpen(id, sid)
	if err != nil {
		return Stateid{}, 0, err
	}
	for ls := range o.locks {
		if ls.nranges > 0 {
			return Stateid{}, 0, ErrLocksHeld
		}
	}
	m.removeOpen(o)
	o.sid.Seqid = nextSeqid(o.sid.Seqid)
	return o.sid, o.file.id, nil
}

// HasOpen reports whether any client holds an open of file. The server
// keeps an unlinked file's data while it does (POSIX unlink semantics
// across clients); callers that act on a false answer serialise with
// Open themselves, since a new open may come right after.
func (m *Manager) HasOpen(file FileID) bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	f := m.files[file]
	return f != nil && len(f.opens) > 0
}

// removeOpen drops an open and its lock stateids. Caller holds mu.
func (m *Manager) removeOpen(o *openState) {
	for ls := range o.locks {
		m.removeLockState(ls)
	}
	delete(o.file.opens, o)
	delete(o.client.opens, openKey{owner: o.owner, file: o.file.id})
	delete(m.states, o.sid.Other)
	m.maybeDropFile(o.file)
}

// lookupState resolves a stateid sent by client id, applying the seqid
// rules. Caller holds mu (read or write).
func (m *Manager) lookupState(id ClientID, sid Stateid) (stateRef, error) {
	if sid.IsSpecial() {
		return stateRef{}, pnfs.ErrBadStateid
	}
	if m.fromEarlierBoot(sid) {
		return stateRef{}, pnfs.ErrStaleStateid
	}
	ref, ok := m.states[sid.Other]
	if !ok {
		if m.expired.has(sid.Other) {
			return stateRef{}, pnfs.ErrExpired
		}
		return stateRef{}, pnfs.ErrBadStateid
	}
	var cur Stateid
	var owner ClientID
	if ref.open != nil {
		cur, owner = ref.open.sid, ref.open.client.id
	} else {
		cur, owner = ref.lock.sid, ref.lock.owner.client.id
	}
	if owner != id {
		return stateRef{}, pnfs.ErrBadStateid
	}
	if err := checkSeqid(sid.Seqid, cur.Seqid); err != nil {
		return stateRef{}, err
	}
	return ref, nil
}

func (m *Manager) lookupOpen(id ClientID, sid Stateid) (*openState, error) {
	ref, err := m.lookupState(id, sid)
	if err != nil {
		return nil, err
	}
	if ref.open == nil {
		return nil, fmt.Errorf("%w: %v is not an open stateid", pnfs.ErrBadStateid, sid)
	}
	return ref.open, nil
}

// CheckIO validates the stateid of a READ (write=false) or WRITE on file.
// Open and lock stateids must belong to the client and the file; WRITE
// needs write access (pnfs.ErrOpenMode), READ accepts read or write access.
// Special stateids are checked against the deny modes of all opens of the
// file: anonymous I/O conflicting with a deny yields ErrLocked, and the
// READ bypass stateid ignores DENY_READ. Byte-range locks are advisory and
// are not consulted. CheckIO takes only the read lock.
func (m *Manager) CheckIO(id ClientID, sid Stateid, file FileID, write bool) error {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if sid.IsCurrent() {
		return fmt.Errorf("%w: current stateid not substituted", pnfs.ErrBadStateid)
	}
	if sid.IsAnonymous() || sid.IsReadBypass() {
		f := m.files[file]
		if f == nil {
			return nil
		}
		bypass := sid.IsReadBypass() && !write
		for o := range f.opens {
			if write && o.deny&DenyWrite != 0 {
				return ErrLocked
			}
			if !write && !bypass && o.deny&DenyRead != 0 {
				return ErrLocked
			}
		}
		return nil
	}
	if sid.Type() == TypeDeleg {
		return m.checkDelegIOLocked(id, sid, file, write)
	}
	ref, err := m.lookupState(id, sid)
	if err != nil {
		return err
	}
	o := ref.open
	if o == nil {
		o = ref.lock.open
	}
	if o.file.id != file {
		return fmt.Errorf("%w: stateid is for another file", pnfs.ErrBadStateid)
	}
	if write && o.access&AccessWrite == 0 {
		return pnfs.ErrOpenMode
	}
	return nil
}

// HasWriteOpen reports whether client id holds an open of file with write
// access (by any of its open-owners). The server uses it to accept a
// LAYOUTCOMMIT under a layout stateid of an earlier boot: such a client may
// extend the file itself, so trusting its last write offset grants nothing
// new.
func (m *Manager) HasWriteOpen(id ClientID, file FileID) bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	f := m.files[file]
	if f == nil {
		return false
	}
	for o := range f.opens {
		if o.client.id == id && o.access&AccessWrite != 0 {
			return true
		}
	}
	return false
}

// TestStateid implements TEST_STATEID: one result per stateid, nil when
// the stateid is valid for the client.
func (m *Manager) TestStateid(id ClientID, sids []Stateid) []error {
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := make([]error, len(sids))
	for i, sid := range sids {
		if l := m.layoutIDs[sid.Other]; l != nil && sid.Type() == TypeLayout {
			switch {
			case l.client.id != id:
				out[i] = pnfs.ErrBadStateid
			default:
				out[i] = checkSeqid(sid.Seqid, l.sid.Seqid)
			}
			continue
		}
		if sid.Type() == TypeDeleg && !sid.IsSpecial() {
			out[i] = m.testDelegLocked(id, sid)
			continue
		}
		_, out[i] = m.lookupState(id, sid)
	}
	return out
}

// FreeStateid implements FREE_STATEID: a lock stateid without locks is
// released; a lock stateid with locks, or an open stateid, yields
// ErrLocksHeld.
func (m *Manager) FreeStateid(id ClientID, sid Stateid) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if sid.Type() == TypeDeleg && !sid.IsSpecial() {
		return m.freeDelegLocked(id, sid)
	}
	ref, err := m.lookupState(id, sid)
	if err != nil {
		return err
	}
	if ref.open != nil || ref.lock.nranges > 0 {
		return ErrLocksHeld
	}
	m.removeLockState(ref.lock)
	return nil
}
