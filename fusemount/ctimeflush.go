package fusemount

import (
	"context"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// The kernel's times flush after link, unlink and rename.
//
// With the writeback cache (AccessCached) the kernel keeps a regular
// file's mtime and ctime itself and never takes them from the server
// while it holds the inode. So after every LINK, UNLINK and RENAME it
// answered successfully, it sets the file's ctime to its own clock and
// writes the inode's times back at once, in the same system call:
// fs/fuse/dir.c's fuse_update_ctime marks the inode dirty and calls
// sync_inode_metadata, and fuse_write_inode sends a SETATTR of mtime and
// ctime (with the handle of a writable open file if there is one). For
// link(2) and rename(2) that is the linked or moved file; for unlink(2)
// and for the file a rename replaces, the file that lost a name (when
// that was its last name, node.gone answered it without the server
// before, and still does for a caller the mark below cannot name).
//
// Forwarded, that SETATTR cost a round trip and a durable commit at the
// MDS for every link, every rename and every unlink of a file with other
// names, and it told the server nothing: the server set the ctime itself
// when it carried out the LINK, REMOVE or RENAME (Shoal's MDS bumps the
// object's change attribute and ctime in all three, in the same
// transaction: meta's Link, unlink and Rename; Linux file systems behind
// other NFS servers do the same), and the mtime is the one the kernel
// had cached, which link, unlink and rename do not change. Worse than
// useless: when another client had set the file's mtime since the kernel
// cached it, the forwarded SETATTR put the old one back.
//
// So the mount answers that SETATTR itself. An operation that triggers
// it leaves a mark on the file's node (expectTimesFlush): the caller's
// pid and a deadline. The next SETATTR of that node from that pid ends
// the mark; if it is mtime and ctime only and comes without a file
// handle, it is the flush, answered from the node's attributes (the
// kernel ignores the attributes of this reply, fuse_flush_times).
// The pid makes the mark safe when the flush never comes: the kernel
// sends it synchronously in the system call that did the link, unlink or
// rename, which holds the file's inode lock, so no other SETATTR of the
// file can come first; if that process was killed before the flush was
// sent, its pid sends nothing more, and a later utimes(2) of the file,
// from any process, goes to the server. (The one other way the flush can
// go missing: the kernel's flusher thread writes the same inode back
// between the two steps, and the flush then comes with the flusher's pid
// and goes to the server as before; the mark then lapses at its
// deadline, and until then an mtime-only utimes(2) of the same file by
// the same process would be taken for the flush. So a SETATTR is taken
// for the flush only if its mtime is the one the mount last knew, which
// is what the flush carries; a utimes(2) that sets another mtime goes to
// the server, and one that sets the same mtime changes nothing but the
// ctime, which the server moved already. flushWindow keeps even that
// short.) A flush through a writable handle (the file is open for
// writing) keeps its own path, the mtime of buffered writes held for the
// close (isWritebackTimes), and ends the mark all the same.
//
// What stat(2) shows does not change: the kernel keeps its own ctime and
// link count for the inode it holds (it drops or raises the link count
// itself on unlink and link), and the node is marked changed (childChanged,
// changed), so the mount's next answer about it comes from the server.

// flushWindow bounds how long a mark waits for its flush. The flush
// follows the reply within the same system call, so in practice within
// microseconds; the bound only matters for a flush that never comes.
const flushWindow = time.Second

// flushTimes is what the kernel's times flush sets: the mtime and ctime
// (FATTR_CTIME since protocol 7.23), never "now" (the kernel sends its
// own clock's time with the writeback cache).
const flushTimes = fuse.FATTR_MTIME | fuse.FATTR_CTIME | fuse.FATTR_LOCKOWNER

// expectTimesFlush marks the node for the kernel's times flush that
// follows a link, unlink or rename of it by the caller of ctx (see
// above). Only regular files have one, and only with the writeback
// cache.
func (n *node) expectTimesFlush(ctx context.Context) {
	if n.fsys.cfg.Access != AccessCached || n.StableAttr().Mode&syscall.S_IFMT != syscall.S_IFREG {
		return
	}
	caller, ok := fuse.FromContext(ctx)
	if !ok || caller.Pid == 0 {
		return
	}
	n.mu.Lock()
	n.flushPid, n.flushBy = caller.Pid, time.Now().Add(flushWindow)
	n.mu.Unlock()
}

// takeTimesFlush reports whether the SETATTR in from the caller of ctx is
// the times flush the node was marked for, without a file handle (with
// one, the flush of a file open for writing elsewhere, it takes the path
// of buffered writes' mtime), and clears the mark once the marked process
// sends any SETATTR of the node: the flush comes first, or not at all.
func (n *node) takeTimesFlush(ctx context.Context, in *fuse.SetAttrIn) bool {
	caller, ok := fuse.FromContext(ctx)
	if !ok {
		return false
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.flushPid == 0 || n.flushPid != caller.Pid {
		return false
	}
	live := time.Now().Before(n.flushBy)
	n.flushPid, n.flushBy = 0, time.Time{}
	return live && in.Valid&fuse.FATTR_MTIME != 0 && in.Valid&^flushTimes == 0 // FATTR_FH: not ours
}
