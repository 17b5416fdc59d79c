package state

import (
	"errors"
	"fmt"
	"time"

	"github.com/shoalfs/shoal/pnfs"
)

// Layout state (RFC 8881 §12.5). A client holds at most one layout stateid
// per file; Shoal grants whole-file layouts, so a layout is just the
// (client, file) pair with the highest iomode granted. Layout stateids live
// in their own table: they are never valid for OPEN or LOCK, nor for I/O
// at the MDS; data servers take them for I/O (CheckIOAny), because a
// flexfiles layout hands its own stateid to the client for its I/O to the
// data servers (RFC 8435 §5.1, ffds_stateid, tight coupling).
//
// Recalls: when an operation conflicts with outstanding layouts (a
// truncate, removing the last link, a data server leaving), the server calls
// BeginRecall, sends CB_LAYOUTRECALL to each holder, and retries the
// operation (answering NFS4ERR_DELAY meanwhile) until Recalled reports the
// layouts gone. While a file is being recalled, LAYOUTGET answers
// NFS4ERR_RECALLCONFLICT to the recalled client and NFS4ERR_LAYOUTTRYLATER
// to others. Holders that do not return within one lease are revoked by
// Sweep (reported through Config.OnRevokeLayout so the server can fence them
// at the data servers).

// Layout iomodes (layoutiomode4).
const (
	IOModeRead = 1
	IOModeRW   = 2
	IOModeAny  = 3
)

var (
	// ErrRecallConflict is NFS4ERR_RECALLCONFLICT (10061).
	ErrRecallConflict = errors.New("nfs4 state: layout is being recalled from this client")
	// ErrLayoutTryLater is NFS4ERR_LAYOUTTRYLATER (10058).
	ErrLayoutTryLater = errors.New("nfs4 state: layouts of this file are being recalled")
	// ErrNoMatchingLayout is NFS4ERR_NOMATCHING_LAYOUT (10060).
	ErrNoMatchingLayout = errors.New("nfs4 state: no matching layout")
	// ErrBadLayout is NFS4ERR_BADLAYOUT (10050): the stateid names no
	// read/write layout the client holds for the file.
	ErrBadLayout = errors.New("nfs4 state: no read/write layout under this stateid")
)

type layoutState struct {
	sid       Stateid
	client    *client
	file      FileID
	iomode    uint32
	recalling bool
	deadline  time.Time // recall must be answered by then
}

// LayoutHolder describes a layout to recall.
type LayoutHolder struct {
	ClientID ClientID
	Stateid  Stateid
	// Sessions of the client, for sending CB_LAYOUTRECALL.
	Sessions []SessionID
	// New: BeginRecall started recalling this layout (it was not being
	// recalled before), so no CB_LAYOUTRECALL has told its holder yet.
	New bool
}

func (m *Manager) layoutsOf(f FileID) map[*layoutState]struct{} {
	if m.layouts == nil {
		m.layouts = make(map[FileID]map[*layoutState]struct{})
		m.layoutIDs = make(map[[12]byte]*layoutState)
	}
	s := m.layouts[f]
	if s == nil {
		s = make(map[*layoutState]struct{})
		m.layouts[f] = s
	}
	return s
}

func (m *Manager) dropLayout(l *layoutState) {
	delete(m.layoutIDs, l.sid.Other)
	if s := m.layouts[l.file]; s != nil {
		delete(s, l)
		if len(s) == 0 {
			delete(m.layouts, l.file)
			if ch := m.layoutsGone[l.file]; ch != nil {
				close(ch)
				delete(m.layoutsGone, l.file)
			}
		}
	}
	delete(l.client.layouts, l.file)
}

