package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"sync"

	"github.com/shoalfs/shoal/internal/ctlproto"
	"github.com/shoalfs/shoal/internal/rpc"
	"github.com/shoalfs/shoal/meta"
	"github.com/shoalfs/shoal/store"
)

// Space management of striped files (NFSv4.2 ALLOCATE, DEALLOCATE, SEEK
// and READ_PLUS on the MDS): store.File's Allocate, PunchHole and Seek
// over the data servers, and the data servers' OBJ_ALLOCATE and OBJ_SEEK.
//
// A data server's object holds the stripe units of the positions it
// stands at, at their file offsets (sparse packing), and holes elsewhere.
// So a range is deallocated by punching it in every good copy's object
// (OBJ_PUNCH): the bytes of other positions' units there are holes
// already. Allocating and seeking must instead consider only the units of
// one position: a data server reserving the whole range would hold space
// for every position, and one seeking a hole would find one in the next
// unit, which another data server holds. Those calls carry the position's
// extents (ctl_extents) and go to one member of each position (SEEK) or
// to every good one (ALLOCATE).

// extents are the object bytes of one position's stripe units:
// [phase + k*stride, phase + k*stride + unit) for k >= 0; unit 0 means
// every byte.
type extents struct{ unit, stride, phase uint64 }

// extentsOf returns the extents of position p of m.
func extentsOf(m meta.StripeMap, p int) extents {
	n := uint64(len(m.DataServers))
	k := (uint64(p) + n - uint64(m.First)%n) % n // the first unit at p
	return extents{unit: m.Unit, stride: m.Unit * n, phase: k * m.Unit}
}

func (x extents) wire() ctlproto.CtlExtents {
	return ctlproto.CtlExtents{Unit: x.unit, Stride: x.stride, Phase: x.phase}
}

func extentsFrom(w ctlproto.CtlExtents) (extents, bool) {
	x := extents{unit: w.Unit, stride: w.Stride, phase: w.Phase}
	if x.unit == 0 {
		return x, true
	}
	ok := x.stride >= x.unit && x.stride%x.unit == 0 && x.phase < x.stride && x.stride <= 1<<62
	return x, ok
}

// at returns the first extent range [lo, hi) ending after pos, starting
// at pos if pos is inside one. hi is clipped to maxOff.
func (x extents) at(pos uint64) (lo, hi uint64) {
	if x.unit == 0 {
		return pos, maxOff
	}
	var start uint64
	if pos > x.phase {
		start = x.phase + (pos-x.phase)/x.stride*x.stride
		if pos >= start+x.unit {
			start += x.stride
		}
	} else {
		start = x.phase
	}
	if start >= maxOff {
		return maxOff, maxOff
	}
	return max(pos, start), min(start+x.unit, maxOff)
}

// maxOff is the largest object offset, plus one.
const maxOff = 1<<63 - 1

// maxSeekSteps bounds the extents one OBJ_SEEK examines: beyond them it
// answers with what is always true of a file, a hole at its end (for
// SEEK_HOLE) or data where it stopped (SEEK_DATA; reporting a hole as
// data is allowed, RFC 7862 §15.11.3).
const maxSeekSteps = 1 << 14

// objAllocate reserves space for the extents' bytes in [offset,
// offset+length) of an object (OBJ_ALLOCATE).
func (a *Agent) objAllocate(args *ctlproto.CtlAllocateArgs) ctlproto.CtlStatus {
	x, ok := extentsFrom(args.Extents)
	end := args.Offset + args.Length
	if !ok || args.Length == 0 || end < args.Offset || end > maxOff {
		return ctlproto.CTL_ERR_INVAL
	}
	if lo, _ := x.at(args.Offset); lo >= end {
		return ctlproto.CTL_OK // none of this position's units is in the range
	}
	f, err := a.cfg.Store.Open(args.Ino, true)
	if err != nil {
		return a.storeStatus("allocate", args.Ino, err)
	}
	defer f.Close()
	for pos := args.Offset; pos < end; {
		lo, hi := x.at(pos)
		if lo >= end {
			break
		}
		hi = min(hi, end)
		if err := f.Allocate(int64(lo), int64(hi-lo)); err != nil {
			return a.storeStatus("allocate", args.Ino, err)
		}
		pos = hi
	}
	return ctlproto.CTL_OK
}

