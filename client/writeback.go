package client

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"
)

// Write-back of the data cache and of AccessODirect's gather buffers:
// collecting dirty runs of a file, writing them out (in the background or
// by the writer itself), and flushing at Sync, Close, Lock and under
// memory pressure.

// writerLocked picks the File that carries ino's write-back: f if it may write,
// else any open writer of the same file.
func (dc *dataCache) writerLocked(ino *inode, f *File) *File {
	if f != nil && f.writable() {
		if _, ok := ino.writers[f]; ok {
			return f
		}
	}
	for w := range ino.writers {
		return w
	}
	return nil
}

// errNoWriter is a write-back with no File left to carry it (only when an
// application closes a File while writing through it).
var errNoWriter = errors.New("nfs: cached data left without an open file to write it back")

// run is one write-back request.
type run struct {
	off   int64
	buf   []byte
	pages []*page
}

// flush writes back ino's dirty pages in [lo, hi) (whole pages) and, with
// wait, waits for every write-back of ino in flight, its own and others'.
//
// A page already being written back is left dirty until that write-back
// is done, so that two WRITEs of the same bytes are never in flight at
// once (the server could apply them in either order); with wait, flush
// comes back for such pages.
func (dc *dataCache) flush(ctx context.Context, f *File, ino *inode, lo, hi int64, wait bool) error {
	var errs []error
	for range 64 {
		dc.mu.Lock()
		runs, w := dc.collectLocked(ino, f, lo, hi)
		dc.mu.Unlock()
		errs = append(errs, dc.writeRuns(ctx, ino, w, runs))
		if !wait {
			break
		}
		dc.mu.Lock()
		for ino.wb > 0 {
			dc.cond.Wait()
		}
		errs = append(errs, ino.err)
		ino.err = nil
		more := dc.hasDirtyLocked(ino, lo, hi)
		dc.mu.Unlock()
		if !more || ctx.Err() != nil {
			break
		}
	}
	return errors.Join(errs...)
}

func (dc *dataCache) hasDirtyLocked(ino *inode, lo, hi int64) bool {
	if ino.ndirty == 0 {
		return false
	}
	ps := int64(dc.pageSize)
	for i, pg := range ino.pages {
		if pg.dirty() && i*ps < hi && (i+1)*ps > lo {
			return true
		}
	}
	return false
}

// collectLocked takes ino's dirty pages in [lo, hi) out of the dirty state
// into write-back runs.
func (dc *dataCache) collectLocked(ino *inode, f *File, lo, hi int64) ([]run, *File) {
	if ino.ndirty == 0 {
		return nil, nil
	}
	ps := int64(dc.pageSize)
	var idxs []int64
	if first, last := lo/ps, (hi-1)/ps; hi > lo && last-first < int64(len(ino.pages)) {
		for i := first; i <= last; i++ {
			if pg := ino.pages[i]; pg != nil && pg.dirty() && pg.wb == 0 {
				idxs = append(idxs, i)
			}
		}
	} else {
		for i, pg := range ino.pages {
			if pg.dirty() && pg.wb == 0 && i*ps < hi && (i+1)*ps > lo {
				idxs = append(idxs, i)
			}
		}
		slices.Sort(idxs)
	}
	if len(idxs) == 0 {
		return nil, nil
	}
	w := dc.writerLocked(ino, f)
	if w == nil {
		ino.err = errors.Join(ino.err, errNoWriter)
	}
	var runs []run
	var cur *run
	var prev *page
	for _, i := range idxs {
		pg := ino.pages[i]
		start := i*ps + int64(pg.dlo)
		joins := cur != nil && prev.idx == i-1 && prev.dhi == dc.pageSize && pg.dlo == 0 &&
			(i*ps)%int64(dc.runMax) != 0 && len(cur.buf)+pg.dhi <= dc.runMax
		if !joins {
			runs = append(runs, run{off: start, buf: dc.runBuf()})
			cur = &runs[len(runs)-1]
		}
		cur.buf = append(cur.buf, pg.data[pg.dlo:pg.dhi]...)
		cur.pages = append(cur.pages, pg)
		pg.dlo, pg.dhi = 0, 0
		pg.wb++
		ino.ndirty--
		prev = pg
	}
	ino.wb += len(runs)
	return runs, w
}

