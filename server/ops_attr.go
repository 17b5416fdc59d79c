package server

import (
	"bytes"
	"time"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/xdr"
	"github.com/shoalfs/shoal/meta"
)

func (c *compound) getattr(a *nfs4.GETATTR4args) opReply {
	o, st := c.current()
	if st != nfs4.NFS4_OK {
		return fail(st)
	}
	if readsWriteOnly(a.AttrRequest) {
		return fail(nfs4.NFS4ERR_INVAL)
	}
	if bitmapHas(a.AttrRequest, nfs4.FATTR4_SIZE) || bitmapHas(a.AttrRequest, nfs4.FATTR4_CHANGE) {
		// Another client may hold a write delegation and have changed
		// the file in its cache (CB_GETATTR, deleg.go).
		var st nfs4.Nfsstat4
		if o, st = c.cbGetattr(o); st != nfs4.NFS4_OK {
			return fail(st)
		}
	}
	return ok(marshalFunc(func(e *xdr.Encoder) { c.encodeAttrs(e, o, a.AttrRequest, nfs4.NFS4_OK) }))
}

// verify implements VERIFY (negate false) and NVERIFY (negate true): the
// client's attribute values are compared byte for byte with Shoal's own
// encoding of the same attributes (RFC 8881 §18.31).
func (c *compound) verify(f *nfs4.Fattr4, negate bool) opReply {
	o, st := c.current()
	if st != nfs4.NFS4_OK {
		return fail(st)
	}
	if bitmapHas(f.Attrmask, nfs4.FATTR4_RDATTR_ERROR) || readsWriteOnly(f.Attrmask) {
		return fail(nfs4.NFS4ERR_INVAL)
	}
	unsupported := false
	bitmapEach(f.Attrmask, func(n uint32) bool {
		unsupported = !bitmapHas(c.supported(), n)
		return !unsupported
	})
	if unsupported {
		return fail(nfs4.NFS4ERR_ATTRNOTSUPP)
	}
	e := xdr.NewEncoder(256)
	c.attrValues(e, o, f.Attrmask, nfs4.NFS4_OK)
	same := bytes.Equal(e.Bytes(), f.AttrVals)
	switch {
	case same && negate:
		return fail(nfs4.NFS4ERR_SAME)
	case !same && !negate:
		return fail(nfs4.NFS4ERR_NOT_SAME)
	}
	return ok(nil)
}

func (c *compound) access(a *nfs4.ACCESS4args) opReply {
	o, st := c.current()
	if st != nfs4.NFS4_OK {
		return fail(st)
	}
	all := uint32(nfs4.ACCESS4_READ | nfs4.ACCESS4_LOOKUP | nfs4.ACCESS4_MODIFY |
		nfs4.ACCESS4_EXTEND | nfs4.ACCESS4_DELETE | nfs4.ACCESS4_EXECUTE)
	if c.minor >= 2 && xattrsOn(o) {
		// The extended attribute bits of RFC 8276, in 4.2 only.
		all |= nfs4.ACCESS4_XAREAD | nfs4.ACCESS4_XAWRITE | nfs4.ACCESS4_XALIST
	}
	supported := a.Access & all
	cr := c.cred(o.export)
	ro := o.export == nil || o.export.readOnlyFor(c.addr)
	var granted uint32
	can := func(bits uint32) bool { return allowed(&o.attr, cr, bits) }
	if supported&nfs4.ACCESS4_READ != 0 && can(permRead) {
		granted |= nfs4.ACCESS4_READ
	}
	if can(permRead) {
		granted |= supported & (nfs4.ACCESS4_XAREAD | nfs4.ACCESS4_XALIST)
	}
	if !ro && can(permWrite) {
		granted |= supported & nfs4.ACCESS4_XAWRITE
	}
	if o.isDir() {
		if supported&nfs4.ACCESS4_LOOKUP != 0 && can(permExec) {
			granted |= nfs4.ACCESS4_LOOKUP
		}
		if !ro && can(permWrite|permExec) {
			granted |= supported & (nfs4.ACCESS4_MODIFY | nfs4.ACCESS4_EXTEND | nfs4.ACCESS4_DELETE)
		}
	} else {
		if !ro && can(permWrite) {
			granted |= supported & (nfs4.ACCESS4_MODIFY | nfs4.ACCESS4_EXTEND)
		}
		if supported&nfs4.ACCESS4_EXECUTE != 0 && can(permExec) {
			granted |= nfs4.ACCESS4_EXECUTE
		}
	}
	return ok(&nfs4.ACCESS4resok{Supported: supported, Access: granted})
}

