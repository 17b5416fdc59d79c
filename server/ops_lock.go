package server

import (
	"errors"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/xdr"
	"github.com/shoalfs/shoal/server/internal/state"
)

// checkRange validates a lock range (RFC 8881 §18.10.3): a zero length is
// invalid, and offset+length must not overflow unless length means "to EOF".
func checkRange(off, length uint64) nfs4.Nfsstat4 {
	if length == 0 {
		return nfs4.NFS4ERR_INVAL
	}
	if length != state.LengthToEOF && off+length < off {
		return nfs4.NFS4ERR_INVAL
	}
	return nfs4.NFS4_OK
}

// denied converts a lock conflict into a LOCK4denied result body.
func denied(err error) (xdr.Marshaler, bool) {
	var d *state.LockDeniedError
	if !errors.As(err, &d) {
		return nil, false
	}
	return &nfs4.LOCK4denied{
		Offset:   d.Offset,
		Length:   d.Length,
		Locktype: nfs4.NfsLockType4(d.Type),
		Owner:    nfs4.LockOwner4{Clientid: uint64(d.Owner.ClientID), Owner: d.Owner.Owner},
	}, true
}

func (c *compound) lock(a *nfs4.LOCK4args) opReply {
	id, st := c.clientID()
	if st != nfs4.NFS4_OK {
		return fail(st)
	}
	if _, st := c.currentFile(); st != nfs4.NFS4_OK {
		return fail(st)
	}
	if st := checkRange(a.Offset, a.Length); st != nfs4.NFS4_OK {
		return fail(st)
	}
	args := state.LockArgs{
		ClientID: id,
		Type:     state.LockType(a.Locktype),
		Reclaim:  a.Reclaim,
		Offset:   a.Offset,
		Length:   a.Length,
	}
	if a.Locker.NewLockOwner {
		if a.Locker.OpenOwner == nil {
			return fail(nfs4.NFS4ERR_BADXDR)
		}
		sid, st := c.stateid(a.Locker.OpenOwner.OpenStateid)
		if st != nfs4.NFS4_OK {
			return fail(st)
		}
		args.NewLockOwner = true
		args.OpenStateid = sid
		args.LockOwner = a.Locker.OpenOwner.LockOwner.Owner
	} else {
		if a.Locker.LockOwner == nil {
			return fail(nfs4.NFS4ERR_BADXDR)
		}
		sid, st := c.stateid(a.Locker.LockOwner.LockStateid)
		if st != nfs4.NFS4_OK {
			return fail(st)
		}
		args.LockStateid = sid
	}
	sid, err := c.s.st.m.Lock(args)
	if err != nil {
		if body, ok := denied(err); ok {
			return fail(nfs4.NFS4ERR_DENIED).withBody(body)
		}
		return failErr(err)
	}
	c.setStateid(sid)
	return ok(&nfs4.LOCK4resok{LockStateid: fromState(sid)})
}

func (c *compound) lockt(a *nfs4.LOCKT4args) opReply {
	id, st := c.clientID()
	if st != nfs4.NFS4_OK {
		return fail(st)
	}
	o, st := c.currentFile()
	if st != nfs4.NFS4_OK {
		return fail(st)
	}
	if st := checkRange(a.Offset, a.Length); st != nfs4.NFS4_OK {
		return fail(st)
	}
	err := c.s.st.m.LockTest(state.LockTestArgs{
		ClientID:  id,
		File:      state.FileID(o.fh.ino),
		Type:      state.LockType(a.Locktype),
		Offset:    a.Offset,
		Length:    a.Length,
		LockOwner: a.Owner.Owner,
	})
	if err != nil {
		if body, ok := denied(err); ok {
			return fail(nfs4.NFS4ERR_DENIED).withBody(body)
		}
		return failErr(err)
	}
	return ok(nil)
}

func (c *compound) locku(a *nfs4.LOCKU4args) opReply {
	id, st := c.clientID()
	if st != nfs4.NFS4_OK {
		return fail(st)
	}
	if _, st := c.currentFile(); st != nfs4.NFS4_OK {
		return fail(st)
	}
	if st := checkRange(a.Offset, a.Length); st != nfs4.NFS4_OK {
		return fail(st)
	}
	sid, st := c.stateid(a.LockStateid)
	if st != nfs4.NFS4_OK {
		return fail(st)
	}
	ns, err := c.s.st.m.Unlock(id, sid, a.Offset, a.Length)
	if err != nil {
		return failErr(err)
	}
	c.setStateid(ns)
	return ok(ptr(fromState(ns)))
}

func (c *compound) testStateid(a *nfs4.TESTSTATEID4args) opReply {
	id, st := c.clientID()
	if st != nfs4.NFS4_OK {
		return fail(st)
	}
	sids := make([]state.Stateid, len(a.TsStateids))
	for i, s := range a.TsStateids {
		sids[i] = toState(s)
	}
	errs := c.s.st.m.TestStateid(id, sids)
	codes := make([]nfs4.Nfsstat4, len(errs))
	for i, err := range errs {
		codes[i] = statusOf(err)
	}
	return ok(&nfs4.TESTSTATEID4resok{TsrStatusCodes: codes})
}

func (c *compound) freeStateid(a *nfs4.FREESTATEID4args) opReply {
	id, st := c.clientID()
	if st != nfs4.NFS4_OK {
		return fail(st)
	}
	sid, st := c.stateid(a.FsaStateid)
	if st != nfs4.NFS4_OK {
		return fail(st)
	}
	return okOrErr(c.s.st.m.FreeStateid(id, sid))
}
