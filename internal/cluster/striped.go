package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"slices"
	"sync"
	"time"

	"github.com/shoalfs/shoal/internal/ctlproto"
	"github.com/shoalfs/shoal/internal/rpc"
	"github.com/shoalfs/shoal/meta"
	"github.com/shoalfs/shoal/pnfs"
	"github.com/shoalfs/shoal/store"
)

// DefaultStripeUnit is the stripe unit NewStriped uses for 0: the Linux
// client's rsize/wsize, so one client RPC maps to one DS.
const DefaultStripeUnit = 1 << 20

// callTimeout bounds one object call; store.Backend has no context.
const callTimeout = 30 * time.Second

// maxParallel bounds the object calls one Striped operation has in flight.
const maxParallel = 16

// StripeMaps is where Striped keeps each file's stripe map: the metadata
// engine (meta.Engine implements it).
type StripeMaps interface {
	StripeMap(ctx context.Context, ino meta.Ino) (meta.StripeMap, error)
	PlaceStripeMap(ctx context.Context, ino meta.Ino, m meta.StripeMap) (meta.StripeMap, error)
	ReplaceStripeMap(ctx context.Context, ino meta.Ino, gen uint64, m meta.StripeMap) (meta.StripeMap, error)
	StripeMaps(ctx context.Context, after meta.Ino, max int) ([]meta.FileStripeMap, error)
}

// Striped is the MDS's store.Backend: file data striped over the data
// servers of a Registry, reached through the control protocol.
//
// Each file's striping is its stripe map (meta.StripeMap), recorded in the
// metadata engine when the file's data is first placed (its first write,
// or its first layout) over the data servers then in Registry.Placement,
// and changed only through replaceMap (a copy marked stale, healing, Move).
// Adding a data server therefore changes nothing for files that exist.
// Stripe unit k belongs to position p = (First+k) mod n of the map and
// lives on every member of p (one, or as many as the file's copies; see
// SetMirrors), at the same offset of each member's object (sparse packing).
//
// With several copies, I/O goes to the good copies (meta.StripeMap.Good):
// a write reaches every good copy in service, and one that misses a copy
// another copy took marks the missed copy stale before it is
// acknowledged; a read is served by the first good copy that answers.
// Losing a data server therefore makes unavailable only the positions all
// of whose good copies it held: with one copy, exactly the files whose
// maps name it.
//
// A file without a map has no data on any data server and reads as empty.
type Striped struct {
	r       *Registry
	unit    uint64
	maps    StripeMaps
	devices *devices

	cacheMu sync.Mutex
	cache   map[uint64]meta.StripeMap

	// moving serialises Move against I/O on the same file: I/O holds its
	// shard for reading, Move for writing.
	moving [64]sync.RWMutex

	mu   sync.Mutex
	verf map[string][8]byte // DS id -> boot verifier seen on its last write
	lost map[string]bool    // DS id -> restarted with uncommitted writes

	fbMu     sync.Mutex
	fallback map[string]store.Backend // DS id -> shared storage (SetFallback)

	// dirty holds, per inode, the data servers written UNSTABLE since
	// their last commit, so that Sync commits only those. Writes clients
	// sent to data servers directly are not here: a client that has to
	// commit them through the MDS (its layout gone) sees the MDS's write
	// verifier, not the data server's, and resends them through the MDS.
	dirtyMu sync.Mutex
	dirty   map[uint64]map[string]struct{}

	hookMu    sync.Mutex
	recall    func(ino uint64)                          // SetRecall
	onStale   func(ino uint64)                          // SetOnStale
	mirrors   int                                       // SetDefaultMirrors
	mirrorsFn func(ctx context.Context, ino uint64) int // SetMirrors
	hold      HoldFunc                                  // SetHold
}

var (
	_ store.Backend = (*Striped)(nil)
	_ store.File    = (*stripedFile)(nil)
)

// maxCachedMaps bounds the stripe-map cache.
const maxCachedMaps = 1 << 16

