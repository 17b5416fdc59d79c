package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/shoalfs/shoal/internal/nfs4"
)

// A File's data path: ReadAt and WriteAt dispatch on the access method
// (cache.go), and direct I/O goes to a layout's data servers (layoutio.go)
// or through the metadata server, split into requests in flight at once;
// Sync commits.

// maxIOInFlight bounds the RPCs one ReadAt or WriteAt keeps outstanding.
const maxIOInFlight = 16

func (f *File) ioStateid() (nfs4.Stateid4, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nfs4.Stateid4{}, ErrClosed
	}
	sid := f.stateid
	sid.Seqid = 0 // "the current one": immune to seqid races with LOCK/OPEN
	return sid, f.lk.lost
}

// ReadAt implements io.ReaderAt. Reads larger than Client.MaxRead are split
// into several READs that are in flight at once.
func (f *File) ReadAt(p []byte, off int64) (int, error) {
	return f.ReadAtContext(context.Background(), p, off)
}

// ReadAtContext is ReadAt with a context.
func (f *File) ReadAtContext(ctx context.Context, p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, pathErr("read", f.path, syscall.EINVAL)
	}
	if len(p) == 0 {
		return 0, nil
	}
	if _, err := f.ioStateid(); err != nil {
		return 0, pathErr("read", f.path, err)
	}
	var n int
	var err error
	if f.mode() == AccessCached {
		n, err = f.c.cache.read(ctx, f, p, off)
	} else {
		// Whatever the cache or a gather buffer holds for the file goes
		// to the server first (read-your-writes across Files).
		if f.c.cache.pending(f.ino) {
			if err := f.c.cache.flushAll(ctx, f, f.ino); err != nil {
				return 0, pathErr("read", f.path, err)
			}
		}
		n, err = f.readDirect(ctx, p, off)
	}
	if err != nil && err != io.EOF {
		return n, pathErr("read", f.path, err)
	}
	return n, err
}

