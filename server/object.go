package server

import (
	"context"
	"errors"
	"strings"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/rpc"
	"github.com/shoalfs/shoal/meta"
)

func splitPath(p string) []string {
	var out []string
	for _, s := range strings.Split(p, "/") {
		if s != "" {
			out = append(out, s)
		}
	}
	return out
}

// rootFH returns the filehandle of the pseudo-root.
func (s *Server) rootFH() fhandle {
	if e := s.ns.rootExport; e != nil {
		return fhandle{kind: fhObject, export: e.ID, ino: e.root}
	}
	return fhandle{kind: fhPseudo, export: 0}
}

// load resolves a filehandle to the object it designates, with fresh
// attributes. A handle whose inode is gone is stale; one naming an unknown
// export or pseudo node is bad.
func (c *compound) load(h fhandle) (*object, nfs4.Nfsstat4) {
	s := c.s
	if h.kind == fhPseudo {
		if int(h.export) >= len(s.ns.nodes) {
			return nil, nfs4.NFS4ERR_STALE
		}
		n := s.ns.nodes[h.export]
		return &object{fh: h, pseudo: n, attr: s.pseudoAttr(n)}, nfs4.NFS4_OK
	}
	if h.kind == fhData || h.kind == fhFlex {
		return nil, nfs4.NFS4ERR_BADHANDLE
	}
	e := s.ns.byID[h.export]
	if e == nil {
		return nil, nfs4.NFS4ERR_STALE
	}
	c.touched(e)
	if s.st.orphans.isDoomed(h.ino) {
		// Unlinked with no open, and about to be freed: gone for
		// clients already (orphans.go).
		return nil, nfs4.NFS4ERR_STALE
	}
	a, err := s.getattr(c.ctx, h.ino)
	if err != nil {
		if errors.Is(err, meta.ErrStale) || errors.Is(err, meta.ErrNotFound) {
			return nil, nfs4.NFS4ERR_STALE
		}
		return nil, statusOf(err)
	}
	return &object{fh: h, export: e, attr: a}, nfs4.NFS4_OK
}

// getattr returns an inode's attributes with not-yet-persisted changes from
// writes applied.
func (s *Server) getattr(ctx context.Context, ino meta.Ino) (meta.Attr, error) {
	a, err := s.meta.GetAttr(ctx, ino)
	if err != nil {
		return a, err
	}
	s.cache.overlay(ino, &a)
	if a.Type == meta.TypeRegular && s.pnfs.writeLayouts(ino) {
		// Clients writing through layouts report the new size only with
		// LAYOUTCOMMIT; until then the data servers know better. Without
		// this an O_APPEND writer that revalidates the size would write
		// over data it appended a moment ago.
		if f, err := s.openData(ino, false); err == nil && f != nil {
			if n, err := f.Size(); err == nil && uint64(n) > a.Size {
				a.Size = uint64(n)
			}
			f.Close()
		}
	}
	return a, nil
}

// current returns the object of the current filehandle.
func (c *compound) current() (*object, nfs4.Nfsstat4) {
	if !c.hasCFH {
		return nil, nfs4.NFS4ERR_NOFILEHANDLE
	}
	o, st := c.load(c.cfh)
	if st != nfs4.NFS4_OK {
		return nil, st
	}
	if o.export != nil && !o.export.allows(c.addr) {
		return nil, nfs4.NFS4ERR_ACCESS
	}
	return o, nfs4.NFS4_OK
}

// currentDir is current, requiring a directory.
func (c *compound) currentDir() (*object, nfs4.Nfsstat4) {
	o, st := c.current()
	if st != nfs4.NFS4_OK {
		return nil, st
	}
	if !o.isDir() {
		if o.attr.Type == meta.TypeSymlink {
			return nil, nfs4.NFS4ERR_SYMLINK
		}
		return nil, nfs4.NFS4ERR_NOTDIR
	}
	return o, nfs4.NFS4_OK
}

// currentFile is current, requiring a regular file.
func (c *compound) currentFile() (*object, nfs4.Nfsstat4) {
	o, st := c.current()
	if st != nfs4.NFS4_OK {
		return nil, st
	}
	switch o.attr.Type {
	case meta.TypeRegular:
		return o, nfs4.NFS4_OK
	case meta.TypeDirectory:
		return nil, nfs4.NFS4ERR_ISDIR
	case meta.TypeSymlink:
		return nil, nfs4.NFS4ERR_SYMLINK
	}
	return nil, nfs4.NFS4ERR_WRONG_TYPE
}

// writable reports an error if o cannot be modified through its export
// by this client.
func (c *compound) writable(o *object) nfs4.Nfsstat4 {
	if o.export == nil || o.export.readOnlyFor(c.addr) {
		return nfs4.NFS4ERR_ROFS
	}
	return nfs4.NFS4_OK
}

func (s *Server) pseudoAttr(n *pseudoNode) meta.Attr {
	t := s.bootTime
	return meta.Attr{
		Type: meta.TypeDirectory, Mode: 0o555, Nlink: 2,
		Atime: t, Mtime: t, Ctime: t, Btime: t, Change: uint64(t.UnixNano()),
	}
}

// cred returns the caller's identity as seen by an export (after squashing).
func (c *compound) cred(e *Export) cred {
	var cr cred
	if p := c.call.Sys; p != nil {
		cr = cred{uid: p.UID, gid: p.GID, gids: p.GIDs}
	} else {
		cr = cred{uid: 65534, gid: 65534} // AUTH_NONE is anonymous
		if e != nil {
			cr.uid, cr.gid = e.anon()
		}
		return cr
	}
	if e != nil {
		cr = e.squash(cr)
	}
	return cr
}

// Permission bits as used by access checks.
const (
	permRead  = 4
	permWrite = 2
	permExec  = 1
)

// allowed reports whether cr has all of the permission bits in want on a.
func allowed(a *meta.Attr, cr cred, want uint32) bool {
	if cr.uid == 0 {
		// root may do anything except execute a file with no x bit at all.
		if want&permExec != 0 && a.Type != meta.TypeDirectory && a.Mode&0o111 == 0 {
			return false
		}
		return true
	}
	var bits uint32
	switch {
	case cr.uid == a.UID:
		bits = (a.Mode >> 6) & 7
	case cr.inGroup(a.GID):
		bits = (a.Mode >> 3) & 7
	default:
		bits = a.Mode & 7
	}
	return bits&want == want
}

// check returns NFS4ERR_ACCESS unless the caller has want on o.
func (c *compound) check(o *object, want uint32) nfs4.Nfsstat4 {
	if allowed(&o.attr, c.cred(o.export), want) {
		return nfs4.NFS4_OK
	}
	return nfs4.NFS4ERR_ACCESS
}

// rpcSys is a convenience for tests and logs.
func credString(call *rpc.Call) string {
	if call.Sys == nil {
		return "none"
	}
	return call.Sys.Machine
}
