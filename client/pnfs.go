package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/shoalfs/shoal/client/layout"
	"github.com/shoalfs/shoal/internal/nfs4"
)

// pNFS (RFC 8881 §12–13) on the client side. The metadata server (the
// server Dial connected to) hands out layouts; this file holds everything
// around them that does not depend on the layout type: the device cache,
// the sessions with data servers, parallel I/O, commits, recalls and
// failover. The layout arithmetic lives in package layout.

const (
	// dsCallTimeout bounds one request to a data server; a data server
	// that does not answer within it is treated as failed.
	dsCallTimeout = time.Minute
	// dsDialTimeout bounds connecting to a data server and setting up a
	// session with it (or Options.DialTimeout, if shorter). Each of its
	// addresses is tried once; if none answers, the I/O goes through the
	// MDS and the data server is left alone for dsDownMin, doubling to
	// dsDownMax.
	dsDialTimeout = 5 * time.Second
	// layoutMaxcount is loga_maxcount and gdia_maxcount.
	layoutMaxcount = 64 << 10
)

// Backoff bounds for LAYOUTGET after a refusal and for redialling a data
// server after a failure.
const (
	layoutRetryMin  = 50 * time.Millisecond
	layoutRetryMax  = 5 * time.Second
	dsDownMin       = time.Second
	dsDownMax       = 30 * time.Second
	layoutUnavailMx = 30 * time.Second
)

// errDSDown reports a data server skipped because it failed recently.
var errDSDown = errors.New("nfs: data server marked down after a failure")

// dsDown is errDSDown with the failure it follows.
type dsDown struct {
	ago   time.Duration
	cause error
}

func (e *dsDown) Error() string {
	when := "just now"
	if ago := e.ago.Round(time.Millisecond); ago > 0 {
		when = ago.String() + " ago"
	}
	return fmt.Sprintf("failed %s, not retried yet: %v", when, e.cause)
}

func (e *dsDown) Is(target error) bool { return target == errDSDown }

// pnfsClient is the pNFS machinery of a metadata-server Client.
type pnfsClient struct {
	c      *Client
	driver layout.Driver
	typ    nfs4.Layouttype4

	mu      sync.Mutex
	devices map[layout.DeviceID]*deviceEntry
	servers map[string]*dataServer
	kept    map[string]keptLayout // by file handle: layouts kept after Close
	// lsid is the newest layout stateid seen per file handle, from
	// LAYOUTGET replies and CB_LAYOUTRECALLs, until the layout state is
	// returned. The server has one layout stateid per client and file, so
	// Files of one Client that each hold a layout of the same file share
	// it, every LAYOUTGET by one of them moves its seqid for all, and so
	// does a recall. LAYOUTGET, LAYOUTCOMMIT and LAYOUTRETURN send it
	// (layoutStateid); lsidMoved is closed and replaced whenever it
	// changes, for callers waiting for the seqid a recall moved to.
	lsid      map[string]nfs4.Stateid4
	lsidMoved chan struct{}
	// last is the last layout obtained per file handle, kept (up to
	// maxLastLayouts) only to name the data server of a range in errors
	// of I/O done through the MDS without a layout.
	last   map[string]*fileLayout
	closed bool
	wg     sync.WaitGroup // background layout returns
}

// newPNFSClient picks the first of the server's layout types that has a
// driver; it returns nil (pNFS off) if none has.
func newPNFSClient(c *Client, types []uint32) *pnfsClient {
	for _, t := range types {
		if d, ok := layout.Lookup(t); ok {
			c.log.Debug("pNFS on", "layout_type", nfs4.Layouttype4(t).String())
			return &pnfsClient{
				c: c, driver: d, typ: nfs4.Layouttype4(t),
				devices: map[layout.DeviceID]*deviceEntry{},
				servers: map[string]*dataServer{},
				kept:    map[string]keptLayout{},
				lsid:    map[string]nfs4.Stateid4{},
				last:    map[string]*fileLayout{},

				lsidMoved: make(chan struct{}),
			}
		}
	}
	return nil
}

// maxLastLayouts bounds pnfsClient.last.
const maxLastLayouts = 1024

// noteLastLayout records l as the last layout of the file with handle fh.
func (p *pnfsClient) noteLastLayout(fh []byte, l *fileLayout) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.last[string(fh)]; !ok && len(p.last) >= maxLastLayouts {
		for k := range p.last { // evict one, any one
			delete(p.last, k)
			break
		}
	}
	p.last[string(fh)] = l
}

// goBG runs fn in the background unless the client is closing.
func (p *pnfsClient) goBG(fn func()) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		fn()
	}()
	return true
}