// readDirect reads p at off from the data servers or the MDS, as asked.
func (f *File) readDirect(ctx context.Context, p []byte, off int64) (int, error) {
	if f.c.pol.large(&f.readEnd, len(p), off) {
		if l := f.layoutFor(ctx); l != nil {
			n, err := l.read(ctx, f, p, off)
			l.release(f)
			return n, err
		}
	}
	chunk := int(f.c.maxRead)
	n, err := parallel(ctx, len(p), chunk, func(i, lo, hi int) (int, bool, error) {
		return f.c.readChunk(ctx, f, p[lo:hi], off+int64(lo))
	})
	if err != nil {
		return n, f.blameDataServer(ctx, off+int64(n), err)
	}
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// maxEmptyReads bounds how often readChunk asks again after a READ that
// returned no data and no EOF.
const maxEmptyReads = 3

// readChunk fills b from off with READs until b is full or the server
// reports EOF.
func (c *Client) readChunk(ctx context.Context, f *File, b []byte, off int64) (int, bool, error) {
	n := 0
	reopened, empty := 0, 0
	for n < len(b) {
		if _, err := f.ioStateid(); err != nil {
			return n, false, err
		}
		want := uint32(len(b) - n)
		gen := f.openGen()
		res, release, err := c.callIORelease(ctx, c.ioBudget(), func() []nfs4.NfsArgop4 {
			sid, _ := f.ioStateid()
			return []nfs4.NfsArgop4{putfh(f.fh), {Argop: nfs4.OP_READ, Opread: &nfs4.READ4args{
				Stateid: sid, Offset: uint64(off) + uint64(n), Count: want,
			}}}
		})
		if err != nil {
			if reopened < maxReopens && staleState(err) {
				if ok, rerr := c.recoverOpen(ctx, f, gen); ok {
					reopened++
					continue
				} else if rerr != nil {
					err = errors.Join(err, rerr)
				}
			}
			return n, false, err
		}
		ok := res[1].Opread.Resok4
		got := copy(b[n:], ok.Data)
		eof := ok.Eof
		release() // the data is copied out; nothing else aliases the reply
		c.stats.mdsIOBytes.Add(uint64(got))
		n += got
		if eof {
			return n, true, nil
		}
		if got == 0 {
			// No data and no EOF below what was asked: a server may
			// answer a READ short, but taking this for the end of the
			// file would hand the caller a file cut short. Ask again a
			// few times, then fail rather than guess.
			empty++
			if empty > maxEmptyReads {
				return n, false, fmt.Errorf("READ at %d: %w (%d empty replies without EOF)", off+int64(n), io.ErrUnexpectedEOF, empty)
			}
			continue
		}
		empty = 0
	}
	return n, false, nil
}

// parallel splits [0,total) into chunks of size chunk and runs do on them
// with at most maxIOInFlight at once. It returns the number of bytes done
// contiguously from the start and the first error within them. do returns
// (bytes done, short-by-design, error); a chunk done short ends the run.
func parallel(ctx context.Context, total, chunk int, do func(i, lo, hi int) (int, bool, error)) (int, error) {
	if chunk <= 0 {
		chunk = 1 << 20
	}
	nchunks := (total + chunk - 1) / chunk
	if nchunks == 1 {
		n, _, err := do(0, 0, total)
		return n, err
	}
	type result struct {
		n   int
		err error
	}
	results := make([]result, nchunks)
	sem := make(chan struct{}, maxIOInFlight)
	var wg sync.WaitGroup
	for i := range nchunks {
		lo := i * chunk
		hi := min(lo+chunk, total)
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			n, _, err := do(i, lo, hi)
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
		if lo, hi := i*chunk, min((i+1)*chunk, total); r.n < hi-lo {
			break
		}
	}
	return done, nil
}

// WriteAt implements io.WriterAt. Writes larger than Client.MaxWrite are
// split into several WRITEs in flight at once. p is sent without copying
// and is not retained after WriteAt returns. Data is written UNSTABLE
// (unless the file was opened O_SYNC) and made durable by Sync or Close;
// until then the File keeps a copy of what the server took UNSTABLE, to
// write it again if the server loses it (Policy.UnstableLimit).
func (f *File) WriteAt(p []byte, off int64) (int, error) {
	return f.WriteAtContext(context.Background(), p, off)
}

// WriteAtContext is WriteAt with a context. If ctx ends while WRITEs are
// in flight, they complete in the background and may still read p until
// they do; keep p unchanged until the File is closed in that case.
func (f *File) WriteAtContext(ctx context.Context, p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, pathErr("write", f.path, syscall.EINVAL)
	}
	if f.access&nfs4.OPEN4_SHARE_ACCESS_WRITE == 0 {
		return 0, pathErr("write", f.path, syscall.EBADF)
	}
	if len(p) == 0 {
		return 0, nil
	}
	if _, err := f.ioStateid(); err != nil {
		return 0, pathErr("write", f.path, err)
	}
	var n int
	var err error
	switch f.mode() {
	case AccessCached:
		f.cacheWrote.Store(true)
		n, err = f.c.cache.write(ctx, f, p, off)
	case AccessODirect:
		f.cacheWrote.Store(true)
		n, err = f.c.cache.gather(ctx, f, p, off, f.c.pol.BlockSize)
	default:
		n, err = f.c.cache.writeThrough(ctx, f, p, off)
	}
	if err == nil && n < len(p) {
		err = io.ErrShortWrite
	}
	return n, pathErr("write", f.path, err)
}

// large decides whether a request of n bytes at off is large enough for
// the data servers (Policy.SmallIOThreshold). It judges the application's
// request, not the pieces it reaches the library in: a short request that
// starts where a large one ended is taken for the tail of the same
// request. The kernel cuts a request whose buffer is not page aligned at
// the FUSE request size, so that fio's 1 MiB buffers reach a direct_io
// mount as 1 MiB - 16 B and then 16 B; without this the 16 bytes made a
// synchronous trip through the MDS after every large WRITE or READ. end
// holds where the last large request ended, plus one (0: none).
func (p *Policy) large(end *atomic.Int64, n int, off int64) bool {
	if n >= p.SmallIOThreshold {
		end.Store(off + int64(n) + 1)
		return true
	}
	return end.CompareAndSwap(off+1, 0)
}

