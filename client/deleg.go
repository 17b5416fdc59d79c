package client

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shoalfs/shoal/internal/nfs4"
)

// Read delegations (RFC 8881 §10.2, §10.4).
//
// A read-only OPEN asks for nothing in particular, and a server that
// grants a read delegation in its reply hands the Client a promise: no
// other client writes the file, changes its attributes, removes or renames
// it without first recalling the delegation with CB_RECALL. While the
// Client holds one it skips revalidation:
//
//   - OpenHandle of the file read-only is satisfied locally: no OPEN, no
//     GETATTR, and the matching Close sends no CLOSE. Such a File reads
//     with the delegation stateid, as RFC 8881 §9.1.3 allows. Path opens
//     (Open, OpenAt) still send OPEN: without a name cache the client does
//     not know the handle before the server resolved the name, and a
//     delegation of a file says nothing about its parent directories.
//   - StatHandle and File.Stat answer from the attributes the OPEN's
//     COMPOUND returned, as long as this Client itself changed nothing that
//     could move them (see attrGen and delegation.mut).
//   - The close-to-open check of AccessCached compares the same change
//     attribute, so cached data stays valid across opens.
//
// Write opens ask for no delegation (OPEN4_SHARE_ACCESS_WANT_NO_DELEG), and
// a write delegation granted anyway is returned at once. A write
// delegation would save little here (Close writes back and commits
// anyway: close-to-open) and would oblige the Client to answer CB_GETATTR
// with sizes of data it still holds; CB_GETATTR is answered with
// NFS4ERR_BADHANDLE, meaning no write delegation is held for the file.
//
// CB_RECALL is answered at once: NFS4_OK for a delegation held (then, in
// the background: write back what the Client's Files hold of the file,
// turn the Files opened locally into server opens with OPEN
// CLAIM_DELEG_CUR_FH, DELEGRETURN), NFS4ERR_BAD_STATEID for one unknown.
// An OPEN whose reply carries the recalled delegation may still be in
// flight (the recall overtook the reply); a recall of an unknown stateid
// while OPENs are in flight is remembered and answered NFS4_OK, and the
// delegation is returned as soon as its OPEN reply arrives.
//
// When a SEQUENCE reply says state was revoked
// (SEQ4_STATUS_RECALLABLE_STATE_REVOKED and its kin), the Client tests its
// delegation stateids with TEST_STATEID, frees the revoked ones with
// FREE_STATEID and drops them: their Files opened locally are opened on
// the server (CLAIM_FH) and cached data of the file is dropped, since
// another client may have written it meanwhile. A new client ID (server
// restart, lease expired) drops all delegations; Close returns them.
//
// Lock order: File.convMu (serializes turning a local open into a server
// one with its Close), then delegTable.mu, then File.mu. No network I/O
// happens under delegTable.mu.

// delegation is a read delegation held for one file.
type delegation struct {
	fh  []byte
	sid nfs4.Stateid4

	// The file's attributes, valid while attrGen of the Client equals
	// gen and mut has not moved since they were read.
	attr     Attr
	haveAttr bool
	gen      uint64
	mut      uint64 // bumped around this Client's changes to the file

	local    map[*File]struct{} // Files opened without OPEN under it
	recalled bool               // being returned: no new local opens
}

type delegTable struct {
	mu      sync.Mutex
	byFH    map[string]*delegation
	byOther map[[12]byte]*delegation
	n       atomic.Int32 // len(byFH), read without mu on hot paths

	opening int               // OPEN COMPOUNDs in flight
	early   map[[12]byte]bool // recalled before their OPEN reply arrived
	// gone holds the stateids of delegations this Client returned or
	// dropped (oldest first in goneQ, at most maxGone): a reply to an
	// OPEN sent before the return may hand the same delegation out
	// again, and it must not be taken for a live one.
	gone    map[[12]byte]struct{}
	goneQ   [][12]byte
	sweep   atomic.Bool   // a revocation sweep is running
	again   atomic.Bool   // revocation flags seen since the sweep began
	lastSwp atomic.Int64  // unix nanos of the last sweep's start
	attrGen atomic.Uint64 // bumped around changes the Client cannot pin to a file
}

func (t *delegTable) init() {
	t.byFH = map[string]*delegation{}
	t.byOther = map[[12]byte]*delegation{}
	t.early = map[[12]byte]bool{}
	t.gone = map[[12]byte]struct{}{}
}

