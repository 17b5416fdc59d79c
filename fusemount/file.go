package fusemount

import (
	"context"
	"errors"
	"io"
	"math"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/shoalfs/shoal/client"
)

// handle is an open file: one client.File, so one NFS open stateid and one
// lock owner per open file description.
type handle struct {
	f    *client.File
	c    *client.Client // the client f belongs to
	n    *node
	fsys *fsys
	// dirty is set by Write and cleared by a successful Sync: close(2)
	// commits only if something was written UNSTABLE.
	dirty atomic.Bool
	// wrote is set by Write and cleared by Flush, which then notes the
	// change attribute after our own writes.
	wrote atomic.Bool
	// empty: the file was empty when opened and nothing was written
	// through the handle yet (see Write).
	empty atomic.Bool
	// writeOnly is set when an O_WRONLY open could not be widened to
	// read-write (see openFile): reads through it, which the writeback
	// cache makes for partial-page writes, may be refused.
	writeOnly bool

	// mtime is the mtime of buffered writes the kernel passed on with a
	// SETATTR through this handle, not sent yet (see deferTimes).
	tmu   sync.Mutex
	mtime *time.Time

	// held is the first small write of an empty file, kept to go to
	// the server with the mtime at the close (held.go); hasHeld says
	// whether there is one without taking hmu. heldErr is the failure
	// of a held write sent before the close, for the close to report.
	hmu       sync.Mutex
	held      []byte
	heldOff   int64
	heldErr   syscall.Errno
	heldTimer *time.Timer
	hasHeld   atomic.Bool
}

var (
	_ fs.FileHandle   = (*handle)(nil)
	_ fs.FileReader   = (*handle)(nil)
	_ fs.FileWriter   = (*handle)(nil)
	_ fs.FileFlusher  = (*handle)(nil)
	_ fs.FileFsyncer  = (*handle)(nil)
	_ fs.FileReleaser = (*handle)(nil)
	_ fs.FileGetlker  = (*handle)(nil)
	_ fs.FileSetlker  = (*handle)(nil)
	_ fs.FileSetlkwer = (*handle)(nil)
)

func newHandle(f *client.File, c *client.Client, n *node, writeOnly bool) *handle {
	h := &handle{f: f, c: c, n: n, fsys: n.fsys, writeOnly: writeOnly}
	h.empty.Store(f.OpenAttr().Size == 0 || f.OpenAttr().Type != client.TypeRegular)
	n.opened(h)
	return h
}

// openFile opens a file for an open(2) with flags, calling open with the
// client's open flags. With the writeback cache (AccessCached) the kernel
// reads through whatever handle a write(2) came through, to fill the rest
// of a page it only partly overwrites, so an O_WRONLY open asks the server
// for read-write access. A user who may write but not read the file is
// refused that; the open then falls back to write-only, and such reads go
// to the server with the write-only open (servers may serve them, Shoal
// does; one that refuses makes the write(2) fail with its error, never
// fills the page with anything but the file's data). The fallback is
// reported as writeOnly.
func (fs *fsys) openFile(ctx context.Context, flags uint32, open func(of int) (*client.File, error)) (f *client.File, writeOnly bool, err error) {
	of := openFlags(flags)
	if fs.cfg.Access != AccessCached {
		f, err = open(of)
		return f, false, err
	}
	if of&syscall.O_ACCMODE == syscall.O_WRONLY {
		f, err = open(of&^syscall.O_ACCMODE | syscall.O_RDWR)
		if errno := toErrno(err); errno == syscall.EACCES || errno == syscall.EPERM {
			f, err = open(of)
			writeOnly = err == nil
		}
	} else {
		f, err = open(of)
	}
	if err != nil {
		return f, writeOnly, err
	}
	if of&syscall.O_ACCMODE == syscall.O_RDONLY {
		if a, ok := fs.readAccess(); ok {
			if err := f.SetAccess(ctx, a); err != nil {
				f.Close()
				return nil, false, err
			}
		}
		return f, false, nil
	}
	// Under the writeback cache the kernel already gathers writes into
	// large WRITEs (up to maxIO) and holds dirty data itself, so a
	// writable open sends them on as they come (client.AccessDirect):
	// a second write-back cache below the kernel's only copies the data
	// once more and delays it. Measured with scripts/fio-access.sh on
	// this tree (2 cores, loopback pNFS cluster): sequential writes of
	// 4 KiB and 1 MiB ran at about 160-190 MB/s with client.AccessCached
	// below the kernel cache and 270-330 MB/s with client.AccessDirect
	// (client.AccessODirect: 230-290). Read-only opens: see readAccess.
	if err := f.SetAccess(ctx, client.AccessDirect); err != nil {
		f.Close()
		return nil, false, err
	}
	return f, writeOnly, nil
}

