package fusemount

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/shoalfs/shoal/client"
)

// node is one file system object: a directory, file, symlink or special
// file, identified by its fileid (StableAttr.Ino).
type node struct {
	fs.Inode
	fsys *fsys

	mu sync.Mutex
	// fh is the object's file handle: operations on the node, and on
	// names in it for a directory, start from it (PUTFH) instead of
	// walking from the root. Another client's removal makes it stale;
	// withFH then walks the node's path again.
	fh []byte
	// attr is what the server last said about the object, at attrAt.
	// attrGen counts changes made through this mount (see changed);
	// stale is set by one and cleared by attributes from a request sent
	// after it (see freshAttr).
	attr    client.Attr
	attrAt  time.Time
	attrGen uint64
	stale   bool
	// change is the change attribute seen at the last open, for the
	// close-to-open revalidation of the page cache (AccessCached).
	change      uint64
	changeValid bool
	// reval is set while an open that found the file changed waits for
	// the kernel to retry it on a fresh inode (see evictChanged).
	reval bool
	// opens counts open handles; silly is where Unlink or Rename hid the
	// file while it was open (see sillyRename), removed by sillyClient at
	// the last Release.
	opens       int
	handles     map[*handle]struct{} // the open handles, for Getattr
	idle        chan struct{}        // closed when opens drops to zero
	silly       string
	sillyDir    *node
	sillyClient *client.Client
	// flushPid and flushBy mark the kernel's times flush expected after
	// a link, unlink or rename of the file (ctimeflush.go): from which
	// process, and until when.
	flushPid uint32
	flushBy  time.Time
}

var (
	_ fs.InodeEmbedder  = (*node)(nil)
	_ fs.NodeLookuper   = (*node)(nil)
	_ fs.NodeGetattrer  = (*node)(nil)
	_ fs.NodeSetattrer  = (*node)(nil)
	_ fs.NodeMkdirer    = (*node)(nil)
	_ fs.NodeMknoder    = (*node)(nil)
	_ fs.NodeCreater    = (*node)(nil)
	_ fs.NodeOpener     = (*node)(nil)
	_ fs.NodeUnlinker   = (*node)(nil)
	_ fs.NodeRmdirer    = (*node)(nil)
	_ fs.NodeRenamer    = (*node)(nil)
	_ fs.NodeLinker     = (*node)(nil)
	_ fs.NodeSymlinker  = (*node)(nil)
	_ fs.NodeReadlinker = (*node)(nil)
	_ fs.NodeStatfser   = (*node)(nil)
	_ fs.NodeFsyncer    = (*node)(nil)
	_ fs.NodeAccesser   = (*node)(nil)
)

func (n *node) setFH(fh []byte) {
	n.mu.Lock()
	n.fh = fh
	n.mu.Unlock()
}

func (n *node) handle() []byte {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.fh
}

// attrMark returns the generation of the node's attributes, to pass to
// noteAttr or noteChange with the reply to a request sent after it.
func (n *node) attrMark() uint64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.attrGen
}

// noteAttr records attributes the server returned for a request sent
// after attrMark returned gen. If a change through this mount ended in
// between, the reply may predate it: the attributes are kept (they are
// still the server's latest answer for Access and the writeback mtime),
// but stale stays set.
func (n *node) noteAttr(a *client.Attr, gen uint64) {
	n.mu.Lock()
	n.noteLocked(a, gen)
	n.mu.Unlock()
}

func (n *node) noteLocked(a *client.Attr, gen uint64) {
	n.attr, n.attrAt = *a, time.Now()
	n.stale = n.attrGen != gen
	if n.stale {
		n.fsys.entries.dropAttr(n.StableAttr().Ino)
	} else {
		n.fsys.entries.noteAttr(n.StableAttr().Ino, a, n.attrAt)
	}
}

// noteChange is noteAttr for the reply to a request that changed the
// object: requests in flight before it may answer with older attributes,
// so it starts a new generation.
func (n *node) noteChange(a *client.Attr, gen uint64) {
	n.mu.Lock()
	n.noteLocked(a, gen)
	n.attrGen++
	n.mu.Unlock()
}

// changed records that an operation through this mount has changed the
// object without telling its attributes: what the node holds, and what
// requests already in flight will answer, may be older than the change.
// Writes, truncates, removals and renames call it once they are done.
func (n *node) changed() {
	n.mu.Lock()
	n.changedLocked()
	n.mu.Unlock()
}

