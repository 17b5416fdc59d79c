package server

import (
	"errors"
	"time"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/xdr"
	"github.com/shoalfs/shoal/meta"
	"github.com/shoalfs/shoal/server/internal/state"
)

// openResult is OPEN4resok, with its delegation (deleg.go).
type openResult struct {
	sid     nfs4.Stateid4
	cinfo   nfs4.ChangeInfo4
	attrset nfs4.Bitmap4
	deleg   delegReply
}

func (r *openResult) EncodeXDR(e *xdr.Encoder) {
	r.sid.EncodeXDR(e)
	r.cinfo.EncodeXDR(e)
	e.Uint32(nfs4.OPEN4_RESULT_LOCKTYPE_POSIX)
	encodeBitmap(e, r.attrset)
	r.deleg.EncodeXDR(e)
}

func (c *compound) open(a *nfs4.OPEN4args) opReply {
	id, st := c.clientID()
	if st != nfs4.NFS4_OK {
		return fail(st)
	}
	access := a.ShareAccess & state.AccessBoth
	if access == 0 || a.ShareDeny > state.DenyBoth {
		return fail(nfs4.NFS4ERR_INVAL)
	}
	want, st := parseWant(a.ShareAccess)
	if st != nfs4.NFS4_OK {
		return fail(st)
	}
	// Taken before the file is resolved; see orphanSet.
	guard := c.s.st.orphans.guard()
	var (
		file    *object
		created bool
		ci      nfs4.ChangeInfo4
		attrset nfs4.Bitmap4
		reclaim bool
		// delegCur: the client turns a delegation it holds into an
		// open (CLAIM_DELEGATE_CUR, CLAIM_DELEG_CUR_FH), typically while
		// it is being recalled.
		delegCur *nfs4.Stateid4
	)
	switch a.Claim.Claim {
	case nfs4.CLAIM_NULL:
		if a.Claim.File == nil {
			return fail(nfs4.NFS4ERR_BADXDR)
		}
		dir, st := c.currentDir()
		if st != nfs4.NFS4_OK {
			return fail(st)
		}
		if dir.pseudo != nil {
			if a.Openhow.Opentype == nfs4.OPEN4_CREATE {
				return fail(nfs4.NFS4ERR_ROFS)
			}
			return fail(nfs4.NFS4ERR_ISDIR)
		}
		if st := checkName(*a.Claim.File); st != nfs4.NFS4_OK {
			return fail(st)
		}
		// The state manager refuses non-reclaim opens during grace and
		// from a client that has not sent RECLAIM_COMPLETE; ask first
		// so a refused OPEN4_CREATE does not leave a file behind.
		if err := c.s.st.m.CheckNonReclaim(id); err != nil {
			return failErr(err)
		}
		file, created, ci, attrset, st = c.openName(dir, string(*a.Claim.File), &a.Openhow)
		if st != nfs4.NFS4_OK {
			return fail(st)
		}
	case nfs4.CLAIM_FH, nfs4.CLAIM_PREVIOUS:
		reclaim = a.Claim.Claim == nfs4.CLAIM_PREVIOUS
		o, st := c.current()
		if st != nfs4.NFS4_OK {
			return fail(st)
		}
		file = o
	case nfs4.CLAIM_DELEGATE_CUR:
		if a.Claim.DelegateCurInfo == nil {
			return fail(nfs4.NFS4ERR_BADXDR)
		}
		dir, st := c.currentDir()
		if st != nfs4.NFS4_OK {
			return fail(st)
		}
		if dir.pseudo != nil {
			return fail(nfs4.NFS4ERR_ISDIR)
		}
		name := a.Claim.DelegateCurInfo.File
		if st := checkName(name); st != nfs4.NFS4_OK {
			return fail(st)
		}
		// The file exists (the client holds a delegation of it): no
		// create, whatever openhow says.
		file, created, ci, attrset, st = c.openName(dir, string(name), &nfs4.Openflag4{Opentype: nfs4.OPEN4_NOCREATE})
		if st != nfs4.NFS4_OK {
			return fail(st)
		}
		delegCur = &a.Claim.DelegateCurInfo.DelegateStateid
	case nfs4.CLAIM_DELEG_CUR_FH:
		if a.Claim.OcDelegateStateid == nil {
			return fail(nfs4.NFS4ERR_BADXDR)
		}
		o, st := c.current()
		if st != nfs4.NFS4_OK {
			return fail(st)
		}
		file, delegCur = o, a.Claim.OcDelegateStateid
	case nfs4.CLAIM_DELEGATE_PREV, nfs4.CLAIM_DELEG_PREV_FH:
		// Reclaiming delegations across a client restart needs
		// DELEGPURGE, which Shoal does not support (RFC 8881 §18.5.3).
		return fail(nfs4.NFS4ERR_NOTSUPP)
	default:
		return fail(nfs4.NFS4ERR_INVAL)
	}
	switch file.attr.Type {
	case meta.TypeRegular:
	case meta.TypeDirectory:
		return fail(nfs4.NFS4ERR_ISDIR)
	case meta.TypeSymlink:
		return fail(nfs4.NFS4ERR_SYMLINK)
	default:
		return fail(nfs4.NFS4ERR_WRONG_TYPE)
	}
	if delegCur != nil {
		sid, st := c.stateid(*delegCur)
		if st != nfs4.NFS4_OK {
			return fail(st)
		}
		if _, err := c.s.st.m.CheckDeleg(id, sid, state.FileID(file.fh.ino)); err != nil {
			return failErr(err)
		}
	}
	if !created {
		if access&state.AccessWrite != 0 {
			if st := c.writable(file); st != nfs4.NFS4_OK {
				return fail(st)
			}
		}
		var want uint32
		if access&state.AccessRead != 0 {
			want |= permRead
		}
		if access&state.AccessWrite != 0 {
			want |= permWrite
		}
		if st := c.check(file, want); st != nfs4.NFS4_OK {
			return fail(st)
		}
	}
	if !created && bitmapHas(attrset, nfs4.FATTR4_SIZE) {
		// The truncate below changes the file even under a read-only
		// open: other clients' delegations go first, before the open
		// exists (a DELAY after it would leave an open the client does
		// not know of).
		if st := c.breakDelegations(file.fh.ino, true); st != nfs4.NFS4_OK {
			return fail(st)
		}
	}
	var res state.OpenResult
	alive, err := guard.open(file.fh.ino, func() error {
		var err error
		res, err = c.s.st.m.Open(state.OpenArgs{
			ClientID: id,
			Owner:    a.Owner.Owner,
			File:     state.FileID(file.fh.ino),
			Access:   access,
			Deny:     a.ShareDeny,
			Reclaim:  reclaim,
		})
		return err
	})
	if err != nil {
		// Other clients' conflicting delegations are recalled first.
		return fail(c.s.recallOn(err))
	}
	if !alive {
		// The file was unlinked after we resolved it, and freed or
		// doomed to be (orphans.go): the open came too late to keep
		// it. By filehandle that is a stale handle; by name, a retry
		// resolves the name afresh.
		if _, err := c.s.st.m.Close(id, res.Stateid); err != nil {
			c.log.Warn("undo open of a freed file", "ino", uint64(file.fh.ino), "err", err)
		}
		if a.Claim.Claim == nfs4.CLAIM_NULL {
			return fail(nfs4.NFS4ERR_DELAY)
		}
		return fail(nfs4.NFS4ERR_STALE)
	}
	if !created && bitmapHas(attrset, nfs4.FATTR4_SIZE) {
		// UNCHECKED4 on an existing file with a size (O_TRUNC): truncate
		// only now, so an OPEN refused for a share conflict or grace
		// leaves the file alone.
		sa, _ := decodeSetAttrs(a.Openhow.How.Createattrs, c.supported())
		if _, err := c.applySetAttr(file, meta.SetAttr{Mask: meta.SetSize, Size: sa.sa.Size}); err != nil {
			return failErr(err)
		}
	}
	var deleg delegReply
	switch {
	case delegCur != nil:
		// The client has the delegation it claims under.
		deleg = delegReply{why: noWant}
	case reclaim && a.Claim.DelegateType != nil && *a.Claim.DelegateType != nfs4.OPEN_DELEGATE_NONE:
		// The client held a delegation before the restart (and may
		// hold locks under it that the server never saw).
		deleg = c.reclaimDelegation(file, *a.Claim.DelegateType)
	case reclaim:
		deleg = delegReply{why: noWant}
		if want != wantNoPreference {
			deleg.why = nfs4.WND4_RESOURCE
		}
	case created && want == wantNoPreference:
		// A file this OPEN created, for a client that states no
		// preference (Linux): no delegation. A new file is mostly
		// written, closed and left (tar x, a build, cp), and Linux
		// returns a delegation before it removes the file, so one
		// handed out here cost a DELEGRETURN round trip per file and
		// saved none: on a 4.2 mount, rm -r of a tarred source tree took
		// 3.19 COMPOUNDs per file with it and 2.39 without, tar x 10.98
		// and 10.77 (test/kernel TestKernelSrcTree). The file's next
		// OPEN may get one; a client that asks gets one now.
		deleg = delegReply{why: noWant}
	default:
		deleg = c.offerDelegation(file, want, access)
	}
	c.setFH(file.fh)
	c.setStateid(res.Stateid)
	return ok(&openResult{sid: fromState(res.Stateid), cinfo: ci, attrset: attrset, deleg: deleg})
}

