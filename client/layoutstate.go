package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shoalfs/shoal/client/layout"
	"github.com/shoalfs/shoal/internal/nfs4"
)

// A File's layouts: getting one (LAYOUTGET, GETDEVICEINFO), using it,
// retiring it on a recall, a failure or Close (commit, LAYOUTCOMMIT,
// LAYOUTRETURN), and the file size as far as the File knows it.

// fileLayout is a layout a File holds.
type fileLayout struct {
	stateid nfs4.Stateid4 // guarded by the File's mu: a recall updates it
	iomode  nfs4.Layoutiomode4
	segs    []layoutSeg
	devs    map[layout.DeviceID]layout.Device

	// Guarded by the File's mu.
	users    int  // I/O calls using the layout
	invalid  bool // recalled, failed or being returned: no new I/O
	idleDone bool
	idle     chan struct{} // closed when invalid and unused

	retireOnce sync.Once
	returned   chan struct{} // closed when the layout has been returned

	// noLayoutCommit: every segment says the MDS needs no LAYOUTCOMMIT
	// (flexfiles' FF_FLAGS_NO_LAYOUTCOMMIT).
	noLayoutCommit bool

	smu sync.Mutex // serializes fileLayout.sync
	// laidAt is when the last LAYOUTCOMMIT through l succeeded (guarded
	// by smu): a background round leaves the LAYOUTCOMMIT to a later
	// round within layoutCommitEvery of it (syncRound).
	laidAt   time.Time
	wmu      sync.Mutex // guards the write state below
	writes   map[string]*dsWrite
	wrote    bool // written since the last LAYOUTCOMMIT
	wroteEnd uint64
	mtime    time.Time
	// stale holds the devices whose copies were reported failing and
	// accepted by the MDS (mirror.go): no more I/O goes to them through
	// this layout, and what they hold is not theirs to commit.
	stale map[layout.DeviceID]bool
	// reporting holds the LAYOUTERRORs in flight, by device.
	reporting map[layout.DeviceID]*report
	// ioErrs are data-server failures not reported with LAYOUTERROR,
	// for the body of the LAYOUTRETURN (layout.ReturnEncoder).
	ioErrs []layout.IOError
}

type layoutSeg struct {
	off, end uint64 // end is exclusive; ^0 means to the end of the file
	lay      layout.Layout
	props    layout.Props
}

// dsWrite is the commit state of one (data server, filehandle). The
// verifiers the WRITEs got are kept with the data (held).
type dsWrite struct {
	ds    *dataServer
	fh    []byte
	dev   layout.DeviceID
	dirty bool // written UNSTABLE since the last COMMIT
	stale bool // its copy was reported failing: nothing to commit there
}

func (l *fileLayout) maybeIdleLocked() {
	if l.invalid && l.users == 0 && !l.idleDone {
		l.idleDone = true
		close(l.idle)
	}
}

// layoutFor returns the File's layout for I/O, fetching one if the file
// has none and may have one. nil means: do the I/O through the MDS. The
// caller must release a non-nil result (fileLayout.release).
func (f *File) layoutFor(ctx context.Context) *fileLayout {
	p := f.c.pnfs
	if p == nil {
		return nil
	}
	use := func() (*fileLayout, bool) {
		if l := f.lay; l != nil && !l.invalid {
			l.users++
			return l, true
		}
		return nil, f.closed || f.layOff || time.Now().Before(f.layRetryAt)
	}
	f.mu.Lock()
	l, done := use()
	f.mu.Unlock()
	if done {
		return l
	}
	f.layMu.Lock()
	defer f.layMu.Unlock()
	f.mu.Lock()
	l, done = use()
	f.mu.Unlock()
	if done {
		return l
	}
	f.mu.Lock()
	f.layGetting, f.layRecalled = true, false
	f.mu.Unlock()
	l, err := p.getLayout(ctx, f)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.layGetting = false
	if err != nil {
		f.layoutRefused(err)
		return nil
	}
	f.layBackoff = 0
	f.layRefused = nil
	p.noteLastLayout(f.fh, l)
	if f.closed || f.layRecalled {
		// A recall crossed our LAYOUTGET: we answered it as if we held the
		// layout, so give it back now.
		l.startRetireLocked(f, layoutRetryMin)
		return nil
	}
	f.lay = l
	l.users++
	return l
}