func (n *node) changedLocked() {
	n.attrGen++
	n.stale = true
	n.fsys.entries.changedAttr(n.StableAttr().Ino)
}

// freshAttr returns the node's attributes and how much of the kernel's
// attribute timeout they have left, if they came from the server after
// every change made through this mount and nothing has the file open
// (an open file's size may count data the library still holds, and
// its writes change it). This answers the kernel's GETATTR after close:
// with the writeback cache the kernel drops the block count it cannot
// keep at every close (fuse_flush), and so asks for the attributes the
// last close just brought from the server.
func (n *node) freshAttr() (client.Attr, time.Duration, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.stale || n.opens > 0 || n.attrAt.IsZero() || n.attr.Type != client.TypeRegular {
		return client.Attr{}, 0, false
	}
	left := n.fsys.attrTimeout(n.attr.Type) - time.Since(n.attrAt)
	if left <= 0 {
		return client.Attr{}, 0, false
	}
	return n.attr, left, true
}

// cachedAttr returns the node's attributes if they are younger than the
// kernel's attribute timeout for the object's type.
func (n *node) cachedAttr() (client.Attr, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.attrAt.IsZero() || time.Since(n.attrAt) >= n.fsys.attrTimeout(n.attr.Type) {
		return client.Attr{}, false
	}
	return n.attr, true
}

