package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"sync"
	"time"

	"github.com/shoalfs/shoal/internal/ctlproto"
	"github.com/shoalfs/shoal/internal/rpc"
	"github.com/shoalfs/shoal/store"
)

// DefaultStripeUnit is the stripe unit NewStriped uses for 0: the Linux
// client's rsize/wsize, so one client RPC maps to one DS.
const DefaultStripeUnit = 1 << 20

// callTimeout bounds one object call; store.Backend has no context.
const callTimeout = 30 * time.Second

// maxParallel bounds the object calls one Striped operation has in flight.
const maxParallel = 16

// Striped is the MDS's store.Backend: file data striped over the data
// servers of a Registry, reached through the control protocol.
//
// Stripe unit k of inode ino (the bytes [k*unit, (k+1)*unit)) lives on the
// DS with stripe index (k + ino) mod n, at the same offset of that DS's
// object (sparse packing), where n = len(Registry.Members()). n counts
// every stripe index claimed since the registry started, in service or
// not, so a DS going down makes its units fail with ErrUnavailable instead
// of silently remapping every file. n does grow when a new DS joins, which
// would remap existing files: start the cluster with Registry.WaitFor the
// full set before serving data.
//
// Open does not contact the data servers: a file with no objects reads as
// empty, which is how the server treats a missing data file anyway.
type Striped struct {
	r    *Registry
	unit uint64

	mu   sync.Mutex
	verf map[string][8]byte // DS id -> boot verifier seen on its last write
	lost map[string]bool    // DS id -> restarted with uncommitted writes

	fbMu     sync.Mutex
	fallback map[int]store.Backend // stripe index -> shared storage (SetFallback)

	// dirty holds, per inode, the stripe indices written UNSTABLE since
	// their last commit, so that Sync commits only those. Writes clients
	// sent to data servers directly are not here: a client that has to
	// commit them through the MDS (its layout gone) sees the MDS's write
	// verifier, not the data server's, and resends them through the MDS.
	dirtyMu sync.Mutex
	dirty   map[uint64]map[int]struct{}
}

var (
	_ store.Backend = (*Striped)(nil)
	_ store.File    = (*stripedFile)(nil)
)

// NewStriped returns a Backend striping over r's data servers with the
// given stripe unit (DefaultStripeUnit if 0).
func NewStriped(r *Registry, stripeUnit uint64) *Striped {
	if stripeUnit == 0 {
		stripeUnit = DefaultStripeUnit
	}
	return &Striped{r: r, unit: stripeUnit, verf: map[string][8]byte{}, lost: map[string]bool{},
		dirty: map[uint64]map[int]struct{}{}}
}

// markDirty records an UNSTABLE write of ino on stripe index i.
func (s *Striped) markDirty(ino uint64, i int) {
	s.dirtyMu.Lock()
	defer s.dirtyMu.Unlock()
	d := s.dirty[ino]
	if d == nil {
		d = map[int]struct{}{}
		s.dirty[ino] = d
	}
	d[i] = struct{}{}
}

// takeDirty returns and forgets the stripe indices ino was written on
// since their last commit. A write that ends after this is marked again
// and committed by the next Sync; one that ended before is covered by the
// commit that follows.
func (s *Striped) takeDirty(ino uint64) []int {
	s.dirtyMu.Lock()
	defer s.dirtyMu.Unlock()
	d := s.dirty[ino]
	delete(s.dirty, ino)
	idx := make([]int, 0, len(d))
	for i := range d {
		idx = append(idx, i)
	}
	return idx
}

// Layout returns the striping of ino for LAYOUTGET: the stripe index of
// stripe unit 0 (nfl_first_stripe_index), the stripe unit, and the stripe
// width n. The device's stripe indices are 0..n-1, index i being
// Registry.Members()[i]. n is 0 while no DS has registered.
func (s *Striped) Layout(ino uint64) (firstIndex int, unit uint64, n int) {
	n = s.r.width()
	if n == 0 {
		return 0, s.unit, 0
	}
	return int(ino % uint64(n)), s.unit, n
}

