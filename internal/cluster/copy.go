package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"slices"

	"github.com/shoalfs/shoal/internal/ctlproto"
	"github.com/shoalfs/shoal/internal/rpc"
	"github.com/shoalfs/shoal/meta"
	"github.com/shoalfs/shoal/store"
)

// Server-side copy on a pNFS cluster (NFSv4.2 COPY and CLONE on the MDS):
// Striped.CopyRange and the data servers' OBJ_COPY.
//
// With sparse packing a data server's object holds the units of its
// positions at their file offsets. When the source range's units and the
// units they are copied to belong to the same positions of two maps with
// the same members (the maps "line up"), every data server already holds
// the bytes it is to hold in the destination: OBJ_COPY has it copy them
// from one object to the other, and no byte crosses the network. The
// common case, `cp` of a whole file into a new one, is made to line up:
// a destination without a map gets one like its source's (placeLike), and
// an empty destination with another map (the Linux client takes a layout
// in the OPEN that creates the file) has its map changed to such a one,
// its layouts recalled and held back meanwhile (alignEmpty). Otherwise
// CopyRange answers store.ErrNotSupported and the MDS copies through its
// own buffer (server.copyData): correct, but every byte then passes
// through the MDS, from and to the data servers.

var _ store.Copier = (*Striped)(nil)

// copyRoundMax bounds the file range of one round of OBJ_COPY calls, so that
// each call ends well within callTimeout.
const copyRoundMax = 256 << 20

// CopyRange implements store.Copier when the stripe maps of src and dst
// line up for these offsets (see above), after making them line up if
// dst is empty; otherwise it fails with store.ErrNotSupported and changes
// no data. Every good copy of the destination's units copies from its own
// good copy of the source's (stable); one that fails while another copy
// of the same units succeeds is marked stale (see settle).
func (s *Striped) CopyRange(src, dst uint64, srcOff, dstOff, n int64) error {
	if srcOff < 0 || dstOff < 0 || n < 0 || uint64(srcOff)+uint64(n) > maxOff || uint64(dstOff)+uint64(n) > maxOff {
		return fmt.Errorf("cluster: copy ino %d to %d: range: %w", src, dst, fs.ErrInvalid)
	}
	if src == dst && srcOff < dstOff+n && dstOff < srcOff+n {
		return fmt.Errorf("cluster: copy ino %d to itself: overlapping ranges: %w", src, fs.ErrInvalid)
	}
	if n == 0 {
		return nil
	}
	s.alignEmpty(src, dst, uint64(srcOff), uint64(dstOff))
	defer s.lockIO2(src, dst)()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	sm, ok, err := s.Map(ctx, src)
	if err != nil {
		return err
	}
	if !ok {
		// The source has no data anywhere: the range is zeros.
		cancel()
		f := &stripedFile{s: s, ino: dst, written: map[string]bool{}}
		return f.punchLocked(dstOff, n)
	}
	if err := noCopy(src, sm); err != nil {
		return err
	}
	dm, err := s.placeLike(ctx, dst, sm, uint64(srcOff), uint64(dstOff))
	if err != nil {
		return err
	}
	if err := noCopy(dst, dm); err != nil {
		return err
	}
	if !linedUp(sm, dm, uint64(srcOff), uint64(dstOff)) {
		return fmt.Errorf("cluster: copy ino %d to %d: stripe maps do not line up: %w", src, dst, store.ErrNotSupported)
	}
	// Each destination copy must hold the source's units too, and a good
	// copy of them.
	for p := range dm.DataServers {
		for _, id := range dm.Good(p) {
			if !sm.IsGood(p, id) {
				return fmt.Errorf("cluster: copy ino %d to %d: %s holds no good copy of the source's position %d: %w",
					src, dst, id, p, store.ErrNotSupported)
			}
		}
	}
	cancel()
	for lo := int64(0); lo < n; lo += copyRoundMax {
		if err := s.copyRound(sm, dm, src, dst, uint64(srcOff+lo), uint64(dstOff+lo), uint64(min(copyRoundMax, n-lo))); err != nil {
			return err
		}
	}
	return nil
}

// copyRound sends OBJ_COPY for [srcOff, srcOff+n) to every good member of
// each position with units in the range, in parallel, and settles the
// destination's copies.
func (s *Striped) copyRound(sm, dm meta.StripeMap, src, dst, srcOff, dstOff, n uint64) error {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	var results []copyResult
	var args []ctlproto.CtlCopyArgs
	group := 0
	for p := range sm.DataServers {
		x := extentsOf(sm, p)
		if lo, _ := x.at(srcOff); lo >= srcOff+n {
			continue // none of p's units in the range
		}
		for _, id := range dm.Good(p) {
			results = append(results, copyResult{group: group, id: id})
			args = append(args, ctlproto.CtlCopyArgs{SrcIno: src, DstIno: dst, SrcOffset: srcOff, DstOffset: dstOff,
				Length: n, Stable: true, Extents: x.wire()})
		}
		group++
	}
	_ = parallel(len(results), func(i int) error {
		results[i].err = objCopy(ctx, s.r, results[i].id, &args[i])
		return nil
	})
	return s.settle(ctx, dst, group, results)
}

