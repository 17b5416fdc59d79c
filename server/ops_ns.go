package server

import (
	"errors"
	"sort"
	"time"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/xdr"
	"github.com/shoalfs/shoal/meta"
	"github.com/shoalfs/shoal/server/internal/state"
)

// dirForUpdate returns the current directory if the caller may add or
// remove entries in it.
func (c *compound) dirForUpdate() (*object, nfs4.Nfsstat4) {
	dir, st := c.currentDir()
	if st != nfs4.NFS4_OK {
		return nil, st
	}
	if st := c.writable(dir); st != nfs4.NFS4_OK {
		return nil, st
	}
	if st := c.check(dir, permWrite|permExec); st != nfs4.NFS4_OK {
		return nil, st
	}
	return dir, nfs4.NFS4_OK
}

// cinfo converts the engine's change info, taken inside the operation's
// transaction, into an atomic change_info4.
func cinfo(ci meta.ChangeInfo) nfs4.ChangeInfo4 {
	return nfs4.ChangeInfo4{Atomic: true, Before: ci.Before, After: ci.After}
}

// replayCinfo is the change_info4 of dir in a reply answered from a
// replay record (replay.go): the values taken with the change are gone,
// so it is not atomic, and before and after are the change attribute now.
func replayCinfo(dir *object) nfs4.ChangeInfo4 {
	return nfs4.ChangeInfo4{Atomic: false, Before: dir.attr.Change, After: dir.attr.Change}
}

// newOwner returns the owner of a new object: the caller, with the group of
// a set-gid parent directory.
func (c *compound) newOwner(dir *object) (uint32, uint32) {
	cr := c.cred(dir.export)
	gid := cr.gid
	if dir.attr.Mode&0o2000 != 0 {
		gid = dir.attr.GID
	}
	return cr.uid, gid
}

func (c *compound) create(a *nfs4.CREATE4args) opReply {
	dir, st := c.dirForUpdate()
	if st != nfs4.NFS4_OK {
		return fail(st)
	}
	if st := checkName(a.Objname); st != nfs4.NFS4_OK {
		return fail(st)
	}
	sa, st := decodeSetAttrs(&a.Createattrs, c.supported())
	if st != nfs4.NFS4_OK {
		return fail(st)
	}
	uid, gid := c.newOwner(dir)
	args := meta.CreateArgs{UID: uid, GID: gid, Mode: 0o755}
	switch a.Objtype.Type {
	case nfs4.NF4DIR:
		args.Type = meta.TypeDirectory
	case nfs4.NF4LNK:
		args.Type = meta.TypeSymlink
		args.Mode = 0o777
		if a.Objtype.Linkdata == nil || len(*a.Objtype.Linkdata) == 0 {
			return fail(nfs4.NFS4ERR_INVAL)
		}
		args.Target = string(*a.Objtype.Linkdata)
	case nfs4.NF4BLK, nfs4.NF4CHR:
		// Device nodes need privilege, as with mknod(2) (CAP_MKNOD): a
		// client that mounts the export with devices enabled would
		// otherwise let any user reach any device.
		if c.cred(dir.export).uid != 0 {
			return fail(nfs4.NFS4ERR_PERM)
		}
		args.Type = meta.TypeBlock
		if a.Objtype.Type == nfs4.NF4CHR {
			args.Type = meta.TypeChar
		}
		if d := a.Objtype.Devdata; d != nil {
			args.RdevMajor, args.RdevMinor = d.Specdata1, d.Specdata2
		}
		args.Mode = 0o644
	case nfs4.NF4SOCK:
		args.Type, args.Mode = meta.TypeSocket, 0o644
	case nfs4.NF4FIFO:
		args.Type, args.Mode = meta.TypeFIFO, 0o644
	case nfs4.NF4REG:
		return fail(nfs4.NFS4ERR_BADTYPE)
	default:
		return fail(nfs4.NFS4ERR_BADTYPE)
	}
	if sa.sa.Mask&meta.SetMode != 0 {
		args.Mode = sa.sa.Mode
	}
	if sa.sa.Mask&meta.SetSize != 0 {
		return fail(nfs4.NFS4ERR_INVAL)
	}
	ctx, rw := c.replayStart(nfs4.OP_CREATE, replayDigest(nfs4.OP_CREATE, []meta.Ino{dir.fh.ino},
		a.Objname, []byte{byte(args.Type)}, []byte(args.Target)))
	nd, ci, err := c.s.meta.Create(ctx, dir.fh.ino, string(a.Objname), args, time.Time{})
	c.replayEnd(rw, err)
	if err != nil {
		if errors.Is(err, meta.ErrExist) {
			if r, found := c.replayAnswer(rw, func(r meta.ReplayRecord) bool { return r.Ino == nd.Ino }); found {
				c.setFH(fhandle{kind: fhObject, export: dir.fh.export, ino: r.Ino})
				return ok(&nfs4.CREATE4resok{Cinfo: replayCinfo(dir), Attrset: sa.set})
			}
		}
		return failErr(err)
	}
	ino, attr := nd.Ino, nd.Attr
	rest := sa.sa
	rest.Mask &^= meta.SetMode
	attrset := sa.set
	if rest.Mask != 0 {
		obj := &object{fh: fhandle{kind: fhObject, export: dir.fh.export, ino: ino}, export: dir.export, attr: attr}
		applied := false
		if st := c.setattrAllowed(obj, &rest); st == nfs4.NFS4_OK {
			_, err := c.s.meta.SetAttr(c.ctx, ino, rest, time.Now())
			applied = err == nil
		}
		if !applied {
			// Report only what was set (RFC 8881 §18.4.4 attrset).
			attrset = bitmapAnd(sa.set, modeOnly)
		}
	}
	c.setFH(fhandle{kind: fhObject, export: dir.fh.export, ino: ino})
	return ok(&nfs4.CREATE4resok{Cinfo: cinfo(ci), Attrset: attrset})
}