// objSeek finds the next data or hole among the extents' bytes of an
// object (OBJ_SEEK).
func (a *Agent) objSeek(args *ctlproto.CtlSeekArgs) ctlproto.CtlSeekRes {
	x, ok := extentsFrom(args.Extents)
	data := args.What == ctlproto.CTL_SEEK_DATA
	if !ok || args.Offset >= maxOff || !data && args.What != ctlproto.CTL_SEEK_HOLE {
		return ctlproto.CtlSeekRes{Status: ctlproto.CTL_ERR_INVAL}
	}
	found := func(off uint64) ctlproto.CtlSeekRes {
		return ctlproto.CtlSeekRes{Status: ctlproto.CTL_OK, Ok: &ctlproto.CtlSeekOk{Found: true, Offset: off}}
	}
	none := ctlproto.CtlSeekRes{Status: ctlproto.CTL_OK, Ok: &ctlproto.CtlSeekOk{}}
	f, err := a.cfg.Store.Open(args.Ino, false)
	if errors.Is(err, fs.ErrNotExist) {
		if data {
			return none
		}
		lo, _ := x.at(args.Offset)
		return found(lo)
	}
	if err != nil {
		return ctlproto.CtlSeekRes{Status: a.storeStatus("seek", args.Ino, err)}
	}
	defer f.Close()
	n, err := f.Size()
	if err != nil {
		return ctlproto.CtlSeekRes{Status: a.storeStatus("seek", args.Ino, err)}
	}
	size := uint64(n)
	pos := args.Offset
	for range maxSeekSteps {
		lo, hi := x.at(pos)
		if lo >= size {
			// Past the object's end: all hole.
			if data {
				return none
			}
			return found(lo)
		}
		whence := store.SeekHole
		if data {
			whence = store.SeekData
		}
		p, err := seekObject(f, lo, whence, size)
		if err != nil {
			return ctlproto.CtlSeekRes{Status: a.storeStatus("seek", args.Ino, err)}
		}
		switch {
		case p < hi:
			return found(p)
		case data:
			pos = p // the next data is past this extent: look from there
		default:
			pos = hi // this extent is data to its end
		}
		if pos >= size {
			break
		}
	}
	if data {
		if pos >= size {
			return none
		}
		return found(pos)
	}
	// The first of the position's bytes past the object's end is a hole
	// (the object's end itself may be another position's unit, holding
	// data there).
	lo, _ := x.at(max(size, pos))
	return found(lo)
}

// seekObject is f.Seek from off (below size) with whence, counting past the
// end of the data as a hole and, on a store that cannot find holes, every
// byte before size as data. It returns size for data that is not there.
func seekObject(f store.File, off uint64, whence int, size uint64) (uint64, error) {
	p, err := f.Seek(int64(off), whence)
	switch {
	case errors.Is(err, io.EOF):
		if whence == store.SeekHole {
			return off, nil
		}
		return maxOff, nil
	case errors.Is(err, store.ErrNotSupported):
		if whence == store.SeekHole {
			return size, nil
		}
		return off, nil
	case err != nil:
		return 0, err
	}
	return uint64(p), nil
}

// changeGood applies a change to every good copy of m and settles it (see
// settle): with perPosition, fn runs once per position and good member,
// with that position; otherwise once per good data server (p is -1), and
// its outcome counts for every position it is a good member of.
func (s *Striped) changeGood(ctx context.Context, ino uint64, m meta.StripeMap, op string, perPosition bool,
	fn func(ctx context.Context, conn *rpc.Conn, id string, p int) error) error {
	if err := noCopy(ino, m); err != nil {
		return err
	}
	type call struct {
		id string
		p  int
	}
	var calls []call
	if perPosition {
		for p := range m.DataServers {
			for _, id := range m.Good(p) {
				calls = append(calls, call{id, p})
			}
		}
	} else {
		for _, id := range goodIDs(m) {
			calls = append(calls, call{id, -1})
		}
	}
	errs := make([]error, len(calls))
	_ = parallel(len(calls), func(i int) error {
		c := calls[i]
		conn, err := s.r.conn(c.id)
		if err == nil {
			err = fn(ctx, conn, c.id, c.p)
		}
		if err != nil {
			errs[i] = fmt.Errorf("cluster: %s ino %d on data server %s: %w", op, ino, c.id, err)
		}
		return nil
	})
	var results []copyResult
	for p := range m.DataServers {
		for _, id := range m.Good(p) {
			for i, c := range calls {
				if c.id == id && (c.p == p || c.p == -1) {
					results = append(results, copyResult{group: p, id: id, err: errs[i]})
				}
			}
		}
	}
	return s.settle(ctx, ino, len(m.DataServers), results)
}