// gone reports whether the node's last name was removed through this
// mount and nothing has it open.
func (n *node) gone() bool {
	if n.IsRoot() {
		return false
	}
	if _, parent := n.Parent(); parent != nil {
		return false
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.opens == 0 && n.silly == ""
}

// lastAttr returns the node's attributes, however old.
func (n *node) lastAttr() (client.Attr, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.attr, !n.attrAt.IsZero()
}

// withFH runs do with the node's file handle. If the server says the
// handle is stale (another client removed the object, or the server
// forgot the handle), the node's path is walked again from the root: the
// same object (same fileid) found there gets its new handle and do runs
// once more; anything else is ESTALE, on which the kernel looks the path
// up again (its retry_estale) rather than taking another object's
// answer for this one.
func (n *node) withFH(ctx context.Context, c *client.Client, do func(fh []byte) error) syscall.Errno {
	err := do(n.handle())
	if !client.IsStale(err) {
		return toErrno(err)
	}
	p, errno := n.path("")
	if errno != 0 {
		return syscall.ESTALE
	}
	gen := n.attrMark()
	fh, a, lerr := c.Lookup(ctx, p)
	if lerr != nil || (a.Fileid != n.StableAttr().Ino && !n.IsRoot()) {
		n.fsys.log.Debug("stale file handle", "path", p, "lookup", lerr)
		return syscall.ESTALE
	}
	n.setFH(fh)
	n.noteAttr(&a, gen)
	err = do(fh)
	if client.IsStale(err) {
		return syscall.ESTALE
	}
	return toErrno(err)
}

// maxDepth bounds the walk up the tree in path.
const maxDepth = 4096

// path returns the node's path below the export root, joined with name
// if that is not empty. A node no longer linked into the tree (removed
// while open) has no path: ENOENT.
func (n *node) path(name string) (string, syscall.Errno) {
	var segs []string
	if name != "" {
		segs = append(segs, name)
	}
	in, root := n.EmbeddedInode(), n.Root()
	for i := 0; in != root; i++ {
		nm, parent := in.Parent()
		if parent == nil || i == maxDepth {
			return "", syscall.ENOENT
		}
		segs = append(segs, nm)
		in = parent
	}
	slices.Reverse(segs)
	return "/" + strings.Join(segs, "/"), 0
}

// mutating shields an operation that changes the server's state from
// FUSE interrupts. The kernel interrupts a request whenever its caller gets
// a signal (Go programs get SIGURG for preemption all the time), and
// returns EINTR to the program if the file system does; the program then
// retries (Go's os package always does). Had the server already carried
// out the abandoned call, the retry fails (ENOENT after an unlink, EEXIST
// after a create) for an operation that in fact succeeded. So changes run
// to completion; only waits that may be endless (lock waits) and reads
// stay interruptible.
func mutating(ctx context.Context) context.Context { return context.WithoutCancel(ctx) }

func typeBits(t client.FileType) uint32 {
	switch t {
	case client.TypeDir:
		return syscall.S_IFDIR
	case client.TypeSymlink:
		return syscall.S_IFLNK
	case client.TypeBlock:
		return syscall.S_IFBLK
	case client.TypeChar:
		return syscall.S_IFCHR
	case client.TypeSocket:
		return syscall.S_IFSOCK
	case client.TypeFIFO:
		return syscall.S_IFIFO
	default:
		return syscall.S_IFREG
	}
}

// blockSize is the st_blksize reported: the largest FUSE request, so that
// cp and friends use whole-request buffers.
const blockSize = maxIO

func fillAttr(a *client.Attr, out *fuse.Attr) {
	out.Ino = a.Fileid
	out.Size = a.Size
	out.Blocks = (a.Used + 511) / 512
	out.Blksize = blockSize
	out.Mode = typeBits(a.Type) | a.Mode&07777
	out.Nlink = a.Nlink
	out.Owner = fuse.Owner{Uid: a.UID, Gid: a.GID}
	out.SetTimes(&a.Atime, &a.Mtime, &a.Ctime)
	out.Rdev = uint32(unix.Mkdev(a.RdevMajor, a.RdevMinor))
}

// child returns the Inode for an object the server just described (by
// LOOKUP, READDIR or the operation that created it), with the kernel's
// timeouts for it. go-fuse keeps one Inode per fileid: if the kernel
// still knows the object (hard links, repeated lookups), the existing
// Inode is used and the new node is dropped.
func (n *node) child(ctx context.Context, fh []byte, a *client.Attr, out *fuse.EntryOut) *fs.Inode {
	return n.childAt(ctx, fh, a, time.Now(), n.fsys.entryTimeout(), n.fsys.attrTimeout(a.Type), out)
}

// childAt is child for attributes the server sent at, which the kernel
// may keep for attrTTL and the name for entryTTL (what is left of them,
// for an answer from the mount's cache).
func (n *node) childAt(ctx context.Context, fh []byte, a *client.Attr, at time.Time, entryTTL, attrTTL time.Duration, out *fuse.EntryOut) *fs.Inode {
	fillAttr(a, &out.Attr)
	out.SetEntryTimeout(entryTTL)
	out.SetAttrTimeout(attrTTL)
	cn := &node{fsys: n.fsys, fh: fh, attr: *a, attrAt: at}
	return n.NewInode(ctx, cn, fs.StableAttr{Mode: typeBits(a.Type), Ino: a.Fileid})
}

func (n *node) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	ec, dir := n.fsys.entries, n.StableAttr().Ino
	if fh, a, at, eLeft, aLeft, ok := ec.get(dir, name); ok {
		return n.childAt(ctx, fh, &a, at, eLeft, aLeft, out), 0
	}
	c, errno := n.fsys.client(ctx)
	if errno != 0 {
		return nil, errno
	}
	gen, at := ec.mark(), time.Now()
	var fh []byte
	var a client.Attr
	errno = n.withFH(ctx, c, func(dir []byte) (err error) {
		fh, a, err = c.LookupAt(ctx, dir, name)
		return err
	})
	if errno != 0 {
		if errno == syscall.ENOENT {
			ec.notFound(dir)
		}
		return nil, errno
	}
	ec.put(dir, name, fh, &a, at, gen)
	if ec.missed(dir) {
		// A run of lookups of names that exist: read the directory
		// once for those that follow (entrycache.go).
		n.fillDir(ctx, c)
	}
	return n.child(ctx, fh, &a, out), 0
}

func (n *node) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	var a client.Attr
	h, ok := f.(*handle)
	if !ok && n.fsys.cfg.Access != AccessDirect {
		// stat(2) of an open file: ask an open File, which counts data
		// the client library still holds back (cached and odirect
		// methods) and works after the name is gone.
		h = n.anyHandle()
		ok = h != nil
	}
	if !ok {
		if a, left, fresh := n.freshAttr(); fresh {
			fillAttr(&a, &out.Attr)
			out.SetTimeout(left)
			return 0
		}
	}
	gen := n.attrMark()
	if ok {
		// Held writes first: the size and blocks must count them.
		if errno := n.sendHeldAll(mutating(ctx), nil); errno != 0 {
			return errno
		}
		var err error
		if a, err = h.f.Stat(ctx); err != nil {
			return toErrno(err)
		}
	} else {
		c, errno := n.fsys.client(ctx)
		if errno != 0 {
			return errno
		}
		if errno := n.withFH(ctx, c, func(fh []byte) (err error) {
			a, err = c.StatHandle(ctx, fh)
			return err
		}); errno != 0 {
			return errno
		}
	}
	n.noteAttr(&a, gen)
	fillAttr(&a, &out.Attr)
	out.SetTimeout(n.fsys.attrTimeout(a.Type))
	return 0
}

