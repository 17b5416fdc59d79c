package server

import (
	"time"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/xdr"
	"github.com/shoalfs/shoal/meta"
)

// Extended attributes (RFC 8276), NFSv4.2 only.
//
// The protocol carries only the user namespace, and its names without the
// "user." prefix (RFC 8276): the client adds and strips the prefix, and
// Shoal stores the names as they come, in the metadata engine next to the
// inode (meta.Engine.SetXattr; the limits are Linux's). Reading or listing
// needs read permission on the object, setting or removing write
// permission and a writable export, as Linux asks of user attributes; the
// ACCESS bits XAREAD, XALIST and XAWRITE follow the same rules. The
// pseudo-root holds no attributes: there the operations are
// NFS4ERR_NOTSUPP and xattr_support is false.

// xattrsOn reports whether o can carry extended attributes: any inode of
// an export.
func xattrsOn(o *object) bool { return o.export != nil && o.pseudo == nil }

// xattrObject returns the current object for an xattr operation, with
// NFS4ERR_ACCESS unless the caller has want on it.
func (c *compound) xattrObject(want uint32) (*object, nfs4.Nfsstat4) {
	o, st := c.current()
	if st != nfs4.NFS4_OK {
		return nil, st
	}
	if !xattrsOn(o) {
		return nil, nfs4.NFS4ERR_NOTSUPP
	}
	if want&permWrite != 0 {
		if st := c.writable(o); st != nfs4.NFS4_OK {
			return nil, st
		}
	}
	if st := c.check(o, want); st != nfs4.NFS4_OK {
		return nil, st
	}
	return o, nfs4.NFS4_OK
}

func (c *compound) getxattr(a *nfs4.GETXATTR4args) opReply {
	o, st := c.xattrObject(permRead)
	if st != nfs4.NFS4_OK {
		return fail(st)
	}
	val, err := c.s.meta.GetXattr(c.ctx, o.fh.ino, string(a.GxaName))
	if err != nil {
		return failErr(err)
	}
	return ok(marshalFunc(func(e *xdr.Encoder) { e.Opaque(val) }))
}

func (c *compound) setxattr(a *nfs4.SETXATTR4args) opReply {
	var mode meta.XattrMode
	switch a.SxaOption {
	case nfs4.SETXATTR4_EITHER:
		mode = meta.XattrEither
	case nfs4.SETXATTR4_CREATE:
		mode = meta.XattrCreate
	case nfs4.SETXATTR4_REPLACE:
		mode = meta.XattrReplace
	default:
		return fail(nfs4.NFS4ERR_INVAL)
	}
	o, st := c.xattrObject(permWrite)
	if st != nfs4.NFS4_OK {
		return fail(st)
	}
	// Persist pending write attributes first, as SETATTR does, so that
	// the change attribute the engine bumps is the one clients saw.
	if err := c.s.cache.flush(c.ctx, o.fh.ino); err != nil {
		return failErr(err)
	}
	ci, err := c.s.meta.SetXattr(c.ctx, o.fh.ino, string(a.SxaKey), a.SxaValue, mode, time.Now())
	if err != nil {
		return failErr(err)
	}
	info := cinfo(ci)
	return ok(&info)
}

func (c *compound) removexattr(a *nfs4.REMOVEXATTR4args) opReply {
	o, st := c.xattrObject(permWrite)
	if st != nfs4.NFS4_OK {
		return fail(st)
	}
	if err := c.s.cache.flush(c.ctx, o.fh.ino); err != nil {
		return failErr(err)
	}
	ci, err := c.s.meta.RemoveXattr(c.ctx, o.fh.ino, string(a.RxaName), time.Now())
	if err != nil {
		return failErr(err)
	}
	info := cinfo(ci)
	return ok(&info)
}

// listxattrsFixed is the size of a LISTXATTRS4resok without names: the
// cookie, the length of the name array and eof.
const listxattrsFixed = 8 + 4 + 4

// listxattrsPage is how many names LISTXATTRS asks the engine for at a
// time.
const listxattrsPage = 256

// listxattrs returns names from the cookie on while they fit in
// lxa_maxcount bytes of LISTXATTRS4resok (RFC 8276: the count
// covers the whole result, as READDIR's maxcount does), and
// NFS4ERR_TOOSMALL if not even one name fits. The cookie is the engine's
// position cookie (see meta.Engine.ListXattrs).
func (c *compound) listxattrs(a *nfs4.LISTXATTRS4args) opReply {
	o, st := c.xattrObject(permRead)
	if st != nfs4.NFS4_OK {
		return fail(st)
	}
	if a.LxaMaxcount < listxattrsFixed {
		return fail(nfs4.NFS4ERR_TOOSMALL)
	}
	left := int64(a.LxaMaxcount) - listxattrsFixed
	res := &nfs4.LISTXATTRS4resok{LxrCookie: a.LxaCookie}
	for full := false; !full; {
		names, eof, err := c.s.meta.ListXattrs(c.ctx, o.fh.ino, res.LxrCookie, listxattrsPage)
		if err != nil {
			return failErr(err)
		}
		for _, n := range names {
			size := int64(4 + (len(n.Name)+3)&^3)
			if size > left {
				full = true
				break
			}
			left -= size
			res.LxrNames = append(res.LxrNames, nfs4.Xattrkey4(n.Name))
			res.LxrCookie = n.Cookie
		}
		if full {
			break
		}
		if eof {
			res.LxrEof = true
			break
		}
	}
	if len(res.LxrNames) == 0 && !res.LxrEof {
		return fail(nfs4.NFS4ERR_TOOSMALL)
	}
	return ok(res)
}