// layoutRefused sets the backoff after a failed LAYOUTGET.
func (f *File) layoutRefused(err error) {
	var se *StatusError
	short := false
	if errors.As(err, &se) {
		switch se.status() {
		case nfs4.NFS4ERR_NOTSUPP, nfs4.NFS4ERR_UNKNOWN_LAYOUTTYPE, nfs4.NFS4ERR_BADIOMODE,
			nfs4.NFS4ERR_INVAL, nfs4.NFS4ERR_WRONG_TYPE, nfs4.NFS4ERR_ISDIR:
			f.layOff = true
			return
		case nfs4.NFS4ERR_LAYOUTTRYLATER, nfs4.NFS4ERR_RECALLCONFLICT, nfs4.NFS4ERR_DELAY,
			nfs4.NFS4ERR_BAD_STATEID, nfs4.NFS4ERR_OLD_STATEID:
			short = true
		}
	}
	f.c.log.Debug("no layout; I/O goes through the MDS", "path", f.path, "err", err)
	f.layRefused = err
	maxB := layoutUnavailMx
	if short {
		maxB = layoutRetryMax
	}
	f.layBackoff = min(max(2*f.layBackoff, layoutRetryMin), maxB)
	f.layRetryAt = time.Now().Add(f.layBackoff)
}

func (l *fileLayout) release(f *File) {
	f.mu.Lock()
	l.users--
	l.maybeIdleLocked()
	f.mu.Unlock()
}

// getLayout runs LAYOUTGET (with a GETATTR of the size, which reads need)
// and resolves the layout's devices.
func (p *pnfsClient) getLayout(ctx context.Context, f *File) (*fileLayout, error) {
	iomode := nfs4.LAYOUTIOMODE4_READ
	if f.access&nfs4.OPEN4_SHARE_ACCESS_WRITE != 0 {
		iomode = nfs4.LAYOUTIOMODE4_RW
	}
	// While the Client has layout state for the file (a layout of this
	// File or of another being used or returned), LAYOUTGET carries its
	// layout stateid (RFC 8881 §12.5.3); an open stateid would tell the
	// server that the Client holds no layout of the file any more.
	var res []nfs4.NfsResop4
	var err error
	for attempt := 0; ; attempt++ {
		lsid, haveL := p.currentStateid(f.fh)
		res, err = f.c.callRetry(ctx, 0, func() []nfs4.NfsArgop4 {
			sid := lsid
			if !haveL {
				f.mu.Lock()
				sid = f.stateid
				f.mu.Unlock()
			}
			return []nfs4.NfsArgop4{putfh(f.fh), getattr(sizeBits), {Argop: nfs4.OP_LAYOUTGET, Oplayoutget: &nfs4.LAYOUTGET4args{
				LogaLayoutType: p.typ, LogaIomode: iomode, LogaOffset: 0, LogaLength: nfs4.NFS4_UINT64_MAX,
				LogaStateid: sid, LogaMaxcount: layoutMaxcount,
			}}}
		})
		var se *StatusError
		if err == nil || attempt > 0 || !haveL || !errors.As(err, &se) {
			break
		}
		retry := false
		switch se.status() {
		case nfs4.NFS4ERR_BAD_STATEID, nfs4.NFS4ERR_STALE_STATEID, nfs4.NFS4ERR_BADLAYOUT, nfs4.NFS4ERR_EXPIRED:
			// The server has no layout state under it any more (returned,
			// revoked, or of its previous boot): start afresh from the
			// open.
			p.forgetStateid(f.fh, lsid)
			retry = true
		case nfs4.NFS4ERR_OLD_STATEID:
			cur, ok := p.currentStateid(f.fh)
			retry = ok && cur != lsid
		}
		if !retry {
			break
		}
	}
	if len(res) >= 2 && res[1].Opgetattr != nil && res[1].Opgetattr.Resok4 != nil {
		var a Attr
		if decodeFattr(&res[1].Opgetattr.Resok4.ObjAttributes, &a, nil) == nil {
			f.mu.Lock()
			f.size, f.sizeKnown = a.Size, true
			f.mu.Unlock()
		}
	}
	if err != nil {
		return nil, err
	}
	ok := res[2].Oplayoutget.LogrResok4
	if ok == nil {
		return nil, errors.New("nfs: LAYOUTGET: empty reply")
	}
	f.c.stats.layoutGets.Add(1)
	p.noteLayoutStateid(f.fh, ok.LogrStateid)
	l := &fileLayout{
		stateid: ok.LogrStateid, iomode: iomode,
		devs: map[layout.DeviceID]layout.Device{}, writes: map[string]*dsWrite{},
		idle: make(chan struct{}), returned: make(chan struct{}),
	}
	var derr error
	for _, seg := range ok.LogrLayout {
		if seg.LoContent.LocType != p.typ {
			continue
		}
		dl, err := p.driver.DecodeLayout(seg.LoContent.LocBody)
		if err != nil {
			derr = err
			break
		}
		end := uint64(seg.LoOffset) + uint64(seg.LoLength)
		if seg.LoLength == nfs4.NFS4_UINT64_MAX || end < uint64(seg.LoOffset) {
			end = nfs4.NFS4_UINT64_MAX
		}
		props := dl.Props()
		l.noLayoutCommit = props.NoLayoutCommit && (len(l.segs) == 0 || l.noLayoutCommit)
		l.segs = append(l.segs, layoutSeg{off: uint64(seg.LoOffset), end: end, lay: dl, props: props})
		for _, id := range dl.Devices() {
			if _, have := l.devs[id]; have {
				continue
			}
			dev, err := p.device(ctx, id)
			if err != nil {
				derr = err
				break
			}
			l.devs[id] = dev
		}
		if derr != nil {
			break
		}
	}
	if derr == nil && len(l.segs) == 0 {
		derr = errors.New("nfs: LAYOUTGET returned no usable layout segment")
	}
	if derr != nil {
		// Give it back at once; I/O goes through the MDS meanwhile.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		l.returnLocked(rctx, f) // layoutFor holds layMu
		cancel()
		return nil, derr
	}
	return l, nil
}