func (n *node) Setattr(ctx context.Context, f fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	ctx = mutating(ctx)
	// Whatever it is, the first SETATTR of a marked process ends the mark.
	flush := n.takeTimesFlush(ctx, in)
	var sa client.SetAttr
	set := false
	if m, ok := in.GetMode(); ok {
		m &= 07777
		sa.Mode, set = &m, true
	}
	if uid, ok := in.GetUID(); ok {
		sa.UID, set = &uid, true
	}
	if gid, ok := in.GetGID(); ok {
		sa.GID, set = &gid, true
	}
	if t, ok := in.GetATime(); ok {
		sa.Atime, set = &t, true
	}
	if t, ok := in.GetMTime(); ok {
		sa.Mtime, set = &t, true
	}
	h, _ := f.(*handle)
	if size, ok := in.GetSize(); ok {
		// Held writes go first, not over the new size.
		if errno := n.sendHeldAll(ctx, nil); errno != 0 {
			return errno
		}
		if h != nil {
			// ftruncate: use the open's stateid, so a file opened for
			// writing can be truncated whatever its mode says now.
			err := h.f.Truncate(ctx, size)
			n.changed()
			if err != nil {
				return toErrno(err)
			}
		} else {
			sa.Size, set = &size, true
		}
	}
	if !set {
		return n.Getattr(ctx, f, out)
	}
	if h == nil && flush {
		// The kernel writing back the ctime it set after a link,
		// unlink or rename through this mount: the server set its own
		// (ctimeflush.go). Only when the mtime it sends is the one the
		// mount knows: the flush carries the kernel's cached mtime,
		// which the operation did not change, while a utimes(2) taken
		// for the flush (the rare case ctimeflush.go describes) sets
		// another one, and goes to the server below.
		if a, ok := n.lastAttr(); ok && a.Mtime.Equal(time.Unix(int64(in.Mtime), int64(in.Mtimensec))) {
			fillAttr(&a, &out.Attr)
			return 0
		}
	}
	if h == nil && in.Valid&^(fuse.FATTR_MTIME|fuse.FATTR_CTIME|fuse.FATTR_MTIME_NOW|fuse.FATTR_LOCKOWNER) == 0 && n.gone() {
		// The writeback cache passes on the mtime of an inode it
		// evicts after its last name was removed here: nothing is
		// left to set it on (before file handles, its path failed).
		a, _ := n.lastAttr()
		fillAttr(&a, &out.Attr)
		return 0
	}
	if h != nil && isWritebackTimes(n.fsys, h, in) {
		// The mtime of buffered writes: it goes to the server with the
		// commit at close (see handle.deferTimes), after the data.
		if a, ok := n.cachedAttr(); ok {
			h.deferTimes(sa.Mtime)
			n.changed() // the kernel's mtime, not the server's yet
			a.Mtime = *sa.Mtime
			fillAttr(&a, &out.Attr)
			out.SetTimeout(n.fsys.attrTimeout(a.Type))
			return 0
		}
	}
	// Held writes first: their WRITE would set the mtime over this one.
	if errno := n.sendHeldAll(ctx, nil); errno != 0 {
		return errno
	}
	if sa.Mtime != nil {
		// An explicit mtime (utimes, touch) replaces the one of the
		// buffered writes before it, which the kernel passed on and the
		// handles keep for the close: sent then, it would undo this one.
		// (Before an explicit time the kernel writes back the file's
		// dirty pages and their mtime, so those come first.)
		n.dropTimes()
	}
	c, errno := n.fsys.client(ctx)
	if errno != 0 {
		return errno
	}
	var a client.Attr
	gen := n.attrMark()
	errno = n.withFH(ctx, c, func(fh []byte) (err error) {
		a, err = c.SetAttrHandle(ctx, fh, sa)
		return err
	})
	if errno != 0 {
		n.changed() // it may have been done
		if writebackTimes(n.fsys, h, in, errno) {
			return n.Getattr(ctx, f, out)
		}
		return errno
	}
	n.noteChange(&a, gen)
	if h != nil || (n.fsys.cfg.Access != AccessDirect && n.anyHandle() != nil) {
		// An open file: its size may count data the library holds.
		return n.Getattr(ctx, f, out)
	}
	fillAttr(&a, &out.Attr)
	out.SetTimeout(n.fsys.attrTimeout(a.Type))
	return 0
}