// LayoutGet implements the state part of LAYOUTGET. sid is either an
// open, lock (or delegation) stateid of the client for file — the first
// LAYOUTGET — or the client's layout stateid for the file. It returns the
// layout stateid with its seqid bumped (1 for a new layout).
func (m *Manager) LayoutGet(id ClientID, sid Stateid, file FileID, iomode uint32) (Stateid, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	c, err := m.confirmedClient(id)
	if err != nil {
		return Stateid{}, err
	}
	var cur *layoutState
	if sid.Type() == TypeLayout && !sid.IsSpecial() {
		if m.fromEarlierBoot(sid) {
			return Stateid{}, pnfs.ErrStaleStateid
		}
		l := m.layoutIDs[sid.Other]
		if l == nil || l.client != c || l.file != file {
			return Stateid{}, fmt.Errorf("%w: unknown layout stateid", pnfs.ErrBadStateid)
		}
		if l.recalling {
			// The recall bumped the seqid the client has not seen yet;
			// the conflict is what it needs to hear (RFC 8881 §12.5.5.2).
			return Stateid{}, ErrRecallConflict
		}
		// Clients send LAYOUTGETs in parallel (RFC 8881 §12.5.3,
		// §12.5.5.2.1.1), each with the highest seqid it has seen:
		// when one of them bumps the seqid first, the others arrive
		// with an older one, and the server processes them all — the
		// seqids of the replies tell the client their order. A recall
		// the client has not seen yet is caught above. Only a seqid
		// the server never issued is wrong.
		if seqidAfter(sid.Seqid, l.sid.Seqid) {
			return Stateid{}, fmt.Errorf("%w: layout seqid %d not issued yet", pnfs.ErrBadStateid, sid.Seqid)
		}
		if iomode == IOModeRW && l.iomode != IOModeRW && !mayWriteLocked(c, file) {
			// As under a read-only open below: a reader's layout stays
			// a read layout, or its LAYOUTCOMMIT could grow the file.
			iomode = IOModeRead
		}
		cur = l
	} else {
		if sid.Type() == TypeDeleg && !sid.IsSpecial() {
			// A client holding a delegation asks for layouts under it.
			d, err := m.lookupDelegLocked(id, sid)
			if err != nil {
				return Stateid{}, err
			}
			if d.file != file {
				return Stateid{}, fmt.Errorf("%w: stateid is for another file", pnfs.ErrBadStateid)
			}
			if iomode == IOModeRW && d.typ != DelegWrite {
				iomode = IOModeRead
			}
		} else {
			ref, err := m.lookupState(id, sid)
			if err != nil {
				return Stateid{}, err
			}
			o := ref.open
			if o == nil {
				o = ref.lock.open
			}
			if o.file.id != file {
				return Stateid{}, fmt.Errorf("%w: stateid is for another file", pnfs.ErrBadStateid)
			}
			if iomode == IOModeRW && o.access&AccessWrite == 0 {
				iomode = IOModeRead
			}
		}
		cur = c.layouts[file]
	}
	// The client's own recall decides first: the set of a file's layouts
	// is a map, so which recalled layout a scan meets first is random.
	if cur != nil && cur.recalling {
		return Stateid{}, ErrRecallConflict
	}
	for l := range m.layouts[file] {
		if l.recalling {
			return Stateid{}, ErrLayoutTryLater
		}
	}
	if cur == nil {
		cur = &layoutState{sid: m.newStateid(TypeLayout), client: c, file: file, iomode: iomode}
		m.layoutsOf(file)[cur] = struct{}{}
		m.layoutIDs[cur.sid.Other] = cur
		if c.layouts == nil {
			c.layouts = make(map[FileID]*layoutState)
		}
		c.layouts[file] = cur
		return cur.sid, nil
	}
	cur.sid.Seqid = nextSeqid(cur.sid.Seqid)
	if iomode > cur.iomode && iomode != IOModeAny {
		cur.iomode = iomode
	}
	return cur.sid, nil
}

// mayWriteLocked reports whether client c may write file: it holds an
// open of it with write access or a write delegation of it.
func mayWriteLocked(c *client, file FileID) bool {
	if d := c.delegs[file]; d != nil && d.typ == DelegWrite {
		return true
	}
	for _, o := range c.opens {
		if o.file.id == file && o.access&AccessWrite != 0 {
			return true
		}
	}
	return false
}

