package client

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"syscall"

	"github.com/shoalfs/shoal/internal/nfs4"
)

// splitPath turns a slash-separated path into components, resolving "."
// and ".." lexically (".." never climbs above the root).
func splitPath(p string) []string {
	var out []string
	for _, c := range strings.Split(p, "/") {
		switch c {
		case "", ".":
		case "..":
			if len(out) > 0 {
				out = out[:len(out)-1]
			}
		default:
			out = append(out, c)
		}
	}
	return out
}

// splitParent returns the parent's components and the final name of p.
func splitParent(p string) ([]string, string) {
	comps := splitPath(p)
	if len(comps) == 0 {
		return nil, ""
	}
	return comps[:len(comps)-1], comps[len(comps)-1]
}

func putfh(fh []byte) nfs4.NfsArgop4 {
	return nfs4.NfsArgop4{Argop: nfs4.OP_PUTFH, Opputfh: &nfs4.PUTFH4args{Object: fh}}
}

func getattr(bm nfs4.Bitmap4) nfs4.NfsArgop4 {
	return nfs4.NfsArgop4{Argop: nfs4.OP_GETATTR, Opgetattr: &nfs4.GETATTR4args{AttrRequest: bm}}
}

var getfh = nfs4.NfsArgop4{Argop: nfs4.OP_GETFH}

// walk returns PUTROOTFH and a LOOKUP for every component of Options.Root
// and then of comps. LOOKUP does not follow symbolic links: a symlink in
// the middle of a path fails with NFS4ERR_SYMLINK, and a final one is
// returned as itself.
func (c *Client) walk(comps []string) []nfs4.NfsArgop4 {
	ops := make([]nfs4.NfsArgop4, 0, 1+len(c.root)+len(comps)+3)
	ops = append(ops, nfs4.NfsArgop4{Argop: nfs4.OP_PUTROOTFH})
	for _, list := range [][]string{c.root, comps} {
		for _, name := range list {
			ops = append(ops, nfs4.NfsArgop4{Argop: nfs4.OP_LOOKUP, Oplookup: &nfs4.LOOKUP4args{Objname: []byte(name)}})
		}
	}
	return ops
}

func fixed(ops []nfs4.NfsArgop4) func() []nfs4.NfsArgop4 {
	return func() []nfs4.NfsArgop4 { return ops }
}

// callOnce runs a COMPOUND that must not run twice (REMOVE, RENAME) and
// reports whether it was sent on more than one session. Resent on the same
// session, the server's reply cache answers a request it already carried
// out; resent on a new session, after the server instance changed (an MDS
// failover or restart, whose new instance has no reply cache of the old
// one's), it may run a second time, and its error may be the first run's
// success seen again.
func (c *Client) callOnce(ctx context.Context, ops []nfs4.NfsArgop4) (resent bool, err error) {
	var first, last uint64
	_, err = c.call(ctx, func() []nfs4.NfsArgop4 {
		if _, s, cerr := c.current(); cerr == nil {
			if first == 0 {
				first = s.gen
			}
			last = s.gen
		}
		return ops
	})
	return first != 0 && last != first, err
}

func lastAttr(res []nfs4.NfsResop4) (Attr, error) {
	var a Attr
	r := res[len(res)-1].Opgetattr
	if r == nil || r.Resok4 == nil {
		return a, errors.New("nfs: GETATTR result missing")
	}
	return a, decodeFattr(&r.Resok4.ObjAttributes, &a, nil)
}

// Stat returns the attributes of the object at path. Like lstat(2), it
// does not follow a final symbolic link.
func (c *Client) Stat(ctx context.Context, path string) (Attr, error) {
	var gen uint64
	if c.cache != nil {
		gen = c.cache.flushGen()
	}
	ops := append(c.walk(splitPath(path)), getattr(statBits))
	res, err := c.call(ctx, fixed(ops))
	if err != nil {
		return Attr{}, pathErr("stat", path, err)
	}
	a, err := lastAttr(res)
	if err == nil && a.Type == TypeRegular {
		a.Size = c.cachedSize(a, gen)
	}
	return a, pathErr("stat", path, err)
}