func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return n.create(mutating(ctx), name, out, func(ctx context.Context, c *client.Client, dir []byte) ([]byte, client.Attr, error) {
		return c.MkdirAt(ctx, dir, name, mode&07777)
	})
}

// create runs a create-like operation in the directory n, which returns
// the new object's handle and attributes in its own COMPOUND, and makes
// the object's Inode from them.
func (n *node) create(ctx context.Context, name string, out *fuse.EntryOut, do func(ctx context.Context, c *client.Client, dir []byte) ([]byte, client.Attr, error)) (*fs.Inode, syscall.Errno) {
	c, errno := n.fsys.client(ctx)
	if errno != 0 {
		return nil, errno
	}
	done := n.nameChanged(name)
	var fh []byte
	var a client.Attr
	if errno := n.withFH(ctx, c, func(dir []byte) (err error) {
		fh, a, err = do(ctx, c, dir)
		return err
	}); errno != 0 {
		done()
		return nil, errno
	}
	n.created(name, fh, &a)
	return n.child(ctx, fh, &a, out), 0
}

// Mknod creates regular files, FIFOs, sockets and devices through the
// client library, which rejects directories (EPERM) and unknown types
// (EINVAL) as mknod(2) does; the kernel has already checked CAP_MKNOD for
// devices. The entry carries the type and rdev the server stored.
func (n *node) Mknod(ctx context.Context, name string, mode uint32, dev uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return n.create(mutating(ctx), name, out, func(ctx context.Context, c *client.Client, dir []byte) ([]byte, client.Attr, error) {
		return c.MknodAt(ctx, dir, name, mode, unix.Major(uint64(dev)), unix.Minor(uint64(dev)))
	})
}

// openFlags converts open(2) flags to the client's. O_APPEND is left out:
// the kernel computes append offsets itself and passes them to Write.
func openFlags(flags uint32) int {
	of := int(flags & syscall.O_ACCMODE)
	if flags&syscall.O_TRUNC != 0 {
		of |= syscall.O_TRUNC
	}
	if flags&(syscall.O_SYNC|syscall.O_DSYNC) != 0 {
		of |= syscall.O_SYNC
	}
	return of
}

// fuseFlags decides the page-cache treatment of an open (see Access).
func (n *node) fuseFlags(flags uint32, a *client.Attr) uint32 {
	switch n.fsys.cfg.Access {
	case AccessDirect:
		return fuse.FOPEN_DIRECT_IO
	case AccessODirect:
		if flags&syscall.O_DIRECT != 0 {
			return fuse.FOPEN_DIRECT_IO
		}
		return 0
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	keep := n.changeValid && n.change == a.Change
	n.change, n.changeValid = a.Change, true
	if keep {
		return fuse.FOPEN_KEEP_CACHE
	}
	return 0
}

func (n *node) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	ctx = mutating(ctx)
	c, errno := n.fsys.client(ctx)
	if errno != 0 {
		return nil, nil, 0, errno
	}
	done := n.nameChanged(name)
	extra := syscall.O_CREAT
	if flags&syscall.O_EXCL != 0 {
		extra |= syscall.O_EXCL
	}
	var f *client.File
	var writeOnly bool
	if errno := n.withFH(ctx, c, func(dir []byte) (err error) {
		f, writeOnly, err = n.fsys.openFile(ctx, flags, func(of int) (*client.File, error) {
			return c.OpenAt(ctx, dir, name, of|extra, mode&07777)
		})
		return err
	}); errno != 0 {
		done()
		return nil, nil, 0, errno
	}
	// OPEN's COMPOUND returned the attributes: no GETATTR of our own.
	a := f.OpenAttr()
	n.created(name, f.Handle(), &a)
	ch := n.child(ctx, f.Handle(), &a, out)
	cn, _ := ch.Operations().(*node)
	if cn == nil {
		cn = n
	}
	return ch, newHandle(f, c, cn, writeOnly), cn.fuseFlags(flags, &a), 0
}