// maxGone bounds delegTable.gone. A stale OPEN reply arrives within a
// round trip of the return, far fewer returns than this later.
const maxGone = 1024

// delegStats are the delegation counters of Stats.
type delegStats struct {
	granted, returned, recalls, revoked atomic.Uint64
	opensRevoked                        atomic.Uint64 // opens and locks mended (revoke.go)
	localOpens, cachedAttrs             atomic.Uint64
}

// wantDeleg is the want flags for an OPEN with share access access.
func (c *Client) wantDeleg(access uint32) uint32 {
	if c.opts.NoDelegations || access&nfs4.OPEN4_SHARE_ACCESS_WRITE != 0 {
		return nfs4.OPEN4_SHARE_ACCESS_WANT_NO_DELEG
	}
	// No preference: servers that know the want flags and those that do
	// not both hand out read delegations to read-only opens.
	return nfs4.OPEN4_SHARE_ACCESS_WANT_NO_PREFERENCE
}

// attrSnap is what an attribute fetch must find unchanged to be cached.
type attrSnap struct {
	gen, mut uint64
}

// beginOpen notes an OPEN in flight and snapshots the attribute
// generation for the attributes its COMPOUND returns.
func (c *Client) beginOpen() attrSnap {
	t := &c.delegs
	t.mu.Lock()
	t.opening++
	t.mu.Unlock()
	return attrSnap{gen: t.attrGen.Load()}
}

// endOpen ends what beginOpen started. When no OPEN is in flight any
// more, recalls of unknown stateids kept for them are forgotten.
func (c *Client) endOpen() {
	t := &c.delegs
	t.mu.Lock()
	t.opening--
	if t.opening == 0 && len(t.early) > 0 {
		clear(t.early)
	}
	t.mu.Unlock()
}

// gotDelegation handles the delegation in an OPEN reply for fh: it keeps
// a read delegation (with the attributes a of the same COMPOUND, if not
// nil) and returns anything else the Client does not want. snap is
// beginOpen's.
func (c *Client) gotDelegation(fh []byte, d *nfs4.OpenDelegation4, a *Attr, snap attrSnap) {
	var sid nfs4.Stateid4
	switch {
	case d.Read != nil:
		sid = d.Read.Stateid
	case d.Write != nil:
		// Asked for none (see the comment at the top of the file).
		c.returnLater(fh, d.Write.Stateid)
		return
	default:
		return
	}
	t := &c.delegs
	t.mu.Lock()
	if t.byFH == nil {
		t.init()
	}
	if _, ok := t.gone[sid.Other]; ok {
		// An OPEN reply that crossed this delegation's return (or its
		// revocation): the server no longer has it.
		t.mu.Unlock()
		return
	}
	if c.opts.NoDelegations || t.early[sid.Other] {
		// Both OPENs of a file may carry the delegation the early
		// recall named: the second reply must not take it for live.
		delete(t.early, sid.Other)
		t.goneLocked(sid.Other)
		t.mu.Unlock()
		c.returnLater(fh, sid)
		return
	}
	old := t.byFH[string(fh)]
	switch {
	case old != nil && old.sid.Other == sid.Other:
		// The server handed the same delegation out again.
		if sid.Seqid > old.sid.Seqid {
			old.sid.Seqid = sid.Seqid
		}
		if a != nil && !old.recalled && snap.gen == t.attrGen.Load() && !old.haveAttr {
			old.attr, old.haveAttr, old.gen = *a, true, snap.gen
		}
		t.mu.Unlock()
		return
	case old != nil:
		// A second delegation of the same file: keep the one local
		// Files may use, give the new one back.
		t.goneLocked(sid.Other)
		t.mu.Unlock()
		c.returnLater(fh, sid)
		return
	}
	dl := &delegation{fh: append([]byte(nil), fh...), sid: sid, local: map[*File]struct{}{}}
	if a != nil && snap.gen == t.attrGen.Load() {
		dl.attr, dl.haveAttr, dl.gen = *a, true, snap.gen
	}
	t.byFH[string(dl.fh)] = dl
	t.byOther[sid.Other] = dl
	t.n.Store(int32(len(t.byFH)))
	t.mu.Unlock()
	c.stats.deleg.granted.Add(1)
}