// readAccess returns the library access method for a read-only open of a
// cached mount, and false to keep the mount's (client.AccessCached).
//
// With the kernel's readahead window raised (New, as root), the kernel
// prefetches through the page cache and the library's cache below it
// would only copy the data once more, so reads go straight through
// (client.AccessDirect). Measured on this tree (2 cores, `shoal up --ds 2`
// on loopback, fio sequential 1 MiB reads of 512 MiB files, 3 runs, MB/s):
// one stream 581-630 with the library's cache and the kernel's 128 KiB,
// 1030-1091 with a 1 MiB kernel window and AccessDirect (900-960 with 4
// MiB); 4 streams 306-703 against 949-1069. Left at 128 KiB (not root),
// the kernel keeps only one small READ ahead, and the library's readahead
// is worth keeping: reads ran at 380-560 MB/s with it against 280-350
// without.
func (fs *fsys) readAccess() (client.Access, bool) {
	if fs.cfg.Access == AccessCached && fs.kernelRA.Load() >= minKernelReadahead {
		return client.AccessDirect, true
	}
	return 0, false
}

func (h *handle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	if errno := h.n.sendHeldAll(mutating(ctx), nil); errno != 0 {
		return nil, errno
	}
	n, err := h.f.ReadAtContext(ctx, dest, off)
	if err != nil && !errors.Is(err, io.EOF) {
		if h.writeOnly {
			h.fsys.log.Debug("read through a write-only open refused", "path", h.f.Name(), "err", err)
		}
		return nil, toErrno(err)
	}
	return fuse.ReadResultData(dest[:n]), 0
}

func (h *handle) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	h.wrote.Store(true)
	defer h.n.changed()
	if h.empty.Swap(false) && off == 0 && h.fsys.cfg.Access == AccessCached && len(data) < h.c.Policy().SmallIOThreshold {
		// The first WRITE of a file that was empty, small and from
		// offset 0: with the writeback cache, that is almost always a
		// small file written whole at its close, whose COMMIT would
		// follow at once. It is held for the close, which sends it
		// FILE_SYNC with the file's mtime in one COMPOUND (held.go):
		// no COMMIT, and one durable commit at the server.
		h.hold(data, off)
		return uint32(len(data)), 0
	}
	// Whatever this or another handle holds goes first, in order.
	if errno := h.n.sendHeldAll(context.Background(), nil); errno != 0 {
		return 0, errno
	}
	h.dirty.Store(true)
	// No cancellation: go-fuse reuses data once Write returns, and WRITEs
	// abandoned by a cancelled context would still read it.
	n, err := h.f.WriteAt(data, off)
	if err != nil {
		return uint32(n), toErrno(err)
	}
	return uint32(n), 0
}

func (h *handle) sync(ctx context.Context) syscall.Errno {
	if !h.dirty.Swap(false) {
		return 0
	}
	if err := h.f.SyncContext(ctx); err != nil {
		h.dirty.Store(true)
		return toErrno(err)
	}
	return 0
}

// syncAll commits what was written through the handle and, with the
// writeback cache, through every other open handle of the file: the
// kernel writes dirty pages back through any writable handle of the inode
// (the first on its list, not the one write(2) used), so the data a
// close(2) or fsync(2) must make durable may have reached another handle.
func (h *handle) syncAll(ctx context.Context) syscall.Errno {
	errno := h.sync(ctx)
	if h.fsys.cfg.Access != AccessCached {
		return errno
	}
	for _, o := range h.n.dirtyHandles(h) {
		if e := o.sync(ctx); e != 0 && errno == 0 {
			errno = e
		}
	}
	return errno
}

// dirtyHandles returns the node's open handles other than except that
// have writes not yet committed.
func (n *node) dirtyHandles(except *handle) []*handle {
	n.mu.Lock()
	defer n.mu.Unlock()
	var hs []*handle
	for o := range n.handles {
		if o != except && o.dirty.Load() {
			hs = append(hs, o)
		}
	}
	return hs
}