func (n *node) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	ctx = mutating(ctx)
	c, errno := n.fsys.client(ctx)
	if errno != 0 {
		return nil, 0, errno
	}
	if flags&syscall.O_TRUNC != 0 {
		// A held write must not land after the truncation.
		if errno := n.sendHeldAll(ctx, nil); errno != 0 {
			return nil, 0, errno
		}
	}
	var f *client.File
	var writeOnly bool
	gen := n.attrMark()
	if errno := n.withFH(ctx, c, func(fh []byte) (err error) {
		f, writeOnly, err = n.fsys.openFile(ctx, flags, func(of int) (*client.File, error) {
			return c.OpenHandle(ctx, fh, of)
		})
		return err
	}); errno != 0 {
		if flags&syscall.O_TRUNC != 0 {
			n.changed()
		}
		return nil, 0, errno
	}
	// OPEN's COMPOUND returned the attributes (CLAIM_FH, then GETATTR).
	a := f.OpenAttr()
	if flags&syscall.O_TRUNC != 0 {
		n.noteChange(&a, gen)
	} else {
		n.noteAttr(&a, gen)
	}
	if n.fsys.cfg.Access == AccessCached {
		if n.evictChanged(&a) {
			// The kernel retries the open with a fresh lookup.
			if err := f.Close(); err != nil {
				n.fsys.log.Debug("closing nfs file", "path", f.Name(), "err", err)
			}
			return nil, 0, syscall.ESTALE
		}
	}
	return newHandle(f, c, n, writeOnly), n.fuseFlags(flags, &a), 0
}

// remove removes name from the directory n: one COMPOUND of PUTFH and
// REMOVE.
func (n *node) remove(ctx context.Context, c *client.Client, name string) syscall.Errno {
	return n.withFH(ctx, c, func(dir []byte) error {
		return c.RemoveAt(ctx, dir, name)
	})
}

func (n *node) Unlink(ctx context.Context, name string) syscall.Errno {
	ctx = mutating(ctx)
	c, errno := n.fsys.client(ctx)
	if errno != 0 {
		return errno
	}
	defer n.nameChanged(name)()
	if hidden, errno := n.sillyRename(ctx, c, name); hidden || errno != 0 {
		if hidden {
			n.childFlushes(ctx, name)
		}
		return errno
	}
	defer n.childChanged(name) // one link fewer, if it has others
	if errno := n.remove(ctx, c, name); errno != 0 {
		return errno
	}
	n.childFlushes(ctx, name)
	return 0
}

// childFlushes marks the node of name in the directory n, if the kernel
// has one, for the kernel's times flush (ctimeflush.go).
func (n *node) childFlushes(ctx context.Context, name string) {
	if ch := n.GetChild(name); ch != nil {
		if cn, ok := ch.Operations().(*node); ok {
			cn.expectTimesFlush(ctx)
		}
	}
}

// childChanged marks the node of name in directory n, if the kernel has
// one, as changed (see node.changed).
func (n *node) childChanged(name string) {
	if ch := n.GetChild(name); ch != nil {
		if cn, ok := ch.Operations().(*node); ok {
			cn.changed()
		}
	}
}

// sillyRename hides the child name instead of removing it while the kernel
// still has it open: NFS servers may destroy a removed file at once, and
// POSIX lets open descriptors outlive the name. The file is renamed to a
// dot name in the same directory (like the kernel NFS client's .nfsXXXX
// files) and removed at its last close. It reports whether it did so.
func (n *node) sillyRename(ctx context.Context, c *client.Client, name string) (bool, syscall.Errno) {
	ch := n.GetChild(name)
	if ch == nil {
		return false, 0
	}
	cn, ok := ch.Operations().(*node)
	if !ok {
		return false, 0
	}
	cn.mu.Lock()
	defer cn.mu.Unlock()
	if cn.opens > 0 && cn.silly == "" {
		// The kernel sends RELEASE asynchronously after the last
		// close(2), so a file closed a moment ago may still look open:
		// give a pending release a little time before hiding the file.
		idle := cn.idle
		cn.mu.Unlock()
		select {
		case <-idle:
		case <-time.After(releaseGrace):
		case <-ctx.Done():
		}
		cn.mu.Lock()
	}
	if cn.opens == 0 || cn.silly != "" {
		return false, 0
	}
	to := fmt.Sprintf(".shoal-silly.%x.%d", ch.StableAttr().Ino, n.fsys.sillySeq.Add(1))
	defer n.nameChanged(to)()
	errno := n.withFH(ctx, c, func(dir []byte) error {
		return c.RenameAt(ctx, dir, name, dir, to)
	})
	cn.changedLocked() // its ctime
	if errno != 0 {
		return false, errno
	}
	cn.silly, cn.sillyDir, cn.sillyClient = to, n, c
	return true, 0
}

