package client

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/shoalfs/shoal/internal/nfs4"
)

// Operations by file handle. The path-based calls (Stat, Open, Remove,
// ...) walk from the export root in every COMPOUND: PUTROOTFH and one
// LOOKUP per path component. A caller that already holds the handle of
// the object or of its directory (from Lookup, LookupAt, the *At
// creators, ReadDirHandle or File.Handle) can start from it instead: one
// COMPOUND of PUTFH and the operation, the same number of round trips
// with no LOOKUPs, and independent of the object's name.
//
// A handle outlives nothing on the server: once another client removed
// the object, operations on its handle fail with NFS4ERR_STALE, an error
// matching syscall.ESTALE (see IsStale). The caller then resolves the
// path again; it must never take the error for the answer about the
// object now at the path.

// IsStale reports whether err means a file handle no longer names an
// object on the server (NFS4ERR_STALE, NFS4ERR_FHEXPIRED, NFS4ERR_BADHANDLE).
func IsStale(err error) bool {
	var se *StatusError
	return errors.As(err, &se) && (se.status() == nfs4.NFS4ERR_STALE || se.status() == nfs4.NFS4ERR_FHEXPIRED ||
		se.status() == nfs4.NFS4ERR_BADHANDLE)
}

func handleName(fh []byte) string { return fmt.Sprintf("handle:%x", fh) }

func childName(dir []byte, name string) string { return handleName(dir) + "/" + name }

// handleErr is pathErr for the object with handle fh, or for name in the
// directory fh if name is not empty. It formats the handle only for an
// error: the calls below succeed far more often than not, and the mount
// makes one for every name it looks up or removes.
func handleErr(op string, fh []byte, name string, err error) error {
	if err == nil {
		return nil
	}
	if name == "" {
		return pathErr(op, handleName(fh), err)
	}
	return pathErr(op, childName(fh, name), err)
}

// StatHandle returns the attributes of the object with handle fh.
func (c *Client) StatHandle(ctx context.Context, fh []byte) (Attr, error) {
	gen := c.cache.flushGen()
	if a, ok := c.cachedDelegAttr(fh); ok {
		// A read delegation: no other client changed the file since.
		a.Size = c.cachedSize(a, gen)
		return a, nil
	}
	res, err := c.call(ctx, fixed([]nfs4.NfsArgop4{putfh(fh), getattr(statBits)}))
	if err != nil {
		return Attr{}, handleErr("stat", fh, "", err)
	}
	a, err := lastAttr(res)
	if err == nil && a.Type == TypeRegular {
		a.Size = c.cachedSize(a, gen)
	}
	return a, handleErr("stat", fh, "", err)
}

// LookupAt returns the file handle and attributes of name in the
// directory with handle dir. Like Lookup, it does not follow a symbolic
// link.
func (c *Client) LookupAt(ctx context.Context, dir []byte, name string) ([]byte, Attr, error) {
	ops := []nfs4.NfsArgop4{putfh(dir), {Argop: nfs4.OP_LOOKUP, Oplookup: &nfs4.LOOKUP4args{Objname: []byte(name)}},
		getfh, getattr(statBits)}
	res, err := c.call(ctx, fixed(ops))
	if err != nil {
		return nil, Attr{}, handleErr("lookup", dir, name, err)
	}
	fh := append([]byte(nil), res[2].Opgetfh.Resok4.Object...)
	a, err := lastAttr(res)
	return fh, a, handleErr("lookup", dir, name, err)
}

