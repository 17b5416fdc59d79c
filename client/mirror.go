package client

import (
	"context"
	"errors"
	"io"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/shoalfs/shoal/client/layout"
	"github.com/shoalfs/shoal/internal/nfs4"
)

// I/O on the copies of an extent. With the files layout an extent has one
// copy; with flexfiles one per mirror (RFC 8435 §2.3, §8), and the client
// itself writes every mirror and reads from one:
//
//   - A write goes to every copy at once. It succeeds when every copy the
//     layout names took it, or when each copy that failed has been
//     reported to the metadata server (LAYOUTERROR, RFC 7862 §15.6) and
//     the metadata server answered NFS4_OK: from then on the metadata
//     server counts that copy as stale and does not serve reads from it,
//     so the write is as durable as the copies that took it. A copy
//     reported so is skipped by the rest of the layout's I/O, and the
//     layout is returned so that the next LAYOUTGET gives one without it.
//     If a failing copy cannot be reported (NFSv4.1 has no LAYOUTERROR, or
//     the metadata server refused the report), the piece is written again
//     through the metadata server, which writes the copies it knows good,
//     and the failure goes into the LAYOUTRETURN's error report instead.
//   - A read tries the copies in the driver's order of preference
//     (flexfiles: by efficiency), skipping copies known stale or data
//     servers left alone after a failure, and reports each failure before
//     it moves to the next copy; when none works, the metadata server.
//
// Only data servers' failures are reported. A limit of the client
// (errDSVersion) or a cancelled caller says nothing of the copy.

// copyResult is one copy's part of a mirrored write.
type copyResult struct {
	ds        *dataServer
	committed nfs4.StableHow4 // the weakest the WRITEs were answered
	verf      nfs4.Verifier4  // the write verifier of the UNSTABLE answers
	mixed     bool            // UNSTABLE answers with different verifiers
	skipped   bool            // the copy was reported stale before
	err       error
}

// writeCopies writes b, piece pc, to its copies. It returns nil when the
// write is done as the comment above says; otherwise the error of a copy
// that failed and that copy, and the caller redoes the piece through the
// MDS.
func (l *fileLayout) writeCopies(ctx context.Context, f *File, pc piece, b []byte) (*layout.Copy, error) {
	copies := pc.Copies
	if pc.props.WriteOneMirror {
		copies = copies[:1] // the data servers copy it to the other mirrors
	}
	res := make([]copyResult, len(copies))
	do := func(i int) {
		c := &copies[i]
		if l.isStale(c.Device) {
			res[i].skipped = true
			return
		}
		ds := f.c.pnfs.server(c)
		res[i] = l.writeCopy(ctx, f, ds, c, b)
	}
	if len(copies) == 1 {
		do(0)
	} else {
		var wg sync.WaitGroup
		for i := range copies {
			wg.Go(func() { do(i) })
		}
		wg.Wait()
	}
	if err := ctx.Err(); err != nil {
		return &copies[0], err
	}
	took := 0
	var failed []int
	for i, r := range res {
		switch {
		case r.skipped:
		case r.err != nil:
			failed = append(failed, i)
		default:
			took++
		}
	}
	if took == 0 {
		// No copy has it: the MDS writes it (a failure is reported below
		// all the same, so that the copy is known stale).
		for _, i := range failed {
			l.reportOrKeep(ctx, f, pc, &copies[i], res[i].err, nfs4.OP_WRITE)
		}
		if len(failed) == 0 {
			return &copies[0], errAllStale
		}
		return &copies[failed[0]], res[failed[0]].err
	}
	for _, i := range failed {
		if !l.reportOrKeep(ctx, f, pc, &copies[i], res[i].err, nfs4.OP_WRITE) {
			// A copy missed the write and the MDS does not know: the
			// MDS writes the piece again, to the copies it knows good.
			return &copies[i], res[i].err
		}
	}
	l.noteCopies(f, pc, b, copies, res)
	return nil, nil
}

// errAllStale: every copy of a piece was reported stale earlier.
var errAllStale = errors.New("nfs: every copy of the range was reported failing")