// writeRuns sends runs (several at once) and ends their write-back.
func (dc *dataCache) writeRuns(ctx context.Context, ino *inode, w *File, runs []run) error {
	if len(runs) == 0 {
		return nil
	}
	errs := make([]error, len(runs))
	sem := make(chan struct{}, maxFlushParallel)
	var wg sync.WaitGroup
	for i := range runs {
		r := &runs[i]
		if w == nil {
			errs[i] = errNoWriter
			continue
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			_, errs[i] = w.writeDirect(ctx, r.buf, r.off)
		}()
	}
	wg.Wait()
	dc.mu.Lock()
	for i := range runs {
		for _, pg := range runs[i].pages {
			pg.wb--
			if errs[i] != nil && !pg.dirty() {
				pg.klo, pg.khi = 0, 0 // not on the server: do not serve it either
			}
		}
	}
	ino.wb -= len(runs)
	dc.flushes++
	dc.cond.Broadcast()
	dc.mu.Unlock()
	for i := range runs {
		// After an error (a cancelled context) a WRITE may still be
		// reading the buffer: only buffers of completed runs are reused.
		if b := runs[i].buf; cap(b) == dc.runMax && errs[i] == nil {
			dc.bufs.Put(&b)
		}
		runs[i].buf = nil
	}
	return errors.Join(errs...)
}

// runBuf returns an empty write-back buffer of capacity runMax.
func (dc *dataCache) runBuf() []byte {
	if b, ok := dc.bufs.Get().(*[]byte); ok {
		return (*b)[:0]
	}
	return make([]byte, 0, dc.runMax)
}

// flushBackground writes back [lo, hi) of ino in the background if a slot
// is free, and in the caller otherwise. Errors surface at Sync or Close.
func (dc *dataCache) flushBackground(f *File, ino *inode, lo, hi int64) {
	dc.mu.Lock()
	runs, w := dc.collectLocked(ino, f, lo, hi)
	dc.mu.Unlock()
	if len(runs) == 0 {
		return
	}
	note := func(err error) {
		if err != nil {
			dc.mu.Lock()
			ino.err = errors.Join(ino.err, err)
			dc.mu.Unlock()
		}
	}
	select {
	case dc.bg <- struct{}{}:
		dc.c.wg.Add(1)
		go func() {
			defer dc.c.wg.Done()
			defer func() { <-dc.bg }()
			ctx, cancel := context.WithTimeout(context.WithoutCancel(dc.c.ctx), 2*time.Minute)
			defer cancel()
			note(dc.writeRuns(ctx, ino, w, runs))
		}()
	default:
		ctx, cancel := context.WithTimeout(context.WithoutCancel(dc.c.ctx), 2*time.Minute)
		defer cancel()
		note(dc.writeRuns(ctx, ino, w, runs))
	}
}

// flushAll writes back everything ino holds (gather buffer and dirty
// pages) and waits for it.
func (dc *dataCache) flushAll(ctx context.Context, f *File, ino *inode) error {
	err := dc.flushGather(ctx, ino, 0, -1)
	return errors.Join(err, dc.flush(ctx, f, ino, 0, 1<<62, true))
}

// pending reports whether ino holds data not yet on the server.
func (dc *dataCache) pending(ino *inode) bool {
	dc.mu.Lock()
	defer dc.mu.Unlock()
	return ino.ndirty > 0 || ino.wb > 0 || len(ino.gbuf) > 0 || ino.err != nil
}

// blockDirty reports whether [lo, hi) is entirely dirty.
func (dc *dataCache) blockDirty(ino *inode, lo, hi int64) bool {
	ps := int64(dc.pageSize)
	dc.mu.Lock()
	defer dc.mu.Unlock()
	for i := lo / ps; i*ps < hi; i++ {
		pg := ino.pages[i]
		if pg == nil || pg.dlo != 0 || pg.dhi != dc.pageSize {
			return false
		}
	}
	return true
}

