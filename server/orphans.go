package server

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shoalfs/shoal/meta"
	"github.com/shoalfs/shoal/server/internal/state"
	"github.com/shoalfs/shoal/store"
)

// Orphans: POSIX keeps the data of an unlinked file until its last close,
// and NFS clients of other nodes expect the same (tail -f of a log that
// another node rotated away). The client's silly-rename only covers opens
// on the same client, so the server does the rest: when REMOVE or RENAME
// drops the last link of a regular file, the metadata engine keeps the
// inode as an orphan (Nlink 0, in a persistent orphan set; see
// meta.Engine.Remove), and the server frees it, data included, once no
// client holds an open of it:
//
//   - if nobody holds it open at the REMOVE or RENAME (and there is no
//     grace period), the orphan is doomed: the operation answers after
//     its one engine commit, and a background freer removes the data
//     from the data servers and then the inode, the inodes of up to
//     freerBatch orphans in one engine commit (a file known to have no
//     data is not even recorded: the REMOVE deletes its inode in its own
//     commit, orphans_remove.go);
//   - else at the CLOSE of the last open (OPEN_DOWNGRADE keeps an open);
//   - else when the last holder's state is purged (lease expiry,
//     DESTROY_CLIENTID, a new incarnation of the client);
//   - after a restart, orphans wait for the grace period, in which holders
//     reclaim their opens (CLAIM_PREVIOUS carries the filehandle); at its
//     end (or at once when there is no grace) those nobody reclaimed go.
//
// Every free that fails is retried by the sweeper with a backoff, and an
// orphan the server stops before freeing stays recorded in the engine and
// is freed after the restart. Space is thus reclaimed asynchronously, as
// on most local file systems: until the freer gets to a doomed orphan,
// its data is still on the data servers, and STATFS (space used and
// free) may count it for that moment.
//
// A doomed orphan is gone for clients: from the REMOVE's reply on, every
// filehandle resolution of it (PUTFH, the saved filehandle) fails with
// NFS4ERR_STALE, exactly as once it is freed, so nothing can open it,
// read, write or truncate it by filehandle in the meantime.
//
// Freeing races with opens by filehandle (CLAIM_FH, CLAIM_PREVIOUS) and
// with an OPEN by name that looked the file up just before the REMOVE. An
// orphan is doomed, or freed by CLOSE, purge or sweep, under its stripe
// lock after checking that it has no open, and OPEN registers its open
// under the same lock, so either the check sees the open or the OPEN sees
// the orphan doomed (and backs out) or comes after the free. OPEN finds
// out about a free with a metadata read, which it only needs when some
// orphan was freed since it started (gen), and about a doom with a lookup
// that it only makes while some orphan is doomed (ndoomed).

// orphanStripes is the number of locks orphans are spread over: frees of
// different files, and opens of files that are not being freed, do not
// wait for each other.
const orphanStripes = 64

// orphanFreers is how many doomed orphans the freer removes the data of
// at a time: enough for the removals to overlap, few enough that a burst
// of removes does not flood the data servers.
const orphanFreers = 8

// A free that failed (data servers not registered yet after a restart, or
// one down) is retried by sweep after a backoff that doubles from
// orphanRetryMin to orphanRetryMax.
const (
	orphanRetryMin = time.Second
	orphanRetryMax = time.Minute
)

// retry is the state of a pending orphan.
type retry struct {
	at      time.Time     // when sweep may next try to free it
	backoff time.Duration // of the last failure; 0 before any
	// doomed: nobody held the orphan open when it lost its last link,
	// and nobody may open it any more; only the freer frees it.
	doomed bool
	// queued: the doomed orphan is in the freer's queue or being freed;
	// cleared when a free fails, so that sweep hands it to the freer
	// again after the backoff.
	queued bool
}