// openName resolves (and with OPEN4_CREATE creates) name in dir.
func (c *compound) openName(dir *object, name string, how *nfs4.Openflag4) (*object, bool, nfs4.ChangeInfo4, nfs4.Bitmap4, nfs4.Nfsstat4) {
	var ci nfs4.ChangeInfo4
	mkobj := func(nd meta.Node) *object {
		return &object{fh: fhandle{kind: fhObject, export: dir.fh.export, ino: nd.Ino}, export: dir.export, attr: nd.Attr}
	}
	if how.Opentype != nfs4.OPEN4_CREATE {
		if st := c.check(dir, permExec); st != nfs4.NFS4_OK {
			return nil, false, ci, nil, st
		}
		nd, err := c.s.meta.Lookup(c.ctx, dir.fh.ino, name)
		if err != nil {
			return nil, false, ci, nil, statusOf(err)
		}
		o := mkobj(nd)
		c.s.cache.overlay(nd.Ino, &o.attr)
		ci = nfs4.ChangeInfo4{Atomic: true, Before: dir.attr.Change, After: dir.attr.Change}
		return o, false, ci, nil, nfs4.NFS4_OK
	}
	if how.How == nil {
		return nil, false, ci, nil, nfs4.NFS4ERR_BADXDR
	}
	if st := c.writable(dir); st != nfs4.NFS4_OK {
		return nil, false, ci, nil, st
	}
	if st := c.check(dir, permWrite|permExec); st != nfs4.NFS4_OK {
		return nil, false, ci, nil, st
	}
	var (
		attrs     *nfs4.Fattr4
		verf      [8]byte
		exclusive bool
	)
	h := how.How
	switch h.Mode {
	case nfs4.UNCHECKED4, nfs4.GUARDED4:
		attrs = h.Createattrs
	case nfs4.EXCLUSIVE4:
		exclusive = true
		if h.Createverf != nil {
			verf = *h.Createverf
		}
	case nfs4.EXCLUSIVE4_1:
		exclusive = true
		if h.ChCreateboth != nil {
			verf = h.ChCreateboth.CvaVerf
			attrs = &h.ChCreateboth.CvaAttrs
		}
	default:
		return nil, false, ci, nil, nfs4.NFS4ERR_INVAL
	}
	var sa setAttrs
	if attrs != nil {
		var st nfs4.Nfsstat4
		if sa, st = decodeSetAttrs(attrs, c.supported()); st != nfs4.NFS4_OK {
			return nil, false, ci, nil, st
		}
	}
	uid, gid := c.newOwner(dir)
	args := meta.CreateArgs{Type: meta.TypeRegular, Mode: 0o644, UID: uid, GID: gid, Exclusive: exclusive, Verifier: verf}
	if sa.sa.Mask&meta.SetMode != 0 {
		args.Mode = sa.sa.Mode
	}
	// A GUARDED4 create is the one that a second execution fails
	// (EXCLUSIVE4 has its verifier, UNCHECKED4 opens what exists): it
	// leaves a replay record (replay.go).
	ctx, rw := c.ctx, (*meta.ReplayWrite)(nil)
	if h.Mode == nfs4.GUARDED4 {
		ctx, rw = c.replayStart(nfs4.OP_OPEN, replayDigest(nfs4.OP_OPEN, []meta.Ino{dir.fh.ino}, []byte(name)))
	}
	nd, mci, err := c.s.meta.Create(ctx, dir.fh.ino, name, args, time.Time{})
	c.replayEnd(rw, err)
	switch {
	case err == nil:
		o := mkobj(nd)
		rest := sa.sa
		rest.Mask &^= meta.SetMode
		if rest.Mask&meta.SetSize != 0 && rest.Size == 0 {
			rest.Mask &^= meta.SetSize // a new file is empty already
		}
		attrset := sa.set
		if rest.Mask != 0 {
			applied := false
			if st := c.setattrAllowed(o, &rest); st == nfs4.NFS4_OK {
				if a, err := c.applySetAttr(o, rest); err == nil {
					o.attr, applied = a, true
				}
			}
			if !applied {
				// Report only what was set (RFC 8881 §18.16.4 attrset).
				attrset = bitmapAnd(sa.set, modeOnly)
				if sa.sa.Mask&meta.SetSize != 0 && sa.sa.Size == 0 {
					attrset = bitmapSet(attrset, nfs4.FATTR4_SIZE)
				}
			}
		}
		return o, true, cinfo(mci), attrset, nfs4.NFS4_OK
	case errors.Is(err, meta.ErrExist):
		o := mkobj(nd)
		c.s.cache.overlay(nd.Ino, &o.attr)
		ci = nfs4.ChangeInfo4{Atomic: true, Before: dir.attr.Change, After: dir.attr.Change}
		switch h.Mode {
		case nfs4.GUARDED4:
			if _, found := c.replayAnswer(rw, func(r meta.ReplayRecord) bool { return r.Ino == nd.Ino }); found {
				// The create was carried out by the previous server;
				// this OPEN opens what it made, as its reply would have.
				return o, true, replayCinfo(dir), sa.set, nfs4.NFS4_OK
			}
			return nil, false, ci, nil, nfs4.NFS4ERR_EXIST
		case nfs4.EXCLUSIVE4, nfs4.EXCLUSIVE4_1:
			// A retransmission of our own exclusive create succeeds.
			if nd.Attr.Verifier != verf || o.attr.Type != meta.TypeRegular {
				return nil, false, ci, nil, nfs4.NFS4ERR_EXIST
			}
			return o, true, ci, sa.set, nfs4.NFS4_OK
		}
		// UNCHECKED4: open the existing file; a size in the attributes
		// truncates it (O_TRUNC).
		if sa.sa.Mask&meta.SetSize != 0 && o.attr.Type == meta.TypeRegular {
			if st := c.check(o, permWrite); st != nfs4.NFS4_OK {
				return nil, false, ci, nil, st
			}
			// The caller truncates once the share reservation is granted.
			return o, false, ci, bitmapSet(nil, nfs4.FATTR4_SIZE), nfs4.NFS4_OK
		}
		return o, false, ci, nil, nfs4.NFS4_OK
	default:
		return nil, false, ci, nil, statusOf(err)
	}
}

