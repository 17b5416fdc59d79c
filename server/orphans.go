package server

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shoalfs/shoal/meta"
	"github.com/shoalfs/shoal/server/state"
)

// Orphans: POSIX keeps the data of an unlinked file until its last close,
// and NFS clients of other nodes expect the same (tail -f of a log that
// another node rotated away). The client's silly-rename only covers opens
// on the same client, so the server does the rest: when REMOVE or RENAME
// drops the last link of a regular file, the metadata engine keeps the
// inode as an orphan (Nlink 0, in a persistent orphan set; see
// meta.Engine.Remove), and the server frees it, data included, as soon as
// no client holds an open of it:
//
//   - at once after the REMOVE or RENAME if there is no open;
//   - else at the CLOSE of the last open (OPEN_DOWNGRADE keeps an open);
//   - else when the last holder's state is purged (lease expiry,
//     DESTROY_CLIENTID, a new incarnation of the client);
//   - after a restart, orphans wait for the grace period, in which holders
//     reclaim their opens (CLAIM_PREVIOUS carries the filehandle); at its
//     end (or at once when there is no grace) those nobody reclaimed go.
//
// Freeing races with opens by filehandle (CLAIM_FH, CLAIM_PREVIOUS) and
// with an OPEN by name that looked the file up just before the REMOVE. An
// orphan is freed under its stripe lock after checking that it has no
// open, and OPEN registers its open under the same lock, so either the
// free sees the open or the OPEN comes after the free. OPEN then finds
// out with a metadata read, which it only needs when some orphan was
// freed since it started (gen), and backs out.

// orphanStripes is the number of locks orphans are spread over: frees of
// different files, and opens of files that are not being freed, do not
// wait for each other.
const orphanStripes = 64

// A free that failed (data servers not registered yet after a restart, or
// one down) is retried by sweep after a backoff that doubles from
// orphanRetryMin to orphanRetryMax.
const (
	orphanRetryMin = time.Second
	orphanRetryMax = time.Minute
)

// retry is when sweep may next try to free a pending orphan.
type retry struct {
	at      time.Time
	backoff time.Duration // of the last failure; 0 before any
}

// orphanSet tracks the orphans the server has not freed yet.
type orphanSet struct {
	s       *Server
	ctx     context.Context // the state glue's: frees outlive requests
	stripes [orphanStripes]sync.Mutex
	// gen counts frees; it is bumped under the stripe lock after the
	// engine has committed the free.
	gen atomic.Uint64

	mu sync.Mutex
	// pending holds the orphans not freed yet, each with the earliest
	// time of its next free attempt by sweep.
	pending map[meta.Ino]retry
	kick    chan struct{}
}

// newOrphanSet loads the persisted orphans: they wait for the grace period
// (or the first sweep, without one) before they are freed.
func newOrphanSet(ctx context.Context, s *Server) (*orphanSet, error) {
	inos, err := s.meta.Orphans(ctx)
	if err != nil {
		return nil, fmt.Errorf("server: loading orphans: %w", err)
	}
	o := &orphanSet{s: s, ctx: ctx, pending: make(map[meta.Ino]retry, len(inos)), kick: make(chan struct{}, 1)}
	for _, ino := range inos {
		o.pending[ino] = retry{}
	}
	if len(inos) > 0 {
		s.log.Info("unlinked files still allocated from the last run", "orphans", len(inos))
	}
	return o, nil
}

func (o *orphanSet) stripe(ino meta.Ino) *sync.Mutex { return &o.stripes[uint64(ino)%orphanStripes] }

func (o *orphanSet) isPending(ino meta.Ino) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	_, ok := o.pending[ino]
	return ok
}

// orphaned is called after REMOVE or RENAME dropped the last link of the
// regular file ino: it frees the file unless somebody has it open.
func (o *orphanSet) orphaned(ino meta.Ino) {
	if o == nil {
		return
	}
	o.mu.Lock()
	o.pending[ino] = retry{}
	o.mu.Unlock()
	o.tryFree(ino)
}

// released is called when opens of file went away (CLOSE): if it was the
// last open of an orphan, the orphan is freed.
func (o *orphanSet) released(file state.FileID) {
	if o == nil || !o.isPending(meta.Ino(file)) {
		return
	}
	o.tryFree(meta.Ino(file))
}