// close ends the data-server sessions and waits for background work. The
// owning Client's context is already cancelled.
func (p *pnfsClient) close() {
	p.mu.Lock()
	p.closed = true
	servers := make([]*dataServer, 0, len(p.servers))
	for _, d := range p.servers {
		servers = append(servers, d)
	}
	p.mu.Unlock()
	p.wg.Wait()
	for _, d := range servers {
		d.mu.Lock()
		cl := d.cl
		d.cl = nil
		d.mu.Unlock()
		if cl != nil {
			cl.close(nil)
		}
	}
}

// deviceEntry is one GETDEVICEINFO answer, fetched once per device id by
// whichever caller asks first.
type deviceEntry struct {
	done chan struct{}
	dev  layout.Device
	err  error
}

func (p *pnfsClient) device(ctx context.Context, id layout.DeviceID) (layout.Device, error) {
	p.mu.Lock()
	e := p.devices[id]
	if e != nil {
		p.mu.Unlock()
		select {
		case <-e.done:
			return e.dev, e.err
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	e = &deviceEntry{done: make(chan struct{})}
	p.devices[id] = e
	p.mu.Unlock()
	e.dev, e.err = p.getDeviceInfo(ctx, id)
	if e.err != nil {
		p.forgetDevice(id, e)
	}
	close(e.done)
	return e.dev, e.err
}

// forgetDevice drops a cached device, so the next use fetches it again.
func (p *pnfsClient) forgetDevice(id layout.DeviceID, e *deviceEntry) {
	p.mu.Lock()
	if cur := p.devices[id]; cur == e || e == nil {
		delete(p.devices, id)
	}
	p.mu.Unlock()
}

func (p *pnfsClient) getDeviceInfo(ctx context.Context, id layout.DeviceID) (layout.Device, error) {
	res, err := p.c.call(ctx, fixed([]nfs4.NfsArgop4{{Argop: nfs4.OP_GETDEVICEINFO, Opgetdeviceinfo: &nfs4.GETDEVICEINFO4args{
		GdiaDeviceId: nfs4.Deviceid4(id), GdiaLayoutType: p.typ, GdiaMaxcount: layoutMaxcount,
	}}}))
	if err != nil {
		return nil, fmt.Errorf("nfs: GETDEVICEINFO %x: %w", id[:], err)
	}
	ok := res[0].Opgetdeviceinfo.GdirResok4
	if ok == nil || ok.GdirDeviceAddr.DaLayoutType != p.typ {
		return nil, fmt.Errorf("nfs: GETDEVICEINFO %x: no device of layout type %v", id[:], p.typ)
	}
	return p.driver.DecodeDevice(ok.GdirDeviceAddr.DaAddrBody)
}

// dataServer is one data server, shared by all files: one session, and a
// bound on the requests in flight to it.
type dataServer struct {
	p     *pnfsClient
	key   string
	addrs []string
	sem   chan struct{}

	mu        sync.Mutex // serializes dials
	cl        *endpoint
	failures  int       // consecutive failures; 0 after a success
	downUntil time.Time // no dial before this
	failedAt  time.Time // the last failure
	lastErr   error     // ... and its error
}

func (p *pnfsClient) server(addrs []string) *dataServer {
	key := strings.Join(addrs, ",")
	p.mu.Lock()
	defer p.mu.Unlock()
	d := p.servers[key]
	if d == nil {
		d = &dataServer{p: p, key: key, addrs: addrs, sem: make(chan struct{}, p.c.opts.MaxPerDS)}
		p.servers[key] = d
	}
	return d
}

// client returns the session with the data server, dialling it if needed.
func (d *dataServer) client(ctx context.Context) (*endpoint, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cl != nil {
		return d.cl, nil
	}
	if now := time.Now(); now.Before(d.downUntil) {
		return nil, &dsDown{ago: now.Sub(d.failedAt), cause: d.lastErr}
	}
	var err error
	for _, a := range d.addrs {
		dctx, cancel := context.WithTimeout(ctx, dsDialTimeout)
		var cl *endpoint
		cl, err = d.p.c.dialDS(dctx, a)
		cancel()
		if err == nil {
			d.cl = cl
			return cl, nil
		}
		if ctx.Err() != nil {
			return nil, err // the caller gave up: says nothing of the data server
		}
	}
	d.markDownLocked(err)
	return nil, err
}

func (d *dataServer) markDownLocked(err error) {
	d.failures++
	back := min(dsDownMin<<min(d.failures-1, 10), dsDownMax)
	d.failedAt, d.lastErr = time.Now(), err
	d.downUntil = d.failedAt.Add(back)
}

// probe checks that the data server answers: a SEQUENCE on its session,
// dialling it if needed, within dsDialTimeout. A failure counts as one of
// the data server's.
func (d *dataServer) probe(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, dsDialTimeout)
	defer cancel()
	cl, err := d.client(ctx)
	if err != nil {
		return err
	}
	_, err = cl.callRetry(ctx, 0, func() []nfs4.NfsArgop4 { return nil })
	var se *StatusError
	if err != nil && !errors.As(err, &se) {
		d.fail(cl, err)
		return err
	}
	return nil // it answered
}

// downErr returns, while the data server is left alone after a failure,
// that failure (errDSDown); nil otherwise.
func (d *dataServer) downErr() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if now := time.Now(); d.cl == nil && d.lastErr != nil && now.Before(d.downUntil) {
		return &dsDown{ago: now.Sub(d.failedAt), cause: d.lastErr}
	}
	return nil
}