// cachedSize is a's size, or larger when this Client has written data to
// the file that is not on the server yet (or was not when the GETATTR was
// sent, at flushGen gen).
func (c *Client) cachedSize(a Attr, gen uint64) uint64 {
	if c.cache == nil {
		return a.Size
	}
	if ino := c.cache.byFileidLookup(a.Fileid); ino != nil {
		return c.cache.statSize(ino, a.Size, gen)
	}
	return a.Size
}

// Lstat is Stat; it exists for readers who look for the name.
func (c *Client) Lstat(ctx context.Context, path string) (Attr, error) { return c.Stat(ctx, path) }

// Statfs returns the space and file counts of the file system holding
// path, like statfs(2). A server computes them for the whole file system
// (Shoal: the disk of its data directory, or for a pNFS metadata server
// the sum over its data servers), not for path's directory alone.
func (c *Client) Statfs(ctx context.Context, path string) (FSStat, error) {
	ops := append(c.walk(splitPath(path)), getattr(fsStatBits))
	res, err := c.call(ctx, fixed(ops))
	if err != nil {
		return FSStat{}, pathErr("statfs", path, err)
	}
	r := res[len(res)-1].Opgetattr
	if r == nil || r.Resok4 == nil {
		return FSStat{}, pathErr("statfs", path, errors.New("nfs: GETATTR result missing"))
	}
	var fi fsInfo
	if err := decodeFattr(&r.Resok4.ObjAttributes, nil, &fi); err != nil {
		return FSStat{}, pathErr("statfs", path, err)
	}
	return fi.stat, nil
}

// Lookup returns the file handle and attributes of path.
func (c *Client) Lookup(ctx context.Context, path string) ([]byte, Attr, error) {
	ops := append(c.walk(splitPath(path)), getfh, getattr(statBits))
	res, err := c.call(ctx, fixed(ops))
	if err != nil {
		return nil, Attr{}, pathErr("lookup", path, err)
	}
	fh := append([]byte(nil), res[len(res)-2].Opgetfh.Resok4.Object...)
	a, err := lastAttr(res)
	return fh, a, pathErr("lookup", path, err)
}

func (c *Client) create(ctx context.Context, op, path string, ct nfs4.Createtype4, attrs nfs4.Fattr4) error {
	parent, name := splitParent(path)
	if name == "" {
		return pathErr(op, path, syscall.EEXIST)
	}
	ops := append(c.walk(parent), nfs4.NfsArgop4{Argop: nfs4.OP_CREATE, Opcreate: &nfs4.CREATE4args{
		Objtype: ct, Objname: []byte(name), Createattrs: attrs,
	}})
	_, err := c.call(ctx, fixed(ops))
	return pathErr(op, path, err)
}

// createIn creates name with CREATE in the directory that start (a walk
// or a PUTFH) makes current, and returns the new object's file handle and
// attributes from the same COMPOUND. label names it in errors.
func (c *Client) createIn(ctx context.Context, op, label string, start []nfs4.NfsArgop4, name string, ct nfs4.Createtype4, attrs nfs4.Fattr4) ([]byte, Attr, error) {
	ops := append(start[:len(start):len(start)], nfs4.NfsArgop4{Argop: nfs4.OP_CREATE, Opcreate: &nfs4.CREATE4args{
		Objtype: ct, Objname: []byte(name), Createattrs: attrs,
	}}, getfh, getattr(statBits))
	res, done, err := c.callCreating(ctx, len(start), fixed(ops))
	if done {
		fh, a, err := c.lookupIn(ctx, start, name)
		return fh, a, pathErr(op, label, err)
	}
	if err != nil {
		return nil, Attr{}, pathErr(op, label, err)
	}
	fh := append([]byte(nil), res[len(res)-2].Opgetfh.Resok4.Object...)
	a, err := lastAttr(res)
	return fh, a, pathErr(op, label, err)
}