// writeCopy writes b to copy c on data server ds.
func (l *fileLayout) writeCopy(ctx context.Context, f *File, ds *dataServer, c *layout.Copy, b []byte) copyResult {
	if ds.v3 {
		return l.writeV3(ctx, f, ds, c, b)
	}
	r := copyResult{ds: ds, committed: nfs4.FILE_SYNC4}
	stable := nfs4.UNSTABLE4
	if f.flag&os.O_SYNC != 0 {
		stable = nfs4.FILE_SYNC4
	}
	haveVerf := false
	for n := 0; n < len(b); {
		_, res, err := ds.call(ctx, f, func(cl *endpoint) []nfs4.NfsArgop4 {
			k := int(cl.maxWrite)
			if c.WSize > 0 {
				k = min(k, int(c.WSize))
			}
			chunk := b[n:min(len(b), n+k)]
			return []nfs4.NfsArgop4{putfh(c.FH), {Argop: nfs4.OP_WRITE, Opwrite: &nfs4.WRITE4args{
				Stateid: copyStateid(f, c), Offset: c.DSOff + uint64(n), Stable: stable, Data: chunk,
			}}}
		})
		if err != nil {
			r.err = err
			return r
		}
		ok := res[1].Opwrite.Resok4
		if ok.Count == 0 {
			r.err = io.ErrShortWrite
			return r
		}
		cnt := int(min(ok.Count, uint32(len(b)-n)))
		switch ok.Committed {
		case nfs4.UNSTABLE4:
			r.committed = nfs4.UNSTABLE4
			if haveVerf && ok.Writeverf != r.verf {
				r.mixed = true
			}
			r.verf, haveVerf = ok.Writeverf, true
		case nfs4.DATA_SYNC4:
			if r.committed == nfs4.FILE_SYNC4 {
				r.committed = nfs4.DATA_SYNC4
			}
		}
		f.c.stats.dsWriteBytes.Add(uint64(cnt))
		n += cnt
	}
	return r
}

// noteCopies records a mirrored write that succeeded: each copy's data
// server and filehandle for the COMMIT that follows, and one copy of the
// data, kept until every copy that took it UNSTABLE has committed it.
func (l *fileLayout) noteCopies(f *File, pc piece, b []byte, copies []layout.Copy, res []copyResult) {
	// The copy of the data is made before taking l.wmu: a 1 MiB copy
	// (and the page faults of a buffer not yet mapped) under the lock
	// held up every other WRITE of the file that ended meanwhile.
	var h *held
	if f.flag&os.O_SYNC == 0 && slices.ContainsFunc(res, func(r copyResult) bool {
		return !r.skipped && r.err == nil && r.committed == nfs4.UNSTABLE4
	}) {
		h = newHeld(pc.Off, b, nfs4.Verifier4{})
	}
	first := true
	l.wmu.Lock()
	defer l.wmu.Unlock()
	for i, r := range res {
		if r.skipped || r.err != nil {
			continue
		}
		w := l.dsWriteLocked(r.ds, copies[i].FH, copies[i].Device)
		if r.committed == nfs4.FILE_SYNC4 || r.committed == nfs4.DATA_SYNC4 {
			continue
		}
		w.dirty = true
		if h == nil {
			continue
		}
		verf := r.verf
		if r.mixed {
			verf = mixedVerf(verf) // matches no COMMIT: written again
		}
		if first {
			first = false
			h.verf, h.lay, h.w = verf, l, w
		} else {
			h.more = append(h.more, heldCopy{w: w, verf: verf})
		}
	}
	if h != nil && !first {
		f.unst.insert(h)
	} else if h != nil {
		h.buf.recycle() // no copy took it UNSTABLE after all
	}
	l.wrote = true
	l.wroteEnd = max(l.wroteEnd, pc.Off+uint64(len(b)))
	l.mtime = time.Now()
}

// mixedVerf returns a verifier unlike v: a range whose WRITEs to one copy
// were answered with different verifiers (the data server restarted in
// between) is vouched for by no COMMIT.
func mixedVerf(v nfs4.Verifier4) nfs4.Verifier4 {
	for i := range v {
		v[i] = ^v[i]
	}
	return v
}

// dsWriteLocked returns the commit state of (ds, fh), creating it. l.wmu
// is held.
func (l *fileLayout) dsWriteLocked(ds *dataServer, fh []byte, dev layout.DeviceID) *dsWrite {
	key := ds.key + "\x00" + string(fh)
	w := l.writes[key]
	if w == nil {
		w = &dsWrite{ds: ds, fh: fh, dev: dev}
		l.writes[key] = w
	}
	return w
}

// readCopies reads b, piece pc, from the first of its copies that works.
func (l *fileLayout) readCopies(ctx context.Context, f *File, pc piece, b []byte) (*layout.Copy, error) {
	var blame *layout.Copy
	var lastErr error
	// Two passes: copies not known to be in trouble first, then data
	// servers left alone after a failure (they may be back).
	for pass := range 2 {
		for i := range pc.Copies {
			c := &pc.Copies[i]
			if l.isStale(c.Device) {
				continue
			}
			ds := f.c.pnfs.server(c)
			if (ds.downErr() != nil) != (pass == 1) {
				continue
			}
			err := ds.read(ctx, f, c, b)
			if err == nil {
				return nil, nil
			}
			if ctx.Err() != nil {
				return c, err
			}
			blame, lastErr = c, err
			if len(pc.Copies) > 1 || pc.props.ErrorReports {
				l.reportOrKeep(ctx, f, pc, c, err, nfs4.OP_READ)
			}
		}
	}
	if blame == nil {
		return &pc.Copies[0], errAllStale
	}
	return blame, lastErr
}