// purged is called with the files of a client whose state was purged. The
// frees run in the sweeper, not in the purging request or the lease
// sweep: removing data on data servers may take a while.
func (o *orphanSet) purged(files []state.FileID) {
	if o == nil {
		return
	}
	for _, f := range files {
		if o.isPending(meta.Ino(f)) {
			select {
			case o.kick <- struct{}{}:
			default:
			}
			return
		}
	}
}

// tryFree frees the orphan ino if it is still pending and nobody holds it
// open, outside the grace period. It reports whether it freed it.
func (o *orphanSet) tryFree(ino meta.Ino) bool {
	l := o.stripe(ino)
	l.Lock()
	defer l.Unlock()
	if !o.isPending(ino) {
		return false // freed by somebody else meanwhile
	}
	m := o.s.st.m
	if m.InGrace() || m.HasOpen(state.FileID(ino)) {
		return false
	}
	log := o.s.log.With("ino", uint64(ino))
	a, err := o.s.meta.GetAttr(o.ctx, ino)
	switch {
	case errors.Is(err, meta.ErrStale):
		// Gone from the engine already; make sure the data is too.
	case err != nil:
		log.Warn("free unlinked file: getattr", "err", err)
		o.retryLater(ino)
		return false
	case a.Nlink != 0:
		// Not an orphan (the engine refuses links to one, so this is a
		// bug elsewhere): never drop a named file's data.
		log.Error("free unlinked file: it has links", "nlink", a.Nlink)
		o.drop(ino)
		return false
	}
	// Data first, then the inode: if the data removal fails or the
	// server stops in between, the orphan is still recorded and freed
	// again later, rather than its data leaking.
	o.s.cache.forget(ino)
	if err := o.s.data.Remove(uint64(ino)); err != nil {
		log.Warn("free unlinked file: remove data", "err", err)
		o.retryLater(ino)
		return false
	}
	if _, err := o.s.meta.FreeOrphan(o.ctx, ino); err != nil {
		log.Warn("free unlinked file: free inode", "err", err)
		o.retryLater(ino)
		return false
	}
	o.s.cache.forget(ino)
	o.gen.Add(1)
	o.drop(ino)
	log.Debug("freed unlinked file")
	return true
}

func (o *orphanSet) retryLater(ino meta.Ino) {
	o.mu.Lock()
	if r, ok := o.pending[ino]; ok {
		r.backoff = min(max(2*r.backoff, orphanRetryMin), orphanRetryMax)
		r.at = time.Now().Add(r.backoff)
		o.pending[ino] = r
	}
	o.mu.Unlock()
}

func (o *orphanSet) drop(ino meta.Ino) {
	o.mu.Lock()
	delete(o.pending, ino)
	o.mu.Unlock()
}

// sweep frees every pending orphan nobody holds open, once the grace
// period is over: the orphans of the previous run that no client
// reclaimed, and any whose free failed or was missed.
func (o *orphanSet) sweep() {
	if o == nil || o.s.st.m.InGrace() {
		return
	}
	now := time.Now()
	o.mu.Lock()
	var due []meta.Ino
	for ino, r := range o.pending {
		if !now.Before(r.at) {
			due = append(due, ino)
		}
	}
	o.mu.Unlock()
	freed := 0
	for _, ino := range due {
		if o.ctx.Err() != nil {
			return
		}
		if o.tryFree(ino) {
			freed++
		}
	}
	if freed > 0 {
		o.s.log.Info("freed unlinked files nobody holds open", "freed", freed, "pending", len(due)-freed)
	}
}

// openGuard is taken by OPEN before it resolves the file: see check.
type openGuard struct {
	o   *orphanSet
	gen uint64
}

func (o *orphanSet) guard() openGuard {
	if o == nil {
		return openGuard{}
	}
	return openGuard{o: o, gen: o.gen.Load()}
}

// open runs register, which adds an open of ino to the state manager,
// under ino's stripe lock, so that no free of ino can run between its own
// check for opens and its free. It returns false if the file was freed
// before the open was registered (the OPEN must then undo it): only
// possible if some orphan was freed since guard was taken, which the
// caller took before looking the file up.
func (g openGuard) open(ino meta.Ino, register func() error) (alive bool, err error) {
	if g.o == nil {
		return true, register()
	}
	l := g.o.stripe(ino)
	l.Lock()
	err = register()
	freed := g.o.gen.Load() != g.gen
	l.Unlock()
	if err != nil || !freed {
		return true, err
	}
	if _, err := g.o.s.meta.GetAttr(g.o.ctx, ino); errors.Is(err, meta.ErrStale) {
		return false, nil
	}
	return true, nil
}
