package client

import (
	"container/list"
	"context"
	"io"
	"sync"
	"time"
)

// The data cache behind AccessCached and the gather buffer behind
// AccessODirect.
//
// Both live per Client and per file handle (an inode), not per File, so
// that every File of a Client that has the same file open sees the others'
// writes (read-your-writes across Files) whatever access method each uses:
// a direct read first writes back what the cache or the gather buffer holds
// for the file, a direct write updates the cached copy.
//
// The cache is made of pages of pageSize bytes (64 KiB, smaller when the
// block size is). A page knows one contiguous byte range of its data
// ("known": read from the server or written by the application) and one
// dirty range inside it. Keeping a single range each, instead of bitmaps,
// keeps the bookkeeping of a 4 KiB write to a compare and a copy: a write
// that would leave a gap in a partly known page first writes the page back
// and starts over. Write-back collects dirty ranges that run from page to
// page into requests of up to one block, aligned to block boundaries, so
// that small application writes reach the server as block-size WRITEs; a
// block that a write completes is written back in the background at once,
// so the network works while the application fills the next one.
//
// One mutex guards the whole cache: the critical sections are copies of at
// most one page, and all network I/O happens outside it. Pages being
// fetched, written back or holding dirty data are never evicted, so a read
// can never go to the server for a range whose newest bytes are only in
// memory.

// maxBackground bounds the background write-backs of a Client; past it the
// writer that completed a block writes it back itself (back-pressure). One
// measured best on a 2-core machine (docs/client-policy.md): more compete
// for the CPU with the copying the application's writes need. Four were
// measured again once a Stat race that only they brought out was fixed
// (see statSize): no faster, often slower. Tests run with four
// (SetMaxBackground) to keep that race covered.
const maxBackground = 1

// maxFlushParallel bounds the write-back requests one flush has in flight.
const maxFlushParallel = 4

type dataCache struct {
	c         *Client
	pageSize  int
	runMax    int // largest write-back request, a multiple of pageSize
	maxPages  int
	readahead int

	mu       sync.Mutex
	cond     *sync.Cond
	inodes   map[string]*inode
	byFileid map[uint64]*inode
	lru      list.List // *page, most recently used at the front
	npages   int
	// flushes counts write-backs and gather-buffer flushes that ended,
	// for statSize: a GETATTR sent before one ended may predate its data.
	flushes uint64
	bg      chan struct{} // background write-back slots
	bufs    sync.Pool     // *[]byte of capacity runMax
}

type inode struct {
	key     string
	fileid  uint64
	opens   int
	writers map[*File]struct{} // open Files with write access
	pages   map[int64]*page
	ndirty  int   // pages with dirty data
	wb      int   // write-back requests in flight
	err     error // a background write-back failed; reported by Sync/Close
	size    uint64
	change  uint64
	haveChg bool
	seqEnd  int64 // where the last cached read ended (readahead)
	raNext  int64 // where the next readahead window starts; 0: none

	gmu    sync.Mutex // serializes the gather buffer's users (with its I/O)
	gbuf   []byte     // guarded by gmu and, for len, by the cache's mu
	goff   int64
	gowner *File
}

type page struct {
	ino      *inode
	idx      int64
	data     []byte
	klo, khi int // known range
	dlo, dhi int // dirty range; empty when dlo == dhi
	wb       int
	fetching bool
	stale    bool // written through while fetching: the fetch is not to be trusted
	elem     *list.Element
}

func (pg *page) dirty() bool { return pg.dhi > pg.dlo }

func (pg *page) busy() bool { return pg.dirty() || pg.wb > 0 || pg.fetching }

func newDataCache(c *Client, pol Policy) *dataCache {
	ps := 64 << 10
	for ps > pol.BlockSize && ps > 512 {
		ps >>= 1
	}
	run := max(ps, pol.BlockSize/ps*ps)
	dc := &dataCache{
		c: c, pageSize: ps, runMax: run,
		maxPages:  int(pol.CacheSize / int64(ps)),
		readahead: pol.Readahead,
		inodes:    map[string]*inode{},
		byFileid:  map[uint64]*inode{},
		bg:        make(chan struct{}, maxBackground),
	}
	dc.cond = sync.NewCond(&dc.mu)
	return dc
}