// sizeFor returns the file size to cap a read ending at end with: the size
// known from the MDS and this File's own writes, refreshed with GETATTR
// when the read goes beyond it (data servers zero-fill past the end of
// the file, since they do not know its size).
func (f *File) sizeFor(ctx context.Context, end uint64) (uint64, error) {
	f.mu.Lock()
	size, known := f.size, f.sizeKnown
	f.mu.Unlock()
	if known && end <= size {
		return size, nil
	}
	a, err := f.Stat(ctx)
	if err != nil {
		return 0, err
	}
	f.mu.Lock()
	f.size, f.sizeKnown = a.Size, true
	f.mu.Unlock()
	return a.Size, nil
}

// grewTo notes that the file is at least end bytes long.
func (f *File) grewTo(end uint64) {
	f.mu.Lock()
	if f.sizeKnown && end > f.size {
		f.size = end
	}
	f.mu.Unlock()
}

// startRetireLocked stops new I/O on l and returns it in the background,
// once the I/O in flight on it is done. The File asks for a new layout no
// sooner than retry from now.
func (l *fileLayout) startRetireLocked(f *File, retry time.Duration) {
	if f.lay == l {
		f.lay = nil
	}
	if l.invalid {
		return
	}
	l.invalid = true
	l.maybeIdleLocked()
	f.layRetryAt = time.Now().Add(retry)
	f.retiring = append(f.retiring, l)
	if !f.c.pnfs.goBG(func() {
		ctx, cancel := context.WithTimeout(f.c.ctx, 2*time.Minute)
		defer cancel()
		l.retire(ctx, f)
	}) {
		l.retireOnce.Do(func() { close(l.returned) })
	}
}

// retire waits for the I/O on l, commits what was written through it
// (COMMIT to the data servers, LAYOUTCOMMIT to the MDS) and returns it.
// Commit failures surface at the next Sync or Close. Until it is
// returned, l is among f.retiring, where a CB_LAYOUTRECALL finds it
// (Close calls retire directly, not through startRetireLocked).
func (l *fileLayout) retire(ctx context.Context, f *File) {
	l.retireOnce.Do(func() {
		defer close(l.returned)
		f.mu.Lock()
		if f.lay == l {
			f.lay = nil
		}
		if !slices.Contains(f.retiring, l) {
			f.retiring = append(f.retiring, l)
		}
		l.invalid = true
		l.maybeIdleLocked()
		f.mu.Unlock()
		select {
		case <-l.idle:
		case <-ctx.Done():
		}
		if err := l.sync(ctx, f); err != nil {
			f.mu.Lock()
			f.layErr = errors.Join(f.layErr, err)
			f.mu.Unlock()
		}
		l.returnLayout(ctx, f)
		f.mu.Lock()
		for i, r := range f.retiring {
			if r == l {
				f.retiring = append(f.retiring[:i], f.retiring[i+1:]...)
				break
			}
		}
		f.mu.Unlock()
	})
	select {
	case <-l.returned:
	case <-ctx.Done():
	}
}