// StripeUnit returns the stripe unit in bytes.
func (s *Striped) StripeUnit() uint64 { return s.unit }

// dsFor returns the stripe index holding file offset off of ino.
func (s *Striped) dsFor(ino, off uint64, n int) int {
	k := off / s.unit
	return int((k%uint64(n) + ino%uint64(n)) % uint64(n))
}

// piece is a part of an I/O that lives on one DS and fits in one call.
type piece struct {
	index  int    // stripe index
	off    uint64 // file (and object) offset
	lo, hi int    // range in the caller's buffer
}

// split cuts [off, off+length) at stripe unit boundaries and at maxIO.
func (s *Striped) split(ino, off uint64, length, n int) []piece {
	var ps []piece
	pos := 0
	for pos < length {
		o := off + uint64(pos)
		end := (o/s.unit + 1) * s.unit
		l := min(uint64(length-pos), end-o, maxIO)
		ps = append(ps, piece{index: s.dsFor(ino, o, n), off: o, lo: pos, hi: pos + int(l)})
		pos += int(l)
	}
	return ps
}

// parallel runs fn for 0..count-1 with bounded concurrency and joins the
// errors.
func parallel(count int, fn func(i int) error) error {
	if count == 1 {
		return fn(0)
	}
	errs := make([]error, count)
	sem := make(chan struct{}, maxParallel)
	var wg sync.WaitGroup
	for i := range count {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			errs[i] = fn(i)
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// width returns the stripe width or ErrNoDataServers.
func (s *Striped) width() (int, error) {
	n := s.r.width()
	if n == 0 {
		return 0, ErrNoDataServers
	}
	return n, nil
}

// Open implements store.Backend. It does not contact the data servers.
func (s *Striped) Open(ino uint64, create bool) (store.File, error) {
	if _, err := s.width(); err != nil {
		return nil, err
	}
	return &stripedFile{s: s, ino: ino, written: map[int]bool{}}, nil
}

// each runs an object call on every stripe index.
func (s *Striped) each(op string, ino uint64, fn func(ctx context.Context, index int) error) error {
	n, err := s.width()
	if err != nil {
		return err
	}
	return parallel(n, func(i int) error {
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		defer cancel()
		if err := fn(ctx, i); err != nil {
			return fmt.Errorf("cluster: %s ino %d on stripe index %d: %w", op, ino, i, err)
		}
		return nil
	})
}

// Remove implements store.Backend: OBJ_REMOVE on every DS.
func (s *Striped) Remove(ino uint64) error {
	s.dirtyMu.Lock()
	delete(s.dirty, ino)
	s.dirtyMu.Unlock()
	return s.each("remove", ino, func(ctx context.Context, i int) error {
		conn, _, err := s.r.conn(i)
		if err != nil {
			return err
		}
		var res ctlproto.CtlStatusRes
		if err := call(ctx, conn, ctlproto.CTLPROC_OBJ_REMOVE, &ctlproto.CtlInoArgs{Ino: ino}, &res); err != nil {
			return err
		}
		return errOf(res.Status)
	})
}

// Truncate implements store.Backend: OBJ_TRUNCATE to size on every DS, so
// every object has the file's size and Size stays the maximum.
func (s *Striped) Truncate(ino uint64, size uint64) error {
	return s.each("truncate", ino, func(ctx context.Context, i int) error {
		conn, _, err := s.r.conn(i)
		if err != nil {
			return err
		}
		var res ctlproto.CtlStatusRes
		if err := call(ctx, conn, ctlproto.CTLPROC_OBJ_TRUNCATE, &ctlproto.CtlTruncateArgs{Ino: ino, Size: size}, &res); err != nil {
			return err
		}
		return errOf(res.Status)
	})
}

// Sync implements store.Backend: OBJ_COMMIT on the DSes that hold UNSTABLE
// writes of ino made through this Striped since their last commit. It
// returns ErrDataLost if a DS restarted while holding uncommitted writes.
func (s *Striped) Sync(ino uint64) error {
	idx := s.takeDirty(ino)
	return parallel(len(idx), func(j int) error {
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		defer cancel()
		err := s.commit(ctx, ino, idx[j])
		if err != nil && !errors.Is(err, ErrDataLost) {
			// Not committed: the next Sync tries again. (ErrDataLost
			// did commit; what was lost is gone either way.)
			s.markDirty(ino, idx[j])
		}
		if err != nil {
			return fmt.Errorf("cluster: commit ino %d on stripe index %d: %w", ino, idx[j], err)
		}
		return nil
	})
}

func (s *Striped) commit(ctx context.Context, ino uint64, i int) error {
	conn, id, err := s.r.conn(i)
	if err != nil {
		return err
	}
	var res ctlproto.CtlCommitRes
	if err := call(ctx, conn, ctlproto.CTLPROC_OBJ_COMMIT, &ctlproto.CtlInoArgs{Ino: ino}, &res); err != nil {
		return err
	}
	if err := errOf(res.Status); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	prev, seen := s.verf[id]
	lost := s.lost[id] || (seen && prev != *res.Verifier)
	s.verf[id] = *res.Verifier
	delete(s.lost, id)
	if lost {
		return fmt.Errorf("%w (data server %s)", ErrDataLost, id)
	}
	return nil
}

// noteWrite records the verifier an unstable write returned.
func (s *Striped) noteWrite(id string, v [8]byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if prev, seen := s.verf[id]; seen && prev != v {
		s.lost[id] = true
	}
	s.verf[id] = v
}

// StatFS implements store.Backend: the sums over all data servers, from
// their last heartbeats.
func (s *Striped) StatFS() (total, free, avail uint64, err error) {
	for _, m := range s.r.Members() {
		total += m.Capacity
		free += m.Free
	}
	return total, free, free, nil
}

// Close implements store.Backend. The registry is not closed.
func (s *Striped) Close() error { return nil }

// SetFallback gives the MDS direct access to the storage of the data
// server at stripe index, for reads while that data server is unreachable.
// This is the shared-storage deployment of the pNFS papers (data servers as
// gateways to storage that survives them); in `shoal up` every data
// server's directory is on the MDS's machine. Without a fallback, the
// stripe units of a dead data server are unavailable until it returns.
func (s *Striped) SetFallback(index int, b store.Backend) {
	s.fbMu.Lock()
	defer s.fbMu.Unlock()
	if s.fallback == nil {
		s.fallback = map[int]store.Backend{}
	}
	s.fallback[index] = b
}

func (s *Striped) fallbackFor(index int) store.Backend {
	s.fbMu.Lock()
	defer s.fbMu.Unlock()
	return s.fallback[index]
}

// readFallback reads one piece from the fallback storage of its stripe
// index. It returns the object size and whether a fallback was used.
func (f *stripedFile) readFallback(index int, off uint64, dst []byte) (uint64, bool, error) {
	fb := f.s.fallbackFor(index)
	if fb == nil {
		return 0, false, nil
	}
	obj, err := fb.Open(f.ino, false)
	if errors.Is(err, fs.ErrNotExist) {
		clear(dst)
		return 0, true, nil
	}
	if err != nil {
		return 0, true, err
	}
	defer obj.Close()
	n, err := obj.ReadAt(dst, int64(off))
	if err != nil && !errors.Is(err, io.EOF) {
		return 0, true, err
	}
	clear(dst[n:])
	size, err := obj.Size()
	return uint64(size), true, err
}

// stripedFile is an open striped file.
type stripedFile struct {
	s   *Striped
	ino uint64

	mu      sync.Mutex
	closed  bool
	written map[int]bool // stripe indexes written through this handle
}

func (f *stripedFile) check() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return store.ErrClosed
	}
	return nil
}

