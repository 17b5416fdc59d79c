package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"os"
	"slices"
	"sort"
	"sync"

	"github.com/shoalfs/shoal/internal/nfs4"
)

// Data written UNSTABLE is kept by the File that wrote it until a COMMIT
// vouches for it, as a kernel client keeps the pages of an unstable write
// in its page cache: a server (a data server or the MDS) may lose UNSTABLE
// data when it restarts, and says so by changing its write verifier. What
// a COMMIT does not vouch for (it failed, or answered another verifier
// than the WRITE got) is written again through the MDS with FILE_SYNC. Data
// written through a layout is also kept until the LAYOUTCOMMIT that
// publishes the size it reached has succeeded, so that when no layout
// stateid is left to publish it with, the range that ends the file can be
// written again through the MDS, which records the size itself.
//
// Each UNSTABLE WRITE that the server answered UNSTABLE costs one copy of
// its payload into a pooled buffer (no other copy: the WRITE itself still
// sends the caller's bytes). Policy.UnstableLimit bounds the buffers one
// File keeps: past half of it the File commits what it holds in the
// background, and a write that would take it past the limit waits for
// that commit (makeRoom).
//
// Lock order, outermost first: fileLayout.smu or File.mdsMu, then
// File.resendMu, then fileLayout.wmu, then unstable.mu, then heldFree.mu
// (heldfree.go), which takes no other lock. File.mu is never held while
// taking any of them, nor taken under unstable.mu.

// Size classes of the pooled buffers: 512 B to 1 MiB (maxIOSize, the
// largest WRITE the client sends).
const (
	heldMinShift = 9
	heldMaxShift = 20
)

var heldPools [heldMaxShift - heldMinShift + 1]sync.Pool

// heldBuf is a pooled copy of written data, shared by the held ranges cut
// from it; refs and noReuse are guarded by unstable.mu.
type heldBuf struct {
	b       []byte
	refs    int
	noReuse bool // a WRITE of it may still be in flight: not back to the pool
}

func heldClass(n int) int {
	if n <= 1<<heldMinShift {
		return 0
	}
	return bits.Len(uint(n-1)) - heldMinShift
}

func newHeldBuf(n int) *heldBuf {
	c := heldClass(n)
	if c >= len(heldPools) {
		return &heldBuf{b: make([]byte, n), refs: 1}
	}
	hb := heldFree.get(c)
	if hb == nil {
		hb, _ = heldPools[c].Get().(*heldBuf)
	}
	if hb != nil {
		hb.b, hb.refs, hb.noReuse = hb.b[:n], 1, false
		return hb
	}
	return &heldBuf{b: make([]byte, n, 1<<(c+heldMinShift)), refs: 1}
}

func (hb *heldBuf) recycle() {
	if hb.noReuse {
		return
	}
	if c := heldClass(cap(hb.b)); c < len(heldPools) && cap(hb.b) == 1<<(c+heldMinShift) && !heldFree.put(hb, c) {
		heldPools[c].Put(hb)
	}
}

// heldState is where a held range is in its way to being vouched for.
type heldState uint8

const (
	// heldPending: written, no COMMIT has vouched for it yet.
	heldPending heldState = iota
	// heldCommitted: a data server's COMMIT vouched for it; kept until
	// the LAYOUTCOMMIT of its layout has succeeded.
	heldCommitted
)

// held is one range of the file written UNSTABLE and not yet vouched for.
// Its fields are guarded by unstable.mu.
type held struct {
	off   uint64
	data  []byte // within buf.b
	buf   *heldBuf
	lay   *fileLayout // the layout it was written through; nil: through the MDS
	w     *dsWrite    // ... to this data server (nil with lay nil)
	verf  nfs4.Verifier4
	more  []heldCopy // the other copies of a mirrored write (immutable)
	seq   uint64     // order of recording: a COMMIT sent after seq covers it
	state heldState
	gone  bool // dropped from the set
}

func (h *held) end() uint64 { return h.off + uint64(len(h.data)) }

// heldCopy is one copy a held range was written to UNSTABLE, and the
// verifier that WRITE got.
type heldCopy struct {
	w    *dsWrite
	verf nfs4.Verifier4
}

// copies lists the copies the range was written to through a layout.
func (h *held) copies() []heldCopy {
	return append([]heldCopy{{w: h.w, verf: h.verf}}, h.more...)
}

