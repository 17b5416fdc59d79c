package server

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/xdr"
	"github.com/shoalfs/shoal/meta"
	"github.com/shoalfs/shoal/server/internal/state"
)

// Delegations (RFC 8881 §10.4). The rules of when a delegation may be
// granted and what conflicts with it live in server/state (deleg.go);
// this file turns them into the protocol: the delegation in OPEN's and
// WANT_DELEGATION's replies, CB_RECALL sent outside the fore-channel
// request that conflicts, and CB_GETATTR for a write delegation.

// recallTimeout bounds one CB_RECALL or CB_GETATTR round trip.
const recallTimeout = 10 * time.Second

// cbGetattrTimeout bounds the CB_GETATTR a GETATTR waits for; past it the
// delegation is recalled instead.
const cbGetattrTimeout = 2 * time.Second

// delegWant is what a client asked for in the OPEN4_SHARE_ACCESS_WANT_*
// bits of share_access (or in WANT_DELEGATION).
type delegWant int

const (
	wantNoPreference delegWant = iota
	wantRead
	wantWrite
	wantAny
	wantNone   // OPEN4_SHARE_ACCESS_WANT_NO_DELEG
	wantCancel // OPEN4_SHARE_ACCESS_WANT_CANCEL
)

// parseWant decodes the delegation want of share_access; an undefined
// value is NFS4ERR_INVAL.
func parseWant(shareAccess uint32) (delegWant, nfs4.Nfsstat4) {
	switch shareAccess & nfs4.OPEN4_SHARE_ACCESS_WANT_DELEG_MASK {
	case nfs4.OPEN4_SHARE_ACCESS_WANT_NO_PREFERENCE:
		return wantNoPreference, nfs4.NFS4_OK
	case nfs4.OPEN4_SHARE_ACCESS_WANT_READ_DELEG:
		return wantRead, nfs4.NFS4_OK
	case nfs4.OPEN4_SHARE_ACCESS_WANT_WRITE_DELEG:
		return wantWrite, nfs4.NFS4_OK
	case nfs4.OPEN4_SHARE_ACCESS_WANT_ANY_DELEG:
		return wantAny, nfs4.NFS4_OK
	case nfs4.OPEN4_SHARE_ACCESS_WANT_NO_DELEG:
		return wantNone, nfs4.NFS4_OK
	case nfs4.OPEN4_SHARE_ACCESS_WANT_CANCEL:
		return wantCancel, nfs4.NFS4_OK
	}
	return 0, nfs4.NFS4ERR_INVAL
}

// delegReply is the open_delegation4 of an OPEN or WANT_DELEGATION reply.
type delegReply struct {
	typ state.DelegType // 0: none
	sid state.Stateid
	// recall asks the client to return the delegation at once (a
	// reclaimed one that cannot stay).
	recall bool
	// why is the reason for none, told to a client that expressed a want
	// (OPEN_DELEGATE_NONE_EXT); noWant for one that did not
	// (OPEN_DELEGATE_NONE).
	why nfs4.WhyNoDelegation4
}

// noWant marks an OPEN without delegation wants.
const noWant nfs4.WhyNoDelegation4 = -1