// WriteAt implements io.WriterAt: the stripe pieces are written in
// parallel (unstable; Sync commits). On error the number of bytes written
// is reported as 0 although some pieces may have landed.
func (f *stripedFile) WriteAt(p []byte, off int64) (int, error) {
	if err := f.check(); err != nil {
		return 0, err
	}
	if off < 0 || uint64(off)+uint64(len(p)) > 1<<63-1 {
		return 0, fmt.Errorf("cluster: write at %d+%d: %w", off, len(p), fs.ErrInvalid)
	}
	if len(p) == 0 {
		return 0, nil
	}
	n, err := f.s.width()
	if err != nil {
		return 0, err
	}
	ps := f.s.split(f.ino, uint64(off), len(p), n)
	err = parallel(len(ps), func(i int) error {
		pc := ps[i]
		conn, id, err := f.s.r.conn(pc.index)
		if err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		defer cancel()
		var res ctlproto.CtlWriteRes
		if err := call(ctx, conn, ctlproto.CTLPROC_OBJ_WRITE,
			&ctlproto.CtlWriteArgs{Ino: f.ino, Offset: pc.off, Data: p[pc.lo:pc.hi]}, &res); err != nil {
			return fmt.Errorf("cluster: write ino %d at %d on %s: %w", f.ino, pc.off, id, err)
		}
		if err := errOf(res.Status); err != nil {
			return fmt.Errorf("cluster: write ino %d at %d on %s: %w", f.ino, pc.off, id, err)
		}
		if int(res.Ok.Count) != pc.hi-pc.lo {
			return fmt.Errorf("cluster: write ino %d at %d on %s: short write %d of %d: %w",
				f.ino, pc.off, id, res.Ok.Count, pc.hi-pc.lo, io.ErrShortWrite)
		}
		f.s.noteWrite(id, res.Ok.Verifier)
		f.s.markDirty(f.ino, pc.index)
		f.mu.Lock()
		f.written[pc.index] = true
		f.mu.Unlock()
		return nil
	})
	if err != nil {
		return 0, err
	}
	return len(p), nil
}