// register attaches f to its inode at open and revalidates the cached data
// with the change attribute (close-to-open: data cached before this open
// is dropped if the file changed since). a is nil when the open returned
// no attributes.
func (dc *dataCache) register(f *File, a *Attr) {
	dc.mu.Lock()
	defer dc.mu.Unlock()
	key := string(f.fh)
	ino := dc.inodes[key]
	if ino == nil {
		ino = &inode{key: key, writers: map[*File]struct{}{}, pages: map[int64]*page{}, seqEnd: -1}
		dc.inodes[key] = ino
	}
	ino.opens++
	if f.writable() {
		ino.writers[f] = struct{}{}
	}
	if a != nil {
		if ino.fileid != a.Fileid {
			delete(dc.byFileid, ino.fileid)
			ino.fileid = a.Fileid
		}
		dc.byFileid[a.Fileid] = ino
		if ino.haveChg && ino.change != a.Change {
			dc.invalidateLocked(ino, 0)
		}
		if ino.ndirty == 0 && ino.wb == 0 && len(ino.gbuf) == 0 {
			ino.size = a.Size
		} else {
			ino.size = max(ino.size, a.Size)
		}
		ino.change, ino.haveChg = a.Change, true
	}
	f.ino = ino
}

// unregister detaches f at close, after it has written back and committed.
// It waits for write-backs that may have picked f to carry them.
func (dc *dataCache) unregister(f *File) {
	dc.mu.Lock()
	defer dc.mu.Unlock()
	ino := f.ino
	delete(ino.writers, f)
	for ino.wb > 0 {
		dc.cond.Wait()
	}
	ino.opens--
	dc.maybeDropLocked(ino)
}

func (dc *dataCache) maybeDropLocked(ino *inode) {
	if ino.opens == 0 && len(ino.pages) == 0 && len(ino.gbuf) == 0 {
		delete(dc.inodes, ino.key)
		if dc.byFileid[ino.fileid] == ino {
			delete(dc.byFileid, ino.fileid)
		}
	}
}

// noteChange records the change attribute after this client's own writes,
// so that its next open keeps the cache.
func (dc *dataCache) noteChange(ino *inode, change uint64) {
	dc.mu.Lock()
	ino.change, ino.haveChg = change, true
	dc.mu.Unlock()
}

// invalidateLocked forgets cached data from byte from on: clean pages go,
// dirty ones keep only their dirty range.
func (dc *dataCache) invalidateLocked(ino *inode, from uint64) {
	for idx, pg := range ino.pages {
		start := uint64(idx) * uint64(dc.pageSize)
		if start+uint64(dc.pageSize) <= from {
			continue
		}
		if pg.busy() {
			if pg.fetching {
				pg.stale = true // what the fetch brings may be older
			}
			switch {
			case pg.dirty():
				pg.klo, pg.khi = pg.dlo, pg.dhi
			case pg.wb == 0:
				pg.klo, pg.khi = 0, 0
			}
			continue
		}
		if start < from {
			cut := int(from - start)
			pg.khi = min(pg.khi, cut)
			pg.klo = min(pg.klo, pg.khi)
			continue
		}
		dc.removeLocked(pg)
	}
	ino.seqEnd = -1
}

func (dc *dataCache) removeLocked(pg *page) {
	delete(pg.ino.pages, pg.idx)
	dc.lru.Remove(pg.elem)
	dc.npages--
}

// allocLocked adds a page to ino, evicting a clean one if the cache is
// full. It returns nil when nothing can be evicted.
func (dc *dataCache) allocLocked(ino *inode, idx int64) *page {
	var data []byte
	if dc.npages >= dc.maxPages {
		if data = dc.evictLocked(); data == nil {
			return nil
		}
	} else {
		data = make([]byte, dc.pageSize)
	}
	// A recycled buffer keeps old bytes, but the page knows none of them.
	pg := &page{ino: ino, idx: idx, data: data}
	pg.elem = dc.lru.PushFront(pg)
	ino.pages[idx] = pg
	dc.npages++
	return pg
}

// evictLocked drops the least recently used idle page and returns its
// buffer for reuse, or nil if every page is busy.
func (dc *dataCache) evictLocked() []byte {
	for e, n := dc.lru.Back(), 0; e != nil && n < dc.npages; e, n = e.Prev(), n+1 {
		pg := e.Value.(*page)
		if pg.busy() {
			continue
		}
		dc.removeLocked(pg)
		dc.maybeDropLocked(pg.ino)
		return pg.data
	}
	return nil
}