// Flush runs at every close(2) of a descriptor, after the kernel has
// written the file's dirty pages back: commit what was written, so that
// write errors reach close and the data is durable (close-to-open).
//
// With the page cache (AccessCached), the change attribute after our own
// writes becomes the one the next open compares with, so that reopening a
// file this mount wrote keeps its page cache (which holds exactly what
// was written) instead of taking the write for another client's change.
// A change another client made while the file was open here is missed
// that way, as by NFS clients without weak cache consistency data.
//
// The mtime of the buffered writes, which the kernel passed on before
// them, goes to the server now, after the data, in one COMPOUND with the
// GETATTR that learns the change attribute.
func (h *handle) Flush(ctx context.Context) syscall.Errno {
	ctx = mutating(ctx)
	wrote := h.wrote.Swap(false) || len(h.n.dirtyHandles(h)) > 0 || len(h.n.heldHandles(h)) > 0
	errno := h.n.sendHeldAll(ctx, h)
	if e := h.syncAll(ctx); errno == 0 {
		errno = e
	}
	if wrote {
		h.n.changed() // held-back writes may have reached the server just now
	}
	if errno != 0 {
		h.sendHeldAndTimes(ctx) // the close must not leave data behind
		return errno
	}
	gen := h.n.attrMark()
	a, ok, errno := h.sendHeldAndTimes(ctx)
	if errno != 0 {
		return errno
	}
	if ok {
		// The server's attributes after the data and its mtime: what
		// the kernel asks for after close (see node.freshAttr).
		h.n.noteChange(&a, gen)
	}
	if !wrote || h.fsys.cfg.Access != AccessCached {
		return 0
	}
	if !ok {
		var err error
		if a, err = h.f.Stat(ctx); err != nil {
			return 0
		}
	}
	h.n.mu.Lock()
	h.n.change, h.n.changeValid = a.Change, true
	h.n.mu.Unlock()
	return 0
}

// deferTimes keeps the mtime of buffered writes for sendTimes. With the
// writeback cache the kernel sends it in a SETATTR through an open handle
// before the data (at fsync, close, or when its flusher runs); the
// WRITEs that follow would overwrite it on the server with their own
// time anyway, so it is set after them, at Flush, Fsync or Release, which
// also saves the SETATTR its own round trip. The kernel keeps the mtime
// it set for the inode meanwhile.
func (h *handle) deferTimes(mtime *time.Time) {
	t := *mtime
	h.tmu.Lock()
	h.mtime = &t
	h.tmu.Unlock()
}

// hasTimes reports whether a deferred mtime waits for sendTimes.
func (h *handle) hasTimes() bool {
	h.tmu.Lock()
	defer h.tmu.Unlock()
	return h.mtime != nil
}

// sendTimes sets a deferred mtime and returns the attributes afterwards.
// Failure is only logged, as for a SETATTR of the writeback cache that
// the server refuses (see writebackTimes).
func (h *handle) sendTimes(ctx context.Context) (client.Attr, bool) {
	h.tmu.Lock()
	t := h.mtime
	h.mtime = nil
	h.tmu.Unlock()
	if t == nil {
		return client.Attr{}, false
	}
	a, err := h.c.SetAttrHandle(ctx, h.f.Handle(), client.SetAttr{Mtime: t})
	if err != nil {
		h.fsys.log.Debug("mtime of buffered writes not set", "path", h.f.Name(), "err", err)
		return client.Attr{}, false
	}
	return a, true
}

// evictChanged makes the kernel forget the inode of a file another client
// changed, when Open finds the change attribute differs from the one seen
// at the last open and nothing here has the file open. With the writeback
// cache the kernel trusts its own size of a regular file over the
// server's for as long as it keeps the inode (it cannot tell our writes
// from anyone else's), so dropping the page cache is not enough: a file
// that grew would read short and one that shrank would read zeros. It
// invalidates the directory entry and reports true, for Open to fail with
// ESTALE: the kernel then puts the inode, which has no other users and is
// evicted, and retries the open once with a fresh LOOKUP, which builds a
// new inode with the server's size. The retry finds reval set and opens
// normally (if something else kept the old inode alive, it keeps its
// size: the limit of the writeback cache). A file open here while another
// client changes it is not handled: the kernel's size wins until the
// inode is evicted.
func (n *node) evictChanged(a *client.Attr) bool {
	n.mu.Lock()
	evict := n.changeValid && n.change != a.Change && n.opens == 0 && !n.reval
	n.reval = evict
	n.mu.Unlock()
	if !evict {
		return false
	}
	name, parent := n.Parent()
	if parent != nil {
		errno := parent.NotifyEntry(name)
		if errno == 0 {
			return true
		}
		n.fsys.log.Debug("invalidating entry of a changed file", "name", name, "err", errno)
	}
	n.mu.Lock()
	n.reval = false
	n.mu.Unlock()
	return false
}

func (h *handle) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	h.dirty.Store(true) // commit even if an earlier Flush already did: it is cheap
	errno := h.n.sendHeldAll(ctx, h)
	if e := h.syncAll(ctx); errno == 0 {
		errno = e
	}
	if _, _, e := h.sendHeldAndTimes(ctx); errno == 0 {
		errno = e
	}
	h.n.changed()
	return errno
}

