package fusemount

import (
	"context"
	"errors"
	"io"
	"math"
	"sync/atomic"
	"syscall"

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
	// commits only if something was written.
	dirty atomic.Bool
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

func newHandle(f *client.File, c *client.Client, n *node) *handle {
	h := &handle{f: f, c: c, n: n, fsys: n.fsys}
	n.opened(h)
	return h
}

func (h *handle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	n, err := h.f.ReadAtContext(ctx, dest, off)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, toErrno(err)
	}
	return fuse.ReadResultData(dest[:n]), 0
}

func (h *handle) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
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

// Flush runs at every close(2) of a descriptor: commit what was written,
// so that write errors reach close and the data is durable (close-to-open).
func (h *handle) Flush(ctx context.Context) syscall.Errno { return h.sync(mutating(ctx)) }

func (h *handle) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	h.dirty.Store(true) // commit even if an earlier Flush already did: it is cheap
	return h.sync(ctx)
}

// Release runs when the last descriptor is gone. Its error cannot reach
// the application, so it is only logged.
func (h *handle) Release(ctx context.Context) syscall.Errno {
	ctx = mutating(ctx)
	defer h.n.released(ctx, h)
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