// write is WriteAt for AccessCached.
func (dc *dataCache) write(ctx context.Context, f *File, p []byte, off int64) (int, error) {
	ino := f.ino
	if err := dc.flushGather(ctx, ino, off, int64(len(p))); err != nil {
		return 0, err
	}
	ps := int64(dc.pageSize)
	pos := 0
	for tries := 0; pos < len(p); {
		at := off + int64(pos)
		idx, po := at/ps, int(at%ps)
		n := min(dc.pageSize-po, len(p)-pos)
		dc.mu.Lock()
		pg := ino.pages[idx]
		if pg == nil {
			pg = dc.allocLocked(ino, idx)
		}
		if pg == nil {
			dc.mu.Unlock()
			// Full of dirty or busy pages: write back, then retry; if even
			// that does not help, write the rest through.
			if tries++; tries > 3 {
				m, err := dc.writeThrough(ctx, f, p[pos:], at)
				return pos + m, err
			}
			if err := dc.makeRoom(ctx, f, ino); err != nil {
				return pos, err
			}
			continue
		}
		if pg.fetching {
			dc.cond.Wait()
			dc.mu.Unlock()
			continue
		}
		if pg.khi > pg.klo && (po > pg.khi || po+n < pg.klo) {
			// Would leave a gap in the known range.
			if pg.busy() {
				dc.mu.Unlock()
				if err := dc.flush(ctx, f, ino, idx*ps, (idx+1)*ps, true); err != nil {
					return pos, err
				}
				continue
			}
			pg.klo, pg.khi = po, po
		}
		if pg.khi == pg.klo {
			pg.klo, pg.khi = po, po+n
		} else {
			pg.klo, pg.khi = min(pg.klo, po), max(pg.khi, po+n)
		}
		copy(pg.data[po:po+n], p[pos:pos+n])
		if !pg.dirty() {
			pg.dlo, pg.dhi = po, po+n
			ino.ndirty++
		} else {
			pg.dlo, pg.dhi = min(pg.dlo, po), max(pg.dhi, po+n)
		}
		dc.lru.MoveToFront(pg.elem)
		ino.size = max(ino.size, uint64(at)+uint64(n))
		dirtyPages := ino.ndirty
		dc.mu.Unlock()
		pos += n
		tries = 0
		// A completed block goes out now; too much dirty data goes out
		// before the writer may go on.
		end := at + int64(n)
		if rm := int64(dc.runMax); end%rm == 0 {
			if dc.blockDirty(ino, end-rm, end) {
				dc.flushBackground(f, ino, end-rm, end)
			}
		}
		if dirtyPages > dc.maxPages/2 {
			if err := dc.flush(ctx, f, ino, 0, 1<<62, false); err != nil {
				return pos, err
			}
		}
	}
	return pos, nil
}

// writeThrough writes p at off to the server and into the cached pages
// that know the range. Dirty data of the file goes first, so that its
// later write-back cannot overwrite p.
func (dc *dataCache) writeThrough(ctx context.Context, f *File, p []byte, off int64) (int, error) {
	ino := f.ino
	if dc.pending(ino) {
		if err := dc.flushAll(ctx, f, ino); err != nil {
			return 0, err
		}
	}
	n, err := f.writeDirect(ctx, p, off)
	dc.update(ino, p[:n], off)
	return n, err
}

// update copies freshly written bytes into the cached pages that know
// their range, and notes the size.
func (dc *dataCache) update(ino *inode, p []byte, off int64) {
	dc.mu.Lock()
	defer dc.mu.Unlock()
	ino.size = max(ino.size, uint64(off)+uint64(len(p)))
	if len(ino.pages) == 0 || len(p) == 0 {
		return
	}
	ps := int64(dc.pageSize)
	for i := off / ps; i*ps < off+int64(len(p)); i++ {
		pg := ino.pages[i]
		if pg == nil {
			continue
		}
		lo, hi := max(off, i*ps), min(off+int64(len(p)), (i+1)*ps)
		plo, phi := int(lo-i*ps), int(hi-i*ps)
		switch {
		case pg.fetching:
			// The fetch may carry older bytes for the range: let it know.
			pg.stale = true
		case plo <= pg.klo && phi >= pg.khi:
			copy(pg.data[plo:phi], p[lo-off:hi-off])
			pg.klo, pg.khi = plo, phi
		case plo >= pg.khi || phi <= pg.klo:
			// Outside what the page knows; the server has it.
		default:
			copy(pg.data[plo:phi], p[lo-off:hi-off])
			pg.klo, pg.khi = min(pg.klo, plo), max(pg.khi, phi)
		}
	}
}