// unstable is the set of held ranges of one File: sorted by offset and
// never overlapping (a newer write cuts what it overwrites out of older
// ranges, so a resend never puts older bytes over newer ones).
type unstable struct {
	mu     sync.Mutex
	ranges []*held
	seq    uint64
	bytes  int64 // capacity of the buffers held
	// room is closed when the commit makeRoom started ends; nil when
	// none runs. Guarded by mu.
	room chan struct{}
}

// newHeld copies p, written at off and answered with verifier v, for
// recording with insert. It takes no lock.
func newHeld(off uint64, p []byte, v nfs4.Verifier4) *held {
	hb := newHeldBuf(len(p))
	copy(hb.b, p)
	return &held{off: off, data: hb.b, buf: hb, verf: v}
}

// heldBytes reports the memory the set holds.
func (u *unstable) heldBytes() int64 {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.bytes
}

// seqNow returns the sequence number of the last range recorded: a COMMIT
// sent after this call covers every range with a sequence number up to it.
func (u *unstable) seqNow() uint64 {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.seq
}

// insert records h, cutting what it overwrites out of older ranges.
func (u *unstable) insert(h *held) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.seq++
	h.seq = u.seq
	u.bytes += int64(cap(h.buf.b))
	end := h.end()
	i := sort.Search(len(u.ranges), func(i int) bool { return u.ranges[i].end() > h.off })
	k := i
	var before, after *held
	for k < len(u.ranges) && u.ranges[k].off < end {
		r := u.ranges[k]
		k++
		rend := r.end()
		switch {
		case r.off < h.off:
			before = r
			if rend > end {
				t := *r
				t.off, t.data = end, r.data[end-r.off:]
				r.buf.refs++
				after = &t
			}
			r.data = r.data[:h.off-r.off]
		case rend > end:
			r.data, r.off = r.data[end-r.off:], end
			after = r
		default:
			u.dropLocked(r)
		}
	}
	repl := make([]*held, 0, 3)
	if before != nil {
		repl = append(repl, before)
	}
	repl = append(repl, h)
	if after != nil {
		repl = append(repl, after)
	}
	u.ranges = slices.Replace(u.ranges, i, k, repl...)
}

// dropLocked forgets r (the caller removes it from ranges).
func (u *unstable) dropLocked(r *held) {
	r.gone = true
	r.buf.refs--
	if r.buf.refs == 0 {
		u.bytes -= int64(cap(r.buf.b))
		r.buf.recycle()
	}
	r.buf, r.data = nil, nil
}

// drop forgets the ranges match selects.
func (u *unstable) drop(match func(*held) bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.dropLockedWhere(match)
}

func (u *unstable) dropLockedWhere(match func(*held) bool) {
	kept := u.ranges[:0]
	for _, r := range u.ranges {
		if match(r) {
			u.dropLocked(r)
		} else {
			kept = append(kept, r)
		}
	}
	clear(u.ranges[len(kept):])
	u.ranges = kept
}

// any reports whether match selects a range.
func (u *unstable) any(match func(*held) bool) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return slices.ContainsFunc(u.ranges, match)
}

// set changes the state of the ranges match selects.
func (u *unstable) set(match func(*held) bool, s heldState) {
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, r := range u.ranges {
		if match(r) {
			r.state = s
		}
	}
}

// last returns the range with the highest end and that end, or nil.
func (u *unstable) last() (*held, uint64) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.ranges) == 0 {
		return nil, 0
	}
	r := u.ranges[len(u.ranges)-1]
	return r, r.end()
}

// truncate forgets what lies at or past size: the file no longer has it.
func (u *unstable) truncate(size uint64) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.dropLockedWhere(func(r *held) bool { return r.off >= size })
	if n := len(u.ranges); n > 0 {
		if r := u.ranges[n-1]; r.end() > size {
			r.data = r.data[:size-r.off]
		}
	}
}

// reset forgets everything (the File is closed).
func (u *unstable) reset() { u.drop(func(*held) bool { return true }) }

// pinned is a snapshot of a held range whose buffer cannot be recycled
// until unpin, whatever happens to the range meanwhile.
type pinned struct {
	h    *held
	off  uint64
	data []byte
	buf  *heldBuf
}

// pin snapshots the ranges match selects.
func (u *unstable) pin(match func(*held) bool) []pinned {
	u.mu.Lock()
	defer u.mu.Unlock()
	var out []pinned
	for _, r := range u.ranges {
		if match(r) {
			r.buf.refs++
			out = append(out, pinned{h: r, off: r.off, data: r.data, buf: r.buf})
		}
	}
	return out
}

