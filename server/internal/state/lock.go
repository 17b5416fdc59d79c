package state

import (
	"bytes"
	"fmt"
	"math"
	"slices"

	"github.com/shoalfs/shoal/pnfs"
)

// LockType is nfs_lock_type4. The blocking variants are accepted but
// treated as non-blocking: a conflict yields ErrDenied.
type LockType uint32

const (
	ReadLock   LockType = 1 // READ_LT
	WriteLock  LockType = 2 // WRITE_LT
	ReadWLock  LockType = 3 // READW_LT
	WriteWLock LockType = 4 // WRITEW_LT
)

func (t LockType) String() string {
	switch t {
	case ReadLock:
		return "read"
	case WriteLock:
		return "write"
	case ReadWLock:
		return "readw"
	case WriteWLock:
		return "writew"
	}
	return fmt.Sprintf("LockType(%d)", uint32(t))
}

// normalize maps blocking types to their non-blocking equivalents.
func (t LockType) normalize() (LockType, error) {
	switch t {
	case ReadLock, ReadWLock:
		return ReadLock, nil
	case WriteLock, WriteWLock:
		return WriteLock, nil
	}
	return 0, fmt.Errorf("%w: lock type %d", ErrInval, uint32(t))
}

// LengthToEOF is the lock length meaning "to the end of the file".
const LengthToEOF = math.MaxUint64

// LockOwner identifies a lock-owner (lock_owner4).
type LockOwner struct {
	ClientID ClientID
	Owner    []byte
}

// lockOwner is a lock-owner of a client with its per-file lock stateids.
type lockOwner struct {
	client *client
	owner  string
	states map[FileID]*lockState
}

// lockState is the lock stateid of (lock-owner, file).
type lockState struct {
	sid     Stateid
	owner   *lockOwner
	file    *fileState
	open    *openState // the open it was derived from
	nranges int        // ranges held in file.locks
}

// lockRange is a held range [first, last] (inclusive; last==MaxUint64
// means to EOF).
type lockRange struct {
	ls    *lockState
	typ   LockType // ReadLock or WriteLock
	first uint64
	last  uint64
}

// span converts (offset, length) to an inclusive range, rejecting zero
// lengths and ranges that run past 2^64-1 (ErrInval).
func span(off, length uint64) (first, last uint64, err error) {
	if length == LengthToEOF {
		return off, math.MaxUint64, nil
	}
	if length == 0 || length-1 > math.MaxUint64-off {
		return 0, 0, fmt.Errorf("%w: lock range offset %d length %d", ErrInval, off, length)
	}
	return off, off + length - 1, nil
}

func (r *lockRange) length() uint64 {
	if r.last == math.MaxUint64 {
		return LengthToEOF
	}
	return r.last - r.first + 1
}

func overlaps(a1, a2, b1, b2 uint64) bool { return a1 <= b2 && b1 <= a2 }

// touches reports whether two ranges overlap or are adjacent.
func touches(a1, a2, b1, b2 uint64) bool {
	return (a2 == math.MaxUint64 || b1 <= a2+1) && (b2 == math.MaxUint64 || a1 <= b2+1)
}

// LockArgs are the inputs of LOCK.
type LockArgs struct {
	ClientID ClientID
	Type     LockType
	Reclaim  bool
	Offset   uint64
	Length   uint64 // LengthToEOF for "to EOF"

	// NewLockOwner selects open_to_lock_owner4: OpenStateid and
	// LockOwner are used. Otherwise exist_lock_owner4: LockStateid.
	NewLockOwner bool
	OpenStateid  Stateid
	LockOwner    []byte
	LockStateid  Stateid
}