// SetAttrHandle changes the attributes set in sa of the object with
// handle fh and returns its attributes afterwards, from the same
// COMPOUND. A size change uses the anonymous stateid, as SetAttr does.
func (c *Client) SetAttrHandle(ctx context.Context, fh []byte, sa SetAttr) (Attr, error) {
	if sa.empty() {
		return c.StatHandle(ctx, fh)
	}
	var ino *inode
	if sa.Size != nil {
		// As SetAttr: cached data must not undo the size change later.
		c.cache.mu.Lock()
		ino = c.cache.inodes[string(fh)]
		c.cache.mu.Unlock()
		if ino != nil && c.cache.pending(ino) {
			if err := c.cache.flushAll(ctx, nil, ino); err != nil {
				return Attr{}, handleErr("setattr", fh, "", err)
			}
		}
	}
	res, err := c.call(ctx, fixed([]nfs4.NfsArgop4{putfh(fh), setattrOp(nfs4.Stateid4{}, sa.encode()), getattr(statBits)}))
	if err != nil {
		return Attr{}, handleErr("setattr", fh, "", err)
	}
	if ino != nil {
		c.cache.truncated(ino, *sa.Size)
		c.setSize(fh, *sa.Size)
	}
	a, err := lastAttr(res)
	return a, handleErr("setattr", fh, "", err)
}

// RemoveAt removes name, a file or an empty directory, from the directory
// with handle dir: one COMPOUND of PUTFH and REMOVE.
func (c *Client) RemoveAt(ctx context.Context, dir []byte, name string) error {
	ops := []nfs4.NfsArgop4{putfh(dir), {Argop: nfs4.OP_REMOVE, Opremove: &nfs4.REMOVE4args{Target: []byte(name)}}}
	_, err := c.call(ctx, fixed(ops))
	return handleErr("remove", dir, name, err)
}

// OpenAt is Open of name in the directory with handle dir: PUTFH, OPEN,
// GETFH and GETATTR in one COMPOUND (see File.OpenAttr).
func (c *Client) OpenAt(ctx context.Context, dir []byte, name string, flag int, perm uint32) (*File, error) {
	return c.openIn(ctx, childName(dir, name), []nfs4.NfsArgop4{putfh(dir)}, name, flag, perm, AccessDefault)
}

// MkdirAt creates the directory name with permission bits mode in the
// directory with handle dir, and returns its handle and attributes from
// the same COMPOUND.
func (c *Client) MkdirAt(ctx context.Context, dir []byte, name string, mode uint32) ([]byte, Attr, error) {
	return c.createIn(ctx, "mkdir", childName(dir, name), []nfs4.NfsArgop4{putfh(dir)}, name,
		nfs4.Createtype4{Type: nfs4.NF4DIR}, modeAttr(mode))
}

// SymlinkAt creates the symbolic link name to target in the directory
// with handle dir, and returns its handle and attributes.
func (c *Client) SymlinkAt(ctx context.Context, dir []byte, name, target string) ([]byte, Attr, error) {
	t := []byte(target)
	return c.createIn(ctx, "symlink", childName(dir, name), []nfs4.NfsArgop4{putfh(dir)}, name,
		nfs4.Createtype4{Type: nfs4.NF4LNK, Linkdata: &t}, modeAttr(0o777))
}

// MknodAt is Mknod of name in the directory with handle dir, returning
// the new object's handle and attributes.
func (c *Client) MknodAt(ctx context.Context, dir []byte, name string, mode, major, minor uint32) ([]byte, Attr, error) {
	label := childName(dir, name)
	ct, err := mknodType(mode, major, minor)
	if err != nil {
		return nil, Attr{}, pathErr("mknod", label, err)
	}
	if ct == nil {
		f, err := c.OpenAt(ctx, dir, name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode&0o7777)
		if err != nil {
			return nil, Attr{}, pathErr("mknod", label, unwrapPath(err))
		}
		fh, a := f.Handle(), f.OpenAttr()
		return fh, a, pathErr("mknod", label, unwrapPath(f.Close()))
	}
	return c.createIn(ctx, "mknod", label, []nfs4.NfsArgop4{putfh(dir)}, name, *ct, modeAttr(mode))
}

// RenameAt renames from in the directory with handle fromDir to to in the
// directory with handle toDir, replacing to if it exists and the types
// allow.
func (c *Client) RenameAt(ctx context.Context, fromDir []byte, from string, toDir []byte, to string) error {
	ops := []nfs4.NfsArgop4{putfh(fromDir), {Argop: nfs4.OP_SAVEFH}, putfh(toDir), {Argop: nfs4.OP_RENAME,
		Oprename: &nfs4.RENAME4args{Oldname: []byte(from), Newname: []byte(to)}}}
	if _, err := c.call(ctx, fixed(ops)); err != nil {
		return &os.LinkError{Op: "rename", Old: childName(fromDir, from), New: childName(toDir, to), Err: err}
	}
	return nil
}