// unpin releases what pin took. With inFlight, WRITEs of the buffers may
// still be in flight (their context ended first): they are left to the
// garbage collector rather than reused.
func (u *unstable) unpin(ps []pinned, inFlight bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, p := range ps {
		p.buf.refs--
		if inFlight {
			p.buf.noReuse = true
		}
		if p.buf.refs == 0 {
			u.bytes -= int64(cap(p.buf.b))
			p.buf.recycle()
		}
	}
}

// forget drops the ranges of ps that are still held.
func (u *unstable) forget(ps []pinned) {
	u.mu.Lock()
	defer u.mu.Unlock()
	set := make(map[*held]bool, len(ps))
	for _, p := range ps {
		set[p.h] = true
	}
	u.dropLockedWhere(func(r *held) bool { return set[r] })
}

// retag makes p's range one written through the MDS with verifier v (a
// resend the MDS answered UNSTABLE), to be committed there.
func (u *unstable) retag(p pinned, v nfs4.Verifier4) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if p.h.gone {
		return
	}
	u.seq++
	p.h.lay, p.h.w, p.h.verf, p.h.more, p.h.seq, p.h.state = nil, nil, v, nil, u.seq, heldPending
}

// makeRoom keeps what f holds under Policy.UnstableLimit. Once a write
// of n more bytes UNSTABLE would take f past half the limit, it starts a
// commit of what f holds in the background (startCommitLocked) and lets
// the write go on; only a write that would take f past the limit itself
// waits for that commit to end. A failure is reported by the next Sync,
// like one of a background commit: the write itself goes on.
//
// One such commit runs at a time per File, and writes that find the File
// over its limit meanwhile wait for it instead of each committing in turn:
// the kernel sends a FUSE mount's writeback as many WRITEs of a file at
// once, and when all of them found the File full, each ran a commit round
// (a COMMIT to every data server written, with its fdatasync, and a
// LAYOUTCOMMIT) one after the other, most of them for the few MiB written
// since the one before: 119 commit rounds for 4 files of 256 MiB at a 64
// MiB limit, where 16 do (issue 27).
//
// The commit starts at half the limit, not at the limit, so that it
// overlaps the writes: a round takes tens of milliseconds (the data
// servers' fdatasync), and when it started at the limit every WRITE of
// the file that came meanwhile waited for it, holding one of the few
// requests the kernel keeps in flight to a FUSE mount (12 by default), so
// the other files' writeback stalled too (issue 27, h3-bigwrite: 137 such
// waits of up to 69 ms in a 2-second run of 4 x 256 MiB).
func (u *unstable) makeRoom(ctx context.Context, f *File, n int) {
	if f.flag&os.O_SYNC != 0 {
		return
	}
	limit := f.c.pol.UnstableLimit
	// Bounded: each round either returns or waits for a commit to end;
	// after a few, the write goes on over the limit rather than wait
	// again (the limit is a bound on memory, not a promise).
	for range 4 {
		u.mu.Lock()
		have, wait := u.bytes, u.room
		if have == 0 || have+int64(n) <= limit/2 {
			u.mu.Unlock()
			return
		}
		if wait == nil {
			wait = u.startCommitLocked(f)
		}
		u.mu.Unlock()
		if have+int64(n) <= limit {
			return
		}
		select {
		case <-wait:
		case <-ctx.Done():
			return
		}
	}
}

// startCommitLocked starts commitHeld for f in a goroutine and returns the
// channel closed when it ends. u.mu is held and no commit of makeRoom
// runs. The commit runs under the Client's context, not the write's (the
// write that started it does not wait for it); its error goes to f.layErr
// before the channel is closed, so a Sync that waited for it (waitCommit)
// reports it.
func (u *unstable) startCommitLocked(f *File) chan struct{} {
	done := make(chan struct{})
	u.room = done
	f.c.stats.earlyCommits.Add(1)
	go func() {
		ctx := f.c.ctx
		err := u.commitHeld(ctx, f, true)
		if err != nil && ctx.Err() == nil {
			f.mu.Lock()
			f.layErr = errors.Join(f.layErr, err)
			f.mu.Unlock()
		}
		u.mu.Lock()
		u.room = nil
		u.mu.Unlock()
		close(done)
	}()
	return done
}