// Lock implements LOCK with POSIX semantics per lock-owner: a new lock
// replaces the owner's existing locks over the range (upgrade, downgrade,
// split) and merges with adjacent or overlapping ranges of the same type.
// Conflicting locks of other lock-owners (any lock against a write lock,
// a write lock against any lock) yield *LockDeniedError. A WRITE lock
// needs an open with write access and a READ lock one with read access
// (pnfs.ErrOpenMode). It returns the lock stateid: seqid 1 when it was just
// created, otherwise bumped.
//
// With NewLockOwner, a lock-owner that already has a lock stateid for the
// file reuses it.
func (m *Manager) Lock(a LockArgs) (Stateid, error) {
	typ, err := a.Type.normalize()
	if err != nil {
		return Stateid{}, err
	}
	first, last, err := span(a.Offset, a.Length)
	if err != nil {
		return Stateid{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	c, err := m.confirmedClient(a.ClientID)
	if err != nil {
		return Stateid{}, err
	}
	if err := m.checkGraceLocked(c, a.Reclaim); err != nil {
		return Stateid{}, err
	}
	var ls *lockState
	created := false
	if a.NewLockOwner {
		o, err := m.lookupOpen(c.id, a.OpenStateid)
		if err != nil {
			return Stateid{}, err
		}
		if len(a.LockOwner) == 0 || len(a.LockOwner) > maxOwnerLen {
			return Stateid{}, fmt.Errorf("%w: lock-owner length %d", ErrInval, len(a.LockOwner))
		}
		lo := c.lockOwners[string(a.LockOwner)]
		if lo == nil {
			lo = &lockOwner{client: c, owner: string(a.LockOwner), states: make(map[FileID]*lockState)}
			c.lockOwners[lo.owner] = lo
		}
		ls = lo.states[o.file.id]
		if ls == nil {
			ls = &lockState{sid: m.newStateid(TypeLock), owner: lo, file: o.file, open: o}
			lo.states[o.file.id] = ls
			o.locks[ls] = struct{}{}
			m.states[ls.sid.Other] = stateRef{lock: ls}
			created = true
		}
	} else {
		ls, err = m.lookupLock(c.id, a.LockStateid)
		if err != nil {
			return Stateid{}, err
		}
	}
	fail := func(err error) (Stateid, error) {
		if created {
			m.removeLockState(ls)
		}
		return Stateid{}, err
	}
	need := AccessRead
	if typ == WriteLock {
		need = AccessWrite
	}
	if ls.open.access&need == 0 {
		return fail(pnfs.ErrOpenMode)
	}
	if d := ls.file.conflict(typ, first, last, func(r *lockRange) bool { return r.ls.owner == ls.owner }); d != nil {
		return fail(d)
	}
	ls.file.setRange(ls, typ, first, last)
	if !created {
		ls.sid.Seqid = nextSeqid(ls.sid.Seqid)
	}
	return ls.sid, nil
}

// LockTestArgs are the inputs of LOCKT.
type LockTestArgs struct {
	ClientID  ClientID
	File      FileID
	Type      LockType
	Offset    uint64
	Length    uint64
	LockOwner []byte // need not have any state
}

// LockTest implements LOCKT: it reports, without creating state, whether
// the lock could be granted: nil, or *LockDeniedError. Locks of the
// testing lock-owner itself never conflict. During grace it yields
// ErrGrace.
func (m *Manager) LockTest(a LockTestArgs) error {
	typ, err := a.Type.normalize()
	if err != nil {
		return err
	}
	first, last, err := span(a.Offset, a.Length)
	if err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	c, err := m.confirmedClient(a.ClientID)
	if err != nil {
		return err
	}
	if err := m.checkGraceLocked(c, false); err != nil {
		return err
	}
	f := m.files[a.File]
	if f == nil {
		return nil
	}
	self := func(r *lockRange) bool {
		return r.ls.owner.client == c && r.ls.owner.owner == string(a.LockOwner)
	}
	if d := f.conflict(typ, first, last, self); d != nil {
		return d
	}
	return nil
}

// Unlock implements LOCKU: it releases [offset, offset+length) for the
// lock-owner, splitting ranges as needed, and returns the lock stateid
// with its seqid bumped. The lock type is not used by the server.
func (m *Manager) Unlock(id ClientID, sid Stateid, offset, length uint64) (Stateid, error) {
	first, last, err := span(offset, length)
	if err != nil {
		return Stateid{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	ls, err := m.lookupLock(id, sid)
	if err != nil {
		return Stateid{}, err
	}
	ls.file.clearRange(ls, first, last)
	ls.sid.Seqid = nextSeqid(ls.sid.Seqid)
	return ls.sid, nil
}

func (m *Manager) lookupLock(id ClientID, sid Stateid) (*lockState, error) {
	ref, err := m.lookupState(id, sid)
	if err != nil {
		return nil, err
	}
	if ref.lock == nil {
		return nil, fmt.Errorf("%w: %v is not a lock stateid", pnfs.ErrBadStateid, sid)
	}
	return ref.lock, nil
}

// removeLockState drops a lock stateid and its ranges. Caller holds mu.
func (m *Manager) removeLockState(ls *lockState) {
	ls.file.clearRange(ls, 0, math.MaxUint64)
	delete(ls.owner.states, ls.file.id)
	if len(ls.owner.states) == 0 {
		delete(ls.owner.client.lockOwners, ls.owner.owner)
	}
	delete(ls.open.locks, ls)
	delete(m.states, ls.sid.Other)
	m.maybeDropFile(ls.file)
}

// conflict returns the first (lowest) range that conflicts with a lock of
// type typ on [first, last], skipping ranges for which self is true.
func (f *fileState) conflict(typ LockType, first, last uint64, self func(*lockRange) bool) *LockDeniedError {
	for _, r := range f.locks {
		if self(r) || !overlaps(r.first, r.last, first, last) {
			continue
		}
		if typ == WriteLock || r.typ == WriteLock {
			return &LockDeniedError{
				Offset: r.first,
				Length: r.length(),
				Type:   r.typ,
				Owner:  LockOwner{ClientID: r.ls.owner.client.id, Owner: []byte(r.ls.owner.owner)},
			}
		}
	}
	return nil
}

// clearRange removes [first, last] from ls's ranges, splitting ranges
// that straddle its edges.
func (f *fileState) clearRange(ls *lockState, first, last uint64) {
	out := make([]*lockRange, 0, len(f.locks)+1)
	for _, r := range f.locks {
		if r.ls != ls || !overlaps(r.first, r.last, first, last) {
			out = append(out, r)
			continue
		}
		if r.first < first {
			out = append(out, &lockRange{ls: ls, typ: r.typ, first: r.first, last: first - 1})
		}
		if r.last > last {
			out = append(out, &lockRange{ls: ls, typ: r.typ, first: last + 1, last: r.last})
		}
	}
	f.setLocks(out)
}

// setRange gives ls a lock of type typ on exactly [first, last], replacing
// whatever ls held there and coalescing with touching ranges of the same
// type.
func (f *fileState) setRange(ls *lockState, typ LockType, first, last uint64) {
	f.clearRange(ls, first, last)
	nr := &lockRange{ls: ls, typ: typ, first: first, last: last}
	out := make([]*lockRange, 0, len(f.locks)+1)
	for _, r := range f.locks {
		if r.ls == ls && r.typ == typ && touches(r.first, r.last, nr.first, nr.last) {
			nr.first = min(nr.first, r.first)
			nr.last = max(nr.last, r.last)
			continue
		}
		out = append(out, r)
	}
	f.setLocks(append(out, nr))
}

// setLocks installs a new range list, keeping it sorted and the per-state
// range counts current.
func (f *fileState) setLocks(rs []*lockRange) {
	slices.SortStableFunc(rs, func(a, b *lockRange) int {
		switch {
		case a.first < b.first:
			return -1
		case a.first > b.first:
			return 1
		}
		return bytes.Compare(a.ls.sid.Other[:], b.ls.sid.Other[:])
	})
	seen := make(map[*lockState]int)
	for _, r := range f.locks {
		seen[r.ls] = 0
	}
	for _, r := range rs {
		seen[r.ls]++
	}
	for ls, n := range seen {
		ls.nranges = n
	}
	f.locks = rs
}