// reportOrKeep reports copy c's failure (err, in operation op on piece
// pc) with LAYOUTERROR, where the layout type takes reports, and marks
// the copy stale for the rest of the layout's I/O if the MDS accepted the
// report; the layout is then returned, for one without the copy. It
// reports whether the MDS accepted it. A failure not reported so goes
// into the LAYOUTRETURN's error report.
func (l *fileLayout) reportOrKeep(ctx context.Context, f *File, pc piece, c *layout.Copy, err error, op nfs4.NfsOpnum4) bool {
	if !pc.props.ErrorReports || errors.Is(err, errDSVersion) {
		return false
	}
	// One report per device and layout: pieces in flight on the same
	// failed data server wait for the first one's answer.
	l.wmu.Lock()
	for waits := 0; waits < maxReportWaits; waits++ {
		if l.stale[c.Device] {
			l.wmu.Unlock()
			return true // reported already, by another piece
		}
		other := l.reporting[c.Device]
		if other == nil {
			break
		}
		l.wmu.Unlock()
		select {
		case <-other.done:
		case <-ctx.Done():
			return false
		}
		l.wmu.Lock()
		if !other.ok && l.reporting[c.Device] == nil {
			break // refused: this piece tries again itself
		}
	}
	r := &report{done: make(chan struct{})}
	if l.reporting == nil {
		l.reporting = map[layout.DeviceID]*report{}
	}
	l.reporting[c.Device] = r
	l.wmu.Unlock()
	defer close(r.done)

	ie := layout.IOError{Off: pc.Off, Len: pc.Len, Device: c.Device, Status: dsErrStatus(err), Op: op}
	if c.Stateid != nil {
		ie.Stateid = *c.Stateid
	} else {
		ie.Stateid = l.currentStateid(f)
	}
	rerr := l.layoutError(ctx, f, ie)
	if rerr != nil {
		f.c.log.Warn("data server failed; could not report it with LAYOUTERROR, reporting it at LAYOUTRETURN",
			"path", f.path, "data_server", c.Addrs[0], "mirror", c.Mirror, "err", err, "report_err", rerr)
		l.wmu.Lock()
		if len(l.ioErrs) < maxIOErrs {
			l.ioErrs = append(l.ioErrs, ie)
		}
		delete(l.reporting, c.Device) // the next failure tries again
		l.wmu.Unlock()
		return false
	}
	f.c.log.Warn("data server failed; reported it to the MDS, which no longer counts that copy",
		"path", f.path, "data_server", c.Addrs[0], "mirror", c.Mirror, "of", c.Mirrors, "err", err)
	l.wmu.Lock()
	r.ok = true
	if l.stale == nil {
		l.stale = map[layout.DeviceID]bool{}
	}
	l.stale[c.Device] = true
	for _, w := range l.writes {
		if w.dev == c.Device {
			w.stale = true
		}
	}
	l.wmu.Unlock()
	f.mu.Lock()
	if !l.invalid {
		l.startRetireLocked(f, layoutRetryMin)
	}
	f.mu.Unlock()
	return true
}

// maxReportWaits bounds how many other pieces' refused reports on one
// device a piece waits for before it sends its own.
const maxReportWaits = 4

// report is a LAYOUTERROR in flight for one device of a layout.
type report struct {
	done chan struct{}
	ok   bool // accepted; set before done is closed
}

// maxIOErrs bounds the errors kept for one LAYOUTRETURN.
const maxIOErrs = 64

// isStale reports whether the copies on device dev were reported failing
// through this layout.
func (l *fileLayout) isStale(dev layout.DeviceID) bool {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	return l.stale[dev]
}

// layoutError sends LAYOUTERROR (NFSv4.2) for e.
func (l *fileLayout) layoutError(ctx context.Context, f *File, e layout.IOError) error {
	if f.c.minor.Load() < 2 {
		return errors.New("LAYOUTERROR needs NFSv4.2")
	}
	_, err := f.c.call(ctx, fixed([]nfs4.NfsArgop4{putfh(f.fh), {Argop: nfs4.OP_LAYOUTERROR, Oplayouterror: &nfs4.LAYOUTERROR4args{
		LeaOffset: nfs4.Offset4(e.Off), LeaLength: nfs4.Length4(e.Len), LeaStateid: l.currentStateid(f),
		LeaErrors: []nfs4.DeviceError4{{DeDeviceid: nfs4.Deviceid4(e.Device), DeStatus: e.Status, DeOpnum: e.Op}},
	}}}))
	if err == nil {
		f.c.stats.layoutErrors.Add(1)
	}
	return err
}

// dsErrStatus is the status to report for a data server's error: its own
// NFS status, or NFS4ERR_NXIO for one that could not be reached (the
// status Linux's flexfiles client reports for it).
func dsErrStatus(err error) nfs4.Nfsstat4 {
	var se *StatusError
	if errors.As(err, &se) {
		return se.status()
	}
	return nfs4.NFS4ERR_NXIO
}