// removeLocked forgets d. t.mu is held.
func (t *delegTable) removeLocked(d *delegation) {
	if t.byFH[string(d.fh)] == d {
		delete(t.byFH, string(d.fh))
	}
	if t.byOther[d.sid.Other] == d {
		delete(t.byOther, d.sid.Other)
	}
	t.n.Store(int32(len(t.byFH)))
	t.goneLocked(d.sid.Other)
}

// goneLocked notes that the delegation with stateid other is being
// returned or was dropped. t.mu is held.
func (t *delegTable) goneLocked(other [12]byte) {
	if _, ok := t.gone[other]; ok {
		return
	}
	if len(t.goneQ) >= maxGone {
		delete(t.gone, t.goneQ[0])
		t.goneQ = t.goneQ[1:]
	}
	t.gone[other] = struct{}{}
	t.goneQ = append(t.goneQ, other)
}

// returnLater sends DELEGRETURN for sid in the background.
func (c *Client) returnLater(fh []byte, sid nfs4.Stateid4) {
	fh = append([]byte(nil), fh...)
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		c.returnDelegation(fh, sid)
	}()
}

// returnDelegation sends DELEGRETURN.
func (c *Client) returnDelegation(fh []byte, sid nfs4.Stateid4) {
	ctx, cancel := context.WithTimeout(c.ctx, 30*time.Second)
	defer cancel()
	_, err := c.call(ctx, func() []nfs4.NfsArgop4 {
		return []nfs4.NfsArgop4{putfh(fh), {Argop: nfs4.OP_DELEGRETURN, Opdelegreturn: &nfs4.DELEGRETURN4args{DelegStateid: sid}}}
	})
	var se *StatusError
	switch {
	case err == nil:
		c.stats.deleg.returned.Add(1)
	case errors.As(err, &se) && (se.status() == nfs4.NFS4ERR_DELEG_REVOKED || se.status() == nfs4.NFS4ERR_ADMIN_REVOKED):
		// Revoked while we were returning it: the server keeps it until
		// FREE_STATEID (RFC 8881 §8.2.3).
		c.freeStateid(ctx, sid)
	case c.ctx.Err() == nil:
		c.log.Warn("DELEGRETURN failed", "err", err)
	}
}

func (c *Client) freeStateid(ctx context.Context, sid nfs4.Stateid4) {
	_, err := c.call(ctx, fixed([]nfs4.NfsArgop4{{Argop: nfs4.OP_FREE_STATEID,
		OpfreeStateid: &nfs4.FREESTATEID4args{FsaStateid: sid}}}))
	if err != nil && c.ctx.Err() == nil {
		c.log.Debug("FREE_STATEID failed", "err", err)
	}
}

// cbRecall answers a CB_RECALL (RFC 8881 §20.2) and starts the return.
func (c *Client) cbRecall(a *nfs4.CBRECALL4args) nfs4.Nfsstat4 {
	t := &c.delegs
	t.mu.Lock()
	if t.byFH == nil {
		t.init()
	}
	d := t.byOther[a.Stateid.Other]
	if d == nil {
		st := nfs4.NFS4ERR_BAD_STATEID
		if t.opening > 0 && len(t.early) < 1024 {
			// Its OPEN reply may be on the way (RFC 8881 §2.10.6.3).
			t.early[a.Stateid.Other] = true
			st = nfs4.NFS4_OK
		}
		t.mu.Unlock()
		return st
	}
	if !bytes.Equal(d.fh, a.Fh) {
		t.mu.Unlock()
		return nfs4.NFS4ERR_BADHANDLE
	}
	if d.recalled {
		t.mu.Unlock()
		return nfs4.NFS4_OK // already on its way back
	}
	d.recalled = true
	t.mu.Unlock()
	c.stats.deleg.recalls.Add(1)
	if c.ignoreRecalls.Load() {
		return nfs4.NFS4_OK
	}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		c.giveBack(d)
	}()
	return nfs4.NFS4_OK
}