// LinkAt creates name in the directory with handle dir as a hard link to
// the object with handle fh, and returns the object's attributes after
// the link (its link count has grown).
func (c *Client) LinkAt(ctx context.Context, fh, dir []byte, name string) (Attr, error) {
	ops := []nfs4.NfsArgop4{putfh(fh), {Argop: nfs4.OP_SAVEFH}, putfh(dir),
		{Argop: nfs4.OP_LINK, Oplink: &nfs4.LINK4args{Newname: []byte(name)}},
		{Argop: nfs4.OP_RESTOREFH}, getattr(statBits)}
	res, err := c.call(ctx, fixed(ops))
	if err != nil {
		return Attr{}, &os.LinkError{Op: "link", Old: handleName(fh), New: childName(dir, name), Err: err}
	}
	a, err := lastAttr(res)
	if err != nil {
		return Attr{}, &os.LinkError{Op: "link", Old: handleName(fh), New: childName(dir, name), Err: err}
	}
	return a, nil
}

// ReadlinkHandle returns the target of the symbolic link with handle fh.
func (c *Client) ReadlinkHandle(ctx context.Context, fh []byte) (string, error) {
	res, err := c.call(ctx, fixed([]nfs4.NfsArgop4{putfh(fh), {Argop: nfs4.OP_READLINK}}))
	if err != nil {
		return "", pathErr("readlink", handleName(fh), err)
	}
	return string(res[1].Opreadlink.Resok4.Link), nil
}

// ReadDirHandle lists the directory with handle fh as ReadDir does. Each
// entry carries its attributes and, where the server returns it, its file
// handle (DirEntry.Handle), so that listing a directory and stat(2) of
// every entry (ls -l) costs the READDIRs alone.
func (c *Client) ReadDirHandle(ctx context.Context, fh []byte) ([]DirEntry, error) {
	return c.readDir(ctx, handleName(fh), fh)
}

// callCreating runs a COMPOUND whose operation at index idx (counted
// after SEQUENCE) creates or opens something and is followed by GETFH
// and GETATTR. NFS4ERR_DELAY is retried as call does while it comes
// before that operation. After it succeeded the COMPOUND must not be sent
// again, or it would run twice (a second exclusive CREATE fails with
// NFS4ERR_EXIST); a server may answer the operations after it with
// NFS4ERR_DELAY (Shoal's does when the connection breaks meanwhile, and
// caches that reply), so then the results so far come back with done set
// and the caller asks for the handle and attributes itself.
func (c *Client) callCreating(ctx context.Context, idx int, build func() []nfs4.NfsArgop4) (res []nfs4.NfsResop4, done bool, err error) {
	delay, start := 10*time.Millisecond, time.Now()
	for {
		res, err = c.callRetry(ctx, 0, build)
		var se *StatusError
		if err == nil || !errors.As(err, &se) || se.status() != nfs4.NFS4ERR_DELAY {
			return res, false, err
		}
		if len(res)-1 > idx {
			return res, true, err
		}
		if time.Since(start) >= delayBudget(c.lease) {
			return res, false, err
		}
		if werr := sleep(ctx, delay); werr != nil {
			return res, false, werr
		}
		delay = min(2*delay, time.Second)
	}
}

// lookupIn returns the handle and attributes of name in the directory
// that start makes current.
func (c *Client) lookupIn(ctx context.Context, start []nfs4.NfsArgop4, name string) ([]byte, Attr, error) {
	ops := append(start[:len(start):len(start)], nfs4.NfsArgop4{Argop: nfs4.OP_LOOKUP, Oplookup: &nfs4.LOOKUP4args{Objname: []byte(name)}},
		getfh, getattr(statBits))
	res, err := c.call(ctx, fixed(ops))
	if err != nil {
		return nil, Attr{}, err
	}
	fh := append([]byte(nil), res[len(res)-2].Opgetfh.Resok4.Object...)
	a, err := lastAttr(res)
	return fh, a, err
}