// ReadAt implements io.ReaderAt. Ranges no DS holds data for read as
// zeros; io.EOF is returned when the read reaches the file's end (the
// largest object size on any DS).
func (f *stripedFile) ReadAt(p []byte, off int64) (int, error) {
	if err := f.check(); err != nil {
		return 0, err
	}
	if off < 0 {
		return 0, fmt.Errorf("cluster: read at %d: %w", off, fs.ErrInvalid)
	}
	if len(p) == 0 {
		return 0, nil
	}
	n, err := f.s.width()
	if err != nil {
		return 0, err
	}
	ps := f.s.split(f.ino, uint64(off), len(p), n)
	sizes := make([]uint64, len(ps))
	err = parallel(len(ps), func(i int) error {
		pc := ps[i]
		dst := p[pc.lo:pc.hi]
		viaFallback := func(err error) error {
			if !errors.Is(err, ErrUnavailable) && !errors.Is(err, rpc.ErrConnClosed) {
				return err
			}
			size, used, ferr := f.readFallback(pc.index, pc.off, dst)
			if !used {
				return err
			}
			sizes[i] = size
			return ferr
		}
		conn, id, err := f.s.r.conn(pc.index)
		if err != nil {
			return viaFallback(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		defer cancel()
		var res ctlproto.CtlReadRes
		release, err := callRelease(ctx, conn, ctlproto.CTLPROC_OBJ_READ,
			&ctlproto.CtlReadArgs{Ino: f.ino, Offset: pc.off, Count: uint32(len(dst))}, &res)
		if err != nil {
			return viaFallback(fmt.Errorf("cluster: read ino %d at %d on %s: %w", f.ino, pc.off, id, err))
		}
		// res.Ok.Data aliases the reply's record buffer, which goes back
		// to its pool once the data is copied into the caller's buffer;
		// nothing else is kept from res.
		defer release()
		if res.Status == ctlproto.CTL_ERR_NOENT {
			clear(dst)
			return nil
		}
		if err := errOf(res.Status); err != nil {
			return fmt.Errorf("cluster: read ino %d at %d on %s: %w", f.ino, pc.off, id, err)
		}
		got := copy(dst, res.Ok.Data)
		clear(dst[got:])
		sizes[i] = res.Ok.Size
		return nil
	})
	if err != nil {
		return 0, err
	}
	end := uint64(off) + uint64(len(p))
	size := uint64(0)
	for _, sz := range sizes {
		size = max(size, sz)
	}
	if size < end {
		// The DSes read from end before the range does; another DS may
		// still hold data further on.
		all, err := f.Size()
		if err != nil {
			return 0, err
		}
		size = max(size, uint64(all))
	}
	if size >= end {
		return len(p), nil
	}
	if size <= uint64(off) {
		return 0, io.EOF
	}
	return int(size - uint64(off)), io.EOF
}

// Size implements store.File: the largest object size on any DS.
func (f *stripedFile) Size() (int64, error) {
	if err := f.check(); err != nil {
		return 0, err
	}
	n, err := f.s.width()
	if err != nil {
		return 0, err
	}
	sizes := make([]uint64, n)
	err = f.s.each("getsize", f.ino, func(ctx context.Context, i int) error {
		viaFallback := func(err error) error {
			if !errors.Is(err, ErrUnavailable) && !errors.Is(err, rpc.ErrConnClosed) {
				return err
			}
			size, used, ferr := f.readFallback(i, 0, nil)
			if !used {
				return err
			}
			sizes[i] = size
			return ferr
		}
		conn, _, err := f.s.r.conn(i)
		if err != nil {
			return viaFallback(err)
		}
		var res ctlproto.CtlGetsizeRes
		if err := call(ctx, conn, ctlproto.CTLPROC_OBJ_GETSIZE, &ctlproto.CtlInoArgs{Ino: f.ino}, &res); err != nil {
			return viaFallback(err)
		}
		if res.Status == ctlproto.CTL_ERR_NOENT {
			return nil
		}
		if err := errOf(res.Status); err != nil {
			return err
		}
		sizes[i] = *res.Size
		return nil
	})
	if err != nil {
		return 0, err
	}
	var size uint64
	for _, sz := range sizes {
		size = max(size, sz)
	}
	return int64(size), nil
}

// Sync implements store.File: OBJ_COMMIT on the DSes this handle wrote to.
func (f *stripedFile) Sync() error {
	if err := f.check(); err != nil {
		return err
	}
	f.mu.Lock()
	idx := make([]int, 0, len(f.written))
	for i := range f.written {
		idx = append(idx, i)
	}
	f.mu.Unlock()
	return parallel(len(idx), func(j int) error {
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		defer cancel()
		if err := f.s.commit(ctx, f.ino, idx[j]); err != nil {
			return fmt.Errorf("cluster: commit ino %d on stripe index %d: %w", f.ino, idx[j], err)
		}
		f.mu.Lock()
		delete(f.written, idx[j])
		f.mu.Unlock()
		return nil
	})
}

// Allocate is not supported on striped files.
func (f *stripedFile) Allocate(off, length int64) error {
	return fmt.Errorf("cluster: allocate: %w", store.ErrNotSupported)
}

// PunchHole is not supported on striped files.
func (f *stripedFile) PunchHole(off, length int64) error {
	return fmt.Errorf("cluster: punch hole: %w", store.ErrNotSupported)
}

// Seek implements store.File without hole detection: everything before
// the end of the file counts as data (as POSIX allows), so SeekData returns
// off and SeekHole the file size; at or past the end both return io.EOF.
func (f *stripedFile) Seek(off int64, whence int) (int64, error) {
	if whence != store.SeekData && whence != store.SeekHole {
		return 0, fmt.Errorf("cluster: seek whence %d: %w", whence, fs.ErrInvalid)
	}
	if off < 0 {
		return 0, fmt.Errorf("cluster: seek to %d: %w", off, fs.ErrInvalid)
	}
	size, err := f.Size()
	if err != nil {
		return 0, err
	}
	switch {
	case off >= size:
		return 0, io.EOF
	case whence == store.SeekData:
		return off, nil
	default:
		return size, nil
	}
}

// Close implements store.File; it is idempotent.
func (f *stripedFile) Close() error {
	f.mu.Lock()
	f.closed = true
	f.mu.Unlock()
	return nil
}