// waitCommit waits for the commit makeRoom started, if one runs, or for
// ctx to end.
func (u *unstable) waitCommit(ctx context.Context) {
	u.mu.Lock()
	wait := u.room
	u.mu.Unlock()
	if wait == nil {
		return
	}
	select {
	case <-wait:
	case <-ctx.Done():
	}
}

// commitHeld commits what f wrote UNSTABLE: through each layout it holds or
// is returning (COMMIT to the data servers, LAYOUTCOMMIT), what is left
// of layouts already returned, then through the MDS; what no COMMIT
// vouches for is written again through the MDS. background says the
// commit is makeRoom's, not a Sync's (fileLayout.syncRound).
func (u *unstable) commitHeld(ctx context.Context, f *File, background bool) error {
	var errs []error
	f.mu.Lock()
	ls := slices.Clone(f.retiring)
	if f.lay != nil {
		ls = append(ls, f.lay)
	}
	f.mu.Unlock()
	cutoff := u.seqNow()
	for _, l := range ls {
		errs = append(errs, l.syncRound(ctx, f, background))
	}
	// Ranges of layouts returned meanwhile without their commit (it ran
	// out of time): no data server session to commit them on is known to
	// be current, so they go through the MDS.
	orphan := func(h *held) bool { return h.lay != nil && h.seq <= cutoff && !slices.Contains(ls, h.lay) }
	if u.any(orphan) {
		errs = append(errs, u.resendHeld(ctx, f, orphan, "its layout was returned before it was committed"))
	}
	f.mu.Lock()
	dirty := f.dirty
	f.mu.Unlock()
	if dirty || u.any(func(h *held) bool { return h.lay == nil }) {
		errs = append(errs, f.c.commitMDS(ctx, f))
	}
	return errors.Join(errs...)
}

// resendHeld writes the ranges match selects again through the MDS with
// FILE_SYNC, and forgets them. No write of the File is in flight
// meanwhile, so a resend never overwrites newer data of the same File. If
// a range cannot be written, the error wraps ErrVerifierChanged: that data
// may be lost, and the caller must write it again.
func (u *unstable) resendHeld(ctx context.Context, f *File, match func(*held) bool, why string) error {
	f.resendMu.Lock()
	defer f.resendMu.Unlock()
	ps := u.pin(match)
	if len(ps) == 0 {
		return nil
	}
	inFlight := false
	defer func() { u.unpin(ps, inFlight) }()
	var total int
	for _, p := range ps {
		total += len(p.data)
	}
	f.c.log.Warn("resending data no COMMIT vouched for through the MDS", "path", f.path, "bytes", total, "ranges", len(ps), "why", why)
	type result struct {
		committed nfs4.StableHow4
		verf      nfs4.Verifier4
		err       error
	}
	results := make([]result, len(ps))
	sem := make(chan struct{}, maxIOInFlight)
	var wg sync.WaitGroup
	for i, p := range ps {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			r := &results[i]
			var n int
			n, r.committed, r.verf, r.err = f.c.mdsWrite(ctx, f, p.data, int64(p.off), nfs4.FILE_SYNC4, false)
			if r.err == nil && n < len(p.data) {
				r.err = io.ErrShortWrite
			}
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		inFlight = true
		return err // kept for the next Sync
	}
	var done []pinned
	var errs []error
	var resent uint64
	for i, p := range ps {
		r := results[i]
		var se *StatusError
		switch {
		case r.err == nil && r.committed == nfs4.UNSTABLE4:
			u.retag(p, r.verf)
			f.mu.Lock()
			f.dirty = true
			f.mu.Unlock()
			resent += uint64(len(p.data))
		case r.err == nil:
			done = append(done, p)
			resent += uint64(len(p.data))
		case errors.As(r.err, &se) && se.status() == nfs4.NFS4ERR_STALE:
			done = append(done, p) // the file is gone: nothing to keep
		default:
			done = append(done, p)
			if len(errs) < 3 {
				errs = append(errs, fmt.Errorf("[%d,+%d): %w", p.off, len(p.data), r.err))
			}
		}
	}
	f.c.stats.resentBytes.Add(resent)
	u.forget(done)
	if len(errs) > 0 {
		return fmt.Errorf("%w (%s; writing it again through the metadata server failed: %w)",
			ErrVerifierChanged, why, errors.Join(errs...))
	}
	return nil
}

// dropHeldPast forgets what f holds at or past size, for a truncate.
func (u *unstable) dropHeldPast(f *File, size uint64) {
	f.resendMu.Lock()
	u.truncate(size)
	f.resendMu.Unlock()
}