func (c *compound) setattr(a *nfs4.SETATTR4args) opReply {
	empty := bitmapVal(nil)
	o, st := c.current()
	if st != nfs4.NFS4_OK {
		return fail(st).withBody(empty)
	}
	if st := c.writable(o); st != nfs4.NFS4_OK {
		return fail(st).withBody(empty)
	}
	sa, st := decodeSetAttrs(&a.ObjAttributes, c.supported())
	if st != nfs4.NFS4_OK {
		return fail(st).withBody(empty)
	}
	if sa.sa.Mask&meta.SetSize != 0 {
		switch o.attr.Type {
		case meta.TypeRegular:
		case meta.TypeDirectory:
			return fail(nfs4.NFS4ERR_ISDIR).withBody(empty)
		default:
			return fail(nfs4.NFS4ERR_INVAL).withBody(empty)
		}
		if st := c.checkIO(&a.Stateid, o, true); st != nfs4.NFS4_OK {
			return fail(st).withBody(empty)
		}
		// Layouts must be recalled before the data servers' objects are
		// truncated under the clients' feet.
		if !c.recallAndWait(o.fh.ino, c.s.fh.encode(o.fh)) {
			return fail(nfs4.NFS4ERR_DELAY).withBody(empty)
		}
	}
	if st := c.setattrAllowed(o, &sa.sa); st != nfs4.NFS4_OK {
		return fail(st).withBody(empty)
	}
	// Other clients' delegations cache the attributes (a write
	// delegation also the data): they are recalled first.
	if st := c.breakDelegations(o.fh.ino, true); st != nfs4.NFS4_OK {
		return fail(st).withBody(empty)
	}
	if _, err := c.applySetAttr(o, sa.sa); err != nil {
		return failErr(err).withBody(empty)
	}
	return ok(bitmapVal(sa.set))
}

// setattrAllowed applies POSIX rules for who may change what.
func (c *compound) setattrAllowed(o *object, sa *meta.SetAttr) nfs4.Nfsstat4 {
	cr := c.cred(o.export)
	if cr.uid == 0 {
		return nfs4.NFS4_OK
	}
	owner := cr.uid == o.attr.UID
	if sa.Mask&meta.SetSize != 0 && !allowed(&o.attr, cr, permWrite) {
		return nfs4.NFS4ERR_ACCESS
	}
	if sa.Mask&meta.SetMode != 0 && !owner {
		return nfs4.NFS4ERR_PERM
	}
	if sa.Mask&meta.SetUID != 0 && sa.UID != o.attr.UID {
		return nfs4.NFS4ERR_PERM
	}
	if sa.Mask&meta.SetGID != 0 && sa.GID != o.attr.GID && (!owner || !cr.inGroup(sa.GID)) {
		return nfs4.NFS4ERR_PERM
	}
	if sa.Mask&(meta.SetAtime|meta.SetMtime) != 0 && !owner {
		return nfs4.NFS4ERR_PERM
	}
	if sa.Mask&(meta.SetAtimeNow|meta.SetMtimeNow) != 0 && !owner && !allowed(&o.attr, cr, permWrite) {
		return nfs4.NFS4ERR_ACCESS
	}
	return nfs4.NFS4_OK
}

// applySetAttr changes attributes, truncating file data when the size
// changes. Pending write attributes are persisted first, so the result never
// goes back in time.
//
// A truncation that cuts data off is answered only once its size is
// durable, on async exports too (durability.go): the data goes first, and
// a machine crash that took the new size back would leave the old size
// over bytes that are gone.
func (c *compound) applySetAttr(o *object, sa meta.SetAttr) (meta.Attr, error) {
	s, ctx := c.s, c.ctx
	if err := s.cache.flush(ctx, o.fh.ino); err != nil {
		return meta.Attr{}, err
	}
	if sa.Mask&meta.SetSize != 0 {
		if sa.Size < o.attr.Size {
			c.needStable()
		}
		if err := s.data.Truncate(uint64(o.fh.ino), sa.Size); err != nil {
			return meta.Attr{}, err
		}
		if sa.Mask&(meta.SetMtime|meta.SetMtimeNow) == 0 && sa.Size != o.attr.Size {
			sa.Mask |= meta.SetMtimeNow
		}
	}
	return s.meta.SetAttr(ctx, o.fh.ino, sa, time.Now())
}