// NewStriped returns a Backend striping new files over r's data servers
// with the given stripe unit (DefaultStripeUnit if 0), keeping stripe maps
// in maps. New files get one copy of each stripe unit unless SetMirrors or
// SetDefaultMirrors say otherwise.
func NewStriped(r *Registry, maps StripeMaps, stripeUnit uint64) *Striped {
	if stripeUnit == 0 {
		stripeUnit = DefaultStripeUnit
	}
	return &Striped{r: r, unit: stripeUnit, maps: maps, devices: newDevices(r), cache: map[uint64]meta.StripeMap{},
		verf: map[string][8]byte{}, lost: map[string]bool{}, dirty: map[uint64]map[string]struct{}{}, mirrors: 1}
}

// StripeUnit returns the stripe unit of new files.
func (s *Striped) StripeUnit() uint64 { return s.unit }

// Map returns file ino's stripe map; ok is false if its data was never
// placed.
func (s *Striped) Map(ctx context.Context, ino uint64) (m meta.StripeMap, ok bool, err error) {
	s.cacheMu.Lock()
	m, ok = s.cache[ino]
	s.cacheMu.Unlock()
	if ok {
		return m, true, nil
	}
	m, err = s.maps.StripeMap(ctx, meta.Ino(ino))
	if errors.Is(err, meta.ErrNotFound) {
		return meta.StripeMap{}, false, nil
	}
	if err != nil {
		return meta.StripeMap{}, false, err
	}
	s.remember(ino, m)
	return m, true, nil
}

func (s *Striped) remember(ino uint64, m meta.StripeMap) {
	s.cacheMu.Lock()
	defer s.cacheMu.Unlock()
	if len(s.cache) >= maxCachedMaps {
		clear(s.cache)
	}
	if cur, ok := s.cache[ino]; !ok || cur.Gen <= m.Gen {
		s.cache[ino] = m
	}
}

func (s *Striped) forget(ino uint64) {
	s.cacheMu.Lock()
	defer s.cacheMu.Unlock()
	delete(s.cache, ino)
}

// Place returns file ino's stripe map, placing its data over the data
// servers in Registry.Placement if it has none, with as many copies of
// each stripe unit as its policy says (SetMirrors), at most one per data
// server.
func (s *Striped) Place(ctx context.Context, ino uint64) (meta.StripeMap, error) {
	m, ok, err := s.Map(ctx, ino)
	if err != nil || ok {
		return m, err
	}
	ids := s.r.Placement()
	if len(ids) == 0 {
		return meta.StripeMap{}, pnfs.ErrNoDataServers
	}
	m, err = s.maps.PlaceStripeMap(ctx, meta.Ino(ino), placeMap(s.unit, ino, ids, s.mirrorsOf(ctx, ino)))
	if err != nil {
		return meta.StripeMap{}, fmt.Errorf("cluster: placing ino %d: %w", ino, err)
	}
	s.remember(ino, m)
	return m, nil
}

// lockIO takes ino's shard for I/O (shared with other I/O, not with Move).
func (s *Striped) lockIO(ino uint64) func() {
	l := &s.moving[ino%uint64(len(s.moving))]
	l.RLock()
	return l.RUnlock
}

// markDirty records an UNSTABLE write of ino on data server id.
func (s *Striped) markDirty(ino uint64, id string) {
	s.dirtyMu.Lock()
	defer s.dirtyMu.Unlock()
	d := s.dirty[ino]
	if d == nil {
		d = map[string]struct{}{}
		s.dirty[ino] = d
	}
	d[id] = struct{}{}
}

// takeDirty returns and forgets the data servers ino was written on since
// their last commit. A write that ends after this is marked again and
// committed by the next Sync; one that ended before is covered by the
// commit that follows.
func (s *Striped) takeDirty(ino uint64) []string {
	s.dirtyMu.Lock()
	defer s.dirtyMu.Unlock()
	d := s.dirty[ino]
	delete(s.dirty, ino)
	ids := make([]string, 0, len(d))
	for id := range d {
		ids = append(ids, id)
	}
	return ids
}