// stickyDenied implements the sticky-directory rule: only the owner of the
// entry or of the directory (or root) may remove or rename it.
func (c *compound) stickyDenied(t *target) bool {
	dir := t.dir
	if dir.attr.Mode&0o1000 == 0 {
		return false
	}
	cr := c.cred(dir.export)
	if cr.uid == 0 || cr.uid == dir.attr.UID {
		return false
	}
	nd, err := t.node()
	return err == nil && nd.Attr.UID != cr.uid
}

// target is the object that a REMOVE or RENAME names, for the checks
// before the change (sticky bit, delegations, layouts): looked up at
// most once for all of them, as the engine call after them looks it up
// again itself. What it finds may be out of date by the time the change
// runs, as each check's own lookup was.
type target struct {
	c    *compound
	dir  *object
	name string

	looked bool
	nd     meta.Node
	err    error
}

func (c *compound) target(dir *object, name string) *target {
	return &target{c: c, dir: dir, name: name}
}

// node looks the target up, the first time it is asked.
func (t *target) node() (meta.Node, error) {
	if !t.looked {
		t.nd, t.err = t.c.s.meta.Lookup(t.c.ctx, t.dir.fh.ino, t.name)
		t.looked = true
	}
	return t.nd, t.err
}

// released handles an inode that lost a link: a regular file whose last
// link went away is an orphan, freed with its data once nobody holds it
// open (orphans.go).
func (c *compound) released(ino meta.Ino, a meta.Attr) {
	if a.Nlink == 0 && a.Type == meta.TypeRegular {
		c.s.st.orphans.orphaned(ino)
	}
}