// WriteAtSync is WriteAt with p on stable storage when it returns, for
// data that would be committed right away anyway: a small file written
// whole just before its close. A request under Policy.SmallIOThreshold
// goes to the metadata server as FILE_SYNC WRITEs, so the close that
// follows has nothing to COMMIT: one round trip fewer, and the same one
// disk flush on the server (the kernel NFS client writes a flush that
// fits in one WRITE with FILE_SYNC for the same reason). Anything else is
// WriteAt followed by Sync. Data the File's cache or gather buffer holds
// is written back first.
func (f *File) WriteAtSync(ctx context.Context, p []byte, off int64) (int, error) {
	if off < 0 || len(p) == 0 || !f.writable() || len(p) >= f.c.pol.SmallIOThreshold || f.writeEnd.Load() == off+1 {
		n, err := f.WriteAtContext(ctx, p, off)
		if err != nil || len(p) == 0 {
			return n, err
		}
		return n, f.SyncContext(ctx)
	}
	if _, err := f.ioStateid(); err != nil {
		return 0, pathErr("write", f.path, err)
	}
	if f.ino != nil && f.c.cache.pending(f.ino) {
		if err := f.c.cache.flushAll(ctx, f, f.ino); err != nil {
			return 0, pathErr("write", f.path, err)
		}
	}
	f.resendMu.RLock()
	n, err := parallel(ctx, len(p), int(f.c.maxWrite), func(i, lo, hi int) (int, bool, error) {
		// keep: a server that answers less than FILE_SYNC gets its
		// COMMIT at the next Sync, as for any UNSTABLE write.
		n, _, _, err := f.c.mdsWrite(ctx, f, p[lo:hi], off+int64(lo), nfs4.FILE_SYNC4, true)
		return n, false, err
	})
	f.resendMu.RUnlock()
	if err != nil {
		err = f.blameDataServer(ctx, off+int64(n), err)
	}
	f.grewTo(uint64(off) + uint64(n))
	if f.ino != nil {
		f.c.cache.update(f.ino, p[:n], off)
	}
	if err == nil && n < len(p) {
		err = io.ErrShortWrite
	}
	return n, pathErr("write", f.path, err)
}

// writeDirect writes p at off to the data servers or the MDS, as asked.
// Unless the File is O_SYNC, what the servers take UNSTABLE is kept until
// a COMMIT vouches for it (unstable.go); a write larger than a quarter of
// Policy.UnstableLimit goes out in parts of that size, and before each the
// File makes room for it (makeRoom: a commit in the background past half
// the limit, a wait for it past the limit).
func (f *File) writeDirect(ctx context.Context, p []byte, off int64) (int, error) {
	if f.flag&os.O_SYNC != 0 {
		return f.writeOut(ctx, p, off)
	}
	part := max(int(f.c.pol.UnstableLimit/4), maxIOSize)
	done := 0
	for done < len(p) {
		k := min(part, len(p)-done)
		f.unst.makeRoom(ctx, f, k)
		n, err := f.writeOut(ctx, p[done:done+k], off+int64(done))
		done += n
		if err != nil {
			return done, err
		}
	}
	return done, nil
}

// writeOut is writeDirect for one part.
func (f *File) writeOut(ctx context.Context, p []byte, off int64) (int, error) {
	var n int
	var err error
	var l *fileLayout
	if f.c.pol.large(&f.writeEnd, len(p), off) {
		l = f.layoutFor(ctx)
	}
	f.resendMu.RLock()
	if l != nil {
		n, err = l.run(ctx, f, p, off, true)
	} else {
		n, err = parallel(ctx, len(p), int(f.c.maxWrite), func(i, lo, hi int) (int, bool, error) {
			return f.c.writeChunk(ctx, f, p[lo:hi], off+int64(lo))
		})
	}
	f.resendMu.RUnlock()
	if l != nil {
		l.release(f)
		if err == nil && f.flag&os.O_SYNC != 0 {
			// Data servers answer DATA_SYNC: the size and mtime need a
			// LAYOUTCOMMIT to be stable too.
			err = l.sync(ctx, f)
		}
	} else if err != nil {
		err = f.blameDataServer(ctx, off+int64(n), err)
	}
	f.grewTo(uint64(off) + uint64(n))
	if err == nil && n < len(p) {
		err = io.ErrShortWrite
	}
	return n, err
}