// read is ReadAt for AccessCached.
func (dc *dataCache) read(ctx context.Context, f *File, p []byte, off int64) (int, error) {
	ino := f.ino
	if err := dc.flushGather(ctx, ino, off, int64(len(p))); err != nil {
		return 0, err
	}
	dc.mu.Lock()
	size := ino.size
	dc.mu.Unlock()
	end := uint64(off) + uint64(len(p))
	if end > size {
		// Maybe someone else made the file longer.
		a, err := f.statServer(ctx)
		if err != nil {
			return 0, err
		}
		dc.mu.Lock()
		ino.size = max(ino.size, a.Size)
		size = ino.size
		dc.mu.Unlock()
	}
	if uint64(off) >= size {
		return 0, io.EOF
	}
	want := len(p)
	if end > size {
		want = int(size - uint64(off))
	}
	ps := int64(dc.pageSize)
	pos := 0
	for pos < want {
		dc.mu.Lock()
		seq := ino.seqEnd == off
		for pos < want {
			at := off + int64(pos)
			idx, po := at/ps, int(at%ps)
			n := min(dc.pageSize-po, want-pos)
			pg := ino.pages[idx]
			if pg == nil || pg.fetching || pg.klo > po || pg.khi < po+n {
				break
			}
			copy(p[pos:pos+n], pg.data[po:po+n])
			dc.lru.MoveToFront(pg.elem)
			pos += n
		}
		if pos == want {
			ino.seqEnd = off + int64(want)
			dc.mu.Unlock()
			break
		}
		at := off + int64(pos)
		first := at / ps
		if pg := ino.pages[first]; pg != nil && pg.fetching {
			dc.cond.Wait()
			dc.mu.Unlock()
			continue
		}
		// Fetch from the missing page to the end of the request, plus
		// readahead for a sequential reader, within the file and a
		// quarter of the cache.
		last := (off + int64(want) - 1) / ps
		if seq || off == 0 {
			last = (off + int64(want) + int64(dc.readahead) - 1) / ps
		}
		last = min(last, (int64(size)-1)/ps, first+int64(max(1, dc.maxPages/4))-1)
		window := dc.startFetchLocked(ino, first, last)
		if len(window) > 0 && last > (off+int64(want)-1)/ps {
			ino.raNext = (first + int64(len(window))) * ps
		}
		dc.mu.Unlock()
		if len(window) == 0 {
			// No room: read the rest around the cache.
			if dc.pending(ino) {
				if err := dc.flushAll(ctx, f, ino); err != nil {
					return pos, err
				}
			}
			n, err := f.readDirect(ctx, p[pos:want], at)
			pos += n
			if err != nil && err != io.EOF {
				return pos, err
			}
			break
		}
		if err := dc.fetch(ctx, f, window, first); err != nil {
			return pos, err
		}
	}
	dc.readAhead(f, ino, off+int64(want), size)
	if pos < len(p) {
		return pos, io.EOF
	}
	return pos, nil
}

// readAhead starts fetching the next readahead window in the background
// when a sequential reader has read half of the current one, so that the
// network works while the application consumes the cache.
func (dc *dataCache) readAhead(f *File, ino *inode, end int64, size uint64) {
	if dc.readahead <= 0 {
		return
	}
	ps := int64(dc.pageSize)
	dc.mu.Lock()
	next := ino.raNext
	if ino.seqEnd != end || next <= 0 || end < next-int64(dc.readahead)/2 || next >= int64(size) {
		dc.mu.Unlock()
		return
	}
	first := next / ps
	last := min((next+int64(dc.readahead)-1)/ps, (int64(size)-1)/ps, first+int64(max(1, dc.maxPages/4))-1)
	window := dc.startFetchLocked(ino, first, last)
	if len(window) == 0 {
		ino.raNext = 0
		dc.mu.Unlock()
		return
	}
	ino.raNext = (first + int64(len(window))) * ps
	dc.mu.Unlock()
	select {
	case dc.bg <- struct{}{}:
	default:
		// Busy: fetch in the caller, still ahead of its next read.
		_ = dc.fetch(context.Background(), f, window, first)
		return
	}
	dc.c.wg.Add(1)
	go func() {
		defer dc.c.wg.Done()
		defer func() { <-dc.bg }()
		ctx, cancel := context.WithTimeout(dc.c.ctx, 2*time.Minute)
		defer cancel()
		_ = dc.fetch(ctx, f, window, first) // a failed readahead just leaves the pages unknown
	}()
}