// CheckLayoutCommit validates the stateid of a LAYOUTCOMMIT on file: it
// must be the client's layout stateid for that very file (RFC 8881
// §18.42.3), and the layout must have been granted LAYOUTIOMODE4_RW, since
// only a client that may write through the layout may publish the size its
// writes reached. It returns ErrBadLayout for anything else the client
// sends of this boot: an open, lock or delegation stateid, a special
// stateid, a layout stateid of another client or another file, one that was
// returned or revoked, or one granted only LAYOUTIOMODE4_READ. A seqid
// never issued is pnfs.ErrBadStateid, an older one is accepted
// (checkLayoutSeqid), and a stateid of an earlier boot yields pnfs.ErrStaleStateid,
// whatever its type, so the caller can apply its own restart policy. A
// layout being recalled still takes commits: the client commits what it
// wrote before it returns the layout.
func (m *Manager) CheckLayoutCommit(id ClientID, sid Stateid, file FileID) error {
	if sid.IsSpecial() {
		return fmt.Errorf("%w: special stateid %v", ErrBadLayout, sid)
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.fromEarlierBoot(sid) {
		return pnfs.ErrStaleStateid
	}
	if sid.Type() != TypeLayout {
		return fmt.Errorf("%w: %v is a %v stateid", ErrBadLayout, sid, sid.Type())
	}
	l := m.layoutIDs[sid.Other]
	switch {
	case l == nil:
		return fmt.Errorf("%w: unknown layout stateid %v", ErrBadLayout, sid)
	case l.client.id != id:
		return fmt.Errorf("%w: layout stateid %v of another client", ErrBadLayout, sid)
	case l.file != file:
		return fmt.Errorf("%w: layout stateid %v of another file", ErrBadLayout, sid)
	}
	if err := checkLayoutSeqid(sid.Seqid, l.sid.Seqid); err != nil {
		return err
	}
	if l.iomode != IOModeRW {
		return fmt.Errorf("%w: layout %v was granted for reading only", ErrBadLayout, sid)
	}
	return nil
}

// CheckLayout checks that sid is client id's current layout stateid for
// file, of either iomode: the stateid LAYOUTERROR and LAYOUTSTATS carry
// (RFC 7862 §15.6.3, §15.7.3). It fails with pnfs.ErrStaleStateid for a stateid
// of an earlier boot and pnfs.ErrBadStateid for anything but a layout stateid
// of this client and file, or a seqid from the future; an older seqid
// names the same layout (checkLayoutSeqid).
func (m *Manager) CheckLayout(id ClientID, sid Stateid, file FileID) error {
	if sid.IsSpecial() || sid.Type() != TypeLayout {
		return fmt.Errorf("%w: %v is not a layout stateid", pnfs.ErrBadStateid, sid)
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.fromEarlierBoot(sid) {
		return pnfs.ErrStaleStateid
	}
	l := m.layoutIDs[sid.Other]
	if l == nil || l.client.id != id || l.file != file {
		return fmt.Errorf("%w: no layout of this client and file under %v", pnfs.ErrBadStateid, sid)
	}
	return checkLayoutSeqid(sid.Seqid, l.sid.Seqid)
}

// checkLayoutSeqid checks the seqid of a layout stateid in LAYOUTCOMMIT,
// LAYOUTRETURN, LAYOUTERROR and LAYOUTSTATS: as for LAYOUTGET, only a
// seqid the server has not issued yet is wrong (pnfs.ErrBadStateid). An older
// one names the same layout: a client's LAYOUTGET may have moved the
// seqid without the client learning it (Linux 6.1 ignores the LAYOUTGET
// reply of an OPEN for an inode it holds a layout of, and resends its
// LAYOUTCOMMIT with the old seqid for ever on NFS4ERR_OLD_STATEID; seen
// with write delegations, which defer LAYOUTCOMMIT past the next OPEN).
func checkLayoutSeqid(req, cur uint32) error {
	if req != 0 && seqidAfter(req, cur) {
		return pnfs.ErrBadStateid
	}
	return nil
}

// LayoutIOMode returns the iomode granted so far under the layout stateid
// sid (IOModeRead or IOModeRW), or 0 if there is no such layout. A
// LAYOUTGET for RW under a read-only open is granted READ, and the reply
// must say so.
func (m *Manager) LayoutIOMode(sid Stateid) uint32 {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if l := m.layoutIDs[sid.Other]; l != nil {
		return l.iomode
	}
	return 0
}

// LayoutReturnFile implements LAYOUTRETURN of type FILE for a whole-file
// range. It returns the layout stateid to report (seqid bumped), and
// present=false when the client holds no layout for the file any more.
func (m *Manager) LayoutReturnFile(id ClientID, sid Stateid, file FileID) (Stateid, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	c, err := m.confirmedClient(id)
	if err != nil {
		return Stateid{}, false, err
	}
	l := c.layouts[file]
	if l == nil {
		// Nothing to return is not an error (RFC 8881 §18.44.3).
		return Stateid{}, false, nil
	}
	if sid.Type() == TypeLayout && !sid.IsSpecial() {
		if sid.Other != l.sid.Other {
			return Stateid{}, false, fmt.Errorf("%w: layout stateid of another file", pnfs.ErrBadStateid)
		}
		if err := checkLayoutSeqid(sid.Seqid, l.sid.Seqid); err != nil {
			return Stateid{}, false, err
		}
	}
	m.dropLayout(l)
	return Stateid{}, false, nil
}

// LayoutReturnAll implements LAYOUTRETURN of type ALL and FSID (Shoal
// exports one file system).
func (m *Manager) LayoutReturnAll(id ClientID) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	c, err := m.confirmedClient(id)
	if err != nil {
		return err
	}
	for _, l := range c.layouts {
		m.dropLayout(l)
	}
	return nil
}

// BeginRecall marks every layout of file as being recalled (deadline: one
// lease from now) and returns the holders that need a CB_LAYOUTRECALL. A
// holder already being recalled is returned again, so callers may resend.
func (m *Manager) BeginRecall(file FileID) []LayoutHolder {
	return m.beginRecall(file, true)
}

// beginRecall is BeginRecall; bump says whether the recall will carry the
// layout stateid, and so moves its seqid.
func (m *Manager) beginRecall(file FileID, bump bool) []LayoutHolder {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []LayoutHolder
	now := m.clock.Now()
	for l := range m.layouts[file] {
		fresh := !l.recalling
		if !l.recalling {
			l.recalling = true
			l.deadline = now.Add(m.lease)
			if bump {
				// A recall changes the layout's state: the
				// CB_LAYOUTRECALL carries the next seqid (RFC 8881
				// §12.5.5.2.1).
				l.sid.Seqid = nextSeqid(l.sid.Seqid)
			}
		}
		h := LayoutHolder{ClientID: l.client.id, Stateid: l.sid, New: fresh}
		for sid := range l.client.sessions {
			h.Sessions = append(h.Sessions, sid)
		}
		out = append(out, h)
	}
	return out
}

// FilesWithLayouts lists the files some client holds a layout of.
func (m *Manager) FilesWithLayouts() []FileID {
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := make([]FileID, 0, len(m.layouts))
	for f := range m.layouts {
		out = append(out, f)
	}
	return out
}

// BeginRecallAll marks every layout of every file as being recalled, for a
// data server leaving the cluster.
func (m *Manager) BeginRecallAll() []LayoutHolder {
	m.mu.RLock()
	files := make([]FileID, 0, len(m.layouts))
	for f := range m.layouts {
		files = append(files, f)
	}
	m.mu.RUnlock()
	var out []LayoutHolder
	for _, f := range files {
		// LAYOUTRECALL4_ALL carries no stateid, so the client cannot
		// learn a new seqid from it: moving the seqid would make its
		// LAYOUTCOMMIT and LAYOUTRETURN under the seqid it has fail with
		// NFS4ERR_OLD_STATEID (seen as a failed write during a drain).
		out = append(out, m.beginRecall(f, false)...)
	}
	return out
}

// Recalled reports whether no layouts of file remain outstanding.
func (m *Manager) Recalled(file FileID) bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return len(m.layouts[file]) == 0
}

