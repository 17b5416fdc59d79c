package fusemount

import (
	"context"
	"syscall"
	"time"

	"github.com/shoalfs/shoal/client"
)

// A small file's close in one durable commit (AccessCached).
//
// With the writeback cache, a small file written whole reaches the mount
// as one WRITE from offset 0 of an empty file, and the mtime of that
// write as a SETATTR through an open handle (deferTimes), both just
// before FLUSH, in either order. Sent as they come, they are two
// COMPOUNDs and, at a server that makes each COMPOUND durable before it
// answers, two fdatasyncs. So the mount holds that first small WRITE in
// the handle (a copy of at most Policy.SmallIOThreshold bytes) and sends
// it at Flush, Fsync or Release together with the mtime and the GETATTR
// the close needs anyway: one COMPOUND, one commit
// (client.File.WriteAtSyncSetAttr).
//
// Held data must never be missing where the server's copy is read or
// changed, so it goes out on its own first (sendHeld) before anything
// else through any handle of the node: another WRITE, a READ, a GETATTR
// or SETATTR through a handle, a SETATTR the mount sends, a lock. And it
// is never held longer than heldMaxAge: a file written once and left
// open reaches the server about as soon as the kernel's writeback would
// have sent it on its own. A failure of such a late send is kept and
// returned by the next Flush or Fsync, as a writeback error would be.
// The kernel keeps the pages meanwhile, so its own reads need no server.
// sync(2) and syncfs(2) reach no method of the mount (go-fuse answers
// FUSE_SYNCFS with ENOSYS): as for the UNSTABLE writes of larger files,
// fsync(2) or close(2) is what makes a file's data durable, and a held
// write waits at most heldMaxAge after the kernel's writeback.

// heldMaxAge bounds how long a held write waits for its close.
const heldMaxAge = time.Second

// hold keeps data, written at off, for the close (see above).
func (h *handle) hold(data []byte, off int64) {
	h.hmu.Lock()
	defer h.hmu.Unlock()
	h.held = append(h.held[:0], data...)
	h.heldOff = off
	h.hasHeld.Store(true)
	if h.heldTimer == nil {
		h.heldTimer = time.AfterFunc(heldMaxAge, func() {
			if errno := h.sendHeld(context.Background()); errno != 0 {
				h.fsys.log.Debug("late write of a held small write failed", "path", h.f.Name(), "err", errno)
			}
		})
	} else {
		h.heldTimer.Reset(heldMaxAge)
	}
}

// sendHeld writes the held data on its own, if there is any. A failure
// is returned, and also kept for the next Flush or Fsync (takeHeldErr).
func (h *handle) sendHeld(ctx context.Context) syscall.Errno {
	if !h.hasHeld.Load() {
		return 0
	}
	h.hmu.Lock()
	defer h.hmu.Unlock()
	if h.held == nil {
		return 0
	}
	if h.heldTimer != nil {
		h.heldTimer.Stop()
	}
	_, err := h.f.WriteAtSync(ctx, h.held, h.heldOff)
	h.held = nil
	h.hasHeld.Store(false)
	h.n.changed()
	if err != nil {
		h.heldErr = toErrno(err)
		return h.heldErr
	}
	return 0
}

// takeHeldErr returns, once, the error of a held write sent before the
// close.
func (h *handle) takeHeldErr() syscall.Errno {
	h.hmu.Lock()
	defer h.hmu.Unlock()
	errno := h.heldErr
	h.heldErr = 0
	return errno
}

// sendHeldAndTimes writes the held data, if any, with the deferred mtime
// and a GETATTR in one COMPOUND, and returns the attributes after them
// (ok false if there are none). Without held data it is sendTimes. A
// refused mtime is only logged (see writebackTimes); a failed write, now
// or in an earlier send of held data, is the errno.
func (h *handle) sendHeldAndTimes(ctx context.Context) (client.Attr, bool, syscall.Errno) {
	h.hmu.Lock()
	defer h.hmu.Unlock()
	data, off, errno := h.held, h.heldOff, h.heldErr
	h.held, h.heldErr = nil, 0
	h.hasHeld.Store(false)
	if h.heldTimer != nil {
		h.heldTimer.Stop()
	}
	if data == nil {
		a, ok := h.sendTimes(ctx)
		return a, ok, errno
	}
	var sa client.SetAttr
	h.tmu.Lock()
	sa.Mtime, h.mtime = h.mtime, nil
	h.tmu.Unlock()
	_, a, ok, setErr, err := h.f.WriteAtSyncSetAttr(ctx, data, off, sa)
	if !ok || err != nil {
		// The server changed the file, and nothing says how.
		h.n.changed()
	}
	if err != nil {
		return client.Attr{}, false, toErrno(err)
	}
	if setErr != nil {
		h.fsys.log.Debug("mtime of buffered writes not set", "path", h.f.Name(), "err", setErr)
	}
	return a, ok, errno
}

// sendHeldAll sends the held writes of the node's open handles other
// than except, each on its own: before anything reads or changes the
// file on the server. It returns the first error.
func (n *node) sendHeldAll(ctx context.Context, except *handle) syscall.Errno {
	var errno syscall.Errno
	for _, h := range n.heldHandles(except) {
		if e := h.sendHeld(ctx); e != 0 && errno == 0 {
			errno = e
		}
	}
	return errno
}

// heldHandles returns the node's open handles other than except that
// hold a write.
func (n *node) heldHandles(except *handle) []*handle {
	n.mu.Lock()
	defer n.mu.Unlock()
	var hs []*handle
	for o := range n.handles {
		if o != except && o.hasHeld.Load() {
			hs = append(hs, o)
		}
	}
	return hs
}

// stopHeld stops the late send of a handle being released.
func (h *handle) stopHeld() {
	h.hmu.Lock()
	if h.heldTimer != nil {
		h.heldTimer.Stop()
	}
	h.hmu.Unlock()
}

// dropTimes forgets the deferred mtimes of the node's open handles.
func (n *node) dropTimes() {
	n.mu.Lock()
	hs := make([]*handle, 0, len(n.handles))
	for h := range n.handles {
		hs = append(hs, h)
	}
	n.mu.Unlock()
	for _, h := range hs {
		h.tmu.Lock()
		h.mtime = nil
		h.tmu.Unlock()
	}
}
