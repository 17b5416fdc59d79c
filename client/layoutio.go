package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"

	"github.com/shoalfs/shoal/client/layout"
	"github.com/shoalfs/shoal/internal/nfs4"
)

// The pNFS I/O engine: a layout's driver (package layout) maps a file range
// onto extents, each on one data server; the engine cuts them into pieces,
// runs them in parallel on the data servers' sessions, keeps what it wrote
// UNSTABLE for the commit, and redoes a failed piece through the metadata
// server. Nothing here depends on the layout type.

var sizeBits = attrBits(nfs4.FATTR4_SIZE)

// piece is one request's worth of a pNFS I/O: an extent of the layout (or
// a range the layout does not cover, with no Copies) at most maxIOSize
// long, and the rules of the layout segment it comes from.
type piece struct {
	layout.Extent
	props  layout.Props
	lo, hi int // the piece's part of the caller's buffer
}

// plan maps [off, off+n) onto the layout.
func (l *fileLayout) plan(off uint64, n int) ([]piece, error) {
	var exts []layout.Extent
	var props []layout.Props // of exts[i]
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
			props = append(props, layout.Props{})
			pos = next
			continue
		}
		hi := min(end, seg.end)
		var err error
		if exts, err = seg.lay.Map(exts, pos, hi-pos, dev); err != nil {
			return nil, err
		}
		for len(props) < len(exts) {
			props = append(props, seg.props)
		}
		pos = hi
	}
	var out []piece
	for i, e := range exts {
		for done := uint64(0); done < e.Len; {
			k := min(e.Len-done, maxIOSize)
			pe := e
			pe.Off, pe.Len = e.Off+done, k
			if done > 0 {
				pe.Copies = slices.Clone(e.Copies)
				for j := range pe.Copies {
					pe.Copies[j].DSOff += done
				}
			}
			lo := int(pe.Off - off)
			out = append(out, piece{Extent: pe, props: props[i], lo: lo, hi: lo + int(k)})
			done += k
		}
	}
	return out, nil
}

// read reads through the layout, capped at the file size.
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

// run does the pieces of b at off in parallel, each on its data
// server, bounded per data server by MaxPerDS; a piece whose data server
// fails is redone through the MDS. It returns the bytes done contiguously
// from off and the first error among them.
func (l *fileLayout) run(ctx context.Context, f *File, b []byte, off int64, write bool) (int, error) {
	pieces, err := l.plan(uint64(off), len(b))
	if err != nil {
		l.failover(f, nil, err)
		pieces = []piece{{Extent: layout.Extent{Off: uint64(off), Len: uint64(len(b))}, lo: 0, hi: len(b)}}
	}
	if len(pieces) == 1 {
		// One data server (a request inside one stripe unit, as a 1 MiB
		// request of a FUSE mount is): no goroutine, whose start and
		// stack growth cost more than the piece's own bookkeeping.
		pc := pieces[0]
		return l.doPiece(ctx, f, pc, b[pc.lo:pc.hi], write)
	}
	type result struct {
		n   int
		err error
	}
	results := make([]result, len(pieces))
	var wg sync.WaitGroup
	last := len(pieces) - 1
	for i, pc := range pieces[:last] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n, err := l.doPiece(ctx, f, pc, b[pc.lo:pc.hi], write)
			results[i] = result{n, err}
		}()
	}
	// The last piece runs here: a FUSE mount's misaligned 1 MiB WRITE is
	// two pieces, and a goroutine for each (its start, and its stack
	// grown to the RPC path's depth) cost the mount more than the piece's
	// own bookkeeping, as for a single piece above.
	pc := pieces[last]
	n, err := l.doPiece(ctx, f, pc, b[pc.lo:pc.hi], write)
	results[last] = result{n, err}
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

// doPiece does one piece on its data servers: a write on every copy, a
// read on the first copy that works. What the data servers cannot do is
// redone through the MDS (unless the layout forbids it).
func (l *fileLayout) doPiece(ctx context.Context, f *File, pc piece, b []byte, write bool) (int, error) {
	var dsErr error
	var blame *layout.Copy // the copy that failed, to name in errors
	if len(pc.Copies) > 0 && (write || !pc.props.NoReadIO) {
		if write {
			blame, dsErr = l.writeCopies(ctx, f, pc, b)
		} else {
			blame, dsErr = l.readCopies(ctx, f, pc, b)
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
			l.failover(f, blame, dsErr)
		}
		if pc.props.NoIOThroughMDS {
			// RFC 8435 §5.1: the metadata server asks not to be sent the
			// I/O; the next try gets a new layout.
			op := nfs4.OP_READ
			if write {
				op = nfs4.OP_WRITE
			}
			return 0, &DataServerError{Offset: int64(pc.Off), Addr: blame.Addrs[0], Stripe: blame.Stripe, Stripes: blame.Stripes,
				Mirror: blame.Mirror, Mirrors: blame.Mirrors, DSErr: dsErr, Err: noMDSError{op}}
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
			Offset: int64(pc.Off) + int64(n), Addr: blame.Addrs[0], Stripe: blame.Stripe, Stripes: blame.Stripes,
			Mirror: blame.Mirror, Mirrors: blame.Mirrors, DSErr: dsErr, Err: err,
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
		(se.status() != nfs4.NFS4ERR_IO && se.status() != nfs4.NFS4ERR_DELAY) {
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
		if pcs, perr := l.plan(uint64(off), 1); perr == nil && len(pcs) == 1 {
			// Blame the first copy that cannot be used; with mirrors,
			// one good copy would have served the I/O, so name one.
			for i := range pcs[0].Copies {
				c := &pcs[0].Copies[i]
				ds := p.server(c)
				dsErr := ds.downErr()
				if dsErr == nil {
					dsErr = ds.probe(ctx)
				}
				if dsErr != nil && ctx.Err() == nil {
					return &DataServerError{Offset: off, Addr: c.Addrs[0], Stripe: c.Stripe, Stripes: c.Stripes,
						Mirror: c.Mirror, Mirrors: c.Mirrors, DSErr: dsErr, Err: err}
				}
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

// failover handles a failed data server (ds nil: the layout itself is
// unusable): the layout is invalidated and returned in the background,
// and the caller redoes its piece through the MDS. Later I/O asks for a
// new layout after a backoff; pieces on a data server that failed recently
// go straight to the MDS.
func (l *fileLayout) failover(f *File, c *layout.Copy, err error) {
	f.c.stats.failovers.Add(1)
	where := "layout"
	if c != nil {
		where = strings.Join(c.Addrs, ",")
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
	if c == nil {
		// The layout itself is unusable (say, a device the server no
		// longer knows): fetch its devices afresh with the next layout.
		for id := range l.devs {
			f.c.pnfs.forgetDevice(id, nil)
		}
	}
}

// noMDSError is the error of I/O a data server failed and the layout
// forbids sending through the metadata server (FF_FLAGS_NO_IO_THRU_MDS).
// It unwraps to NFS4ERR_IO, which is what the application sees (EIO).
type noMDSError struct{ op nfs4.NfsOpnum4 }

func (e noMDSError) Error() string {
	return "not sent there: the layout forbids I/O through the metadata server (FF_FLAGS_NO_IO_THRU_MDS)"
}

func (e noMDSError) Unwrap() error { return statusErr(e.op, nfs4.NFS4ERR_IO) }