// giveBack returns a recalled delegation: the Client's Files of the file
// write back and commit, the Files opened locally become server opens,
// then DELEGRETURN.
func (c *Client) giveBack(d *delegation) {
	ctx, cancel := context.WithTimeout(c.ctx, time.Minute)
	defer cancel()
	for _, f := range c.filesOf(d.fh) {
		if f.writable() {
			if err := f.SyncContext(ctx); err != nil && !errors.Is(err, ErrClosed) {
				c.log.Warn("writing back before DELEGRETURN", "path", f.path, "err", err)
			}
		}
	}
	t := &c.delegs
	t.mu.Lock()
	local := make([]*File, 0, len(d.local))
	for f := range d.local {
		local = append(local, f)
	}
	t.mu.Unlock()
	for _, f := range local {
		if err := d.unlocal(ctx, f, true); err != nil {
			c.log.Warn("opening on the server before DELEGRETURN", "path", f.path, "err", err)
		}
	}
	t.mu.Lock()
	t.removeLocked(d)
	t.mu.Unlock()
	c.returnDelegation(d.fh, d.sid)
}

// unlocal turns f, opened locally under d, into an open on the server:
// OPEN CLAIM_DELEG_CUR_FH while the delegation is valid (cur), CLAIM_FH
// once it is revoked.
func (d *delegation) unlocal(ctx context.Context, f *File, cur bool) error {
	f.convMu.Lock()
	defer f.convMu.Unlock()
	f.mu.Lock()
	if f.local != d {
		f.mu.Unlock()
		return nil // closed or converted meanwhile
	}
	f.mu.Unlock()
	c := f.c
	claim := nfs4.OpenClaim4{Claim: nfs4.CLAIM_FH}
	if cur {
		sid := d.sid
		claim = nfs4.OpenClaim4{Claim: nfs4.CLAIM_DELEG_CUR_FH, OcDelegateStateid: &sid}
	}
	open := func(claim nfs4.OpenClaim4) ([]nfs4.NfsResop4, error) {
		return c.call(ctx, func() []nfs4.NfsArgop4 {
			_, s, _ := c.current()
			var cid nfs4.Clientid4
			if s != nil {
				cid = s.clientID
			}
			return []nfs4.NfsArgop4{putfh(f.fh), {Argop: nfs4.OP_OPEN, Opopen: &nfs4.OPEN4args{
				ShareAccess: f.access | nfs4.OPEN4_SHARE_ACCESS_WANT_NO_DELEG,
				ShareDeny:   nfs4.OPEN4_SHARE_DENY_NONE,
				Owner:       nfs4.OpenOwner4{Clientid: cid, Owner: f.openOwner},
				Openhow:     nfs4.Openflag4{Opentype: nfs4.OPEN4_NOCREATE},
				Claim:       claim,
			}}}
		})
	}
	res, err := open(claim)
	var se *StatusError
	if cur && errors.As(err, &se) && (se.status() == nfs4.NFS4ERR_NOTSUPP || se.status() == nfs4.NFS4ERR_INVAL) {
		// A server without CLAIM_DELEG_CUR_FH: a plain open by handle
		// conflicts with nothing a read delegation allows.
		res, err = open(nfs4.OpenClaim4{Claim: nfs4.CLAIM_FH})
	}
	if err != nil {
		return err
	}
	ok := res[1].Opopen.Resok4
	f.mu.Lock()
	f.stateid = ok.Stateid
	f.local = nil
	f.mu.Unlock()
	c.delegs.mu.Lock()
	delete(d.local, f)
	c.delegs.mu.Unlock()
	if dd := ok.Delegation; dd.Read != nil && dd.Read.Stateid.Other != d.sid.Other || dd.Write != nil {
		c.gotDelegation(f.fh, &dd, nil, attrSnap{})
	}
	return nil
}

// ensureServerOpen makes f an open on the server if it was opened locally
// under a delegation, for operations that need an open stateid (LOCK).
func (c *Client) ensureServerOpen(ctx context.Context, f *File) error {
	f.mu.Lock()
	d := f.local
	f.mu.Unlock()
	if d == nil {
		return nil
	}
	c.delegs.mu.Lock()
	revoked := c.delegs.byOther[d.sid.Other] != d
	c.delegs.mu.Unlock()
	return d.unlocal(ctx, f, !revoked)
}

// openLocal opens f (read-only, by handle) without OPEN under a read
// delegation of its file, if the Client holds one with attributes it can
// trust, refreshing them with a GETATTR if needed. It reports whether it
// did, with the attributes.
func (c *Client) openLocal(ctx context.Context, f *File) (Attr, bool) {
	if c.opts.NoDelegations || c.delegs.n.Load() == 0 || f.access != nfs4.OPEN4_SHARE_ACCESS_READ {
		return Attr{}, false
	}
	a, d, ok := c.delegAttr(ctx, f.fh)
	if !ok {
		return Attr{}, false
	}
	t := &c.delegs
	t.mu.Lock()
	defer t.mu.Unlock()
	if d.recalled || t.byFH[string(f.fh)] != d {
		return Attr{}, false
	}
	d.local[f] = struct{}{}
	f.mu.Lock()
	f.stateid = d.sid
	f.local = d
	f.mu.Unlock()
	c.stats.deleg.localOpens.Add(1)
	return a, true
}