// untrack forgets that ino was written UNSTABLE on ids, which are about
// to be committed, and reports which of them were marked.
func (s *Striped) untrack(ino uint64, ids []string) map[string]bool {
	s.dirtyMu.Lock()
	defer s.dirtyMu.Unlock()
	d := s.dirty[ino]
	out := make(map[string]bool, len(ids))
	for _, id := range ids {
		if _, ok := d[id]; ok {
			out[id] = true
			delete(d, id)
		}
	}
	if d != nil && len(d) == 0 {
		delete(s.dirty, ino)
	}
	return out
}

// dsFor returns the data server of m holding file offset off.
func dsFor(m meta.StripeMap, off uint64) string {
	n := uint64(len(m.DataServers))
	return m.DataServers[(off/m.Unit+uint64(m.First))%n]
}

// piece is a part of an I/O that lives in one stripe unit (so on the
// members of one position) and fits in one call.
type piece struct {
	pos    int    // position of the map
	off    uint64 // file (and object) offset
	lo, hi int    // range in the caller's buffer
}

// split cuts [off, off+length) at stripe unit boundaries and at maxIO.
func split(m meta.StripeMap, off uint64, length int) []piece {
	var ps []piece
	pos := 0
	for pos < length {
		o := off + uint64(pos)
		end := (o/m.Unit + 1) * m.Unit
		l := min(uint64(length-pos), end-o, maxIO)
		ps = append(ps, piece{pos: m.Position(o), off: o, lo: pos, hi: pos + int(l)})
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

// Open implements store.Backend. It does not contact the data servers.
func (s *Striped) Open(ino uint64, create bool) (store.File, error) {
	return &stripedFile{s: s, ino: ino, written: map[string]bool{}}, nil
}

// onMap runs an object call on every data server ino's map names, stale
// copies included; nothing if it has none.
//
// With skipGone, data servers removed from the cluster are skipped: what
// they held is gone with them, and waiting for them would keep, for
// example, a deleted file's other objects forever.
func (s *Striped) onMap(op string, ino uint64, skipGone bool, fn func(ctx context.Context, conn *rpc.Conn, id string) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	m, ok, err := s.Map(ctx, ino)
	if err != nil || !ok {
		return err
	}
	ids := m.All()
	return parallel(len(ids), func(i int) error {
		id := ids[i]
		conn, err := s.r.conn(id)
		if err != nil && skipGone && s.r.gone(id) {
			return nil
		}
		if err == nil {
			err = fn(ctx, conn, id)
		}
		if err != nil {
			return fmt.Errorf("cluster: %s ino %d on data server %s: %w", op, ino, id, err)
		}
		return nil
	})
}

// Remove implements store.Backend: OBJ_REMOVE on every data server of the
// file's map, stale copies included. The map itself goes with the inode
// (meta.Engine.FreeOrphan). A copy that cannot be reached is not marked
// stale: the removal fails and is retried until it is reachable again or
// removed from the cluster, so that no object is left behind.
func (s *Striped) Remove(ino uint64) error {
	s.dirtyMu.Lock()
	delete(s.dirty, ino)
	s.dirtyMu.Unlock()
	defer s.lockIO(ino)()
	err := s.onMap("remove", ino, true, func(ctx context.Context, conn *rpc.Conn, _ string) error {
		return objRemove(ctx, conn, ino)
	})
	s.forget(ino)
	return err
}

func objRemove(ctx context.Context, conn *rpc.Conn, ino uint64) error {
	var res ctlproto.CtlStatusRes
	if err := call(ctx, conn, ctlproto.CTLPROC_OBJ_REMOVE, &ctlproto.CtlInoArgs{Ino: ino}, &res); err != nil {
		return err
	}
	return errOf(res.Status)
}

// goodIDs returns the data servers holding a good copy of some position
// of m, each once.
func goodIDs(m meta.StripeMap) []string {
	return slices.DeleteFunc(m.All(), m.IsStale)
}

// noCopy checks that every position of m has a good member.
func noCopy(ino uint64, m meta.StripeMap) error {
	for p := range m.DataServers {
		if len(m.Good(p)) == 0 {
			return fmt.Errorf("cluster: ino %d: no current copy of stripe position %d (members %q stale): %w",
				ino, p, m.Members(p), pnfs.ErrDataServerDown)
		}
	}
	return nil
}

// copyResult is the outcome of a change on one good member of one group
// of a change: a piece of a write, or a position for a truncate.
type copyResult struct {
	group int
	id    string
	err   error
}

// settle ends a change that went to every good member of each of its
// groups (results has one entry per member and group). Members that
// failed in a group where another member took the change missed it: they
// are marked stale, in one map change, before the change is acknowledged.
// The change succeeds if every group has a member that took it and every
// member that missed it is now stale. Otherwise the error joins why the
// members of the groups nobody took failed, and why the members that could
// not be marked stale (their copy is the only good one in service of some
// position; see markStale) failed: an out-of-service member is retried
// (pnfs.ErrUnavailable) for DownAfter and fails (pnfs.ErrDataServerDown)
// afterwards, as with one copy.
// Like a failed change of a file with one copy, which may have reached
// some of its data servers, a failed change may have reached some copies
// of a unit and not others: the range it covers is undefined until it is
// written again.
func (s *Striped) settle(ctx context.Context, ino uint64, groups int, results []copyResult) error {
	took := make([]bool, groups)
	for _, r := range results {
		if r.err == nil {
			took[r.group] = true
		}
	}
	var missed []string
	why := map[string]error{}
	var errs []error
	for _, r := range results {
		switch {
		case r.err == nil:
		case took[r.group]:
			if _, seen := why[r.id]; !seen {
				missed = append(missed, r.id)
				why[r.id] = r.err
				s.r.log.Warn("cluster: a copy missed a change", "ino", ino, "ds", r.id, "err", r.err)
			}
		default:
			errs = append(errs, r.err)
		}
	}
	for g, ok := range took {
		if !ok && !slices.ContainsFunc(results, func(r copyResult) bool { return r.group == g }) {
			errs = append(errs, fmt.Errorf("cluster: ino %d: a change reached no copy: %w", ino, pnfs.ErrDataServerDown))
		}
	}
	if len(missed) > 0 {
		_, refused, err := s.markStaleAll(ctx, ino, missed)
		if err != nil {
			return fmt.Errorf("cluster: ino %d: recording the copies that missed a change: %w", ino, err)
		}
		for _, id := range refused {
			errs = append(errs, why[id])
		}
	}
	return errors.Join(errs...)
}

// Truncate implements store.Backend: OBJ_TRUNCATE to size on every good
// copy, so every object has the file's size and Size stays the maximum.
// Copies that cannot be reached are marked stale if another copy of each
// of their positions took it (see settle). A file without a map has
// nothing to truncate.
func (s *Striped) Truncate(ino uint64, size uint64) error {
	defer s.lockIO(ino)()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	m, ok, err := s.Map(ctx, ino)
	if err != nil || !ok {
		return err
	}
	return s.changeGood(ctx, ino, m, "truncate", false, func(ctx context.Context, conn *rpc.Conn, _ string, _ int) error {
		var res ctlproto.CtlStatusRes
		if err := call(ctx, conn, ctlproto.CTLPROC_OBJ_TRUNCATE, &ctlproto.CtlTruncateArgs{Ino: ino, Size: size}, &res); err != nil {
			return err
		}
		return errOf(res.Status)
	})
}

// Sync implements store.Backend: OBJ_COMMIT on the copies that hold
// UNSTABLE writes of ino made through this Striped since their last
// commit. A copy whose commit fails is marked stale if every position it
// holds has another good copy (see syncMembers); otherwise Sync fails, and
// returns pnfs.ErrDataLost if a data server restarted while holding
// uncommitted writes.
func (s *Striped) Sync(ino uint64) error {
	ids := s.takeDirty(ino)
	if len(ids) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	failed := s.syncMembers(ctx, ino, ids)
	var errs []error
	for _, id := range ids {
		err := failed[id]
		if err == nil {
			continue
		}
		if !errors.Is(err, pnfs.ErrDataLost) {
			// Not committed: the next Sync tries again. (pnfs.ErrDataLost
			// did commit; what was lost is gone either way.)
			s.markDirty(ino, id)
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// syncMembers commits ino on the data servers ids and returns the errors
// of those whose commit failed and whose copy could not be marked stale
// instead. A copy whose commit failed (unreachable, restarted with
// uncommitted writes, an I/O error) may lack what was written to it; when
// the other copies of its positions hold it, marking it stale loses
// nothing and the commit succeeds.
func (s *Striped) syncMembers(ctx context.Context, ino uint64, ids []string) map[string]error {
	errs := make([]error, len(ids))
	_ = parallel(len(ids), func(j int) error {
		if err := s.commit(ctx, ino, ids[j]); err != nil {
			errs[j] = fmt.Errorf("cluster: commit ino %d on %s: %w", ino, ids[j], err)
		}
		return nil
	})
	failed := map[string]error{}
	var cand []string
	for j, err := range errs {
		if err != nil {
			failed[ids[j]] = err
			cand = append(cand, ids[j])
		}
	}
	if len(cand) == 0 {
		return nil
	}
	if m, ok, err := s.Map(ctx, ino); err != nil || !ok || m.Mirrors() == 1 {
		return failed
	}
	_, refused, err := s.markStaleAll(ctx, ino, cand)
	if err != nil {
		for _, id := range cand {
			failed[id] = errors.Join(failed[id], err)
		}
		return failed
	}
	for _, id := range cand {
		if !slices.Contains(refused, id) {
			s.r.log.Warn("cluster: a copy failed its commit and is stale until healed", "ino", ino, "ds", id, "err", failed[id])
			delete(failed, id)
		}
	}
	return failed
}

func (s *Striped) commit(ctx context.Context, ino uint64, id string) error {
	conn, err := s.r.conn(id)
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
		return fmt.Errorf("%w (data server %s)", pnfs.ErrDataLost, id)
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

// StatFS implements store.Backend: the sums over the data servers that are
// not removed, from their last heartbeats.
func (s *Striped) StatFS() (total, free, avail uint64, err error) {
	for _, m := range s.r.DataServers() {
		if m.State != Removed {
			total += m.Capacity
			free += m.Free
		}
	}
	return total, free, free, nil
}

// Close implements store.Backend. The registry is not closed.
func (s *Striped) Close() error { return nil }

// PlacedByMap implements store.MapPlaced: every object of a file is on
// the data servers of its stripe map, and a file without one has none.
func (s *Striped) PlacedByMap() bool { return true }

var _ store.MapPlaced = (*Striped)(nil)

// SetFallback gives the MDS direct access to the storage of data server
// id, for reads while that data server is unreachable. This is the
// shared-storage deployment of the pNFS papers (data servers as gateways to
// storage that survives them); in `shoal up` every data server's directory
// is on the MDS's machine. Without a fallback, the stripe units of a dead
// data server are unavailable until it returns.
func (s *Striped) SetFallback(id string, b store.Backend) {
	s.fbMu.Lock()
	defer s.fbMu.Unlock()
	if s.fallback == nil {
		s.fallback = map[string]store.Backend{}
	}
	s.fallback[id] = b
}

func (s *Striped) fallbackFor(id string) store.Backend {
	s.fbMu.Lock()
	defer s.fbMu.Unlock()
	return s.fallback[id]
}

// unreachable reports whether err means the data server could not be
// asked, as opposed to answering with an error.
func unreachable(err error) bool {
	return errors.Is(err, pnfs.ErrUnavailable) || errors.Is(err, pnfs.ErrDataServerDown) || errors.Is(err, rpc.ErrConnClosed)
}

// readFallback reads one piece from the fallback storage of data server
// id. It returns the object size and whether a fallback was used.
func (f *stripedFile) readFallback(id string, off uint64, dst []byte) (uint64, bool, error) {
	fb := f.s.fallbackFor(id)
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
	written map[string]bool // data servers written through this handle
}

func (f *stripedFile) check() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return store.ErrClosed
	}
	return nil
}

// WriteAt implements io.WriterAt: every piece is written (unstable; Sync
// commits) to every good copy of its position that is in service, all in
// parallel; the data servers get slices of p, never copies. A copy that is
// out of service or fails while another copy took the piece is marked
// stale before WriteAt returns (see settle); the write succeeds if every
// piece reached a good copy. The file's data is placed first if it has no
// stripe map. On error the number of bytes written is reported as 0
// although some pieces may have landed.
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
	defer f.s.lockIO(f.ino)()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	m, err := f.s.Place(ctx, f.ino)
	if err != nil {
		return 0, err
	}
	ps := split(m, uint64(off), len(p))
	var results []copyResult
	for i, pc := range ps {
		good := m.Good(pc.pos)
		if len(good) == 0 {
			return 0, noCopy(f.ino, m)
		}
		for _, id := range good {
			results = append(results, copyResult{group: i, id: id})
		}
	}
	_ = parallel(len(results), func(i int) error {
		r := &results[i]
		pc := ps[r.group]
		if r.err = writeObj(ctx, f.s.r, f.ino, r.id, pc.off, p[pc.lo:pc.hi], false, f.s.noteWrite); r.err != nil {
			return nil
		}
		f.s.markDirty(f.ino, r.id)
		f.mu.Lock()
		f.written[r.id] = true
		f.mu.Unlock()
		return nil
	})
	if err := f.s.settle(ctx, f.ino, len(ps), results); err != nil {
		return 0, err
	}
	return len(p), nil
}

// writeObj writes data at off of ino's object on data server id.
func writeObj(ctx context.Context, r *Registry, ino uint64, id string, off uint64, data []byte, stable bool, note func(string, [8]byte)) error {
	conn, err := r.conn(id)
	if err != nil {
		return fmt.Errorf("cluster: write ino %d at %d: %w", ino, off, err)
	}
	var res ctlproto.CtlWriteRes
	if err := call(ctx, conn, ctlproto.CTLPROC_OBJ_WRITE,
		&ctlproto.CtlWriteArgs{Ino: ino, Offset: off, Stable: stable, Data: data}, &res); err != nil {
		return fmt.Errorf("cluster: write ino %d at %d on %s: %w", ino, off, id, err)
	}
	if err := errOf(res.Status); err != nil {
		return fmt.Errorf("cluster: write ino %d at %d on %s: %w", ino, off, id, err)
	}
	if int(res.Ok.Count) != len(data) {
		return fmt.Errorf("cluster: write ino %d at %d on %s: short write %d of %d: %w",
			ino, off, id, res.Ok.Count, len(data), io.ErrShortWrite)
	}
	if note != nil {
		note(id, res.Ok.Verifier)
	}
	return nil
}

// readObj reads ino's object on data server id at off into dst, zero
// filling what the object does not hold, and returns the object's size.
func readObj(ctx context.Context, r *Registry, ino uint64, id string, off uint64, dst []byte) (uint64, error) {
	conn, err := r.conn(id)
	if err != nil {
		return 0, err
	}
	var res ctlproto.CtlReadRes
	release, err := callRelease(ctx, conn, ctlproto.CTLPROC_OBJ_READ,
		&ctlproto.CtlReadArgs{Ino: ino, Offset: off, Count: uint32(len(dst))}, &res)
	if err != nil {
		return 0, fmt.Errorf("cluster: read ino %d at %d on %s: %w", ino, off, id, err)
	}
	// res.Ok.Data aliases the reply's record buffer, which goes back to
	// its pool once the data is copied into the caller's buffer; nothing
	// else is kept from res.
	defer release()
	if res.Status == ctlproto.CTL_ERR_NOENT {
		clear(dst)
		return 0, nil
	}
	if err := errOf(res.Status); err != nil {
		return 0, fmt.Errorf("cluster: read ino %d at %d on %s: %w", ino, off, id, err)
	}
	got := copy(dst, res.Ok.Data)
	clear(dst[got:])
	return res.Ok.Size, nil
}

// ReadAt implements io.ReaderAt. Each piece is read from the first good
// copy of its position that answers, in member order: a copy that cannot
// be reached, or fails otherwise, is skipped, and one whose data failed
// its checksum (ErrCorrupt) is also marked stale so that healing rewrites
// it. Only if no good copy answers is the shared storage of one read
// (SetFallback). Stale copies are never read. Ranges no DS holds data for
// read as zeros; io.EOF is returned when the read reaches the file's end
// (the largest object size on the map's good copies).
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
	ps := split(m, uint64(off), len(p))
	sizes := make([]uint64, len(ps))
	var corruptMu sync.Mutex
	var corrupt []string
	err = parallel(len(ps), func(i int) error {
		pc := ps[i]
		size, bad, err := f.readPiece(ctx, m, pc.pos, pc.off, p[pc.lo:pc.hi])
		if len(bad) > 0 {
			corruptMu.Lock()
			for _, id := range bad {
				if !slices.Contains(corrupt, id) {
					corrupt = append(corrupt, id)
				}
			}
			corruptMu.Unlock()
		}
		sizes[i] = size
		return err
	})
	if len(corrupt) > 0 {
		f.s.dropCorrupt(ctx, f.ino, corrupt)
	}
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
		all, err := f.size(ctx, m)
		if err != nil {
			return 0, err
		}
		size = max(size, all)
	}
	if size >= end {
		return len(p), nil
	}
	if size <= uint64(off) {
		return 0, io.EOF
	}
	return int(size - uint64(off)), io.EOF
}

// readPiece reads [off, off+len(dst)) of position pos into dst from the
// first good copy that answers, or else from the shared storage of a good
// copy that could not be reached, and returns the object's size there. bad
// lists the copies whose data failed its checksum. If none answered, the
// error joins why.
func (f *stripedFile) readPiece(ctx context.Context, m meta.StripeMap, pos int, off uint64, dst []byte) (size uint64, bad []string, err error) {
	good := m.Good(pos)
	if len(good) == 0 {
		return 0, nil, noCopy(f.ino, m)
	}
	var errs []error
	for _, id := range good {
		size, err := readObj(ctx, f.s.r, f.ino, id, off, dst)
		if err == nil {
			return size, bad, nil
		}
		if errors.Is(err, ErrCorrupt) {
			bad = append(bad, id)
			f.s.r.log.Warn("cluster: a copy failed its checksum; reading another", "ino", f.ino, "ds", id, "off", off, "err", err)
		}
		errs = append(errs, err)
	}
	for i, id := range good {
		if !unreachable(errs[i]) {
			continue
		}
		fsize, used, ferr := f.readFallback(id, off, dst)
		if !used {
			continue
		}
		if ferr == nil {
			return fsize, bad, nil
		}
		errs = append(errs, fmt.Errorf("cluster: read ino %d at %d from the storage of %s: %w", f.ino, off, id, ferr))
	}
	return 0, bad, errors.Join(errs...)
}

// dropCorrupt marks the copies whose data failed its checksum stale, so
// that they are not read again and healing rewrites them. It is only
// logged if that cannot be done: the read was served from another copy.
func (s *Striped) dropCorrupt(ctx context.Context, ino uint64, ids []string) {
	_, refused, err := s.markStaleAll(ctx, ino, ids)
	if err != nil {
		s.r.log.Error("cluster: cannot mark corrupt copies stale", "ino", ino, "ds", ids, "err", err)
	}
	if len(refused) > 0 {
		s.r.log.Error("cluster: corrupt copies hold the only good copy of other stripe units; left in place",
			"ino", ino, "ds", refused)
	}
}

// Size implements store.File: the largest object size on the map's good
// copies; 0 for a file without a map.
func (f *stripedFile) Size() (int64, error) {
	if err := f.check(); err != nil {
		return 0, err
	}
	defer f.s.lockIO(f.ino)()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	m, ok, err := f.s.Map(ctx, f.ino)
	if err != nil || !ok {
		return 0, err
	}
	size, err := f.size(ctx, m)
	return int64(size), err
}

// size returns the largest object size over m's good copies that answer
// (or whose shared storage does). Every position's good copies have the
// same size, so it fails only if some position has no good copy that
// answered.
func (f *stripedFile) size(ctx context.Context, m meta.StripeMap) (uint64, error) {
	if err := noCopy(f.ino, m); err != nil {
		return 0, err
	}
	ids := goodIDs(m)
	sizes := make(map[string]uint64, len(ids))
	errs := make(map[string]error, len(ids))
	var mu sync.Mutex
	_ = parallel(len(ids), func(i int) error {
		size, err := objSize(ctx, f.s.r, f.ino, ids[i])
		if err != nil && unreachable(err) {
			if fsize, used, ferr := f.readFallback(ids[i], 0, nil); used {
				size, err = fsize, ferr
			}
		}
		if err != nil {
			err = fmt.Errorf("cluster: size of ino %d on %s: %w", f.ino, ids[i], err)
		}
		mu.Lock()
		sizes[ids[i]], errs[ids[i]] = size, err
		mu.Unlock()
		return nil
	})
	var size uint64
	for id, sz := range sizes {
		if errs[id] == nil {
			size = max(size, sz)
		}
	}
	var failed []error
	for p := range m.DataServers {
		good := m.Good(p)
		if !slices.ContainsFunc(good, func(id string) bool { return errs[id] == nil }) {
			for _, id := range good {
				if !slices.ContainsFunc(failed, func(e error) bool { return e == errs[id] }) {
					failed = append(failed, errs[id])
				}
			}
		}
	}
	return size, errors.Join(failed...)
}

// objectsSize returns the largest size of ino's objects on ids.
func objectsSize(ctx context.Context, r *Registry, ino uint64, ids []string, fallback func(string) (uint64, bool, error)) (uint64, error) {
	sizes := make([]uint64, len(ids))
	err := parallel(len(ids), func(i int) error {
		size, err := objSize(ctx, r, ino, ids[i])
		if err != nil && unreachable(err) && fallback != nil {
			if fsize, used, ferr := fallback(ids[i]); used {
				size, err = fsize, ferr
			}
		}
		sizes[i] = size
		if err != nil {
			return fmt.Errorf("cluster: size of ino %d on %s: %w", ino, ids[i], err)
		}
		return nil
	})
	var size uint64
	for _, sz := range sizes {
		size = max(size, sz)
	}
	return size, err
}

func objSize(ctx context.Context, r *Registry, ino uint64, id string) (uint64, error) {
	conn, err := r.conn(id)
	if err != nil {
		return 0, err
	}
	var res ctlproto.CtlGetsizeRes
	if err := call(ctx, conn, ctlproto.CTLPROC_OBJ_GETSIZE, &ctlproto.CtlInoArgs{Ino: ino}, &res); err != nil {
		return 0, err
	}
	if res.Status == ctlproto.CTL_ERR_NOENT {
		return 0, nil
	}
	if err := errOf(res.Status); err != nil {
		return 0, err
	}
	return *res.Size, nil
}

// Sync implements store.File: OBJ_COMMIT on the copies this handle wrote
// to; a copy whose commit fails is marked stale if the other copies of
// its positions hold its data (see Striped.syncMembers).
func (f *stripedFile) Sync() error {
	if err := f.check(); err != nil {
		return err
	}
	f.mu.Lock()
	ids := make([]string, 0, len(f.written))
	for id := range f.written {
		ids = append(ids, id)
	}
	f.mu.Unlock()
	if len(ids) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	// The commit covers every write that ended before it, whichever
	// handle made it: Striped.Sync need not commit them again (nor find
	// a copy that went away since, and mark it stale for nothing).
	dirty := f.s.untrack(f.ino, ids)
	failed := f.s.syncMembers(ctx, f.ino, ids)
	var errs []error
	f.mu.Lock()
	for _, id := range ids {
		if err := failed[id]; err != nil {
			errs = append(errs, err)
			if dirty[id] && !errors.Is(err, pnfs.ErrDataLost) {
				f.s.markDirty(f.ino, id)
			}
			continue
		}
		delete(f.written, id)
	}
	f.mu.Unlock()
	return errors.Join(errs...)
}

// Close implements store.File; it is idempotent.
func (f *stripedFile) Close() error {
	f.mu.Lock()
	f.closed = true
	f.mu.Unlock()
	return nil
}