func (c *compound) openDowngrade(a *nfs4.OPENDOWNGRADE4args) opReply {
	id, st := c.clientID()
	if st != nfs4.NFS4_OK {
		return fail(st)
	}
	if _, st := c.current(); st != nfs4.NFS4_OK {
		return fail(st)
	}
	sid, st := c.stateid(a.OpenStateid)
	if st != nfs4.NFS4_OK {
		return fail(st)
	}
	ns, err := c.s.st.m.OpenDowngrade(id, sid, a.ShareAccess&state.AccessBoth, a.ShareDeny)
	if err != nil {
		return failErr(err)
	}
	c.setStateid(ns)
	return ok(&nfs4.OPENDOWNGRADE4resok{OpenStateid: fromState(ns)})
}

func (c *compound) close(a *nfs4.CLOSE4args) opReply {
	id, st := c.clientID()
	if st != nfs4.NFS4_OK {
		return fail(st)
	}
	if !c.hasCFH {
		return fail(nfs4.NFS4ERR_NOFILEHANDLE)
	}
	sid, st := c.stateid(a.OpenStateid)
	if st != nfs4.NFS4_OK {
		return fail(st)
	}
	ns, file, err := c.s.st.m.CloseOpen(id, sid)
	if err != nil {
		return failErr(err)
	}
	// The last close of an unlinked file frees it.
	c.s.st.orphans.released(file)
	// The closed stateid is invalid; RFC 8881 §18.2.4 suggests returning a
	// special value so clients do not use it again.
	ns = state.InvalidStateid
	c.setStateid(ns)
	return ok(ptr(fromState(ns)))
}

func ptr[T any](v T) *T { return &v }