// delegAttr returns the attributes of fh from a read delegation the Client
// holds, fetching them with GETATTR if the ones it has may be stale.
func (c *Client) delegAttr(ctx context.Context, fh []byte) (Attr, *delegation, bool) {
	if c.delegs.n.Load() == 0 {
		return Attr{}, nil, false
	}
	t := &c.delegs
	t.mu.Lock()
	d := t.byFH[string(fh)]
	if d == nil || d.recalled {
		t.mu.Unlock()
		return Attr{}, nil, false
	}
	snap := attrSnap{gen: t.attrGen.Load(), mut: d.mut}
	if d.haveAttr && d.gen == snap.gen {
		a := d.attr
		t.mu.Unlock()
		c.stats.deleg.cachedAttrs.Add(1)
		return a, d, true
	}
	t.mu.Unlock()
	res, err := c.call(ctx, fixed([]nfs4.NfsArgop4{putfh(fh), getattr(statBits)}))
	if err != nil {
		return Attr{}, nil, false
	}
	a, err := lastAttr(res)
	if err != nil {
		return Attr{}, nil, false
	}
	t.mu.Lock()
	if t.byFH[string(fh)] == d && !d.recalled && d.mut == snap.mut && t.attrGen.Load() == snap.gen {
		d.attr, d.haveAttr, d.gen = a, true, snap.gen
	}
	t.mu.Unlock()
	return a, d, true
}

// cachedDelegAttr returns the attributes of fh from a delegation, without
// a round trip, if the Client holds one with attributes it can trust.
func (c *Client) cachedDelegAttr(fh []byte) (Attr, bool) {
	if c.delegs.n.Load() == 0 {
		return Attr{}, false
	}
	t := &c.delegs
	t.mu.Lock()
	d := t.byFH[string(fh)]
	ok := d != nil && !d.recalled && d.haveAttr && d.gen == t.attrGen.Load()
	var a Attr
	if ok {
		a = d.attr
	}
	t.mu.Unlock()
	if ok {
		c.stats.deleg.cachedAttrs.Add(1)
	}
	return a, ok
}

// noteLocalClose detaches f, opened locally under d, at Close. It reports
// whether f was still local (then there is nothing to CLOSE).
func (c *Client) noteLocalClose(f *File) bool {
	f.convMu.Lock()
	defer f.convMu.Unlock()
	f.mu.Lock()
	d := f.local
	f.local = nil
	f.mu.Unlock()
	if d == nil {
		return false
	}
	c.delegs.mu.Lock()
	delete(d.local, f)
	c.delegs.mu.Unlock()
	return true
}

// mutating is called before a COMPOUND is sent and after its reply: ops
// that change a file's attributes make the attributes a delegation holds
// of it untrustworthy (the server does not recall a delegation for its
// holder's own changes). Changes pinned to a file by a PUTFH invalidate
// that file's; the rest (names: REMOVE, RENAME, LINK change link counts)
// all of them.
func (c *Client) mutating(ops []nfs4.NfsArgop4) {
	var cur []byte
	// Every COMPOUND comes here twice, WRITEs through the MDS included:
	// a small array on the stack spares them an allocation.
	var fileBuf [4][]byte
	files := fileBuf[:0]
	all := false
	for _, op := range ops {
		switch op.Argop {
		case nfs4.OP_PUTFH:
			cur = op.Opputfh.Object
		case nfs4.OP_PUTROOTFH, nfs4.OP_PUTPUBFH, nfs4.OP_LOOKUP, nfs4.OP_LOOKUPP, nfs4.OP_RESTOREFH:
			cur = nil
		case nfs4.OP_WRITE, nfs4.OP_SETATTR, nfs4.OP_ALLOCATE, nfs4.OP_DEALLOCATE, nfs4.OP_LAYOUTCOMMIT,
			nfs4.OP_SETXATTR, nfs4.OP_REMOVEXATTR, nfs4.OP_CLONE, nfs4.OP_COPY:
			if cur == nil {
				all = true
			} else {
				files = append(files, cur)
			}
		case nfs4.OP_REMOVE, nfs4.OP_RENAME, nfs4.OP_LINK, nfs4.OP_CREATE:
			all = true
		case nfs4.OP_OPEN:
			// Creating may set attributes of an existing file.
			if op.Opopen != nil && op.Opopen.Openhow.Opentype == nfs4.OPEN4_CREATE {
				all = true
			}
		}
	}
	if !all && len(files) == 0 {
		return
	}
	t := &c.delegs
	if t.n.Load() == 0 {
		// No delegation to pin the change to, but one may be on its way
		// in an OPEN reply whose GETATTR predates this change.
		t.attrGen.Add(1)
		return
	}
	t.mu.Lock()
	if all {
		t.attrGen.Add(1)
	}
	for _, fh := range files {
		if d := t.byFH[string(fh)]; d != nil {
			d.mut++
			d.haveAttr = false
		}
	}
	t.mu.Unlock()
}