// writeChunk writes b at off through the MDS: UNSTABLE, kept until
// committed, unless the File is O_SYNC.
func (c *Client) writeChunk(ctx context.Context, f *File, b []byte, off int64) (int, bool, error) {
	stable := nfs4.UNSTABLE4
	if f.flag&os.O_SYNC != 0 {
		stable = nfs4.FILE_SYNC4
	}
	n, _, _, err := c.mdsWrite(ctx, f, b, off, stable, stable == nfs4.UNSTABLE4)
	return n, false, err
}

// mdsWrite writes b at off through the MDS with WRITEs of the given
// stability until it is all written. With keep, what the MDS answers
// UNSTABLE is kept for the File's next commit through the MDS. It returns
// the weakest stability the MDS answered and its last write verifier.
func (c *Client) mdsWrite(ctx context.Context, f *File, b []byte, off int64, stable nfs4.StableHow4, keep bool) (int, nfs4.StableHow4, nfs4.Verifier4, error) {
	n := 0
	committed := nfs4.FILE_SYNC4
	var verf nfs4.Verifier4
	reopened := 0
	for n < len(b) {
		if _, err := f.ioStateid(); err != nil {
			return n, committed, verf, err
		}
		gen := f.openGen()
		res, err := c.callIO(ctx, func() []nfs4.NfsArgop4 {
			sid, _ := f.ioStateid()
			return []nfs4.NfsArgop4{putfh(f.fh), {Argop: nfs4.OP_WRITE, Opwrite: &nfs4.WRITE4args{
				Stateid: sid, Offset: uint64(off) + uint64(n), Stable: stable, Data: b[n:],
			}}}
		})
		if err != nil {
			if reopened < maxReopens && staleState(err) {
				if ok, rerr := c.recoverOpen(ctx, f, gen); ok {
					reopened++
					continue
				} else if rerr != nil {
					err = errors.Join(err, rerr)
				}
			}
			return n, committed, verf, err
		}
		ok := res[1].Opwrite.Resok4
		cnt := int(min(ok.Count, uint32(len(b)-n)))
		c.stats.mdsIOBytes.Add(uint64(cnt))
		verf = ok.Writeverf
		committed = min(committed, ok.Committed)
		if keep {
			f.noteWrite(ok.Committed)
			if ok.Committed == nfs4.UNSTABLE4 && cnt > 0 {
				f.unst.insert(newHeld(uint64(off)+uint64(n), b[n:n+cnt], ok.Writeverf))
			}
		}
		if ok.Count == 0 {
			return n, committed, verf, io.ErrShortWrite
		}
		n += cnt
	}
	return n, committed, verf, nil
}

// noteWrite records a WRITE through the MDS for the commit that follows.
func (f *File) noteWrite(committed nfs4.StableHow4) {
	if committed == nfs4.FILE_SYNC4 {
		return
	}
	f.mu.Lock()
	f.dirty = true
	f.mu.Unlock()
}

// Read implements io.Reader at the file offset.
func (f *File) Read(p []byte) (int, error) {
	f.mu.Lock()
	off := f.off
	f.mu.Unlock()
	n, err := f.ReadAt(p, off)
	f.mu.Lock()
	f.off = off + int64(n)
	f.mu.Unlock()
	if err == io.EOF && n > 0 {
		err = nil
	}
	return n, err
}

// Write implements io.Writer at the file offset (or at the end with
// O_APPEND).
func (f *File) Write(p []byte) (int, error) {
	f.mu.Lock()
	off := f.off
	f.mu.Unlock()
	if f.flag&os.O_APPEND != 0 {
		a, err := f.Stat(context.Background())
		if err != nil {
			return 0, err
		}
		off = int64(a.Size)
	}
	n, err := f.WriteAt(p, off)
	f.mu.Lock()
	f.off = off + int64(n)
	f.mu.Unlock()
	return n, err
}