// closedChan is what LayoutsGone returns when nothing is outstanding.
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// LayoutsGone returns a channel that is closed once no client holds a
// layout of file (at once if none does now): returned, answered with
// NFS4ERR_NOMATCHING_LAYOUT, revoked or purged. An operation that
// recalled them waits on it instead of polling.
func (m *Manager) LayoutsGone(file FileID) <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.layouts[file]) == 0 {
		return closedChan
	}
	ch := m.layoutsGone[file]
	if ch == nil {
		if m.layoutsGone == nil {
			m.layoutsGone = make(map[FileID]chan struct{})
		}
		ch = make(chan struct{})
		m.layoutsGone[file] = ch
	}
	return ch
}

// HasLayouts reports whether any client holds a layout of file.
func (m *Manager) HasLayouts(file FileID) bool { return !m.Recalled(file) }

// RecallNoMatch records a client's NFS4ERR_NOMATCHING_LAYOUT answer to a
// recall: it holds no layout of file, so its state is dropped.
func (m *Manager) RecallNoMatch(id ClientID, file FileID) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if c := m.clients[id]; c != nil {
		if l := c.layouts[file]; l != nil {
			m.dropLayout(l)
		}
	}
}

// revokeOverdueLayoutsLocked revokes layouts whose recall deadline passed
// and returns their clients (deduplicated).
func (m *Manager) revokeOverdueLayoutsLocked(now time.Time) []ClientID {
	seen := map[ClientID]bool{}
	var out []ClientID
	for _, set := range m.layouts {
		for l := range set {
			if l.recalling && now.After(l.deadline) {
				m.dropLayout(l)
				if !seen[l.client.id] {
					seen[l.client.id] = true
					out = append(out, l.client.id)
				}
			}
		}
	}
	return out
}

