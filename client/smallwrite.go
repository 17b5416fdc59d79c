package client

import (
	"context"
	"errors"
	"io"

	"github.com/shoalfs/shoal/internal/nfs4"
)

// WriteAtSyncSetAttr writes p at off to stable storage, then changes the
// attributes set in sa, and returns the object's attributes after both:
// for a small file written whole at its close, whose writer also sets
// its mtime (a writeback cache passing on the time of the buffered
// writes). Where WriteAtSync's conditions for a single FILE_SYNC WRITE
// hold and p fits one WRITE, the WRITE, the SETATTR and a GETATTR go to
// the metadata server in one COMPOUND: one round trip, and one durable
// commit at a server that makes a COMPOUND's changes durable together
// (Shoal's MDS does), instead of one per COMPOUND. Otherwise it is
// WriteAtSync followed by the client's SetAttrHandle.
//
// err is the write's error, and n how much of p was written. The
// attribute change can fail on its own (a writer who does not own the
// file may not set its times): setErr then says why, n is len(p), and the
// attributes returned come from a separate GETATTR (aok false if that
// failed too). An empty sa only fetches the attributes.
func (f *File) WriteAtSyncSetAttr(ctx context.Context, p []byte, off int64, sa SetAttr) (n int, a Attr, aok bool, setErr, err error) {
	if off < 0 || len(p) == 0 || !f.writable() || len(p) >= f.c.pol.SmallIOThreshold ||
		len(p) > int(f.c.maxWrite) || f.writeEnd.Load() == off+1 {
		return f.writeThenSetAttr(ctx, p, off, sa)
	}
	if _, err := f.ioStateid(); err != nil {
		return 0, Attr{}, false, nil, pathErr("write", f.path, err)
	}
	if f.ino != nil && f.c.cache.pending(f.ino) {
		if err := f.c.cache.flushAll(ctx, f, f.ino); err != nil {
			return 0, Attr{}, false, nil, pathErr("write", f.path, err)
		}
	}
	var setOps []nfs4.NfsArgop4
	if !sa.empty() {
		setOps = []nfs4.NfsArgop4{setattrOp(nfs4.Stateid4{}, sa.encode())}
	}
	reopened := 0
	var res []nfs4.NfsResop4
	f.resendMu.RLock()
	for {
		gen := f.openGen()
		res, err = f.c.callIO(ctx, func() []nfs4.NfsArgop4 {
			sid, _ := f.ioStateid()
			ops := make([]nfs4.NfsArgop4, 0, 4)
			ops = append(ops, putfh(f.fh), nfs4.NfsArgop4{Argop: nfs4.OP_WRITE, Opwrite: &nfs4.WRITE4args{
				Stateid: sid, Offset: uint64(off), Stable: nfs4.FILE_SYNC4, Data: p,
			}})
			ops = append(ops, setOps...)
			return append(ops, getattr(statBits))
		})
		if err != nil && len(res) < 2 && reopened < maxReopens && staleState(err) {
			if ok, rerr := f.c.recoverOpen(ctx, f, gen); ok {
				reopened++
				continue
			} else if rerr != nil {
				err = errors.Join(err, rerr)
			}
		}
		break
	}
	f.resendMu.RUnlock()
	if len(res) < 2 || res[1].Opwrite == nil || res[1].Opwrite.Resok4 == nil {
		// The WRITE failed (or never ran): nothing was written.
		if err == nil {
			err = errors.New("nfs: WRITE result missing")
		}
		return 0, Attr{}, false, nil, pathErr("write", f.path, f.blameDataServer(ctx, off, err))
	}
	ok := res[1].Opwrite.Resok4
	n = int(min(ok.Count, uint32(len(p))))
	f.c.stats.mdsIOBytes.Add(uint64(n))
	f.noteWrite(ok.Committed)
	if ok.Committed == nfs4.UNSTABLE4 && n > 0 {
		// A server that answers less than FILE_SYNC gets its COMMIT at
		// the next Sync, as for any UNSTABLE write.
		f.unst.insert(newHeld(uint64(off), p[:n], ok.Writeverf))
	}
	f.grewTo(uint64(off) + uint64(n))
	if f.ino != nil {
		f.c.cache.update(f.ino, p[:n], off)
	}
	if n < len(p) {
		// A short WRITE: the rest goes on its own, and the attributes
		// after it.
		m, werr := f.WriteAtSync(ctx, p[n:], off+int64(n))
		n += m
		if werr == nil && m < len(p[n-m:]) {
			werr = io.ErrShortWrite
		}
		if werr != nil {
			return n, Attr{}, false, nil, werr
		}
		a, aok, setErr = f.setAttrAfter(ctx, sa)
		return n, a, aok, setErr, nil
	}
	if err != nil {
		// The WRITE is done; the SETATTR (or the GETATTR) failed.
		if len(setOps) > 0 && len(res) == 3 {
			setErr = pathErr("setattr", f.path, err)
			a, serr := f.statServer(ctx)
			return n, a, serr == nil, setErr, nil
		}
		a, serr := f.statServer(ctx)
		return n, a, serr == nil, nil, nil
	}
	a, aerr := lastAttr(res)
	return n, a, aerr == nil, nil, nil
}

// writeThenSetAttr is WriteAtSyncSetAttr in separate COMPOUNDs.
func (f *File) writeThenSetAttr(ctx context.Context, p []byte, off int64, sa SetAttr) (int, Attr, bool, error, error) {
	n, err := f.WriteAtSync(ctx, p, off)
	if err != nil {
		return n, Attr{}, false, nil, err
	}
	a, aok, setErr := f.setAttrAfter(ctx, sa)
	return n, a, aok, setErr, nil
}

// setAttrAfter applies sa after a write and returns the attributes,
// asking for them on their own if the change was refused.
func (f *File) setAttrAfter(ctx context.Context, sa SetAttr) (Attr, bool, error) {
	if sa.empty() {
		a, err := f.statServer(ctx)
		return a, err == nil, nil
	}
	a, err := f.c.SetAttrHandle(ctx, f.fh, sa)
	if err == nil {
		return a, true, nil
	}
	a, serr := f.statServer(ctx)
	return a, serr == nil, err
}