// orphanSet tracks the orphans the server has not freed yet.
type orphanSet struct {
	s   *Server
	ctx context.Context // the state glue's: frees outlive requests
	// freeCtx is ctx marked meta.Deferred, for freeing inodes: a free
	// that a machine crash takes back leaves the orphan recorded, and
	// it is freed again after the restart (its data is gone already,
	// which removeData takes in its stride), so it need not wait for an
	// fdatasync of its own.
	freeCtx context.Context
	stripes [orphanStripes]sync.Mutex
	// gen counts frees; it is bumped under the stripe lock after the
	// engine has committed the free.
	gen atomic.Uint64
	// doomedSet holds the doomed orphans not freed yet (meta.Ino keys),
	// for the lookups of filehandle resolution and OPEN, which skip it
	// while ndoomed, its size, is 0. Both change under the orphan's
	// stripe lock and mu, together with pending.
	doomedSet sync.Map
	ndoomed   atomic.Int64

	mu sync.Mutex
	// pending holds the orphans not freed yet, each with the earliest
	// time of its next free attempt by sweep.
	pending map[meta.Ino]retry
	// queue holds the doomed orphans for the freer, which wake tells
	// about new ones.
	queue []meta.Ino
	wake  chan struct{}
	kick  chan struct{}

	// testHookBeforeFree, set by tests only, runs in the freer before
	// it frees a doomed orphan.
	testHookBeforeFree atomic.Pointer[func(meta.Ino)]
}