func (c *compound) remove(a *nfs4.REMOVE4args) opReply {
	dir, st := c.dirForUpdate()
	if st != nfs4.NFS4_OK {
		return fail(st)
	}
	if st := checkName(a.Target); st != nfs4.NFS4_OK {
		return fail(st)
	}
	t := c.target(dir, string(a.Target))
	if c.stickyDenied(t) {
		return fail(nfs4.NFS4ERR_ACCESS)
	}
	if st := c.breakDelegationsOf(t); st != nfs4.NFS4_OK {
		return fail(st)
	}
	if !c.s.pnfs.recallLastLink(c, t) {
		return fail(nfs4.NFS4ERR_DELAY)
	}
	ctx, rw := c.replayStart(nfs4.OP_REMOVE, replayDigest(nfs4.OP_REMOVE, []meta.Ino{dir.fh.ino}, a.Target))
	free := c.s.st.orphans.freeAtRemove(t)
	if free != nil {
		ctx = meta.WithFreeUnlinked(ctx, &free.f)
	}
	nd, ci, err := c.s.meta.Remove(ctx, dir.fh.ino, string(a.Target), time.Time{})
	freed := free != nil && free.done(err)
	c.replayEnd(rw, err)
	if err != nil {
		if errors.Is(err, meta.ErrNotFound) {
			if _, found := c.replayAnswer(rw, func(meta.ReplayRecord) bool { return true }); found {
				return ok(&nfs4.REMOVE4resok{Cinfo: replayCinfo(dir)})
			}
		}
		return failErr(err)
	}
	if !freed {
		c.released(nd.Ino, nd.Attr)
	}
	return ok(&nfs4.REMOVE4resok{Cinfo: cinfo(ci)})
}

func (c *compound) rename(a *nfs4.RENAME4args) opReply {
	if !c.hasSFH {
		return fail(nfs4.NFS4ERR_NOFILEHANDLE)
	}
	dst, st := c.dirForUpdate()
	if st != nfs4.NFS4_OK {
		return fail(st)
	}
	src, st := c.load(c.sfh)
	if st != nfs4.NFS4_OK {
		return fail(st)
	}
	if !src.isDir() {
		return fail(nfs4.NFS4ERR_NOTDIR)
	}
	if src.export != dst.export || src.export == nil {
		return fail(nfs4.NFS4ERR_XDEV)
	}
	if st := c.check(src, permWrite|permExec); st != nfs4.NFS4_OK {
		return fail(st)
	}
	for _, n := range [][]byte{a.Oldname, a.Newname} {
		if st := checkName(n); st != nfs4.NFS4_OK {
			return fail(st)
		}
	}
	from, to := c.target(src, string(a.Oldname)), c.target(dst, string(a.Newname))
	if c.stickyDenied(from) || c.stickyDenied(to) {
		return fail(nfs4.NFS4ERR_ACCESS)
	}
	for _, t := range []*target{from, to} {
		if st := c.breakDelegationsOf(t); st != nfs4.NFS4_OK {
			return fail(st)
		}
	}
	if !c.s.pnfs.recallLastLink(c, to) {
		return fail(nfs4.NFS4ERR_DELAY)
	}
	ctx, rw := c.replayStart(nfs4.OP_RENAME, replayDigest(nfs4.OP_RENAME, []meta.Ino{src.fh.ino, dst.fh.ino}, a.Oldname, a.Newname))
	rr, err := c.s.meta.Rename(ctx, src.fh.ino, string(a.Oldname), dst.fh.ino, string(a.Newname), time.Time{})
	c.replayEnd(rw, err)
	if err != nil {
		if errors.Is(err, meta.ErrNotFound) {
			// A second execution finds the source gone; the first put
			// the object under the target name.
			if _, found := c.replayAnswer(rw, func(r meta.ReplayRecord) bool {
				nd, err := c.s.meta.Lookup(c.ctx, dst.fh.ino, string(a.Newname))
				return err == nil && nd.Ino == r.Ino
			}); found {
				return ok(&nfs4.RENAME4resok{SourceCinfo: replayCinfo(src), TargetCinfo: replayCinfo(dst)})
			}
		}
		return failErr(err)
	}
	if rr.Replaced.Ino != 0 {
		c.released(rr.Replaced.Ino, rr.Replaced.Attr)
	}
	return ok(&nfs4.RENAME4resok{SourceCinfo: cinfo(rr.Src), TargetCinfo: cinfo(rr.Dst)})
}