func (r *delegReply) EncodeXDR(e *xdr.Encoder) {
	// Permissions: an empty ACE, so the client checks access with the
	// server (ACCESS) rather than trusting a cached one.
	perm := nfs4.Nfsace4{Type: nfs4.ACE4_ACCESS_ALLOWED_ACE_TYPE}
	switch r.typ {
	case state.DelegRead:
		d := nfs4.OpenDelegation4{DelegationType: nfs4.OPEN_DELEGATE_READ,
			Read: &nfs4.OpenReadDelegation4{Stateid: fromState(r.sid), Recall: r.recall, Permissions: perm}}
		d.EncodeXDR(e)
	case state.DelegWrite:
		noLimit := nfs4.Uint64T(^uint64(0))
		d := nfs4.OpenDelegation4{DelegationType: nfs4.OPEN_DELEGATE_WRITE,
			Write: &nfs4.OpenWriteDelegation4{Stateid: fromState(r.sid), Recall: r.recall, Permissions: perm,
				SpaceLimit: nfs4.NfsSpaceLimit4{Limitby: nfs4.NFS_LIMIT_SIZE, Filesize: &noLimit}}}
		d.EncodeXDR(e)
	default:
		if r.why == noWant {
			e.Uint32(uint32(nfs4.OPEN_DELEGATE_NONE))
			return
		}
		// Shoal does not promise to push a delegation later
		// (WND4_CONTENTION) or to signal one (WND4_RESOURCE).
		f := false
		nd := nfs4.OpenDelegation4{DelegationType: nfs4.OPEN_DELEGATE_NONE_EXT,
			OdWhynone: &nfs4.OpenNoneDelegation4{OndWhy: r.why, OndServerWillPushDeleg: &f, OndServerWillSignalAvail: &f}}
		nd.EncodeXDR(e)
	}
}

// offerDelegation decides the delegation of an OPEN (access is its
// OPEN4_SHARE_ACCESS_READ/WRITE bits) or a WANT_DELEGATION (access 0) of
// file by the COMPOUND's client.
func (c *compound) offerDelegation(file *object, want delegWant, access uint32) delegReply {
	expressed := want != wantNoPreference
	none := func(why nfs4.WhyNoDelegation4) delegReply {
		if !expressed {
			return delegReply{why: noWant}
		}
		return delegReply{why: why}
	}
	switch want {
	case wantNone:
		return delegReply{why: nfs4.WND4_NOT_WANTED}
	case wantCancel:
		return delegReply{why: nfs4.WND4_CANCELLED}
	}
	switch {
	case file.attr.Type == meta.TypeDirectory:
		return none(nfs4.WND4_IS_DIR)
	case file.attr.Type != meta.TypeRegular || c.s.cfg.NoDelegations:
		if want == wantWrite {
			return none(nfs4.WND4_WRITE_DELEG_NOT_SUPP_FTYPE)
		}
		return none(nfs4.WND4_NOT_SUPP_FTYPE)
	}
	id, st := c.clientID()
	if st != nfs4.NFS4_OK {
		return none(nfs4.WND4_RESOURCE)
	}
	args := state.DelegArgs{ClientID: id, File: state.FileID(file.fh.ino), FH: c.s.fh.encode(file.fh), Type: state.DelegRead, Since: c.delegSince}
	switch want {
	case wantWrite:
		args.Type = state.DelegWrite
	case wantAny:
		args.Type, args.Fallback = state.DelegWrite, true
	case wantNoPreference:
		// The file's use decides: a writer gets a write delegation, a
		// reader a read one.
		if access&state.AccessWrite != 0 {
			args.Type = state.DelegWrite
		}
	}
	g, why, err := c.s.st.m.Delegate(args)
	if err != nil {
		c.log.Debug("no delegation", "ino", uint64(file.fh.ino), "err", err)
		return none(nfs4.WND4_RESOURCE)
	}
	if g.Type != 0 {
		c.s.counters.delegGranted.Add(1)
		return delegReply{typ: g.Type, sid: g.Stateid}
	}
	switch why {
	case state.NoDelegResource:
		return none(nfs4.WND4_RESOURCE)
	case state.NoDelegUpgrade:
		return none(nfs4.WND4_NOT_SUPP_UPGRADE)
	}
	return none(nfs4.WND4_CONTENTION)
}