// Release runs when the last descriptor is gone. Its error cannot reach
// the application, so it is only logged.
func (h *handle) Release(ctx context.Context) syscall.Errno {
	ctx = mutating(ctx)
	defer h.n.released(ctx, h)
	if h.wrote.Load() || h.hasTimes() || h.hasHeld.Load() {
		// Writes after the last Flush, or their mtime, reach the
		// server now.
		defer h.n.changed()
	}
	if _, _, errno := h.sendHeldAndTimes(ctx); errno != 0 {
		h.fsys.log.Warn("writing back at release", "path", h.f.Name(), "err", errno)
	}
	h.stopHeld()
	if err := h.f.Close(); err != nil {
		h.fsys.log.Warn("closing nfs file", "path", h.f.Name(), "err", err)
		return toErrno(err)
	}
	return 0
}

// lockRange converts a FUSE lock range (inclusive end, OFFSET_MAX or more
// meaning to end of file) to the client's offset and length (0: to EOF).
func lockRange(lk *fuse.FileLock) (off, length uint64) {
	if lk.End >= math.MaxInt64 || lk.End < lk.Start {
		return lk.Start, 0
	}
	return lk.Start, lk.End - lk.Start + 1
}

func (h *handle) Getlk(ctx context.Context, owner uint64, lk *fuse.FileLock, flags uint32, out *fuse.FileLock) syscall.Errno {
	off, length := lockRange(lk)
	if flags&fuse.FUSE_LK_FLOCK != 0 {
		off, length = 0, 0
	}
	conflict, err := h.f.TestLock(ctx, off, length, lk.Typ == syscall.F_WRLCK)
	if err != nil {
		return toErrno(err)
	}
	if conflict == nil {
		*out = fuse.FileLock{Start: lk.Start, End: lk.End, Typ: syscall.F_UNLCK}
		return 0
	}
	*out = fuse.FileLock{Start: conflict.Offset, End: math.MaxInt64, Typ: syscall.F_RDLCK}
	if conflict.Length != 0 && conflict.Length != math.MaxUint64 {
		out.End = conflict.Offset + conflict.Length - 1
	}
	if conflict.Write {
		out.Typ = syscall.F_WRLCK
	}
	return 0
}

func (h *handle) setlk(ctx context.Context, lk *fuse.FileLock, flags uint32, wait bool) syscall.Errno {
	// Another client that takes the lock next reads what was written.
	if errno := h.n.sendHeldAll(mutating(ctx), nil); errno != 0 {
		return errno
	}
	off, length := lockRange(lk)
	if flags&fuse.FUSE_LK_FLOCK != 0 {
		off, length = 0, 0
	}
	switch lk.Typ {
	case syscall.F_UNLCK:
		return toErrno(h.f.Unlock(ctx, off, length))
	case syscall.F_RDLCK, syscall.F_WRLCK:
		return toErrno(h.f.Lock(ctx, off, length, lk.Typ == syscall.F_WRLCK, wait))
	}
	return syscall.EINVAL
}

func (h *handle) Setlk(ctx context.Context, owner uint64, lk *fuse.FileLock, flags uint32) syscall.Errno {
	return h.setlk(mutating(ctx), lk, flags, false)
}

func (h *handle) Setlkw(ctx context.Context, owner uint64, lk *fuse.FileLock, flags uint32) syscall.Errno {
	return h.setlk(ctx, lk, flags, true)
}

// writebackTimes reports whether a failed SETATTR may be treated as done
// because it is the writeback cache passing on the mtime of buffered
// writes: the kernel sends it through an open handle, with the closing (or
// syncing) caller's credentials, before the data itself reaches the
// server, whose WRITEs then set the mtime anyway. Refusing it would fail
// close(2) for a writer who does not own the file (only owners may set
// explicit times; with default_permissions the kernel refuses that for a
// futimens(2) before asking us). Most such SETATTRs never get here:
// Setattr defers them to the handle's Flush (deferTimes), and this
// covers those it could not answer from the node's attributes.
func writebackTimes(fs *fsys, h *handle, in *fuse.SetAttrIn, errno syscall.Errno) bool {
	if !isWritebackTimes(fs, h, in) {
		return false
	}
	if errno != syscall.ENOENT && errno != syscall.EPERM && errno != syscall.EACCES {
		return false
	}
	fs.log.Debug("mtime of buffered writes not set", "path", h.f.Name(), "err", errno)
	return true
}

// isWritebackTimes reports whether a SETATTR looks like the writeback
// cache passing on the mtime of buffered writes: mtime (and ctime) alone,
// through an open handle (the kernel names the handle only for that and
// for ftruncate; futimens(2) comes without one).
func isWritebackTimes(fs *fsys, h *handle, in *fuse.SetAttrIn) bool {
	const times = fuse.FATTR_MTIME | fuse.FATTR_CTIME | fuse.FATTR_MTIME_NOW | fuse.FATTR_FH | fuse.FATTR_LOCKOWNER
	return fs.cfg.Access == AccessCached && h != nil && in.Valid&fuse.FATTR_MTIME != 0 && in.Valid&^times == 0
}
