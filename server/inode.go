package server

import (
	"context"
	"sync"
	"time"

	"github.com/shoalfs/shoal/meta"
)

// inodeCache holds attribute changes caused by WRITE that are not yet in the
// metadata engine. Persisting size and mtime on every WRITE would put a
// metadata transaction (and an fsync) on the data path; instead WRITE updates
// this overlay and the change is persisted when the data becomes stable
// (COMMIT, FILE_SYNC/DATA_SYNC writes, CLOSE) or by a periodic flush. Data
// that was never committed may be lost in a crash anyway, so its size may be
// too. Every attribute read goes through overlay, so clients never see the
// difference.
type inodeCache struct {
	s     *Server
	mu    sync.Mutex
	dirty map[meta.Ino]*pendingAttr
}

type pendingAttr struct {
	size   uint64
	mtime  time.Time
	change uint64
}

func newInodeCache(s *Server) *inodeCache {
	return &inodeCache{s: s, dirty: map[meta.Ino]*pendingAttr{}}
}

// overlay applies pending changes to attributes read from the engine.
func (ic *inodeCache) overlay(ino meta.Ino, a *meta.Attr) {
	ic.mu.Lock()
	if p := ic.dirty[ino]; p != nil {
		a.Size, a.Mtime, a.Ctime = p.size, p.mtime, p.mtime
		if p.change > a.Change {
			a.Change = p.change
		}
	}
	ic.mu.Unlock()
}

// wrote records a write that ended at end. base is the inode's current
// attributes (overlay applied). It returns the attributes after the write.
func (ic *inodeCache) wrote(ino meta.Ino, base meta.Attr, end uint64, now time.Time) meta.Attr {
	ic.mu.Lock()
	defer ic.mu.Unlock()
	p := ic.dirty[ino]
	if p == nil {
		// base was read before the write, and a concurrent flush may
		// have persisted a larger size and change since then. A flush
		// drops its entry only after the engine has committed, and only
		// under ic.mu, so reading the engine here cannot miss it.
		if cur, err := ic.s.meta.GetAttr(context.Background(), ino); err == nil {
			base.Size, base.Change = cur.Size, cur.Change
		}
		p = &pendingAttr{size: base.Size, change: base.Change}
		ic.dirty[ino] = p
	}
	if end > p.size {
		p.size = end
	}
	if now.After(p.mtime) {
		p.mtime = now
	}
	p.change++
	base.Size, base.Mtime, base.Ctime, base.Change = p.size, p.mtime, p.mtime, p.change
	return base
}

// forget drops pending changes, for inodes that were truncated or removed by
// an operation that persisted their attributes itself.
func (ic *inodeCache) forget(ino meta.Ino) {
	ic.mu.Lock()
	delete(ic.dirty, ino)
	ic.mu.Unlock()
}

// flush persists the pending changes of one inode.
func (ic *inodeCache) flush(ctx context.Context, ino meta.Ino) error {
	ic.mu.Lock()
	p := ic.dirty[ino]
	if p == nil {
		ic.mu.Unlock()
		return nil
	}
	snap := *p
	ic.mu.Unlock()
	_, err := ic.s.meta.SetAttr(ctx, ino, meta.SetAttr{
		Mask:   meta.SetSize | meta.SetMtime | meta.SetChange,
		Size:   snap.size,
		Mtime:  snap.mtime,
		Change: snap.change,
	}, snap.mtime)
	if err != nil {
		return err
	}
	ic.mu.Lock()
	if cur := ic.dirty[ino]; cur != nil && cur.change == snap.change {
		delete(ic.dirty, ino)
	}
	ic.mu.Unlock()
	return nil
}

// flushAll persists every pending change.
func (ic *inodeCache) flushAll(ctx context.Context) error {
	ic.mu.Lock()
	inos := make([]meta.Ino, 0, len(ic.dirty))
	for ino := range ic.dirty {
		inos = append(inos, ino)
	}
	ic.mu.Unlock()
	var first error
	for _, ino := range inos {
		if err := ic.flush(ctx, ino); err != nil && first == nil {
			first = err
		}
	}
	return first
}