// reclaimDelegation answers an OPEN with CLAIM_PREVIOUS whose
// delegate_type names the delegation the client held before the server
// restarted: it gets it back (see state.Manager.ReclaimDelegation), with
// the recall flag set when it cannot keep it.
func (c *compound) reclaimDelegation(file *object, typ nfs4.OpenDelegationType4) delegReply {
	var t state.DelegType
	switch typ {
	case nfs4.OPEN_DELEGATE_READ:
		t = state.DelegRead
	case nfs4.OPEN_DELEGATE_WRITE:
		t = state.DelegWrite
	default:
		return delegReply{why: noWant}
	}
	id, st := c.clientID()
	if st != nfs4.NFS4_OK {
		return delegReply{why: noWant}
	}
	g, recall, err := c.s.st.m.ReclaimDelegation(state.DelegArgs{ClientID: id, File: state.FileID(file.fh.ino),
		FH: c.s.fh.encode(file.fh), Type: t}, c.s.cfg.NoDelegations)
	if err != nil {
		c.log.Info("delegation not reclaimed", "ino", uint64(file.fh.ino), "err", err)
		return delegReply{why: noWant}
	}
	c.s.counters.delegGranted.Add(1)
	return delegReply{typ: g.Type, sid: g.Stateid, recall: recall}
}

// breakDelegations holds back an operation of the COMPOUND's client on
// file ino that conflicts with other clients' delegations (write: it
// changes the file): it starts their recall and answers NFS4ERR_DELAY
// until they are returned or revoked.
//
// When nothing conflicts, no delegation of the file is granted until the
// COMPOUND ends, so one granted between this check and the change the
// operation makes cannot miss its recall.
func (c *compound) breakDelegations(ino meta.Ino, write bool) nfs4.Nfsstat4 {
	if c.s.cfg.NoDelegations {
		return nfs4.NFS4_OK
	}
	id, _ := c.clientID()
	release, err := c.s.st.m.BreakDelegations(id, state.FileID(ino), write)
	if err != nil {
		return c.s.recallOn(err)
	}
	c.delegHolds = append(c.delegHolds, release)
	return nfs4.NFS4_OK
}

func (c *compound) releaseDelegHolds() {
	for _, release := range c.delegHolds {
		release()
	}
}

// recallOn sends the recalls a *state.RecallError asks for and maps err
// to a status: NFS4ERR_DELAY for a recall, NFS4_OK for nil.
func (s *Server) recallOn(err error) nfs4.Nfsstat4 {
	if err == nil {
		return nfs4.NFS4_OK
	}
	var re *state.RecallError
	if errors.As(err, &re) {
		s.sendRecalls(re.Holders)
	}
	return statusOf(err)
}

// sendRecalls sends CB_RECALL to each holder, each from its own goroutine:
// callbacks never run inside the fore-channel request that caused them
// (see internal/rpc's doc on backchannel deadlock).
func (s *Server) sendRecalls(holders []state.DelegHolder) {
	for _, h := range holders {
		s.event(Event{Kind: EventDelegRecall, ClientID: uint64(h.ClientID), Ino: uint64(h.File)})
		go s.sendDelegRecall(h)
	}
}

// sendDelegRecall sends one CB_RECALL on the first of the holder's
// sessions that takes it. A holder that says it has no such delegation
// has it dropped; one that cannot be reached keeps it until the recall
// deadline (one lease), when Sweep revokes it: the client may reconnect
// and bind a new back channel in that time, and the next retry of the
// conflicting operation resends the recall.
func (s *Server) sendDelegRecall(h state.DelegHolder) {
	ctx, cancel := context.WithTimeout(s.st.ctx, recallTimeout)
	defer cancel()
	// A write delegation is recalled with truncate false: Shoal does not
	// know whether the conflicting operation will truncate.
	var lastErr error
	for _, sess := range h.Sessions {
		st, err := s.recall(ctx, sess, fromState(h.Stateid), h.FH, false)
		if err != nil {
			lastErr = err
			if !errors.Is(err, state.ErrDelay) && !errors.Is(err, state.ErrBadSession) {
				s.callbackFailed(sess)
			}
			continue
		}
		s.counters.delegRecalled.Add(1)
		switch st {
		case nfs4.NFS4_OK:
		case nfs4.NFS4ERR_BAD_STATEID, nfs4.NFS4ERR_BADHANDLE:
			// The client does not hold it (it returned it already, or
			// never saw the grant): nothing is cached to lose.
			s.st.m.RecallRefused(h.Stateid)
		default:
			s.log.Info("CB_RECALL refused", "clientid", fmt.Sprintf("%#x", uint64(h.ClientID)), "status", st.String())
		}
		return
	}
	s.log.Info("CB_RECALL not delivered; the delegation is revoked if not returned within the lease",
		"clientid", fmt.Sprintf("%#x", uint64(h.ClientID)), "ino", uint64(h.File), "err", lastErr)
}