// waitRetired waits for the layouts being returned in the background.
func (f *File) waitRetired(ctx context.Context) {
	f.mu.Lock()
	ls := append([]*fileLayout(nil), f.retiring...)
	f.mu.Unlock()
	for _, l := range ls {
		select {
		case <-l.returned:
		case <-ctx.Done():
			return
		}
	}
}

// currentStateid returns the stateid to send for l: the newest the Client
// holds of l's layout state (a LAYOUTGET of another File or a recall may
// have moved its seqid since l was granted).
func (l *fileLayout) currentStateid(f *File) nfs4.Stateid4 {
	f.mu.Lock()
	sid := l.stateid
	f.mu.Unlock()
	p := f.c.pnfs
	p.mu.Lock()
	if t, ok := p.lsid[string(f.fh)]; ok && t.Other == sid.Other && seqNewer(t.Seqid, sid.Seqid) {
		sid = t
	}
	p.mu.Unlock()
	return sid
}

// siblingHolds reports whether another open File of the Client holds a
// layout of f's file: the server's layout state is shared with it, so f
// must not return it.
func (c *Client) siblingHolds(f *File) bool {
	c.filesMu.Lock()
	var sibs []*File
	for g := range c.files {
		if g != f && bytes.Equal(g.fh, f.fh) {
			sibs = append(sibs, g)
		}
	}
	c.filesMu.Unlock()
	for _, g := range sibs {
		g.mu.Lock()
		holds := (g.lay != nil && !g.lay.invalid) || g.layGetting
		g.mu.Unlock()
		if holds {
			return true
		}
	}
	return false
}

// returnLayout returns the Client's layout state of f's file, which l is
// part of, unless another layout uses it (f's current one or a sibling's):
// the server's LAYOUTRETURN would take that away too. It is serialized
// with f's LAYOUTGETs.
func (l *fileLayout) returnLayout(ctx context.Context, f *File) {
	f.layMu.Lock()
	defer f.layMu.Unlock()
	l.returnLocked(ctx, f)
}

// returnLocked is fileLayout.returnLayout with f.layMu held.
func (l *fileLayout) returnLocked(ctx context.Context, f *File) {
	p := f.c.pnfs
	inUse := func() bool {
		f.mu.Lock()
		other := f.lay != nil && f.lay != l && !f.lay.invalid
		f.mu.Unlock()
		return other || f.c.siblingHolds(f)
	}
	if inUse() {
		return // the layout in use is returned (or recalled) in its turn
	}
	sid := l.currentStateid(f)
	var body []byte
	var errs []layout.IOError
	if enc, ok := p.driver.(layout.ReturnEncoder); ok {
		// The layout type's body: for flexfiles, the errors not reported
		// with LAYOUTERROR (RFC 8435 §9.3).
		l.wmu.Lock()
		errs = slices.Clone(l.ioErrs)
		l.wmu.Unlock()
		body = enc.EncodeReturn(errs)
	}
	for attempt := 0; ; attempt++ {
		_, err := f.c.call(ctx, fixed([]nfs4.NfsArgop4{putfh(f.fh), {Argop: nfs4.OP_LAYOUTRETURN, Oplayoutreturn: &nfs4.LAYOUTRETURN4args{
			LoraLayoutType: p.typ, LoraIomode: nfs4.LAYOUTIOMODE4_ANY,
			LoraLayoutreturn: nfs4.Layoutreturn4{LrReturntype: nfs4.LAYOUTRETURN4_FILE, LrLayout: &nfs4.LayoutreturnFile4{
				LrfOffset: 0, LrfLength: nfs4.NFS4_UINT64_MAX, LrfStateid: sid, LrfBody: body,
			}},
		}}}))
		var se *StatusError
		switch {
		case err == nil:
			p.forgetStateid(f.fh, sid)
			f.c.stats.layoutReturns.Add(1)
			f.c.stats.returnedErrors.Add(uint64(len(errs)))
			return
		case errors.As(err, &se) && (se.status() == nfs4.NFS4ERR_BAD_STATEID || se.status() == nfs4.NFS4ERR_STALE_STATEID ||
			se.status() == nfs4.NFS4ERR_BADLAYOUT || se.status() == nfs4.NFS4ERR_NOMATCHING_LAYOUT):
			// The server holds none of it (revoked, or of its previous
			// boot).
			p.forgetStateid(f.fh, sid)
		case attempt == 0 && errors.As(err, &se) && se.status() == nfs4.NFS4ERR_OLD_STATEID:
			// A recall moved the seqid (its CB_LAYOUTRECALL is on its
			// way), or a sibling's LAYOUTGET did.
			if next, ok := p.waitNewer(ctx, f.fh, sid, layoutSeqidWait); ok && next.Other == sid.Other && !inUse() {
				sid = next
				continue
			}
		}
		f.c.log.Debug("LAYOUTRETURN", "path", f.path, "err", err)
		return
	}
}