// Allocate implements store.File: OBJ_ALLOCATE of each position's units
// in [off, off+length) on every good copy of the position, placing the
// file's data first if it has none. Copies that miss it are marked stale
// as for a write (see settle). Each object grows to the end of the last
// unit of its own it reserved, never past off+length. A data server whose
// file system cannot reserve space answers CTL_ERR_NOTSUPP, and Allocate
// fails with store.ErrNotSupported.
func (f *stripedFile) Allocate(off, length int64) error {
	if err := f.check(); err != nil {
		return err
	}
	if off < 0 || length <= 0 || off+length < off {
		return fmt.Errorf("cluster: allocate [%d,+%d): %w", off, length, fs.ErrInvalid)
	}
	defer f.s.lockIO(f.ino)()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	m, err := f.s.Place(ctx, f.ino)
	if err != nil {
		return err
	}
	var nosupp sync.Once
	var unsupported bool
	err = f.s.changeGood(ctx, f.ino, m, "allocate", true, func(ctx context.Context, conn *rpc.Conn, _ string, p int) error {
		var res ctlproto.CtlStatusRes
		err := call(ctx, conn, ctlproto.CTLPROC_OBJ_ALLOCATE, &ctlproto.CtlAllocateArgs{
			Ino: f.ino, Offset: uint64(off), Length: uint64(length), Extents: extentsOf(m, p).wire()}, &res)
		if err == nil {
			err = errOf(res.Status)
		}
		if errors.Is(err, store.ErrNotSupported) {
			nosupp.Do(func() { unsupported = true })
		}
		return err
	})
	if err != nil && unsupported {
		return fmt.Errorf("cluster: allocate ino %d: %w", f.ino, store.ErrNotSupported)
	}
	return err
}

// PunchHole implements store.File: OBJ_PUNCH of [off, off+length) on
// every good copy; objects keep their sizes, and copies that miss it are
// marked stale as for a write (see settle). A file without a stripe map
// has no data to punch.
func (f *stripedFile) PunchHole(off, length int64) error {
	if err := f.check(); err != nil {
		return err
	}
	if off < 0 || length <= 0 {
		return fmt.Errorf("cluster: punch hole [%d,+%d): %w", off, length, fs.ErrInvalid)
	}
	n := uint64(length)
	if uint64(off)+n > maxOff || uint64(off)+n < uint64(off) {
		n = maxOff - uint64(off)
	}
	defer f.s.lockIO(f.ino)()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	m, ok, err := f.s.Map(ctx, f.ino)
	if err != nil || !ok {
		return err
	}
	return f.s.changeGood(ctx, f.ino, m, "punch hole", false, func(ctx context.Context, conn *rpc.Conn, _ string, _ int) error {
		return objPunch(ctx, conn, f.ino, uint64(off), n)
	})
}

// Seek implements store.File: for each position of the file's stripe map,
// the first good copy that answers finds the position's next data or hole
// from off (OBJ_SEEK), and the nearest of them is the file's. SeekData
// returns io.EOF when no position has data from off on; SeekHole always
// finds one (the object ends are holes), which the caller bounds by the
// file's size. A file without a stripe map has no data: io.EOF.
func (f *stripedFile) Seek(off int64, whence int) (int64, error) {
	if err := f.check(); err != nil {
		return 0, err
	}
	if whence != store.SeekData && whence != store.SeekHole {
		return 0, fmt.Errorf("cluster: seek whence %d: %w", whence, fs.ErrInvalid)
	}
	if off < 0 {
		return 0, fmt.Errorf("cluster: seek to %d: %w", off, fs.ErrInvalid)
	}
	defer f.s.lockIO(f.ino)()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	m, ok, err := f.s.Map(ctx, f.ino)
	if err != nil {
		return 0, err
	}
	if !ok {
		return 0, io.EOF
	}
	if err := noCopy(f.ino, m); err != nil {
		return 0, err
	}
	what := ctlproto.CTL_SEEK_DATA
	if whence == store.SeekHole {
		what = ctlproto.CTL_SEEK_HOLE
	}
	type answer struct {
		found bool
		off   uint64
	}
	answers := make([]answer, len(m.DataServers))
	err = parallel(len(m.DataServers), func(p int) error {
		var errs []error
		for _, id := range m.Good(p) {
			ok, at, err := objSeek(ctx, f.s.r, f.ino, id, &ctlproto.CtlSeekArgs{
				Ino: f.ino, Offset: uint64(off), What: what, Extents: extentsOf(m, p).wire()})
			if err == nil {
				answers[p] = answer{ok, at}
				return nil
			}
			errs = append(errs, err)
		}
		return fmt.Errorf("cluster: seek ino %d position %d: %w", f.ino, p, errors.Join(errs...))
	})
	if err != nil {
		return 0, err
	}
	best, found := uint64(0), false
	for _, a := range answers {
		if a.found && (!found || a.off < best) {
			best, found = a.off, true
		}
	}
	if !found {
		return 0, io.EOF
	}
	return int64(best), nil
}

func objSeek(ctx context.Context, r *Registry, ino uint64, id string, args *ctlproto.CtlSeekArgs) (bool, uint64, error) {
	conn, err := r.conn(id)
	if err != nil {
		return false, 0, err
	}
	var res ctlproto.CtlSeekRes
	if err := call(ctx, conn, ctlproto.CTLPROC_OBJ_SEEK, args, &res); err != nil {
		return false, 0, fmt.Errorf("on %s: %w", id, err)
	}
	if err := errOf(res.Status); err != nil {
		return false, 0, fmt.Errorf("on %s: %w", id, err)
	}
	return res.Ok.Found, res.Ok.Offset, nil
}