func objCopy(ctx context.Context, r *Registry, id string, args *ctlproto.CtlCopyArgs) error {
	conn, err := r.conn(id)
	if err != nil {
		return fmt.Errorf("cluster: copy ino %d to %d on %s: %w", args.SrcIno, args.DstIno, id, err)
	}
	var res ctlproto.CtlStatusRes
	if err := call(ctx, conn, ctlproto.CTLPROC_OBJ_COPY, args, &res); err != nil {
		return fmt.Errorf("cluster: copy ino %d to %d on %s: %w", args.SrcIno, args.DstIno, id, err)
	}
	if err := errOf(res.Status); err != nil {
		return fmt.Errorf("cluster: copy ino %d to %d on %s: %w", args.SrcIno, args.DstIno, id, err)
	}
	return nil
}

// lockIO2 takes the I/O shards of two files, in shard order.
func (s *Striped) lockIO2(a, b uint64) func() {
	i, j := a%uint64(len(s.moving)), b%uint64(len(s.moving))
	if i == j {
		return s.lockIO(a)
	}
	if j < i {
		a, b = b, a
	}
	ua := s.lockIO(a)
	ub := s.lockIO(b)
	return func() { ub(); ua() }
}

// SetHold installs the function that recalls a file's layouts and holds
// new ones back (server.Server.HoldLayouts), for CopyRange to change the
// map of an empty destination that clients hold layouts of.
func (s *Striped) SetHold(hold HoldFunc) {
	s.hookMu.Lock()
	defer s.hookMu.Unlock()
	s.hold = hold
}

// likeMap returns a map for a copy's destination under which copying
// [srcOff, ...) of a file with map sm to dstOff lines up, if there is one
// that new data may use: sm's members, all where new data goes now
// (Registry.Placement), as many copies as dst's policy asks for, and the
// offsets at the same place of a unit.
func (s *Striped) likeMap(ctx context.Context, dst uint64, sm meta.StripeMap, srcOff, dstOff uint64) (meta.StripeMap, bool) {
	placement := s.r.Placement()
	if sm.Degraded() || srcOff%sm.Unit != dstOff%sm.Unit || s.mirrorsOf(ctx, dst) != sm.Mirrors() ||
		slices.ContainsFunc(sm.All(), func(id string) bool { return !slices.Contains(placement, id) }) {
		return meta.StripeMap{}, false
	}
	like := sm.Clone()
	like.Gen, like.Stale = 0, nil
	n := uint64(len(sm.DataServers))
	// The unit at srcOff is at position p of sm; the one at dstOff must
	// be at p too.
	like.First = uint32((uint64(sm.Position(srcOff)) + n - (dstOff/sm.Unit)%n) % n)
	return like, true
}

// alignEmpty gives an empty destination whose map does not line up with
// the source's one that does (see likeMap), so that the data servers can
// copy. A client that created the file may already hold a layout of it
// (the Linux client asks for one in its OPEN): the layouts are recalled
// and held back while the map changes (Move, which has nothing to copy).
// Anything that fails leaves the map as it was: the copy then goes
// through the MDS.
func (s *Striped) alignEmpty(src, dst uint64, srcOff, dstOff uint64) {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	sm, ok, err := s.Map(ctx, src)
	if err != nil || !ok {
		return
	}
	dm, ok, err := s.Map(ctx, dst)
	if err != nil || !ok || linedUp(sm, dm, srcOff, dstOff) || dm.Unit != sm.Unit {
		return
	}
	like, ok := s.likeMap(ctx, dst, sm, srcOff, dstOff)
	if !ok {
		return
	}
	f := &stripedFile{s: s, ino: dst, written: map[string]bool{}}
	if size, err := f.Size(); err != nil || size > 0 {
		return
	}
	s.hookMu.Lock()
	hold := s.hold
	s.hookMu.Unlock()
	if _, err := s.Move(ctx, dst, dm, like, hold); err != nil {
		s.r.log.Info("cluster: could not align an empty copy destination's stripe map with its source's", "src", src, "dst", dst, "err", err)
		return
	}
	s.forget(dst)
}

// placeLike returns dst's stripe map, first placing it so that the copy
// lines up (likeMap) if dst has no data yet, or as any new file's if
// that cannot be.
func (s *Striped) placeLike(ctx context.Context, dst uint64, sm meta.StripeMap, srcOff, dstOff uint64) (meta.StripeMap, error) {
	m, ok, err := s.Map(ctx, dst)
	if err != nil || ok {
		return m, err
	}
	like, ok := s.likeMap(ctx, dst, sm, srcOff, dstOff)
	if !ok {
		return s.Place(ctx, dst)
	}
	m, err = s.maps.PlaceStripeMap(ctx, meta.Ino(dst), like)
	if err != nil {
		return meta.StripeMap{}, fmt.Errorf("cluster: placing ino %d like its copy's source: %w", dst, err)
	}
	s.remember(dst, m)
	return m, nil
}