func (c *compound) link(a *nfs4.LINK4args) opReply {
	if !c.hasSFH {
		return fail(nfs4.NFS4ERR_NOFILEHANDLE)
	}
	dir, st := c.dirForUpdate()
	if st != nfs4.NFS4_OK {
		return fail(st)
	}
	src, st := c.load(c.sfh)
	if st != nfs4.NFS4_OK {
		return fail(st)
	}
	if src.isDir() {
		return fail(nfs4.NFS4ERR_ISDIR)
	}
	if src.export != dir.export {
		return fail(nfs4.NFS4ERR_XDEV)
	}
	if st := checkName(a.Newname); st != nfs4.NFS4_OK {
		return fail(st)
	}
	if st := c.breakDelegations(src.fh.ino, true); st != nfs4.NFS4_OK {
		return fail(st)
	}
	ctx, rw := c.replayStart(nfs4.OP_LINK, replayDigest(nfs4.OP_LINK, []meta.Ino{src.fh.ino, dir.fh.ino}, a.Newname))
	_, ci, err := c.s.meta.Link(ctx, src.fh.ino, dir.fh.ino, string(a.Newname), time.Time{})
	c.replayEnd(rw, err)
	if err != nil {
		if errors.Is(err, meta.ErrExist) {
			if _, found := c.replayAnswer(rw, func(r meta.ReplayRecord) bool {
				nd, err := c.s.meta.Lookup(c.ctx, dir.fh.ino, string(a.Newname))
				return err == nil && nd.Ino == r.Ino && r.Ino == src.fh.ino
			}); found {
				return ok(&nfs4.LINK4resok{Cinfo: replayCinfo(dir)})
			}
		}
		return failErr(err)
	}
	return ok(&nfs4.LINK4resok{Cinfo: cinfo(ci)})
}

func (c *compound) readlink() opReply {
	o, st := c.current()
	if st != nfs4.NFS4_OK {
		return fail(st)
	}
	if o.attr.Type != meta.TypeSymlink {
		return fail(nfs4.NFS4ERR_INVAL)
	}
	target, err := c.s.meta.Readlink(c.ctx, o.fh.ino)
	if err != nil {
		return failErr(err)
	}
	return ok(&nfs4.READLINK4resok{Link: []byte(target)})
}

// cookieVerf derives a directory's cookie verifier. Cookies are per-entry
// sequence numbers that never change, so the verifier only has to tell
// directories apart; it is stable across restarts.
func cookieVerf(a *meta.Attr) nfs4.Verifier4 { return meta.DirVerifier(*a) }

func (c *compound) readdir(a *nfs4.READDIR4args) opReply {
	dir, st := c.currentDir()
	if st != nfs4.NFS4_OK {
		return fail(st)
	}
	if readsWriteOnly(a.AttrRequest) {
		return fail(nfs4.NFS4ERR_INVAL)
	}
	if dir.export != nil {
		if st := c.check(dir, permRead); st != nfs4.NFS4_OK {
			return fail(st)
		}
	}
	verf := cookieVerf(&dir.attr)
	if a.Cookie != 0 && a.Cookieverf != (nfs4.Verifier4{}) && a.Cookieverf != verf {
		return fail(nfs4.NFS4ERR_NOT_SAME)
	}
	if a.Cookie == 1 || a.Cookie == 2 {
		return fail(nfs4.NFS4ERR_BAD_COOKIE)
	}
	entries, eof, st := c.dirEntries(dir, a.Cookie, a.Maxcount)
	if st != nfs4.NFS4_OK {
		return fail(st)
	}
	maxcount := int(a.Maxcount)
	e := xdr.NewEncoder(min(maxcount, 64<<10))
	e.FixedOpaque(verf[:])
	n := 0
	for i := range entries {
		ent := &entries[i]
		m := e.Mark()
		e.Bool(true)
		e.Uint64(ent.cookie)
		e.String(ent.name)
		c.encodeAttrs(e, &ent.obj, a.AttrRequest, nfs4.NFS4_OK)
		if e.Mark()+8 > maxcount {
			e.Truncate(m)
			eof = false
			break
		}
		n++
	}
	if n == 0 && len(entries) > 0 {
		return fail(nfs4.NFS4ERR_TOOSMALL)
	}
	e.Bool(false)
	e.Bool(eof)
	return ok(rawXDR(e.Bytes()))
}

// rawXDR is a result body that is already encoded.
type rawXDR []byte