// makeRoom writes back ino, and then every inode, until a page can be
// evicted.
func (dc *dataCache) makeRoom(ctx context.Context, f *File, ino *inode) error {
	if err := dc.flush(ctx, f, ino, 0, 1<<62, true); err != nil {
		return err
	}
	dc.mu.Lock()
	if dc.npages < dc.maxPages || dc.evictLocked() != nil {
		dc.mu.Unlock()
		return nil
	}
	var others []*inode
	for _, o := range dc.inodes {
		if o != ino && o.ndirty > 0 {
			others = append(others, o)
		}
	}
	dc.mu.Unlock()
	var errs []error
	for _, o := range others {
		errs = append(errs, dc.flush(ctx, nil, o, 0, 1<<62, true))
	}
	return errors.Join(errs...)
}

// gather is WriteAt for AccessODirect.
func (dc *dataCache) gather(ctx context.Context, f *File, p []byte, off int64, block int) (int, error) {
	ino := f.ino
	if dc.dirtyPages(ino) {
		if err := dc.flush(ctx, f, ino, 0, 1<<62, true); err != nil {
			return 0, err
		}
	}
	ino.gmu.Lock()
	defer ino.gmu.Unlock()
	var errs error
	if len(ino.gbuf) > 0 && (ino.goff+int64(len(ino.gbuf)) != off || ino.gowner != f) {
		errs = dc.flushGatherLocked(ctx, ino)
		if errs != nil {
			return 0, errs
		}
	}
	if len(ino.gbuf) == 0 && len(p) >= block {
		n, err := f.writeDirect(ctx, p, off)
		dc.update(ino, p[:n], off)
		return n, err
	}
	done := 0
	for done < len(p) {
		if len(ino.gbuf) == 0 {
			if cap(ino.gbuf) < block {
				// Under the cache's mu as well: register and friends read
				// len(gbuf) holding only that lock.
				buf := make([]byte, 0, block)
				dc.mu.Lock()
				ino.gbuf = buf
				dc.mu.Unlock()
			}
			ino.goff, ino.gowner = off+int64(done), f
		}
		k := min(block-len(ino.gbuf), len(p)-done)
		dc.mu.Lock()
		ino.gbuf = append(ino.gbuf, p[done:done+k]...)
		dc.mu.Unlock()
		dc.update(ino, p[done:done+k], off+int64(done))
		done += k
		if len(ino.gbuf) >= block {
			if err := dc.flushGatherLocked(ctx, ino); err != nil {
				return done, err
			}
		}
	}
	return done, nil
}

func (dc *dataCache) dirtyPages(ino *inode) bool {
	dc.mu.Lock()
	defer dc.mu.Unlock()
	return ino.ndirty > 0 || ino.wb > 0
}

// flushGather writes the gather buffer if it overlaps [off, off+n) (n < 0:
// whatever it holds).
func (dc *dataCache) flushGather(ctx context.Context, ino *inode, off, n int64) error {
	dc.mu.Lock()
	empty := len(ino.gbuf) == 0
	dc.mu.Unlock()
	if empty {
		return nil
	}
	ino.gmu.Lock()
	defer ino.gmu.Unlock()
	if len(ino.gbuf) == 0 || (n >= 0 && (off+n <= ino.goff || off >= ino.goff+int64(len(ino.gbuf)))) {
		return nil
	}
	return dc.flushGatherLocked(ctx, ino)
}

func (dc *dataCache) flushGatherLocked(ctx context.Context, ino *inode) error {
	if len(ino.gbuf) == 0 {
		return nil
	}
	_, err := ino.gowner.writeDirect(ctx, ino.gbuf, ino.goff)
	dc.mu.Lock()
	dc.flushes++
	ino.gbuf = ino.gbuf[:0]
	if err != nil {
		ino.gbuf = nil // a cancelled WRITE may still read the old buffer
	}
	ino.gowner = nil
	dc.mu.Unlock()
	return err
}

// flushOnClose writes back and commits, best effort, what the cache and
// the gather buffers hold when the Client is closed with Files still open.
func (dc *dataCache) flushOnClose(ctx context.Context) {
	dc.mu.Lock()
	var ws []*File
	for _, ino := range dc.inodes {
		if ino.ndirty > 0 || ino.wb > 0 || len(ino.gbuf) > 0 {
			if w := dc.writerLocked(ino, nil); w != nil {
				ws = append(ws, w)
			}
		}
	}
	dc.mu.Unlock()
	for _, w := range ws {
		if err := w.SyncContext(ctx); err != nil {
			dc.c.log.Warn("writing back cached data at client close", "path", w.path, "err", err)
		}
	}
}