// opened and released count a node's open handles; the last release
// removes a silly-renamed file.
func (n *node) opened(h *handle) {
	n.mu.Lock()
	if n.opens == 0 {
		n.idle = make(chan struct{})
		n.handles = make(map[*handle]struct{})
	}
	n.opens++
	n.handles[h] = struct{}{}
	n.mu.Unlock()
}

// anyHandle returns one of the node's open handles, or nil.
func (n *node) anyHandle() *handle {
	n.mu.Lock()
	defer n.mu.Unlock()
	for h := range n.handles {
		return h
	}
	return nil
}

// releaseGrace is how long Unlink waits for a pending RELEASE.
const releaseGrace = 100 * time.Millisecond

func (n *node) released(ctx context.Context, h *handle) {
	n.mu.Lock()
	n.opens--
	delete(n.handles, h)
	if n.opens == 0 {
		close(n.idle)
		n.idle = nil
	}
	var silly string
	var dir *node
	var c *client.Client
	if n.opens == 0 && n.silly != "" {
		silly, dir, c = n.silly, n.sillyDir, n.sillyClient
		n.silly, n.sillyDir, n.sillyClient = "", nil, nil
	}
	n.mu.Unlock()
	if silly != "" {
		if errno := dir.remove(ctx, c, silly); errno != 0 {
			n.fsys.log.Warn("removing silly-renamed file", "name", silly, "err", errno)
		}
	}
}

func (n *node) Rmdir(ctx context.Context, name string) syscall.Errno {
	ctx = mutating(ctx)
	c, errno := n.fsys.client(ctx)
	if errno != 0 {
		return errno
	}
	defer n.nameChanged(name)()
	return n.remove(ctx, c, name)
}

func (n *node) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	ctx = mutating(ctx)
	np, ok := newParent.(*node)
	if !ok {
		return syscall.EXDEV
	}
	if flags&^unix.RENAME_NOREPLACE != 0 {
		return syscall.EINVAL // RENAME_EXCHANGE and RENAME_WHITEOUT have no NFS equivalent
	}
	c, errno := n.fsys.client(ctx)
	if errno != 0 {
		return errno
	}
	defer n.nameChanged(name)()
	defer np.nameChanged(newName)()
	if flags&unix.RENAME_NOREPLACE != 0 {
		// Not atomic: NFSv4 RENAME always replaces.
		errno := np.withFH(ctx, c, func(dir []byte) error {
			_, _, err := c.LookupAt(ctx, dir, newName)
			return err
		})
		if errno == 0 {
			return syscall.EEXIST
		}
		if errno != syscall.ENOENT {
			return errno
		}
	}
	// A target that is open is hidden first, as Unlink does, so its
	// descriptors keep working after it is replaced.
	if np.GetChild(newName) != n.GetChild(name) {
		if _, errno := np.sillyRename(ctx, c, newName); errno != 0 {
			return errno
		}
	}
	// The moved object's ctime and a replaced one's link count change.
	defer n.childChanged(name)
	defer np.childChanged(newName)
	moved, replaced := n.GetChild(name), np.GetChild(newName)
	errno = n.withFH(ctx, c, func(from []byte) error {
		var err error
		if errno := np.withFH(ctx, c, func(to []byte) error {
			err = c.RenameAt(ctx, from, name, to, newName)
			if client.IsStale(err) && !bytes.Equal(from, to) {
				// Which of the two is stale? Ask about the target
				// directory: a stale source goes back to n.withFH.
				if _, serr := c.StatHandle(ctx, to); !client.IsStale(serr) {
					return nil
				}
			}
			return err
		}); errno != 0 {
			return errno
		}
		return err
	})
	if errno == 0 {
		// The kernel writes back the ctime of both (ctimeflush.go).
		for _, ch := range []*fs.Inode{moved, replaced} {
			if ch == nil {
				continue
			}
			if cn, ok := ch.Operations().(*node); ok {
				cn.expectTimesFlush(ctx)
			}
		}
	}
	return errno
}