// callbackFailed marks a session's back channel as failing, so its client
// gets no new delegations until it binds another back channel connection.
func (s *Server) callbackFailed(id state.SessionID) {
	if sess, err := s.st.m.Session(id); err == nil {
		sess.SetCallbackFailed(true)
	}
}

// delegRevoked is the state manager's report of a revoked delegation.
func (s *Server) delegRevoked(h state.DelegHolder) {
	s.counters.delegRevoked.Add(1)
	s.event(Event{Kind: EventDelegRevoke, ClientID: uint64(h.ClientID), Ino: uint64(h.File)})
}

func (c *compound) delegReturn(a *nfs4.DELEGRETURN4args) opReply {
	id, st := c.clientID()
	if st != nfs4.NFS4_OK {
		return fail(st)
	}
	o, st := c.current()
	if st != nfs4.NFS4_OK {
		return fail(st)
	}
	sid, st := c.stateid(a.DelegStateid)
	if st != nfs4.NFS4_OK {
		return fail(st)
	}
	if err := c.s.st.m.DelegReturn(id, sid, state.FileID(o.fh.ino)); err != nil {
		return failErr(err)
	}
	c.s.counters.delegReturned.Add(1)
	// The next holder's CB_GETATTR answers are compared with the
	// server's change attribute afresh.
	c.s.st.mu.Lock()
	delete(c.s.st.cbChanges, o.fh.ino)
	c.s.st.mu.Unlock()
	return ok(nil)
}

// wantDelegation is WANT_DELEGATION (RFC 8881 §18.49): a delegation
// without an OPEN. Only CLAIM_FH is served; CLAIM_PREVIOUS gets
// NFS4ERR_NO_GRACE outside grace and none during it (delegations are not
// reclaimed), CLAIM_DELEG_PREV_FH NFS4ERR_NOTSUPP (no DELEGPURGE).
func (c *compound) wantDelegation(a *nfs4.WANTDELEGATION4args) opReply {
	if _, st := c.clientID(); st != nfs4.NFS4_OK {
		return fail(st)
	}
	o, st := c.current()
	if st != nfs4.NFS4_OK {
		return fail(st)
	}
	want, st := parseWant(a.WdaWant)
	if st != nfs4.NFS4_OK {
		return fail(st)
	}
	if want == wantNoPreference {
		return fail(nfs4.NFS4ERR_INVAL)
	}
	switch a.WdaClaim.DcClaim {
	case nfs4.CLAIM_FH:
	case nfs4.CLAIM_PREVIOUS:
		if !c.s.st.m.InGrace() {
			return fail(nfs4.NFS4ERR_NO_GRACE)
		}
		return ok(&delegReply{why: nfs4.WND4_RESOURCE})
	case nfs4.CLAIM_DELEG_PREV_FH:
		return fail(nfs4.NFS4ERR_NOTSUPP)
	default:
		return fail(nfs4.NFS4ERR_INVAL)
	}
	r := c.offerDelegation(o, want, 0)
	return ok(&r)
}

