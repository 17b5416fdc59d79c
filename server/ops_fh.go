package server

import (
	"unicode/utf8"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/xdr"
	"github.com/shoalfs/shoal/meta"
)

// marshalFunc adapts a function to xdr.Marshaler, for result bodies that are
// not generated structs.
type marshalFunc func(e *xdr.Encoder)

func (f marshalFunc) EncodeXDR(e *xdr.Encoder) { f(e) }

func (c *compound) putRootFH() opReply {
	c.setFH(c.s.rootFH())
	return ok(nil)
}

func (c *compound) putFH(a *nfs4.PUTFH4args) opReply {
	h, err := c.s.fh.decode(a.Object)
	if err != nil {
		return fail(nfs4.NFS4ERR_BADHANDLE)
	}
	if _, st := c.load(h); st != nfs4.NFS4_OK {
		return fail(st)
	}
	c.setFH(h)
	return ok(nil)
}

func (c *compound) getFH() opReply {
	if !c.hasCFH {
		return fail(nfs4.NFS4ERR_NOFILEHANDLE)
	}
	fh := c.encodeFH(c.cfh)
	return ok(&nfs4.GETFH4resok{Object: fh})
}

func (c *compound) saveFH() opReply {
	if !c.hasCFH {
		return fail(nfs4.NFS4ERR_NOFILEHANDLE)
	}
	c.sfh, c.hasSFH = c.cfh, true
	c.ssid, c.hasSSID = c.csid, c.hasCSID
	return ok(nil)
}

func (c *compound) restoreFH() opReply {
	if !c.hasSFH {
		return fail(nfs4.NFS4ERR_RESTOREFH)
	}
	c.cfh, c.hasCFH = c.sfh, true
	c.csid, c.hasCSID = c.ssid, c.hasSSID
	return ok(nil)
}

// checkName validates a component name (RFC 8881 §14.2).
func checkName(name []byte) nfs4.Nfsstat4 {
	switch {
	case len(name) == 0:
		return nfs4.NFS4ERR_INVAL
	case len(name) > 255:
		return nfs4.NFS4ERR_NAMETOOLONG
	case !utf8.Valid(name):
		return nfs4.NFS4ERR_INVAL
	case string(name) == "." || string(name) == "..":
		return nfs4.NFS4ERR_BADNAME
	}
	for _, b := range name {
		if b == '/' || b == 0 {
			return nfs4.NFS4ERR_BADCHAR
		}
	}
	return nfs4.NFS4_OK
}

// lookupName resolves name in directory dir (which may be a pseudo node).
func (c *compound) lookupName(dir *object, name []byte) (fhandle, nfs4.Nfsstat4) {
	if dir.pseudo != nil {
		ch, ok := dir.pseudo.children[string(name)]
		if !ok {
			return fhandle{}, nfs4.NFS4ERR_NOENT
		}
		if ch.export == nil {
			return fhandle{kind: fhPseudo, export: ch.pseudo}, nfs4.NFS4_OK
		}
		if !ch.export.allows(c.addr) {
			return fhandle{}, nfs4.NFS4ERR_ACCESS
		}
		return fhandle{kind: fhObject, export: ch.export.ID, ino: ch.export.root}, nfs4.NFS4_OK
	}
	if st := c.check(dir, permExec); st != nfs4.NFS4_OK {
		return fhandle{}, st
	}
	nd, err := c.s.meta.Lookup(c.ctx, dir.fh.ino, string(name))
	if err != nil {
		return fhandle{}, statusOf(err)
	}
	return fhandle{kind: fhObject, export: dir.fh.export, ino: nd.Ino}, nfs4.NFS4_OK
}

func (c *compound) lookup(a *nfs4.LOOKUP4args) opReply {
	dir, st := c.currentDir()
	if st != nfs4.NFS4_OK {
		return fail(st)
	}
	if st := checkName(a.Objname); st != nfs4.NFS4_OK {
		return fail(st)
	}
	h, st := c.lookupName(dir, a.Objname)
	if st != nfs4.NFS4_OK {
		return fail(st)
	}
	c.setFH(h)
	return ok(nil)
}

func (c *compound) lookupp() opReply {
	// A symbolic link is NFS4ERR_SYMLINK, another non-directory
	// NFS4ERR_NOTDIR (RFC 8881 §18.14.3), as for LOOKUP.
	o, st := c.currentDir()
	if st != nfs4.NFS4_OK {
		return fail(st)
	}
	if o.pseudo != nil {
		if o.pseudo.index == 0 {
			return fail(nfs4.NFS4ERR_NOENT)
		}
		c.setFH(fhandle{kind: fhPseudo, export: o.pseudo.parent})
		return ok(nil)
	}
	if o.fh.ino == o.export.root {
		if c.s.ns.rootExport != nil {
			return fail(nfs4.NFS4ERR_NOENT)
		}
		// Step out of the export into the pseudo node holding it.
		parent := c.s.ns.parentOf(o.export)
		c.setFH(fhandle{kind: fhPseudo, export: parent})
		return ok(nil)
	}
	if st := c.check(o, permExec); st != nfs4.NFS4_OK {
		return fail(st)
	}
	c.setFH(fhandle{kind: fhObject, export: o.fh.export, ino: o.attr.Parent})
	return ok(nil)
}

// parentOf returns the pseudo node that holds export e.
func (ns *namespace) parentOf(e *Export) uint16 {
	for _, n := range ns.nodes {
		for _, ch := range n.children {
			if ch.export == e {
				return n.index
			}
		}
	}
	return 0
}

// secinfoList is AUTH_SYS then AUTH_NONE: the flavors Shoal accepts.
var secinfoList = marshalFunc(func(e *xdr.Encoder) {
	e.Uint32(2)
	e.Uint32(1) // AUTH_SYS
	e.Uint32(0) // AUTH_NONE
})

func (c *compound) secinfo(a *nfs4.SECINFO4args) opReply {
	dir, st := c.currentDir()
	if st != nfs4.NFS4_OK {
		return fail(st)
	}
	if st := checkName(a.Name); st != nfs4.NFS4_OK {
		return fail(st)
	}
	if _, st := c.lookupName(dir, a.Name); st != nfs4.NFS4_OK {
		return fail(st)
	}
	// SECINFO consumes the current filehandle (RFC 8881 §18.29.3).
	c.hasCFH = false
	return ok(secinfoList)
}

func (c *compound) secinfoNoName(a *nfs4.SECINFONONAME4args) opReply {
	o, st := c.current()
	if st != nfs4.NFS4_OK {
		return fail(st)
	}
	if *a == nfs4.SECINFO_STYLE4_PARENT {
		if o.pseudo != nil && o.pseudo.index == 0 || o.export != nil && o.fh.ino == o.export.root && c.s.ns.rootExport != nil {
			return fail(nfs4.NFS4ERR_NOENT)
		}
	}
	c.hasCFH = false
	return ok(secinfoList)
}

var _ = meta.RootIno