// stateRevoked handles SEQUENCE status flags that say the server revoked
// state: a sweep (one at a time, at most one a second) tests the
// Client's stateids and mends the revoked ones. Flags that arrive while a
// sweep runs, or within a second of the last one, are not dropped: they
// start one more sweep once the second is over, since the state they
// report may have been revoked after the running sweep tested it.
func (c *Client) stateRevoked(flags uint32) {
	const revoked = nfs4.SEQ4_STATUS_RECALLABLE_STATE_REVOKED | nfs4.SEQ4_STATUS_EXPIRED_SOME_STATE_REVOKED |
		nfs4.SEQ4_STATUS_EXPIRED_ALL_STATE_REVOKED | nfs4.SEQ4_STATUS_ADMIN_STATE_REVOKED
	if flags&revoked == 0 {
		return
	}
	t := &c.delegs
	t.again.Store(true)
	if !t.sweep.CompareAndSwap(false, true) {
		return
	}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		for {
			for t.again.Swap(false) {
				wait := time.Second - time.Since(time.Unix(0, t.lastSwp.Load()))
				if wait > 0 {
					select {
					case <-time.After(wait):
					case <-c.ctx.Done():
						t.sweep.Store(false)
						return
					}
				}
				t.lastSwp.Store(time.Now().UnixNano())
				c.sweepRevoked()
			}
			t.sweep.Store(false)
			// Flags seen between the last Swap and the Store above
			// would otherwise wait for the next flagged reply.
			if !t.again.Load() || !t.sweep.CompareAndSwap(false, true) {
				return
			}
		}
	}()
}

// sweepRevoked tests every stateid the Client holds (delegations, and
// the opens and byte-range locks of its Files: revoke.go) and mends those
// the server no longer honours: a revoked delegation is dropped, a revoked
// open opened again, a revoked lock reported lost.
func (c *Client) sweepRevoked() {
	ctx, cancel := context.WithTimeout(c.ctx, time.Minute)
	defer cancel()
	t := &c.delegs
	t.mu.Lock()
	all := make([]heldStateid, 0, len(t.byFH))
	for _, d := range t.byFH {
		all = append(all, heldStateid{sid: d.sid, deleg: d})
	}
	t.mu.Unlock()
	all = c.openStateids(all)
	const batch = 64
	for len(all) > 0 {
		part := all[:min(batch, len(all))]
		all = all[len(part):]
		sids := make([]nfs4.Stateid4, len(part))
		for i, h := range part {
			sids[i] = h.sid
		}
		res, err := c.call(ctx, fixed([]nfs4.NfsArgop4{{Argop: nfs4.OP_TEST_STATEID,
			OptestStateid: &nfs4.TESTSTATEID4args{TsStateids: sids}}}))
		if err != nil {
			if c.ctx.Err() == nil {
				c.log.Warn("TEST_STATEID failed", "err", err)
			}
			return
		}
		ok := res[0].OptestStateid.TsrResok4
		if ok == nil {
			return
		}
		for i, st := range ok.TsrStatusCodes {
			if i >= len(part) || st == nfs4.NFS4_OK {
				continue
			}
			if d := part[i].deleg; d != nil {
				c.dropRevoked(ctx, d, st)
				continue
			}
			c.mendRevoked(ctx, part[i], st)
		}
	}
}