// Mkdir creates a directory with permission bits mode.
func (c *Client) Mkdir(ctx context.Context, path string, mode uint32) error {
	return c.create(ctx, "mkdir", path, nfs4.Createtype4{Type: nfs4.NF4DIR}, modeAttr(mode))
}

// MkdirAll creates path and any missing parents, like os.MkdirAll.
func (c *Client) MkdirAll(ctx context.Context, path string, mode uint32) error {
	comps := splitPath(path)
	for i := range comps {
		p := "/" + strings.Join(comps[:i+1], "/")
		a, err := c.Stat(ctx, p)
		if err == nil {
			if a.Type != TypeDir {
				return pathErr("mkdir", p, syscall.ENOTDIR)
			}
			continue
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		if err := c.Mkdir(ctx, p, mode); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
	}
	return nil
}

// Symlink creates a symbolic link at path pointing to target.
func (c *Client) Symlink(ctx context.Context, target, path string) error {
	t := []byte(target)
	return c.create(ctx, "symlink", path, nfs4.Createtype4{Type: nfs4.NF4LNK, Linkdata: &t}, modeAttr(0o777))
}

// Mknod creates a file at path like mknod(2): mode holds the type and the
// permission bits. syscall.S_IFIFO, S_IFSOCK, S_IFCHR and S_IFBLK create a
// special file with CREATE (the device number, major and minor, only
// matters for the last two); S_IFREG, or no type bits, creates an empty
// regular file with an exclusive OPEN. Like mknod(2), S_IFDIR fails with
// EPERM and any other type with EINVAL, without asking the server. Whether
// a non-root caller may create devices is the server's decision; it
// answers NFS4ERR_PERM (EPERM) when not, and NFS4ERR_BADTYPE (EINVAL) for
// a type it does not support.
func (c *Client) Mknod(ctx context.Context, path string, mode, major, minor uint32) error {
	ct, err := mknodType(mode, major, minor)
	if err != nil {
		return pathErr("mknod", path, err)
	}
	if ct == nil {
		f, err := c.Open(ctx, path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode&0o7777)
		if err != nil {
			return pathErr("mknod", path, unwrapPath(err))
		}
		return pathErr("mknod", path, unwrapPath(f.Close()))
	}
	return c.create(ctx, "mknod", path, *ct, modeAttr(mode))
}

// mknodType is the CREATE type for a mknod(2) mode, or nil for a regular
// file (created with OPEN).
func mknodType(mode, major, minor uint32) (*nfs4.Createtype4, error) {
	var ct nfs4.Createtype4
	switch mode & syscall.S_IFMT {
	case 0, syscall.S_IFREG:
		return nil, nil
	case syscall.S_IFIFO:
		ct.Type = nfs4.NF4FIFO
	case syscall.S_IFSOCK:
		ct.Type = nfs4.NF4SOCK
	case syscall.S_IFCHR, syscall.S_IFBLK:
		ct.Type = nfs4.NF4CHR
		if mode&syscall.S_IFMT == syscall.S_IFBLK {
			ct.Type = nfs4.NF4BLK
		}
		ct.Devdata = &nfs4.Specdata4{Specdata1: major, Specdata2: minor}
	case syscall.S_IFDIR:
		return nil, syscall.EPERM
	default:
		return nil, syscall.EINVAL
	}
	return &ct, nil
}

// unwrapPath returns the error inside a *fs.PathError, so that it can be
// wrapped again under another operation's name.
func unwrapPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// Readlink returns the target of the symbolic link at path.
func (c *Client) Readlink(ctx context.Context, path string) (string, error) {
	ops := append(c.walk(splitPath(path)), nfs4.NfsArgop4{Argop: nfs4.OP_READLINK})
	res, err := c.call(ctx, fixed(ops))
	if err != nil {
		return "", pathErr("readlink", path, err)
	}
	return string(res[len(res)-1].Opreadlink.Resok4.Link), nil
}

// Remove removes a file or an empty directory.
func (c *Client) Remove(ctx context.Context, path string) error {
	parent, name := splitParent(path)
	if name == "" {
		return pathErr("remove", path, syscall.EBUSY)
	}
	ops := append(c.walk(parent), nfs4.NfsArgop4{Argop: nfs4.OP_REMOVE, Opremove: &nfs4.REMOVE4args{Target: []byte(name)}})
	// A REMOVE resent to a new server instance (a failover) that finds
	// nothing may be the first one's work or a name that was never
	// there: the client cannot tell, so it reports what the server said.
	_, err := c.call(ctx, fixed(ops))
	return pathErr("remove", path, err)
}

// RemoveAll removes path and everything below it. A missing path is not an
// error.
func (c *Client) RemoveAll(ctx context.Context, path string) error {
	return c.removeAll(ctx, path, 0)
}

func (c *Client) removeAll(ctx context.Context, path string, depth int) error {
	if depth > 256 {
		return pathErr("remove", path, syscall.ELOOP)
	}
	a, err := c.Stat(ctx, path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if a.Type == TypeDir {
		ents, err := c.ReadDir(ctx, path)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		for _, e := range ents {
			if err := c.removeAll(ctx, strings.TrimSuffix(path, "/")+"/"+e.Name, depth+1); err != nil {
				return err
			}
		}
	}
	if len(splitPath(path)) == 0 {
		return nil // the root itself stays
	}
	if err := c.Remove(ctx, path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// Rename moves from to to, replacing to if it exists and the types allow.
func (c *Client) Rename(ctx context.Context, from, to string) error {
	fp, fname := splitParent(from)
	tp, tname := splitParent(to)
	if fname == "" || tname == "" {
		return &os.LinkError{Op: "rename", Old: from, New: to, Err: syscall.EBUSY}
	}
	ops := append(c.walk(fp), nfs4.NfsArgop4{Argop: nfs4.OP_SAVEFH})
	ops = append(ops, c.walk(tp)...)
	ops = append(ops, nfs4.NfsArgop4{Argop: nfs4.OP_RENAME, Oprename: &nfs4.RENAME4args{
		Oldname: []byte(fname), Newname: []byte(tname),
	}})
	resent, err := c.callOnce(ctx, ops)
	if resent && errors.Is(err, fs.ErrNotExist) {
		// Sent again to a new server instance, which found no source:
		// the first instance renamed it and died before answering if
		// the source is gone and the target is there.
		_, serr := c.Stat(ctx, from)
		if _, terr := c.Stat(ctx, to); errors.Is(serr, fs.ErrNotExist) && terr == nil {
			c.log.Debug("RENAME resent after a failover found its work done", "from", from, "to", to)
			return nil
		}
	}
	if err != nil {
		return &os.LinkError{Op: "rename", Old: from, New: to, Err: err}
	}
	return nil
}

// Link creates newpath as a hard link to oldpath.
func (c *Client) Link(ctx context.Context, oldpath, newpath string) error {
	np, nname := splitParent(newpath)
	if nname == "" {
		return &os.LinkError{Op: "link", Old: oldpath, New: newpath, Err: syscall.EEXIST}
	}
	ops := append(c.walk(splitPath(oldpath)), nfs4.NfsArgop4{Argop: nfs4.OP_SAVEFH})
	ops = append(ops, c.walk(np)...)
	ops = append(ops, nfs4.NfsArgop4{Argop: nfs4.OP_LINK, Oplink: &nfs4.LINK4args{Newname: []byte(nname)}})
	if _, err := c.call(ctx, fixed(ops)); err != nil {
		return &os.LinkError{Op: "link", Old: oldpath, New: newpath, Err: err}
	}
	return nil
}

// SetAttr changes the attributes of path that are set in sa. Changing the
// size of a file this way uses the anonymous stateid; File.Truncate uses the
// open's.
func (c *Client) SetAttr(ctx context.Context, path string, sa SetAttr) error {
	if sa.empty() {
		return nil
	}
	var ino *inode
	if sa.Size != nil {
		// A size change must not be undone by cached data written back
		// later, nor leave stale cached data past the new end.
		if ino = c.cache.lookupPath(ctx, c, path); ino != nil && c.cache.pending(ino) {
			if err := c.cache.flushAll(ctx, nil, ino); err != nil {
				return pathErr("setattr", path, err)
			}
		}
	}
	ops := append(c.walk(splitPath(path)), setattrOp(nfs4.Stateid4{}, sa.encode()))
	_, err := c.call(ctx, fixed(ops))
	if err == nil && ino != nil {
		c.cache.truncated(ino, *sa.Size)
		c.setSize([]byte(ino.key), *sa.Size)
	}
	return pathErr("setattr", path, err)
}

func setattrOp(sid nfs4.Stateid4, attrs nfs4.Fattr4) nfs4.NfsArgop4 {
	return nfs4.NfsArgop4{Argop: nfs4.OP_SETATTR, Opsetattr: &nfs4.SETATTR4args{Stateid: sid, ObjAttributes: attrs}}
}

// DirEntry is one entry of a directory listing.
type DirEntry struct {
	Name string
	Attr Attr
	// Handle is the entry's file handle, if the server returned one.
	Handle []byte
}

// readdir paging limits: dircount bounds the names and cookies, maxcount
// the whole reply.
const (
	readdirDircount = 8 << 10
	readdirMaxcount = 32 << 10
	// maxReaddirPages bounds a listing (and a server that never says EOF).
	maxReaddirPages = 1 << 16
)

// ReadDir lists the directory at path, following READDIR cookies until the
// server reports the end. "." and ".." are not included. The listing is not
// a snapshot: entries added or removed meanwhile may or may not appear.
func (c *Client) ReadDir(ctx context.Context, path string) ([]DirEntry, error) {
	fh, a, err := c.Lookup(ctx, path)
	if err != nil {
		return nil, pathErr("readdir", path, errors.Unwrap(err))
	}
	if a.Type != TypeDir {
		return nil, pathErr("readdir", path, syscall.ENOTDIR)
	}
	return c.readDir(ctx, path, fh)
}

// readdirBits are the attributes asked for each entry: those of Attr and
// the entry's file handle.
var readdirBits = func() nfs4.Bitmap4 {
	bm := append(nfs4.Bitmap4(nil), statBits...)
	for len(bm) < 1 {
		bm = append(bm, 0)
	}
	bm[0] |= 1 << nfs4.FATTR4_FILEHANDLE
	return bm
}()

// readDir lists the directory with handle fh; label names it in errors.
func (c *Client) readDir(ctx context.Context, label string, fh []byte) ([]DirEntry, error) {
	var (
		out    []DirEntry
		cookie uint64
		verf   nfs4.Verifier4
	)
	for page := 0; page < maxReaddirPages; page++ {
		ops := []nfs4.NfsArgop4{putfh(fh), {Argop: nfs4.OP_READDIR, Opreaddir: &nfs4.READDIR4args{
			Cookie: cookie, Cookieverf: verf, Dircount: readdirDircount, Maxcount: readdirMaxcount, AttrRequest: readdirBits,
		}}}
		res, err := c.call(ctx, fixed(ops))
		if err != nil {
			return out, pathErr("readdir", label, err)
		}
		ok := res[1].Opreaddir.Resok4
		verf = ok.Cookieverf
		n := 0
		for e := ok.Reply.Entries; e != nil; e = e.Nextentry {
			n++
			cookie = e.Cookie
			name := string(e.Name)
			if name == "." || name == ".." {
				continue
			}
			d := DirEntry{Name: name}
			var fi fsInfo
			if err := decodeFattr(&e.Attrs, &d.Attr, &fi); err != nil {
				return out, pathErr("readdir", label, err)
			}
			d.Handle = fi.fh
			out = append(out, d)
		}
		if ok.Reply.Eof {
			return out, nil
		}
		if n == 0 {
			return out, pathErr("readdir", label, fmt.Errorf("nfs: server returned an empty READDIR page without EOF"))
		}
	}
	return out, pathErr("readdir", label, errors.New("nfs: directory listing did not end"))
}