// Seek implements io.Seeker. io.SeekEnd asks the server for the size.
func (f *File) Seek(offset int64, whence int) (int64, error) {
	var base int64
	switch whence {
	case io.SeekStart:
	case io.SeekCurrent:
		f.mu.Lock()
		base = f.off
		f.mu.Unlock()
	case io.SeekEnd:
		a, err := f.Stat(context.Background())
		if err != nil {
			return 0, err
		}
		base = int64(a.Size)
	default:
		return 0, pathErr("seek", f.path, syscall.EINVAL)
	}
	if base+offset < 0 {
		return 0, pathErr("seek", f.path, syscall.EINVAL)
	}
	f.mu.Lock()
	f.off = base + offset
	f.mu.Unlock()
	return base + offset, nil
}

// Sync commits UNSTABLE writes to stable storage with COMMIT. Data a
// COMMIT does not vouch for (the server restarted or could not be
// reached since the WRITE) is written again through the metadata server;
// Sync returns an error wrapping ErrVerifierChanged only if even that
// fails, meaning data written since the last successful Sync may be lost.
func (f *File) Sync() error { return f.SyncContext(context.Background()) }

// SyncContext is Sync with a context.
//
// With pNFS, data written to data servers is committed there (COMMIT to
// each of them, then LAYOUTCOMMIT to the MDS), and data written through
// the MDS with a COMMIT to the MDS.
//
// Data the Client caches or gathers for the file is written back first,
// and since any open File of the file may have carried it, every such
// File of the Client commits.
func (f *File) SyncContext(ctx context.Context) error {
	if f.ino == nil {
		return f.syncOwn(ctx)
	}
	errs := []error{pathErr("sync", f.path, f.c.cache.flushAll(ctx, f, f.ino))}
	f.c.cache.mu.Lock()
	ws := make([]*File, 0, len(f.ino.writers))
	for w := range f.ino.writers {
		if w != f {
			ws = append(ws, w)
		}
	}
	f.c.cache.mu.Unlock()
	errs = append(errs, f.syncOwn(ctx))
	for _, w := range ws {
		if err := w.syncOwn(ctx); err != nil && !errors.Is(err, ErrClosed) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// syncOwn commits what went out through this File.
func (f *File) syncOwn(ctx context.Context) error {
	if f.c.pnfs != nil {
		f.waitRetired(ctx)
	}
	// A commit makeRoom started reports its error in f.layErr: it ends
	// first, so that this Sync reports it.
	f.unst.waitCommit(ctx)
	errs := []error{f.unst.commitHeld(ctx, f, false)}
	f.mu.Lock()
	errs = append(errs, f.layErr)
	f.layErr = nil
	f.mu.Unlock()
	return pathErr("sync", f.path, errors.Join(errs...))
}

// commitMDS sends COMMIT to the MDS. What was written UNSTABLE through it
// under another verifier than the COMMIT answers, or everything if the
// COMMIT fails, is written again with FILE_SYNC.
func (c *Client) commitMDS(ctx context.Context, f *File) error {
	f.mdsMu.Lock()
	defer f.mdsMu.Unlock()
	f.mu.Lock()
	f.dirty = false
	f.mu.Unlock()
	cutoff := f.unst.seqNow()
	res, err := c.callIO(ctx, fixed([]nfs4.NfsArgop4{putfh(f.fh), {Argop: nfs4.OP_COMMIT, Opcommit: &nfs4.COMMIT4args{}}}))
	if err != nil && ctx.Err() != nil {
		f.mu.Lock()
		f.dirty = true // not committed: the next Sync tries again
		f.mu.Unlock()
		return err
	}
	var v nfs4.Verifier4
	if err == nil {
		v = res[1].Opcommit.Resok4.Writeverf
	}
	unvouched := func(h *held) bool { return h.lay == nil && h.seq <= cutoff && (err != nil || h.verf != v) }
	if f.unst.any(unvouched) {
		why := "the metadata server's write verifier changed"
		if err != nil {
			why = "COMMIT to the metadata server failed: " + err.Error()
		}
		return f.unst.resendHeld(ctx, f, unvouched, why)
	}
	if err != nil {
		f.mu.Lock()
		f.dirty = true
		f.mu.Unlock()
		return err
	}
	f.unst.drop(func(h *held) bool { return h.lay == nil && h.seq <= cutoff && h.verf == v })
	return nil
}