// cbGetattr answers a GETATTR of size or change of a file another client
// holds a write delegation of (RFC 8881 §10.4.3): it asks the holder
// with CB_GETATTR and, when the holder reports a change, reports the
// holder's size and a change attribute moved past the server's. It never
// waits longer than cbGetattrTimeout; a holder that does not answer has
// its delegation recalled and the GETATTR answers NFS4ERR_DELAY.
func (c *compound) cbGetattr(o *object) (*object, nfs4.Nfsstat4) {
	if o.attr.Type != meta.TypeRegular {
		return o, nfs4.NFS4_OK
	}
	id, _ := c.clientID()
	h, found := c.s.st.m.WriteDelegation(id, state.FileID(o.fh.ino))
	if !found {
		return o, nfs4.NFS4_OK
	}
	// The GETATTR waits for the callback; CB_GETATTR travels on the
	// holder's back channel, not on this request's connection, so this
	// cannot deadlock the way a callback on the caller's own session
	// could (the holder is another client).
	ctx, cancel := context.WithTimeout(c.s.st.ctx, cbGetattrTimeout)
	defer cancel()
	req := makeBitmap([]uint32{nfs4.FATTR4_SIZE, nfs4.FATTR4_CHANGE})
	for _, sess := range h.Sessions {
		res, err := c.s.callback(ctx, sess, nfs4.NfsCbArgop4{Argop: nfs4.OP_CB_GETATTR,
			Opcbgetattr: &nfs4.CBGETATTR4args{Fh: h.FH, AttrRequest: req}})
		if err != nil {
			continue
		}
		if len(res) != 1 || res[0].Opcbgetattr == nil || res[0].Opcbgetattr.Status != nfs4.NFS4_OK || res[0].Opcbgetattr.Resok4 == nil {
			break
		}
		size, change, ok := decodeSizeChange(&res[0].Opcbgetattr.Resok4.ObjAttributes)
		if !ok {
			break
		}
		c.s.counters.cbGetattr.Add(1)
		if change != c.s.cbChange(o.fh.ino, change, o.attr.Change) || size != o.attr.Size {
			// The holder changed the file (§10.4.3): show its size and a
			// change attribute past the server's, and move mtime. The
			// object is this COMPOUND's; a copy keeps it unchanged.
			oc := *o
			oc.attr.Size = size
			oc.attr.Change++
			oc.attr.Mtime = time.Now()
			oc.attr.Ctime = oc.attr.Mtime
			return &oc, nfs4.NFS4_OK
		}
		return o, nfs4.NFS4_OK
	}
	return o, c.breakDelegations(o.fh.ino, true)
}

// cbChange remembers the change attribute a write delegation holder last
// reported for ino and returns the one it reported before, or the server's
// own (cur) the first time.
func (s *Server) cbChange(ino meta.Ino, change, cur uint64) uint64 {
	s.st.mu.Lock()
	defer s.st.mu.Unlock()
	if s.st.cbChanges == nil || len(s.st.cbChanges) > 1<<14 {
		s.st.cbChanges = map[meta.Ino]uint64{}
	}
	prev, seen := s.st.cbChanges[ino]
	s.st.cbChanges[ino] = change
	if !seen {
		return cur
	}
	return prev
}

// decodeSizeChange reads size and change from a CB_GETATTR reply: the
// attributes come in bit order, change (3) before size (4), each 8 bytes.
func decodeSizeChange(f *nfs4.Fattr4) (size, change uint64, ok bool) {
	has := func(a uint32) bool {
		return uint32(len(f.Attrmask)) > a/32 && f.Attrmask[a/32]&(1<<(a%32)) != 0
	}
	if !has(nfs4.FATTR4_SIZE) || !has(nfs4.FATTR4_CHANGE) {
		return 0, 0, false
	}
	for i, w := range f.Attrmask {
		mask := w
		if i == 0 {
			mask &^= 1<<nfs4.FATTR4_SIZE | 1<<nfs4.FATTR4_CHANGE
		}
		if mask != 0 {
			return 0, 0, false // attributes we did not ask for
		}
	}
	d := xdr.NewDecoder(f.AttrVals)
	change = d.Uint64()
	size = d.Uint64()
	if d.Err() != nil {
		return 0, 0, false
	}
	return size, change, true
}