// fail drops the session cl after a transport failure (err) and keeps
// the data server out of use for a while.
func (d *dataServer) fail(cl *endpoint, err error) {
	d.mu.Lock()
	if d.cl != cl {
		d.mu.Unlock()
		return
	}
	d.cl = nil
	d.markDownLocked(err)
	d.mu.Unlock()
	if !d.p.goBG(func() { cl.close(nil) }) {
		cl.close(nil)
	}
}

func (d *dataServer) succeeded() {
	d.mu.Lock()
	d.failures = 0
	d.mu.Unlock()
}

func (d *dataServer) acquire(ctx context.Context) error {
	select {
	case d.sem <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (d *dataServer) release() { <-d.sem }

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

	smu      sync.Mutex // serializes syncLayout
	wmu      sync.Mutex // guards the write state below
	writes   map[string]*dsWrite
	wrote    bool // written since the last LAYOUTCOMMIT
	wroteEnd uint64
	mtime    time.Time
}

type layoutSeg struct {
	off, end uint64 // end is exclusive; ^0 means to the end of the file
	lay      layout.Layout
}

// dsWrite is the commit state of one (data server, filehandle). The
// verifiers the WRITEs got are kept with the data (held).
type dsWrite struct {
	ds    *dataServer
	fh    []byte
	dirty bool // written UNSTABLE since the last COMMIT
}

func (l *fileLayout) maybeIdleLocked() {
	if l.invalid && l.users == 0 && !l.idleDone {
		l.idleDone = true
		close(l.idle)
	}
}

// layoutFor returns the File's layout for I/O, fetching one if the file
// has none and may have one. nil means: do the I/O through the MDS. The
// caller must releaseLayout a non-nil result.
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
		switch se.NFSStatus {
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
		switch se.NFSStatus {
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
		l.segs = append(l.segs, layoutSeg{off: uint64(seg.LoOffset), end: end, lay: dl})
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

var sizeBits = attrBits(nfs4.FATTR4_SIZE)

// piece is one request's worth of a pNFS I/O: an extent of the layout (or
// a range the layout does not cover, with no Addrs) at most maxIOSize long.
type piece struct {
	layout.Extent
	lo, hi int // the piece's part of the caller's buffer
}

// plan maps [off, off+n) onto the layout.
func (l *fileLayout) plan(off uint64, n int) ([]piece, error) {
	var exts []layout.Extent
	pos, end := off, off+uint64(n)
	dev := func(id layout.DeviceID) (layout.Device, bool) { d, ok := l.devs[id]; return d, ok }
	for pos < end {
		var seg *layoutSeg
		next := end
		for i := range l.segs {
			s := &l.segs[i]
			if s.off <= pos && pos < s.end {
				seg = s
				break
			}
			if s.off > pos && s.off < next {
				next = s.off
			}
		}
		if seg == nil {
			exts = append(exts, layout.Extent{Off: pos, Len: next - pos})
			pos = next
			continue
		}
		hi := min(end, seg.end)
		var err error
		if exts, err = seg.lay.Map(exts, pos, hi-pos, dev); err != nil {
			return nil, err
		}
		pos = hi
	}
	var out []piece
	for _, e := range exts {
		for done := uint64(0); done < e.Len; {
			k := min(e.Len-done, maxIOSize)
			pe := e
			pe.Off, pe.Len, pe.DSOff = e.Off+done, k, e.DSOff+done
			lo := int(pe.Off - off)
			out = append(out, piece{Extent: pe, lo: lo, hi: lo + int(k)})
			done += k
		}
	}
	return out, nil
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

// pnfsRead reads through the layout, capped at the file size.
func (l *fileLayout) read(ctx context.Context, f *File, p []byte, off int64) (int, error) {
	size, err := f.sizeFor(ctx, uint64(off)+uint64(len(p)))
	if err != nil {
		return 0, err
	}
	if uint64(off) >= size {
		return 0, io.EOF
	}
	want := len(p)
	if uint64(off)+uint64(want) > size {
		want = int(size - uint64(off))
	}
	n, err := l.run(ctx, f, p[:want], off, false)
	if err == nil && n < len(p) {
		err = io.EOF
	}
	return n, err
}

// pnfsRun does the pieces of b at off in parallel, each on its data
// server, bounded per data server by MaxPerDS; a piece whose data server
// fails is redone through the MDS. It returns the bytes done contiguously
// from off and the first error among them.
func (l *fileLayout) run(ctx context.Context, f *File, b []byte, off int64, write bool) (int, error) {
	pieces, err := l.plan(uint64(off), len(b))
	if err != nil {
		l.failover(f, nil, err)
		pieces = []piece{{Extent: layout.Extent{Off: uint64(off), Len: uint64(len(b))}, lo: 0, hi: len(b)}}
	}
	type result struct {
		n   int
		err error
	}
	results := make([]result, len(pieces))
	var wg sync.WaitGroup
	for i, pc := range pieces {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n, err := l.doPiece(ctx, f, pc, b[pc.lo:pc.hi], write)
			results[i] = result{n, err}
		}()
	}
	wg.Wait()
	done := 0
	for i, r := range results {
		if r.err != nil {
			return done + r.n, r.err
		}
		done += r.n
		if r.n < pieces[i].hi-pieces[i].lo {
			break
		}
	}
	return done, nil
}

func (l *fileLayout) doPiece(ctx context.Context, f *File, pc piece, b []byte, write bool) (int, error) {
	var dsErr error
	if pc.Addrs != nil {
		ds := f.c.pnfs.server(pc.Addrs)
		if write {
			dsErr = l.writeTo(ctx, f, ds, pc.Extent, b)
		} else {
			dsErr = ds.read(ctx, f, pc.Extent, b)
		}
		if dsErr == nil {
			return len(b), nil
		}
		switch {
		case ctx.Err() != nil:
			return 0, dsErr
		case errors.Is(dsErr, errDSDown):
			// Known to be down since an earlier failure, which already
			// returned the layout that saw it: just use the MDS.
			f.c.stats.failovers.Add(1)
		default:
			l.failover(f, ds, dsErr)
		}
	}
	var n int
	var err error
	if write {
		n, _, err = f.c.writeChunk(ctx, f, b, int64(pc.Off))
	} else {
		n, _, err = f.c.readChunk(ctx, f, b, int64(pc.Off))
	}
	if err != nil && dsErr != nil && ctx.Err() == nil {
		// Neither way worked: say which data server failed, and how.
		err = &DataServerError{
			Offset: int64(pc.Off) + int64(n), Addr: pc.Addrs[0], Stripe: pc.Stripe, Stripes: pc.Stripes,
			DSErr: dsErr, Err: err,
		}
	}
	return n, err
}

// blameDataServer adds to err, the failure of I/O at off through the MDS
// without a layout, the data server that holds off in the last layout the
// Client got for the file, if that data server cannot be used: it failed
// recently and is left alone, or it does not answer now (probe: one dial
// or SEQUENCE, bounded by dsDialTimeout). Stripe units on a data server that is out of service
// are what Shoal's MDS cannot serve (NFS4ERR_DELAY, then NFS4ERR_IO), and
// refuses layouts for (NFS4ERR_LAYOUTUNAVAILABLE). Errors with other
// statuses are returned as they are.
func (f *File) blameDataServer(ctx context.Context, off int64, err error) error {
	var se *StatusError
	p := f.c.pnfs
	if p == nil || ctx.Err() != nil || !errors.As(err, &se) ||
		(se.NFSStatus != nfs4.NFS4ERR_IO && se.NFSStatus != nfs4.NFS4ERR_DELAY) {
		return err
	}
	var de *DataServerError
	if errors.As(err, &de) {
		return err
	}
	f.mu.Lock()
	refused := f.layRefused
	f.mu.Unlock()
	p.mu.Lock()
	l := p.last[string(f.fh)]
	p.mu.Unlock()
	if l != nil {
		if pcs, perr := l.plan(uint64(off), 1); perr == nil && len(pcs) == 1 && pcs[0].Addrs != nil {
			pc := pcs[0]
			ds := p.server(pc.Addrs)
			dsErr := ds.downErr()
			if dsErr == nil {
				dsErr = ds.probe(ctx)
			}
			if dsErr != nil && ctx.Err() == nil {
				return &DataServerError{Offset: off, Addr: pc.Addrs[0], Stripe: pc.Stripe, Stripes: pc.Stripes,
					DSErr: dsErr, Err: err}
			}
		}
	}
	if refused != nil {
		// The MDS gives no layout of a file whose data server is out of
		// service (the kernel client then goes through the MDS at once),
		// so a client that never held one cannot name it.
		return fmt.Errorf("%w (a data server holding this file is out of service; the metadata server gave no layout to name it by: %v; `shoal admin status` lists it)", err, refused)
	}
	return err
}

// dsCall runs one COMPOUND on a data server. A transport failure drops the
// session and keeps the data server out of use for a while.
func (ds *dataServer) call(ctx context.Context, f *File, build func(cl *endpoint) []nfs4.NfsArgop4) (*endpoint, []nfs4.NfsResop4, error) {
	cl, res, _, err := ds.callRelease(ctx, f, build)
	return cl, res, err
}

// dsCallRelease is dsCall that also returns, on success, the function that
// releases the reply's buffer (see Client.callRelease).
func (ds *dataServer) callRelease(ctx context.Context, f *File, build func(cl *endpoint) []nfs4.NfsArgop4) (*endpoint, []nfs4.NfsResop4, func(), error) {
	if err := ds.acquire(ctx); err != nil {
		return nil, nil, nil, err
	}
	defer ds.release()
	cl, err := ds.client(ctx)
	if err != nil {
		return nil, nil, nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, dsCallTimeout)
	defer cancel()
	res, release, err := cl.callIORelease(cctx, f.c.ioBudget(), func() []nfs4.NfsArgop4 { return build(cl) })
	var se *StatusError
	switch {
	case err == nil:
		ds.succeeded()
	case errors.As(err, &se), ctx.Err() != nil:
	default:
		ds.fail(cl, err) // connection refused or reset, timeout, session lost
	}
	return cl, res, release, err
}

func (ds *dataServer) read(ctx context.Context, f *File, e layout.Extent, b []byte) error {
	for n := 0; n < len(b); {
		var want uint32
		_, res, release, err := ds.callRelease(ctx, f, func(cl *endpoint) []nfs4.NfsArgop4 {
			want = min(uint32(len(b)-n), cl.maxRead)
			sid, _ := f.ioStateid()
			return []nfs4.NfsArgop4{putfh(e.FH), {Argop: nfs4.OP_READ, Opread: &nfs4.READ4args{
				Stateid: sid, Offset: e.DSOff + uint64(n), Count: want,
			}}}
		})
		if err != nil {
			return err
		}
		ok := res[1].Opread.Resok4
		got := copy(b[n:], ok.Data)
		eof := ok.Eof
		release() // the data is copied out; nothing else aliases the reply
		f.c.stats.dsReadBytes.Add(uint64(got))
		n += got
		if eof || got == 0 {
			// Below the file size, what the data server does not have is
			// a hole.
			clear(b[n:])
			return nil
		}
	}
	return nil
}

func (l *fileLayout) writeTo(ctx context.Context, f *File, ds *dataServer, e layout.Extent, b []byte) error {
	stable := nfs4.UNSTABLE4
	if f.flag&os.O_SYNC != 0 {
		stable = nfs4.FILE_SYNC4
	}
	for n := 0; n < len(b); {
		_, res, err := ds.call(ctx, f, func(cl *endpoint) []nfs4.NfsArgop4 {
			chunk := b[n:min(len(b), n+int(cl.maxWrite))]
			sid, _ := f.ioStateid()
			return []nfs4.NfsArgop4{putfh(e.FH), {Argop: nfs4.OP_WRITE, Opwrite: &nfs4.WRITE4args{
				Stateid: sid, Offset: e.DSOff + uint64(n), Stable: stable, Data: chunk,
			}}}
		})
		if err != nil {
			return err
		}
		ok := res[1].Opwrite.Resok4
		if ok.Count == 0 {
			return io.ErrShortWrite
		}
		cnt := int(min(ok.Count, uint32(len(b)-n)))
		var h *held
		if stable == nfs4.UNSTABLE4 && ok.Committed == nfs4.UNSTABLE4 {
			h = newHeld(e.Off+uint64(n), b[n:n+cnt], ok.Writeverf)
		}
		l.noteWrite(ds, e.FH, ok.Committed, e.Off+uint64(n+cnt), &f.unst, h)
		f.c.stats.dsWriteBytes.Add(uint64(cnt))
		n += cnt
	}
	return nil
}

// noteWrite records a WRITE to a data server for the commit that
// follows, and the copy h of what it wrote UNSTABLE (nil: none kept) in u.
func (l *fileLayout) noteWrite(ds *dataServer, fh []byte, committed nfs4.StableHow4, end uint64, u *unstable, h *held) {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	key := ds.key + "\x00" + string(fh)
	w := l.writes[key]
	if w == nil {
		w = &dsWrite{ds: ds, fh: fh}
		l.writes[key] = w
	}
	if committed != nfs4.FILE_SYNC4 && committed != nfs4.DATA_SYNC4 {
		w.dirty = true
	}
	if h != nil {
		h.lay, h.w = l, w
		u.insert(h)
	}
	l.wrote = true
	l.wroteEnd = max(l.wroteEnd, end)
	l.mtime = time.Now()
}

// failover handles a failed data server (ds nil: the layout itself is
// unusable): the layout is invalidated and returned in the background,
// and the caller redoes its piece through the MDS. Later I/O asks for a
// new layout after a backoff; pieces on a data server that failed recently
// go straight to the MDS.
func (l *fileLayout) failover(f *File, ds *dataServer, err error) {
	f.c.stats.failovers.Add(1)
	where := "layout"
	if ds != nil {
		where = ds.key
	}
	f.mu.Lock()
	first := !l.invalid
	if first {
		f.layBackoff = min(max(2*f.layBackoff, dsDownMin), dsDownMax)
		l.startRetireLocked(f, f.layBackoff)
	}
	f.mu.Unlock()
	if !first {
		f.c.log.Debug("pNFS I/O failed; redoing it through the MDS", "path", f.path, "data_server", where, "err", err)
		return
	}
	f.c.log.Warn("pNFS I/O failed; redoing it through the MDS and returning the layout", "path", f.path, "data_server", where, "err", err)
	if ds == nil {
		// The layout itself is unusable (say, a device the server no
		// longer knows): fetch its devices afresh with the next layout.
		for id := range l.devs {
			f.c.pnfs.forgetDevice(id, nil)
		}
	}
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
// Commit failures surface at the next Sync or Close.
func (l *fileLayout) retire(ctx context.Context, f *File) {
	l.retireOnce.Do(func() {
		defer close(l.returned)
		f.mu.Lock()
		if f.lay == l {
			f.lay = nil
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

// layoutStateid returns the stateid to send for l: the newest the Client
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

// noteLayoutStateid records a layout stateid the server sent for the file
// with handle fh (a LAYOUTGET reply, whose layout state replaces any
// other).
func (p *pnfsClient) noteLayoutStateid(fh []byte, sid nfs4.Stateid4) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if t, ok := p.lsid[string(fh)]; !ok || t.Other != sid.Other || seqNewer(sid.Seqid, t.Seqid) {
		p.setStateidLocked(fh, sid)
	}
}

// noteRecallStateid records the layout stateid a CB_LAYOUTRECALL carries,
// unless the Client knows other layout state of the file (the recall is
// of state already returned).
func (p *pnfsClient) noteRecallStateid(fh []byte, sid nfs4.Stateid4) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if t, ok := p.lsid[string(fh)]; !ok || (t.Other == sid.Other && seqNewer(sid.Seqid, t.Seqid)) {
		p.setStateidLocked(fh, sid)
	}
}

func (p *pnfsClient) setStateidLocked(fh []byte, sid nfs4.Stateid4) {
	p.lsid[string(fh)] = sid
	close(p.lsidMoved)
	p.lsidMoved = make(chan struct{})
}

// currentStateid returns the newest layout stateid of the file with
// handle fh, if the Client has layout state for it.
func (p *pnfsClient) currentStateid(fh []byte) (nfs4.Stateid4, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	sid, ok := p.lsid[string(fh)]
	return sid, ok
}

// forgetStateid forgets the layout state sid of the file with handle fh
// (returned, or unknown to the server), unless newer state replaced it.
func (p *pnfsClient) forgetStateid(fh []byte, sid nfs4.Stateid4) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if t, ok := p.lsid[string(fh)]; ok && t.Other == sid.Other {
		delete(p.lsid, string(fh))
	}
}

// layoutSeqidWait bounds how long a LAYOUTCOMMIT or LAYOUTRETURN that got
// NFS4ERR_OLD_STATEID waits for the stateid the server moved to. The
// server moves it for a recall before it sends the CB_LAYOUTRECALL that
// carries it (and a sibling File's LAYOUTGET moves it before its reply
// arrives), so the wait is normally short.
const layoutSeqidWait = 5 * time.Second

// waitNewer waits up to d for a layout stateid of the file with handle fh
// newer than than (same layout state, later seqid; or other layout state)
// and returns it.
func (p *pnfsClient) waitNewer(ctx context.Context, fh []byte, than nfs4.Stateid4, d time.Duration) (nfs4.Stateid4, bool) {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		p.mu.Lock()
		cur, ok := p.lsid[string(fh)]
		moved := p.lsidMoved
		p.mu.Unlock()
		if ok && (cur.Other != than.Other || seqNewer(cur.Seqid, than.Seqid)) {
			return cur, true
		}
		select {
		case <-moved:
		case <-t.C:
			return nfs4.Stateid4{}, false
		case <-ctx.Done():
			return nfs4.Stateid4{}, false
		}
	}
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

// layoutReturn returns the Client's layout state of f's file, which l is
// part of, unless another layout uses it (f's current one or a sibling's):
// the server's LAYOUTRETURN would take that away too. It is serialized
// with f's LAYOUTGETs.
func (l *fileLayout) returnLayout(ctx context.Context, f *File) {
	f.layMu.Lock()
	defer f.layMu.Unlock()
	l.returnLocked(ctx, f)
}

// layoutReturnLocked is layoutReturn with f.layMu held.
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
	for attempt := 0; ; attempt++ {
		_, err := f.c.call(ctx, fixed([]nfs4.NfsArgop4{putfh(f.fh), {Argop: nfs4.OP_LAYOUTRETURN, Oplayoutreturn: &nfs4.LAYOUTRETURN4args{
			LoraLayoutType: p.typ, LoraIomode: nfs4.LAYOUTIOMODE4_ANY,
			LoraLayoutreturn: nfs4.Layoutreturn4{LrReturntype: nfs4.LAYOUTRETURN4_FILE, LrLayout: &nfs4.LayoutreturnFile4{
				LrfOffset: 0, LrfLength: nfs4.NFS4_UINT64_MAX, LrfStateid: sid,
			}},
		}}}))
		var se *StatusError
		switch {
		case err == nil:
			p.forgetStateid(f.fh, sid)
			f.c.stats.layoutReturns.Add(1)
			return
		case errors.As(err, &se) && (se.NFSStatus == nfs4.NFS4ERR_BAD_STATEID || se.NFSStatus == nfs4.NFS4ERR_STALE_STATEID ||
			se.NFSStatus == nfs4.NFS4ERR_BADLAYOUT || se.NFSStatus == nfs4.NFS4ERR_NOMATCHING_LAYOUT):
			// The server holds none of it (revoked, or of its previous
			// boot).
			p.forgetStateid(f.fh, sid)
		case attempt == 0 && errors.As(err, &se) && se.NFSStatus == nfs4.NFS4ERR_OLD_STATEID:
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

// syncLayout makes the writes through l durable and visible: COMMIT to
// each data server written UNSTABLE (in parallel), then LAYOUTCOMMIT to
// the MDS with the last write offset and the modification time. Data a
// COMMIT does not vouch for (the data server could not be reached, or
// answered another write verifier than the WRITE got: it restarted, or a
// copy it forwarded the data to did) is written again through the MDS,
// which reaches every copy over its own connections. If no layout stateid
// the MDS takes is left for the LAYOUTCOMMIT, the range that ends the
// file is written again through the MDS, which records the size itself.
func (l *fileLayout) sync(ctx context.Context, f *File) error {
	l.smu.Lock()
	defer l.smu.Unlock()
	l.wmu.Lock()
	var dirty []*dsWrite
	for _, w := range l.writes {
		if w.dirty {
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
			f.c.stats.failovers.Add(1)
			why = append(why, fmt.Sprintf("COMMIT to data server %s failed: %v", w.ds.key, err))
		}
	}
	unvouched := func(h *held) bool {
		if h.lay != l || h.seq > cutoff || h.state != heldPending {
			return false
		}
		o, ok := res[h.w]
		return ok && (o.err != nil || o.verf != h.verf)
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
		o, ok := res[h.w]
		return ok && o.err == nil && o.verf == h.verf
	}, heldCommitted)
	if wrote {
		err := l.commit(ctx, f, end, mtime)
		var se *StatusError
		switch {
		case err == nil:
		case errors.As(err, &se) && se.NFSStatus == nfs4.NFS4ERR_STALE:
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
	f.unst.drop(func(h *held) bool { return h.lay == l && h.seq <= cutoff && h.state == heldCommitted })
	return errors.Join(errs...)
}

// layoutCommit sends LAYOUTCOMMIT for the writes through l, which reached
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
		switch se.NFSStatus {
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

// recall answers CB_LAYOUTRECALL at once: NFS4_OK when the client holds a
// matching layout, which it then returns in the background after the I/O
// in flight on it is done and committed; NFS4ERR_NOMATCHING_LAYOUT
// otherwise. The next I/O on the file asks for a new layout (and goes
// through the MDS while the server refuses one).
func (p *pnfsClient) recall(a *nfs4.CBLAYOUTRECALL4args) nfs4.Nfsstat4 {
	if a.CloraType != p.typ {
		return nfs4.NFS4ERR_NOMATCHING_LAYOUT
	}
	var fh []byte
	var sid *nfs4.Stateid4
	switch a.CloraRecall.LorRecalltype {
	case nfs4.LAYOUTRECALL4_FILE:
		if a.CloraRecall.LorLayout == nil {
			return nfs4.NFS4ERR_BADXDR
		}
		fh = a.CloraRecall.LorLayout.LorFh
		sid = &a.CloraRecall.LorLayout.LorStateid
	case nfs4.LAYOUTRECALL4_FSID, nfs4.LAYOUTRECALL4_ALL:
	default:
		return nfs4.NFS4ERR_INVAL
	}
	c := p.c
	c.filesMu.Lock()
	files := make([]*File, 0, len(c.files))
	for f := range c.files {
		if fh == nil || bytes.Equal(f.fh, fh) {
			files = append(files, f)
		}
	}
	c.filesMu.Unlock()
	matched := false
	for _, f := range files {
		f.mu.Lock()
		if l := f.lay; l != nil {
			matched = true
			l.startRetireLocked(f, 0)
		} else if len(f.retiring) > 0 {
			matched = true // already on its way back
		}
		if f.layGetting {
			matched = true // returned as soon as the LAYOUTGET completes
			f.layRecalled = true
		}
		if sid != nil {
			// The recall carries the layout stateid with the seqid the
			// server moved to; LAYOUTCOMMIT and LAYOUTRETURN must use it.
			for _, l := range f.retiring {
				if l.stateid.Other == sid.Other && seqNewer(sid.Seqid, l.stateid.Seqid) {
					l.stateid = *sid
				}
			}
		}
		f.mu.Unlock()
	}
	if fh != nil && sid != nil {
		p.noteRecallStateid(fh, *sid)
	}
	if p.recallKept(fh, sid) {
		matched = true
	}
	if !matched {
		return nfs4.NFS4ERR_NOMATCHING_LAYOUT
	}
	c.stats.layoutRecalls.Add(1)
	return nfs4.NFS4_OK
}

// keptLayout is a layout kept after its File was closed
// (Policy.KeepLayouts), committed and unused, waiting for the next File
// of the same file. owner is the closed File, which can still return it.
type keptLayout struct {
	owner *File
	l     *fileLayout
}

// keep keeps f's layout l after Close instead of returning it. It reports
// false if l cannot be kept (it is being returned already).
func (p *pnfsClient) keep(f *File, l *fileLayout) bool {
	f.mu.Lock()
	if l.invalid || l.users > 0 || f.lay != l {
		f.mu.Unlock()
		return false
	}
	f.lay = nil
	f.mu.Unlock()
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return false
	}
	old, had := p.kept[string(f.fh)]
	p.kept[string(f.fh)] = keptLayout{owner: f, l: l}
	p.mu.Unlock()
	if had {
		p.returnKept(old)
	}
	return true
}

// adoptKept gives f the layout kept for its file, if any.
func (p *pnfsClient) adoptKept(f *File) {
	p.mu.Lock()
	k, ok := p.kept[string(f.fh)]
	delete(p.kept, string(f.fh))
	p.mu.Unlock()
	if !ok {
		return
	}
	f.mu.Lock()
	fits := f.lay == nil && !f.closed && (k.l.iomode == nfs4.LAYOUTIOMODE4_RW || !f.writable())
	if fits {
		f.lay = k.l
	}
	f.mu.Unlock()
	if !fits {
		p.returnKept(k)
	}
}

// returnKept returns a kept layout in the background.
func (p *pnfsClient) returnKept(k keptLayout) {
	p.goBG(func() {
		ctx, cancel := context.WithTimeout(p.c.ctx, 30*time.Second)
		defer cancel()
		k.l.returnLayout(ctx, k.owner)
	})
}

// recallKept hands back the kept layouts a recall of fh (nil: all) asks
// for, and reports whether there were any.
func (p *pnfsClient) recallKept(fh []byte, sid *nfs4.Stateid4) bool {
	p.mu.Lock()
	var ks []keptLayout
	for key, k := range p.kept {
		if fh == nil || key == string(fh) {
			ks = append(ks, k)
			delete(p.kept, key)
		}
	}
	p.mu.Unlock()
	for _, k := range ks {
		if sid != nil {
			k.owner.mu.Lock()
			if k.l.stateid.Other == sid.Other && seqNewer(sid.Seqid, k.l.stateid.Seqid) {
				k.l.stateid = *sid
			}
			k.owner.mu.Unlock()
		}
		p.returnKept(k)
	}
	return len(ks) > 0
}

// seqNewer reports whether stateid seqid a is after b (RFC 8881 §8.2.2:
// seqids wrap from 0xffffffff to 1).
func seqNewer(a, b nfs4.Uint32T) bool { return int32(uint32(a)-uint32(b)) > 0 }