// dropClientLayoutsLocked forgets a purged client's layouts.
func (m *Manager) dropClientLayoutsLocked(c *client) {
	for _, l := range c.layouts {
		m.dropLayout(l)
	}
}

// CheckIOAny validates an open or lock stateid for I/O on file without
// knowing the client, as a data server asks it through the metadata
// server. It returns the owning client.
func (m *Manager) CheckIOAny(sid Stateid, file FileID, write bool) (ClientID, error) {
	if sid.IsSpecial() {
		// Data servers only accept I/O under state the MDS granted.
		return 0, pnfs.ErrBadStateid
	}
	if sid.Type() == TypeLayout {
		return m.checkLayoutIO(sid, file, write)
	}
	m.mu.RLock()
	ref, ok := m.states[sid.Other]
	var owner ClientID
	var err error
	dOwner, isDeleg := m.delegOwnerLocked(sid)
	switch {
	case isDeleg:
		// The Linux files-layout client sends I/O to data servers under
		// its delegation stateid when it holds one.
		owner = dOwner
	case ok && ref.open != nil:
		owner = ref.open.client.id
	case ok:
		owner = ref.lock.owner.client.id
	case m.fromEarlierBoot(sid):
		err = pnfs.ErrStaleStateid
	case m.expired.has(sid.Other):
		err = pnfs.ErrExpired
	default:
		err = pnfs.ErrBadStateid
	}
	m.mu.RUnlock()
	if err != nil {
		return 0, err
	}
	return owner, m.CheckIO(owner, sid, file, write)
}

// HasWriteLayouts reports whether any client holds a read/write layout of
// file: its size may then have grown on the data servers beyond what the
// metadata server has recorded.
func (m *Manager) HasWriteLayouts(file FileID) bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	for l := range m.layouts[file] {
		if l.iomode == IOModeRW {
			return true
		}
	}
	return false
}

// checkLayoutIO is CheckIOAny for a layout stateid: the stateid a
// flexfiles layout gives its client for I/O to the data servers. It
// allows I/O on the layout's file, writes only under a read/write layout;
// a seqid the server has not issued is pnfs.ErrBadStateid, an older one
// names the same layout (the client keeps the stateid of the layout it
// got, checkLayoutSeqid). A returned or revoked layout is
// pnfs.ErrBadStateid, one of an earlier boot pnfs.ErrStaleStateid.
func (m *Manager) checkLayoutIO(sid Stateid, file FileID, write bool) (ClientID, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.fromEarlierBoot(sid) {
		return 0, pnfs.ErrStaleStateid
	}
	l := m.layoutIDs[sid.Other]
	switch {
	case l == nil:
		return 0, fmt.Errorf("%w: no layout under %v", pnfs.ErrBadStateid, sid)
	case l.file != file:
		return 0, fmt.Errorf("%w: layout stateid %v is for another file", pnfs.ErrBadStateid, sid)
	}
	if err := checkLayoutSeqid(sid.Seqid, l.sid.Seqid); err != nil {
		return 0, err
	}
	if write && l.iomode != IOModeRW {
		return 0, fmt.Errorf("%w: layout %v was granted for reading only", pnfs.ErrOpenMode, sid)
	}
	return l.client.id, nil
}

// CheckCurrentLayoutSeqid checks that a layout stateid of client id for
// file carries the layout's current seqid: an older one is
// pnfs.ErrOldStateid (RFC 8881 §8.2.2). LAYOUTRETURN of a flexfiles layout
// asks this before LayoutReturnFile, which, like every other layout
// operation, takes an older seqid as naming the same layout
// (checkLayoutSeqid); clients that return with an old seqid refresh it
// from the layout they hold and resend (pynfs FFLOOS expects the error).
// Anything but a layout stateid of the client's current layout of file
// is left to LayoutReturnFile.
func (m *Manager) CheckCurrentLayoutSeqid(id ClientID, sid Stateid, file FileID) error {
	if sid.IsSpecial() || sid.Type() != TypeLayout || sid.Seqid == 0 {
		return nil
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	l := m.layoutIDs[sid.Other]
	if l == nil || l.client.id != id || l.file != file {
		return nil
	}
	if seqidAfter(l.sid.Seqid, sid.Seqid) {
		return fmt.Errorf("%w: layout seqid %d, current %d", pnfs.ErrOldStateid, sid.Seqid, l.sid.Seqid)
	}
	return nil
}