func (n *node) Link(ctx context.Context, target fs.InodeEmbedder, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	ctx = mutating(ctx)
	t, ok := target.(*node)
	if !ok {
		return nil, syscall.EXDEV
	}
	c, errno := n.fsys.client(ctx)
	if errno != 0 {
		return nil, errno
	}
	defer n.nameChanged(name)()
	var fh []byte
	var a client.Attr
	gen := t.attrMark()
	if errno := t.withFH(ctx, c, func(tfh []byte) error {
		fh = tfh
		var err error
		if errno := n.withFH(ctx, c, func(dir []byte) error {
			a, err = c.LinkAt(ctx, tfh, dir, name)
			if client.IsStale(err) {
				if _, serr := c.StatHandle(ctx, dir); !client.IsStale(serr) {
					return nil // the target is stale: t.withFH walks again
				}
			}
			return err
		}); errno != 0 {
			return errno
		}
		return err
	}); errno != 0 {
		t.changed() // it may have been done
		return nil, errno
	}
	t.noteChange(&a, gen)
	t.expectTimesFlush(ctx) // the kernel writes back its ctime (ctimeflush.go)
	return n.child(ctx, fh, &a, out), 0
}

func (n *node) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return n.create(mutating(ctx), name, out, func(ctx context.Context, c *client.Client, dir []byte) ([]byte, client.Attr, error) {
		return c.SymlinkAt(ctx, dir, name, target)
	})
}

func (n *node) Readlink(ctx context.Context) ([]byte, syscall.Errno) {
	c, errno := n.fsys.client(ctx)
	if errno != 0 {
		return nil, errno
	}
	var s string
	if errno := n.withFH(ctx, c, func(fh []byte) (err error) {
		s, err = c.ReadlinkHandle(ctx, fh)
		return err
	}); errno != 0 {
		return nil, errno
	}
	return []byte(s), 0
}

// Statfs reports the server's space and file counts (see client.Statfs)
// in blocks of blockSize, rounded down; df(1) counts in Frsize units, so
// Frsize is blockSize too. The counts are the whole file system's, so they
// are asked for at the root, which also answers fstatfs(2) on a file
// that was removed while open.
func (n *node) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	c, errno := n.fsys.client(ctx)
	if errno != 0 {
		return errno
	}
	st, err := c.Statfs(ctx, "/")
	if err != nil {
		return toErrno(err)
	}
	*out = fuse.StatfsOut{
		Blocks: st.Total / blockSize, Bfree: st.Free / blockSize, Bavail: st.Avail / blockSize,
		Files: st.Files, Ffree: st.FilesFree,
		Bsize: blockSize, Frsize: blockSize, NameLen: 255,
	}
	return 0
}

// Fsync commits an open file's writes. Directory operations are durable
// when the server answers them, so fsync of a directory has nothing to do.
func (n *node) Fsync(ctx context.Context, f fs.FileHandle, flags uint32) syscall.Errno {
	if h, ok := f.(*handle); ok {
		return h.Fsync(ctx, flags)
	}
	return 0
}

// Access answers access(2) from the mode bits and owner, as the server
// would for the request's identity (without supplementary groups); the
// server still decides the real operations. Root may do anything except
// execute a file without any execute bit.
func (n *node) Access(ctx context.Context, mask uint32) syscall.Errno {
	mask &= unix.R_OK | unix.W_OK | unix.X_OK
	if mask == 0 {
		return 0
	}
	a, ok := n.cachedAttr()
	if !ok {
		c, errno := n.fsys.client(ctx)
		if errno != 0 {
			return errno
		}
		gen := n.attrMark()
		if errno := n.withFH(ctx, c, func(fh []byte) (err error) {
			a, err = c.StatHandle(ctx, fh)
			return err
		}); errno != 0 {
			return errno
		}
		n.noteAttr(&a, gen)
	}
	id := n.fsys.identity(ctx)
	if id.uid == 0 {
		if mask&unix.X_OK != 0 && a.Type != client.TypeDir && a.Mode&0111 == 0 {
			return syscall.EACCES
		}
		return 0
	}
	perm := a.Mode & 07
	switch {
	case a.UID == id.uid:
		perm = a.Mode >> 6 & 07
	case a.GID == id.gid:
		perm = a.Mode >> 3 & 07
	}
	if perm&mask != mask {
		return syscall.EACCES
	}
	return 0
}

// nameChanged drops name in the directory n from the mount's cache now,
// and again when the returned function runs: for an operation that adds,
// removes or renames it (defer n.nameChanged(name)()).
func (n *node) nameChanged(name string) func() {
	ec, dir := n.fsys.entries, n.StableAttr().Ino
	ec.changedName(dir, name)
	return func() { ec.changedName(dir, name) }
}

// created records in the mount's cache the object an operation of the
// mount just made as name in the directory n.
func (n *node) created(name string, fh []byte, a *client.Attr) {
	n.fsys.entries.created(n.StableAttr().Ino, name, fh, a, time.Now())
}