// newOrphanSet loads the persisted orphans: they wait for the grace period
// (or the first sweep, without one) before they are freed.
func newOrphanSet(ctx context.Context, s *Server) (*orphanSet, error) {
	inos, err := s.meta.Orphans(ctx)
	if err != nil {
		return nil, fmt.Errorf("server: loading orphans: %w", err)
	}
	o := &orphanSet{
		s: s, ctx: ctx, freeCtx: meta.Deferred(ctx), pending: make(map[meta.Ino]retry, len(inos)),
		wake: make(chan struct{}, 1), kick: make(chan struct{}, 1),
	}
	for _, ino := range inos {
		// Not doomed: a client may reclaim an open of it in the grace
		// period.
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

// isDoomed reports whether ino is a doomed orphan, which clients must
// find gone. Without doomed orphans it costs one atomic load.
func (o *orphanSet) isDoomed(ino meta.Ino) bool {
	if o == nil || o.ndoomed.Load() == 0 {
		return false
	}
	_, ok := o.doomedSet.Load(ino)
	return ok
}

// orphaned is called after REMOVE or RENAME dropped the last link of the
// regular file ino. Unless somebody has it open (or may still reclaim an
// open of it in the grace period), it is doomed and queued for the
// freer: the request does not wait for the free.
func (o *orphanSet) orphaned(ino meta.Ino) {
	if o == nil {
		return
	}
	l := o.stripe(ino)
	l.Lock()
	m := o.s.st.m
	doomed := !m.InGrace() && !m.HasOpen(state.FileID(ino))
	o.mu.Lock()
	if old, ok := o.pending[ino]; ok && old.doomed {
		// Doomed already (the engine refuses links to an orphan, so
		// this cannot happen): counted and queued once is enough.
		o.mu.Unlock()
		l.Unlock()
		return
	}
	o.pending[ino] = retry{doomed: doomed, queued: doomed}
	if doomed {
		o.ndoomed.Add(1)
		o.doomedSet.Store(ino, struct{}{})
		o.queue = append(o.queue, ino)
	}
	o.mu.Unlock()
	l.Unlock()
	if doomed {
		select {
		case o.wake <- struct{}{}:
		default:
		}
	}
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
// open, outside the grace period. It reports whether it freed it. Doomed
// orphans are the freer's: tryFree leaves them alone.
func (o *orphanSet) tryFree(ino meta.Ino) bool {
	l := o.stripe(ino)
	l.Lock()
	defer l.Unlock()
	o.mu.Lock()
	r, ok := o.pending[ino]
	o.mu.Unlock()
	if !ok || r.doomed {
		return false // freed by somebody else meanwhile, or the freer's
	}
	m := o.s.st.m
	if m.InGrace() || m.HasOpen(state.FileID(ino)) {
		return false
	}
	if !o.free(ino) {
		return false
	}
	o.gen.Add(1)
	o.drop(ino)
	return true
}

// free removes the data of the orphan ino, then its inode. It reports
// whether it did; on failure the orphan is left pending (and retried
// after a backoff) or, if it turns out not to be an orphan, dropped.
// The caller makes sure nobody opens ino meanwhile: the stripe lock for
// an orphan that is not doomed, the doom itself for one that is.
func (o *orphanSet) free(ino meta.Ino) bool {
	return o.awaitUnlinks([]meta.Ino{ino}) && o.removeData(ino, false) && o.syncRemoved([]meta.Ino{ino}) && o.freeInodes([]meta.Ino{ino}) == 1
}

// awaitUnlinks returns once the changes that made inos orphans (a REMOVE
// or RENAME each, possibly still only in the metadata log:
// durability.go) are durable, which they must be before their data goes,
// or a machine crash would bring back a name whose data is gone. It waits
// for the log's next fdatasync (at most the commit interval) rather than
// add one, and once for a whole batch of orphans: their changes were all
// made before they were queued. On failure the orphans are retried later.
func (o *orphanSet) awaitUnlinks(inos []meta.Ino) bool {
	sy := o.s.syncer
	if sy == nil || len(inos) == 0 {
		return true
	}
	if err := sy.Await(o.ctx); err != nil {
		o.s.log.Warn("free unlinked files: sync metadata", "orphans", len(inos), "err", err)
		for _, ino := range inos {
			o.retryLater(ino)
		}
		return false
	}
	return true
}

// syncRemoved makes the data removals of inos durable before their
// inodes are freed: a local store's unlink reaches the disk with the
// file system's next journal commit, which the log's fdatasync need not
// force, so without it a machine crash could keep the free and bring
// the data back, a data object no inode owns (found by the
// machine-crash harness, test/crash). On failure the orphans are retried
// later.
func (o *orphanSet) syncRemoved(inos []meta.Ino) bool {
	rs, ok := o.s.data.(store.RemoveSyncer)
	if !ok || len(inos) == 0 {
		return true
	}
	raw := make([]uint64, len(inos))
	for i, ino := range inos {
		raw[i] = uint64(ino)
	}
	if err := rs.SyncRemoved(raw); err != nil {
		o.s.log.Warn("free unlinked files: sync data removals", "err", err)
		for _, ino := range inos {
			o.retryLater(ino)
		}
		return false
	}
	return true
}

// orphanDataRemover is a data backend that removes the data of a doomed
// orphan more cheaply than Remove, leaving to the inode's free what goes
// with the inode (the inline store: inline.go).
type orphanDataRemover interface {
	RemoveOrphanData(ino uint64) error
}

// removeData is free's first step, after awaitUnlinks: it removes the
// data of the orphan ino. Data goes first: if the inode's free then
// fails or the server stops in between, the orphan is still recorded and
// freed again later, rather than its data leaking. doomed says the
// orphan is the freer's, which nobody can open any more.
func (o *orphanSet) removeData(ino meta.Ino, doomed bool) bool {
	a, err := o.s.meta.GetAttr(o.ctx, ino)
	switch {
	case errors.Is(err, meta.ErrStale):
		// Gone from the engine already; make sure the data is too.
	case err != nil:
		o.s.log.Warn("free unlinked file: getattr", "ino", uint64(ino), "err", err)
		o.retryLater(ino)
		return false
	case a.Nlink != 0:
		// Not an orphan (the engine refuses links to one, so this is a
		// bug elsewhere): never drop a named file's data.
		o.s.log.Error("free unlinked file: it has links", "ino", uint64(ino), "nlink", a.Nlink)
		o.drop(ino)
		return false
	}
	o.s.cache.forget(ino)
	remove := o.s.data.Remove
	if r, ok := o.s.data.(orphanDataRemover); ok && doomed {
		remove = r.RemoveOrphanData
	}
	if err := remove(uint64(ino)); err != nil {
		o.s.log.Warn("free unlinked file: remove data", "ino", uint64(ino), "err", err)
		o.retryLater(ino)
		return false
	}
	return true
}

// freeInodes is free's second step for orphans whose data is gone: it
// frees their inodes in one engine transaction (so a burst of removes
// costs the freer one commit per batch, not one per file) and returns
// how many it freed. If the batch fails, each is freed on its own, so
// that one bad inode does not hold back the others.
func (o *orphanSet) freeInodes(inos []meta.Ino) int {
	if len(inos) == 0 {
		return 0
	}
	if len(inos) > 1 {
		if err := o.s.meta.FreeOrphans(o.freeCtx, inos); err == nil {
			for _, ino := range inos {
				o.s.cache.forget(ino)
			}
			return len(inos)
		}
	}
	freed := 0
	for _, ino := range inos {
		if _, err := o.s.meta.FreeOrphan(o.freeCtx, ino); err != nil {
			o.s.log.Warn("free unlinked file: free inode", "ino", uint64(ino), "err", err)
			o.retryLater(ino)
			continue
		}
		o.s.cache.forget(ino)
		freed++
	}
	return freed
}

// freedDoomed ends the free of the doomed orphan ino, under its stripe
// lock as for any free: an OPEN that registered its open under it before
// sees the orphan doomed, one after sees gen changed.
func (o *orphanSet) freedDoomed(ino meta.Ino) {
	l := o.stripe(ino)
	l.Lock()
	o.gen.Add(1)
	o.drop(ino)
	l.Unlock()
	o.s.log.Debug("freed unlinked file", "ino", uint64(ino))
}

// freerBatch bounds the doomed orphans whose inodes the freer frees in
// one engine transaction; freerRound those it takes from its queue at a
// time, after one wait for the metadata log's fdatasync (awaitUnlinks);
// freerGather is how long the freer lets them gather after it was woken.
const (
	freerBatch  = 64
	freerRound  = 1024
	freerGather = 10 * time.Millisecond
)

// runFreer frees the doomed orphans queued by orphaned (and requeued by
// sweep) until the state's context ends: their data up to orphanFreers
// at a time, then their inodes in batches of up to freerBatch. It
// returns once the frees it started are over. What is still queued then
// stays recorded in the engine and is freed after the restart.
func (o *orphanSet) runFreer() {
	for {
		select {
		case <-o.ctx.Done():
			return
		case <-o.wake:
		}
		// Let a burst of removes gather, so that one commit frees many.
		select {
		case <-o.ctx.Done():
			return
		case <-time.After(freerGather):
		}
		for {
			o.mu.Lock()
			n := min(len(o.queue), freerRound)
			round := slices.Clone(o.queue[:n])
			o.queue = append(o.queue[:0], o.queue[n:]...)
			more := len(o.queue) > 0
			o.mu.Unlock()
			if n == 0 || o.ctx.Err() != nil {
				break
			}
			// One wait for the log's fdatasync for the whole round:
			// with one per orphan, eight at a time, an async server
			// (whose log is synced only every commit interval) freed
			// about eighty orphans a second, and with one per batch
			// about six hundred, fewer than it removes.
			if o.awaitUnlinks(round) {
				for batch := range slices.Chunk(round, freerBatch) {
					if o.ctx.Err() != nil {
						break
					}
					o.freeBatch(batch)
				}
			}
			if !more {
				break
			}
		}
	}
}

// freeBatch frees the doomed orphans of batch, whose unlinks are durable
// (awaitUnlinks).
func (o *orphanSet) freeBatch(batch []meta.Ino) {
	gone := make([]bool, len(batch))
	inline := o.unplaced(batch)
	var wg sync.WaitGroup
	slots := make(chan struct{}, orphanFreers)
	for i, ino := range batch {
		if inline[i] {
			// No data on the data servers: its bytes, if any, are
			// inline and go with the inode.
			o.s.cache.forget(ino)
			gone[i] = true
			continue
		}
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			if h := o.testHookBeforeFree.Load(); h != nil {
				(*h)(ino)
			}
			gone[i] = o.removeData(ino, true)
		})
	}
	wg.Wait()
	var inos []meta.Ino
	for i, ino := range batch {
		if gone[i] {
			inos = append(inos, ino)
		}
	}
	if !o.syncRemoved(inos) {
		return
	}
	if o.freeInodes(inos) == len(inos) {
		for _, ino := range inos {
			o.freedDoomed(ino)
		}
		return
	}
	// Some failed alone (and were put back for a retry): finish the
	// others, whose inodes are gone.
	for _, ino := range inos {
		if _, err := o.s.meta.GetAttr(o.ctx, ino); errors.Is(err, meta.ErrStale) {
			o.freedDoomed(ino)
		}
	}
}

// unplaced reports, for each doomed orphan of batch, whether it is an
// orphan (no links) without a stripe map on a backend that keeps data
// only where a file's map says (store.MapPlaced): a small file kept
// inline, whose data removal (removeData: a read of its attributes, then
// one of its stripe map, each a read transaction) has nothing to do. One
// read transaction for the batch (meta.OrphanStater). On any doubt (no
// such backend or engine, a failed read) it reports false, and the
// orphan takes removeData's way.
func (o *orphanSet) unplaced(batch []meta.Ino) []bool {
	out := make([]bool, len(batch))
	mp, ok := o.s.data.(store.MapPlaced)
	if !ok || !mp.PlacedByMap() {
		return out
	}
	stater, ok := o.s.meta.(meta.OrphanStater)
	if !ok {
		return out
	}
	states, err := stater.OrphanStates(o.ctx, batch)
	if err != nil {
		o.s.log.Debug("free unlinked files: read their states", "orphans", len(batch), "err", err)
		return out
	}
	for i, st := range states {
		out[i] = !st.Gone && st.Nlink == 0 && !st.Placed
	}
	return out
}

// retryLater schedules the next attempt at freeing ino, after a backoff.
// A doomed orphan goes back to the freer through sweep.
func (o *orphanSet) retryLater(ino meta.Ino) {
	o.mu.Lock()
	if r, ok := o.pending[ino]; ok {
		r.backoff = min(max(2*r.backoff, orphanRetryMin), orphanRetryMax)
		r.at = time.Now().Add(r.backoff)
		r.queued = false
		o.pending[ino] = r
	}
	o.mu.Unlock()
}

// drop forgets ino, freed or not an orphan.
func (o *orphanSet) drop(ino meta.Ino) {
	o.mu.Lock()
	if r, ok := o.pending[ino]; ok && r.doomed {
		o.doomedSet.Delete(ino)
		o.ndoomed.Add(-1)
	}
	delete(o.pending, ino)
	o.mu.Unlock()
}

// sweep frees every pending orphan nobody holds open, once the grace
// period is over: the orphans of the previous run that no client
// reclaimed, and any whose free failed or was missed. Doomed orphans
// whose free failed go back to the freer.
func (o *orphanSet) sweep() {
	if o == nil || o.s.st.m.InGrace() {
		return
	}
	now := time.Now()
	o.mu.Lock()
	var due []meta.Ino
	requeued := 0
	for ino, r := range o.pending {
		switch {
		case now.Before(r.at) || r.queued:
		case r.doomed:
			r.queued = true
			o.pending[ino] = r
			o.queue = append(o.queue, ino)
			requeued++
		default:
			due = append(due, ino)
		}
	}
	o.mu.Unlock()
	if requeued > 0 {
		select {
		case o.wake <- struct{}{}:
		default:
		}
	}
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

// openGuard is taken by OPEN before it resolves the file: see open.
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
// check for opens and its free, and ino cannot be doomed without the
// open being seen. It returns false if the file was doomed or freed
// before the open was registered (the OPEN must then undo it). A free
// is only possible if some orphan was freed since guard was taken, which
// the caller took before looking the file up; a doom is only possible
// while some orphan is doomed.
func (g openGuard) open(ino meta.Ino, register func() error) (alive bool, err error) {
	if g.o == nil {
		return true, register()
	}
	l := g.o.stripe(ino)
	l.Lock()
	err = register()
	doomed := g.o.isDoomed(ino)
	freed := g.o.gen.Load() != g.gen
	l.Unlock()
	if err != nil {
		return true, err
	}
	if doomed {
		return false, nil
	}
	if !freed {
		return true, nil
	}
	if _, err := g.o.s.meta.GetAttr(g.o.ctx, ino); errors.Is(err, meta.ErrStale) {
		return false, nil
	}
	return true, nil
}