// startFetchLocked marks pages first..last (up to the first one that is
// known entirely or being fetched, or that cannot be had) as being fetched.
func (dc *dataCache) startFetchLocked(ino *inode, first, last int64) []*page {
	var window []*page
	for i := first; i <= last; i++ {
		pg := ino.pages[i]
		if pg == nil {
			if pg = dc.allocLocked(ino, i); pg == nil {
				break
			}
		} else if pg.fetching || (pg.klo == 0 && pg.khi == dc.pageSize) {
			break
		}
		pg.fetching = true
		window = append(window, pg)
	}
	return window
}

// fetch reads the pages of window (consecutive from page first) from the
// server and fills in what they do not know.
func (dc *dataCache) fetch(ctx context.Context, f *File, window []*page, first int64) error {
	buf := make([]byte, len(window)*dc.pageSize)
	n, err := f.readDirect(ctx, buf, first*int64(dc.pageSize))
	if err == io.EOF {
		err = nil
	}
	clear(buf[n:])
	dc.mu.Lock()
	defer dc.mu.Unlock()
	for k, pg := range window {
		pg.fetching = false
		if err != nil || pg.stale {
			pg.stale = false
			if !pg.dirty() && pg.wb == 0 {
				pg.klo, pg.khi = 0, 0
			}
			continue
		}
		src := buf[k*dc.pageSize : (k+1)*dc.pageSize]
		if pg.khi > pg.klo {
			copy(pg.data[:pg.klo], src[:pg.klo])
			copy(pg.data[pg.khi:], src[pg.khi:])
		} else {
			copy(pg.data, src)
		}
		pg.klo, pg.khi = 0, dc.pageSize
	}
	dc.cond.Broadcast()
	return err
}

// truncated drops what the cache holds past size.
func (dc *dataCache) truncated(ino *inode, size uint64) {
	dc.mu.Lock()
	defer dc.mu.Unlock()
	dc.invalidateLocked(ino, size)
	ino.size = size
	ino.haveChg = false
}

// dropClean forgets all clean cached data of ino (after a lock is taken:
// another client may have changed the file under the lock before).
func (dc *dataCache) dropClean(ino *inode) {
	dc.mu.Lock()
	defer dc.mu.Unlock()
	dc.invalidateLocked(ino, 0)
	ino.haveChg = false
}

// flushGen returns the count of ended write-backs, to be taken before a
// GETATTR whose size goes to statSize.
func (dc *dataCache) flushGen() uint64 {
	dc.mu.Lock()
	defer dc.mu.Unlock()
	return dc.flushes
}

// statSize is the size to report for ino, given the size server from a
// GETATTR sent when flushGen was gen: the server's, or the cache's when
// it holds data not yet written back. The cache's also when a write-back
// ended since gen, because the server may have answered before that
// write-back reached it, when the data was still the cache's, and the
// cache no longer counts it as pending now that it is done.
func (dc *dataCache) statSize(ino *inode, server, gen uint64) uint64 {
	dc.mu.Lock()
	defer dc.mu.Unlock()
	if ino.ndirty > 0 || ino.wb > 0 || len(ino.gbuf) > 0 || dc.flushes != gen {
		return max(server, ino.size)
	}
	return server
}

// byFileidLookup returns the inode of an open file with the given fileid.
func (dc *dataCache) byFileidLookup(fileid uint64) *inode {
	dc.mu.Lock()
	defer dc.mu.Unlock()
	return dc.byFileid[fileid]
}

// --- AccessODirect: the gather buffer. ---

// lookupPath returns the inode of path if the cache has one.
func (dc *dataCache) lookupPath(ctx context.Context, c *Client, path string) *inode {
	dc.mu.Lock()
	empty := len(dc.inodes) == 0
	dc.mu.Unlock()
	if empty {
		return nil
	}
	fh, _, err := c.Lookup(ctx, path)
	if err != nil {
		return nil
	}
	dc.mu.Lock()
	defer dc.mu.Unlock()
	return dc.inodes[string(fh)]
}