// sync makes the writes through l durable and visible: COMMIT to
// each data server written UNSTABLE (in parallel), then LAYOUTCOMMIT to
// the MDS with the last write offset and the modification time. Data a
// COMMIT does not vouch for (the data server could not be reached, or
// answered another write verifier than the WRITE got: it restarted, or a
// copy it forwarded the data to did) is written again through the MDS,
// which reaches every copy over its own connections. If no layout stateid
// the MDS takes is left for the LAYOUTCOMMIT, the range that ends the
// file is written again through the MDS, which records the size itself.
func (l *fileLayout) sync(ctx context.Context, f *File) error {
	return l.syncRound(ctx, f, false)
}

// layoutCommitEvery is how often, in nanoseconds, the background commit
// rounds of a streaming write send LAYOUTCOMMIT (syncRound): a second.
// Tests change it.
var layoutCommitEvery atomic.Int64

func init() { layoutCommitEvery.Store(int64(time.Second)) }

// syncRound is sync. In a background round (background: a commit
// makeRoom started to bound the File's copies, not a Sync), the
// LAYOUTCOMMIT is left to a later round or to the next Sync if one
// succeeded through l less than layoutCommitEvery (a second) ago: the
// COMMITs alone make the data durable and let the File drop its copies,
// and the size and mtime other clients see move at most that much later
// (and at every Sync, fsync(2) and close(2), as before). A streaming write of 256 MiB
// made a round, with its LAYOUTCOMMIT and the MDS's log sync for it,
// every 32 MiB; most of the MDS's CPU while a FUSE mount wrote large
// files went to them (issue 27, h3-bigwrite2). The range that ends the
// file stays held, as the LAYOUTCOMMIT that was left out would have kept
// it until it succeeded: should no layout stateid be left for the one
// that follows, that range is written again through the MDS, which
// records the size (publishSize).
func (l *fileLayout) syncRound(ctx context.Context, f *File, background bool) error {
	l.smu.Lock()
	defer l.smu.Unlock()
	l.wmu.Lock()
	var dirty []*dsWrite
	for _, w := range l.writes {
		if w.dirty && !w.stale {
			dirty = append(dirty, w)
			w.dirty = false
		}
	}
	cutoff := f.unst.seqNow() // every range of l up to it was answered before the COMMITs go out
	wrote, end, mtime := l.wrote, l.wroteEnd, l.mtime
	l.wrote = false
	l.wmu.Unlock()
	undo := func(dirtyToo bool) {
		l.wmu.Lock()
		defer l.wmu.Unlock()
		if dirtyToo {
			for _, w := range dirty {
				w.dirty = true
			}
		}
		if wrote {
			l.wrote = true
			l.wroteEnd = max(l.wroteEnd, end)
			if l.mtime.Before(mtime) {
				l.mtime = mtime
			}
		}
	}

	type outcome struct {
		verf nfs4.Verifier4
		err  error
	}
	outs := make([]outcome, len(dirty))
	var wg sync.WaitGroup
	for i, w := range dirty {
		wg.Go(func() {
			if w.ds.v3 {
				outs[i].verf, outs[i].err = w.ds.commitV3(ctx, w.fh)
				return
			}
			_, res, err := w.ds.call(ctx, f, func(*endpoint) []nfs4.NfsArgop4 {
				return []nfs4.NfsArgop4{putfh(w.fh), {Argop: nfs4.OP_COMMIT, Opcommit: &nfs4.COMMIT4args{}}}
			})
			if err != nil {
				outs[i].err = err
				return
			}
			outs[i].verf = res[1].Opcommit.Resok4.Writeverf
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		undo(true) // nothing is settled: the next sync tries again
		return err
	}
	res := make(map[*dsWrite]outcome, len(dirty))
	var why []string
	for i, w := range dirty {
		res[w] = outs[i]
		if err := outs[i].err; err != nil {
			// With mirrors, a copy whose COMMIT failed can be reported
			// stale instead: the other copies vouch for the data.
			if l.reportCommit(ctx, f, w, err) {
				continue
			}
			f.c.stats.failovers.Add(1)
			why = append(why, fmt.Sprintf("COMMIT to data server %s failed: %v", w.ds.key, err))
		}
	}
	l.wmu.Lock()
	stale := make(map[*dsWrite]bool)
	for _, w := range l.writes {
		if w.stale {
			stale[w] = true
		}
	}
	l.wmu.Unlock()
	// A held range is vouched for when every copy it was written to that
	// is not stale answered this COMMIT with the WRITE's verifier, and
	// at least one such copy is left; it is written again through the MDS
	// when one of them did not, or when none is left.
	vouched := func(h *held) (yes, no bool) {
		live := 0
		for _, c := range h.copies() {
			if stale[c.w] {
				continue
			}
			live++
			o, ok := res[c.w]
			if !ok {
				return false, false // not in this round
			}
			if o.err != nil || o.verf != c.verf {
				return false, true
			}
		}
		return live > 0, live == 0
	}
	unvouched := func(h *held) bool {
		if h.lay != l || h.seq > cutoff || h.state != heldPending {
			return false
		}
		_, no := vouched(h)
		return no
	}
	var errs []error
	if f.unst.any(unvouched) {
		if len(why) == 0 {
			why = append(why, "a data server's write verifier changed")
		}
		errs = append(errs, f.unst.resendHeld(ctx, f, unvouched, strings.Join(why, "; ")))
		if err := ctx.Err(); err != nil {
			undo(true) // what was not resent is kept for the next sync
			return err
		}
	}
	f.unst.set(func(h *held) bool {
		if h.lay != l || h.seq > cutoff || h.state != heldPending {
			return false
		}
		yes, _ := vouched(h)
		return yes
	}, heldCommitted)
	if wrote && l.noLayoutCommit {
		// FF_FLAGS_NO_LAYOUTCOMMIT: the data servers tell the MDS what
		// they were written (tight coupling); the COMMITs above made it
		// durable.
		wrote = false
	}
	var last *held // kept for a LAYOUTCOMMIT left to later
	if wrote && background && !l.laidAt.IsZero() && time.Since(l.laidAt) < time.Duration(layoutCommitEvery.Load()) {
		if t, tend := f.unst.last(); t != nil && tend >= end {
			undo(false) // the next round or Sync sends it (before wrote is cleared: undo reads it)
			last, wrote = t, false
		}
	}
	if wrote {
		err := l.commit(ctx, f, end, mtime)
		var se *StatusError
		switch {
		case err == nil:
			l.laidAt = time.Now()
		case errors.As(err, &se) && se.status() == nfs4.NFS4ERR_STALE:
			// The file was removed: nothing left to update.
		case ctx.Err() != nil:
			undo(false)
			errs = append(errs, err)
		case errors.As(err, &se):
			// The MDS takes no layout stateid the Client holds (the
			// layout state was returned or revoked meanwhile).
			if ferr := f.unst.publishSize(ctx, f, end, err); ferr != nil {
				undo(false)
				errs = append(errs, ferr)
			}
		default:
			undo(false)
			errs = append(errs, err)
		}
	}
	f.unst.drop(func(h *held) bool { return h.lay == l && h.seq <= cutoff && h.state == heldCommitted && h != last })
	return errors.Join(errs...)
}

// commit sends LAYOUTCOMMIT for the writes through l, which reached
// end, with the newest layout stateid the Client holds of l's layout
// state. If the server moved the seqid meanwhile (NFS4ERR_OLD_STATEID: a
// recall whose CB_LAYOUTRECALL has not arrived yet, or a sibling File's
// LAYOUTGET), it waits for the new one and retries; if the layout state is
// gone (NFS4ERR_BAD_STATEID, NFS4ERR_BADLAYOUT) it retries with the
// Client's current layout state of the file, if any: the MDS takes a
// LAYOUTCOMMIT under any read/write layout of the file the Client holds.
func (l *fileLayout) commit(ctx context.Context, f *File, end uint64, mtime time.Time) error {
	p := f.c.pnfs
	last := end - 1
	mt := nfs4.Nfstime4{Seconds: nfs4.Int64T(mtime.Unix()), Nseconds: nfs4.Uint32T(mtime.Nanosecond())}
	sid := l.currentStateid(f)
	for attempt := 0; ; attempt++ {
		res, err := f.c.call(ctx, fixed([]nfs4.NfsArgop4{putfh(f.fh), {Argop: nfs4.OP_LAYOUTCOMMIT, Oplayoutcommit: &nfs4.LAYOUTCOMMIT4args{
			LocaOffset: 0, LocaLength: nfs4.Length4(end), LocaStateid: sid,
			LocaLastWriteOffset: nfs4.Newoffset4{NoNewoffset: true, NoOffset: (*nfs4.Offset4)(&last)},
			LocaTimeModify:      nfs4.Newtime4{NtTimechanged: true, NtTime: &mt},
			LocaLayoutupdate:    nfs4.Layoutupdate4{LouType: p.typ},
		}}}))
		if err == nil {
			if ok := res[1].Oplayoutcommit.LocrResok4; ok != nil && ok.LocrNewsize.NsSizechanged && ok.LocrNewsize.NsSize != nil {
				f.grewTo(uint64(*ok.LocrNewsize.NsSize))
			}
			return nil
		}
		var se *StatusError
		if attempt >= 2 || !errors.As(err, &se) {
			return err
		}
		var next nfs4.Stateid4
		var ok bool
		switch se.status() {
		case nfs4.NFS4ERR_OLD_STATEID:
			next, ok = p.waitNewer(ctx, f.fh, sid, layoutSeqidWait)
		case nfs4.NFS4ERR_BAD_STATEID, nfs4.NFS4ERR_BADLAYOUT:
			next, ok = p.currentStateid(f.fh)
			ok = ok && next != sid
		}
		if !ok {
			return err
		}
		f.c.log.Debug("LAYOUTCOMMIT: retrying with the current layout stateid", "path", f.path, "err", err)
		sid = next
	}
}

// publishSize makes the size end durable without a LAYOUTCOMMIT: the
// range that ends the file (still kept: the data written through a layout
// is kept until its LAYOUTCOMMIT succeeds) is written again through the
// MDS, which records the size a WRITE reaches. cause is why the
// LAYOUTCOMMIT failed.
func (u *unstable) publishSize(ctx context.Context, f *File, end uint64, cause error) error {
	t, tend := u.last()
	if t == nil || tend < end {
		return fmt.Errorf("%w (no copy of the data kept to publish the file size %d through the metadata server)", cause, end)
	}
	return u.resendHeld(ctx, f, func(h *held) bool { return h == t }, "publishing the file size: "+cause.Error())
}

// reportCommit reports copy w's failed COMMIT (err) like a failed WRITE
// (mirror.go), where the layout takes reports and another copy is left to
// vouch for the data. It reports whether the copy is now stale.
func (l *fileLayout) reportCommit(ctx context.Context, f *File, w *dsWrite, err error) bool {
	var seg *layoutSeg
	for i := range l.segs {
		if l.segs[i].props.ErrorReports {
			seg = &l.segs[i]
			break
		}
	}
	if seg == nil || ctx.Err() != nil {
		return false
	}
	l.wmu.Lock()
	others := false
	for _, o := range l.writes {
		others = others || (o != w && !o.stale && o.dev != w.dev)
	}
	l.wmu.Unlock()
	if !others {
		return false
	}
	c := &layout.Copy{Device: w.dev, Addrs: w.ds.addrs, FH: w.fh}
	pc := piece{Extent: layout.Extent{Off: 0, Len: nfs4.NFS4_UINT64_MAX}, props: seg.props}
	return l.reportOrKeep(ctx, f, pc, c, err, nfs4.OP_COMMIT)
}