// linedUp reports whether copying [srcOff, ...) of a file with map sm to
// dstOff of one with map dm keeps every byte on the members it is on:
// the maps have the same unit and members, the offsets differ by whole
// units, and the unit at srcOff lands at the same position in dm.
func linedUp(sm, dm meta.StripeMap, srcOff, dstOff uint64) bool {
	if sm.Unit != dm.Unit || len(sm.DataServers) != len(dm.DataServers) || sm.Mirrors() != dm.Mirrors() {
		return false
	}
	for p := range sm.DataServers {
		if !slices.Equal(sm.Members(p), dm.Members(p)) {
			return false
		}
	}
	u, n := sm.Unit, uint64(len(sm.DataServers))
	return srcOff%u == dstOff%u && sm.Position(srcOff) == dm.Position(dstOff) && n > 0
}

// maxCopy is CTL_MAX_COPY.
const maxCopy = ctlproto.CTL_MAX_COPY

// objCopy copies the extents' bytes of one object to another (OBJ_COPY),
// in the store (store.Copier) where it can, through a buffer otherwise;
// the bytes stay on this data server either way.
func (a *Agent) objCopy(args *ctlproto.CtlCopyArgs) ctlproto.CtlStatus {
	x, ok := extentsFrom(args.Extents)
	srcEnd, dstEnd := args.SrcOffset+args.Length, args.DstOffset+args.Length
	if !ok || args.Length > maxCopy || srcEnd < args.SrcOffset || dstEnd < args.DstOffset || srcEnd > maxOff || dstEnd > maxOff ||
		x.unit != 0 && args.SrcOffset%x.unit != args.DstOffset%x.unit ||
		args.SrcIno == args.DstIno && args.SrcOffset < dstEnd && args.DstOffset < srcEnd {
		return ctlproto.CTL_ERR_INVAL
	}
	a.stats.copyOps.Add(1)
	st := a.cfg.Store
	cp, _ := st.(store.Copier)
	var err error
	for pos := args.SrcOffset; pos < srcEnd && err == nil; {
		lo, hi := x.at(pos)
		if lo >= srcEnd {
			break
		}
		hi = min(hi, srcEnd)
		to := lo - args.SrcOffset + args.DstOffset
		if cp != nil {
			err = cp.CopyRange(args.SrcIno, args.DstIno, int64(lo), int64(to), int64(hi-lo))
		}
		if cp == nil || errors.Is(err, store.ErrNotSupported) {
			err = copyObject(st, args.SrcIno, args.DstIno, lo, to, hi-lo)
		}
		if err == nil {
			a.stats.copyBytes.Add(hi - lo)
		}
		pos = hi
	}
	if err == nil && args.Stable {
		err = st.Sync(args.DstIno)
	}
	if err != nil {
		return a.storeStatus("copy", args.DstIno, err)
	}
	return ctlproto.CTL_OK
}

// copyObject is store.Copier's CopyRange through a buffer.
func copyObject(st store.Backend, src, dst, srcOff, dstOff, n uint64) error {
	sf, err := st.Open(src, false)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if sf != nil {
		defer sf.Close()
	}
	df, err := st.Open(dst, true)
	if err != nil {
		return err
	}
	defer df.Close()
	buf := make([]byte, min(n, maxIO))
	for done := uint64(0); done < n; {
		b := buf[:min(uint64(len(buf)), n-done)]
		got := 0
		if sf != nil {
			got, err = sf.ReadAt(b, int64(srcOff+done))
			if err != nil && !errors.Is(err, io.EOF) {
				return err
			}
		}
		if got > 0 {
			if _, err := df.WriteAt(b[:got], int64(dstOff+done)); err != nil {
				return err
			}
		}
		if got < len(b) {
			// The source ends here: the rest is zeros, which the
			// destination must hold where it has data.
			size, err := df.Size()
			if err != nil {
				return err
			}
			from, to := int64(dstOff+done)+int64(got), min(int64(dstOff+n), size)
			if from < to {
				return df.PunchHole(from, to-from)
			}
			return nil
		}
		done += uint64(len(b))
	}
	return nil
}

// punchLocked deallocates [off, off+n) of the file on every good copy, as
// PunchHole does, for a caller already holding the file's I/O shard.
func (f *stripedFile) punchLocked(off, n int64) error {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	m, ok, err := f.s.Map(ctx, f.ino)
	if err != nil || !ok {
		return err
	}
	return f.s.changeGood(ctx, f.ino, m, "punch hole", false, func(ctx context.Context, conn *rpc.Conn, _ string, _ int) error {
		return objPunch(ctx, conn, f.ino, uint64(off), uint64(n))
	})
}