func (r rawXDR) EncodeXDR(e *xdr.Encoder) { e.Append(r) }

type dirEntry struct {
	name   string
	cookie uint64
	obj    object
}

// dirEntries returns up to about maxcount bytes' worth of entries after cookie.
func (c *compound) dirEntries(dir *object, cookie uint64, maxcount uint32) ([]dirEntry, bool, nfs4.Nfsstat4) {
	if dir.pseudo != nil {
		var out []dirEntry
		seq := uint64(2)
		for _, name := range sortedKeys(dir.pseudo.children) {
			seq++
			if seq <= cookie {
				continue
			}
			h, st := c.lookupName(dir, []byte(name))
			if st != nfs4.NFS4_OK {
				continue
			}
			o, st := c.load(h)
			if st != nfs4.NFS4_OK {
				continue
			}
			out = append(out, dirEntry{name: name, cookie: seq, obj: *o})
		}
		return out, true, nfs4.NFS4_OK
	}
	// Each entry takes at least ~32 bytes on the wire; fetch a little more
	// than can fit so the encoder decides where to stop.
	max := int(maxcount/32) + 1
	if max > 1024 {
		max = 1024
	}
	ents, eof, err := c.s.meta.ReadDir(c.ctx, dir.fh.ino, cookie, max)
	if err != nil {
		if errors.Is(err, meta.ErrNotFound) {
			return nil, false, nfs4.NFS4ERR_BAD_COOKIE
		}
		return nil, false, statusOf(err)
	}
	out := make([]dirEntry, len(ents))
	for i, ent := range ents {
		a := ent.Attr
		c.s.cache.overlay(ent.Ino, &a)
		out[i] = dirEntry{name: ent.Name, cookie: ent.Cookie,
			obj: object{fh: fhandle{kind: fhObject, export: dir.fh.export, ino: ent.Ino}, export: dir.export, attr: a}}
	}
	return out, eof, nfs4.NFS4_OK
}

func sortedKeys(m map[string]child) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// breakDelegationsOf recalls other clients' delegations of the file t
// names, which the operation removes or renames (deleg.go).
func (c *compound) breakDelegationsOf(t *target) nfs4.Nfsstat4 {
	if c.s.cfg.NoDelegations {
		return nfs4.NFS4_OK
	}
	// Looked up even when no delegation is out: breakDelegations also
	// holds back grants of the file until the operation is done.
	nd, err := t.node()
	if err != nil || nd.Attr.Type != meta.TypeRegular {
		return nfs4.NFS4_OK // the operation reports a missing name itself
	}
	return c.breakDelegations(nd.Ino, true)
}

// recallLastLink recalls the layouts of the file t names when the operation
// would drop the file's last link (REMOVE, or RENAME over it) and so free
// it: the data servers' objects go away with it (RFC 8881 §12.5.5.1). It
// reports whether the caller may go ahead, after waiting up to recallWait
// for the holders; otherwise the client is told to retry (NFS4ERR_DELAY)
// while they return their layouts. A file that
// somebody holds open is not freed but kept as an orphan, data included
// (orphans.go), so its layouts stay valid and nothing is recalled: in
// particular an rm does not wait for the lease of a dead client that held
// the file open; the orphan goes when that client's state is purged. If
// the last open goes before the remove, the file is freed with layouts
// out, which can do no more I/O: data servers accept only the open and
// lock stateids the metadata server still knows.
func (p *pnfsState) recallLastLink(c *compound, t *target) bool {
	if p == nil {
		return true // no layouts
	}
	nd, err := t.node()
	if err != nil || nd.Attr.Type != meta.TypeRegular || nd.Attr.Nlink != 1 {
		return true
	}
	if c.s.st.m.HasOpen(state.FileID(nd.Ino)) || c.s.st.m.Recalled(state.FileID(nd.Ino)) {
		// Open: nothing is freed. No layout out (the common case): no
		// recall, and no filehandle to sign for one.
		return true
	}
	h := fhandle{kind: fhObject, export: t.dir.fh.export, ino: nd.Ino}
	return c.recallAndWait(nd.Ino, c.s.fh.encode(h))
}