// dropRevoked forgets a delegation the server revoked (status st from
// TEST_STATEID), frees its stateid and reopens its local Files on the
// server.
func (c *Client) dropRevoked(ctx context.Context, d *delegation, st nfs4.Nfsstat4) {
	c.log.Warn("delegation revoked by the server", "status", st.String())
	c.stats.deleg.revoked.Add(1)
	t := &c.delegs
	t.mu.Lock()
	t.removeLocked(d)
	d.recalled = true
	local := make([]*File, 0, len(d.local))
	for f := range d.local {
		local = append(local, f)
	}
	t.mu.Unlock()
	if st == nfs4.NFS4ERR_DELEG_REVOKED || st == nfs4.NFS4ERR_ADMIN_REVOKED || st == nfs4.NFS4ERR_EXPIRED {
		c.freeStateid(ctx, d.sid)
	}
	// Another client may have written the file since the delegation
	// stopped protecting the cached copy.
	c.cache.mu.Lock()
	if ino := c.cache.inodes[string(d.fh)]; ino != nil {
		c.cache.invalidateLocked(ino, 0)
		ino.haveChg = false
	}
	c.cache.mu.Unlock()
	for _, f := range local {
		if err := d.unlocal(ctx, f, false); err != nil {
			c.log.Warn("reopening after a revoked delegation", "path", f.path, "err", err)
		}
	}
}

// dropAllDelegations forgets every delegation without returning it: the
// server lost them with the session (restart, expired lease). Files opened
// locally become ordinary Files for the reclaim that follows.
func (c *Client) dropAllDelegations() {
	t := &c.delegs
	t.mu.Lock()
	var local []*File
	for _, d := range t.byFH {
		d.recalled = true
		for f := range d.local {
			local = append(local, f)
		}
		clear(d.local)
	}
	clear(t.byFH)
	clear(t.byOther)
	clear(t.early)
	t.n.Store(0)
	t.mu.Unlock()
	for _, f := range local {
		f.mu.Lock()
		f.local = nil
		f.mu.Unlock()
	}
}

// returnAllDelegations returns every delegation, at Close.
func (c *Client) returnAllDelegations(ctx context.Context) {
	t := &c.delegs
	t.mu.Lock()
	all := make([]*delegation, 0, len(t.byFH))
	for _, d := range t.byFH {
		d.recalled = true
		all = append(all, d)
	}
	t.mu.Unlock()
	sem := make(chan struct{}, 8)
	var wg sync.WaitGroup
	for _, d := range all {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			_, err := c.call(ctx, fixed([]nfs4.NfsArgop4{putfh(d.fh),
				{Argop: nfs4.OP_DELEGRETURN, Opdelegreturn: &nfs4.DELEGRETURN4args{DelegStateid: d.sid}}}))
			if err == nil {
				c.stats.deleg.returned.Add(1)
			}
		}()
	}
	wg.Wait()
	c.dropAllDelegations()
}

// dropDelegation returns any delegation an OPEN that asked for none got.
func (c *Client) dropDelegation(fh []byte, d *nfs4.OpenDelegation4) {
	switch {
	case d.Read != nil:
		c.returnLater(fh, d.Read.Stateid)
	case d.Write != nil:
		c.returnLater(fh, d.Write.Stateid)
	}
}

// Delegations returns how many delegations the Client holds now.
func (c *Client) Delegations() int { return int(c.delegs.n.Load()) }

// opCounter counts the operations the Client sends, by operation number.
type opCounter struct {
	n [80]atomic.Uint64
}

func (o *opCounter) count(ops []nfs4.NfsArgop4) {
	for _, op := range ops {
		if i := int(op.Argop); i >= 0 && i < len(o.n) {
			o.n[i].Add(1)
		}
	}
}

// OpCounts returns how many of each NFSv4 operation the Client has sent
// since Dial, by name without the OP_ prefix ("OPEN", "GETATTR"), counting
// every transmission of a COMPOUND after a retry (not replays after a
// reconnect). SEQUENCE counts the COMPOUNDs sent on the session. Tests and
// benchmarks use it to show round trips saved.
func (c *Client) OpCounts() map[string]uint64 {
	m := map[string]uint64{}
	for i := range c.ops.n {
		if v := c.ops.n[i].Load(); v > 0 {
			name := nfs4.NfsOpnum4(i).String()
			if len(name) > 3 && name[:3] == "OP_" {
				name = name[3:]
			}
			m[name] = v
		}
	}
	return m
}
