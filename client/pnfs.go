package client

import (
	"bytes"
	"context"
	"fmt"
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
	// (fileLayout.currentStateid); lsidMoved is closed and replaced whenever it
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
		cl, c3 := d.cl, d.c3
		d.cl, d.c3 = nil, nil
		d.mu.Unlock()
		if cl != nil {
			cl.close(nil)
		}
		if c3 != nil {
			c3.Close()
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
