package cluster

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/shoalfs/shoal/internal/ctlproto"
	"github.com/shoalfs/shoal/meta"
	"github.com/shoalfs/shoal/pnfs"
	"github.com/shoalfs/shoal/store"
)

// The data server's side of replicated stripes.
//
// A client with a layout writes a stripe unit to one member of the unit's
// position, the first good member in service (Striped.Layout). That data
// server, through ReplicaStore, writes the bytes locally and hands the
// same bytes to the position's other good members with REPLICA_WRITE, in
// parallel; a client COMMIT (or a stable WRITE) syncs locally and sends
// REPLICA_COMMIT to the peers written since. To know the members, the data
// server asks the MDS for the file's stripe map (MAP) and caches it
// (Agent.Map) until the MDS says it changed (MAP_CHANGED) or the data
// server registers again (the cache outlives the MDS's absence: see
// Agent.run).
//
// A peer that cannot be reached is reported to the MDS (REPLICA_FAILED),
// which marks its copy stale and answers with the new map; the write then
// succeeds with the remaining good copies, as a write through the MDS does
// (Striped). A data server that is not a good member of a unit's position
// refuses the unit with pnfs.ErrNotMember, so a client with an old layout goes
// through the MDS instead of writing a copy nobody reads or reading one
// that missed writes.
//
// Locking: Agent.mu guards the map cache and the peer addresses;
// ReplicaStore.mu guards the per-file record of peers written unstable;
// peerPool.mu and each peer's own mutex guard the peer connections. None
// is held while another is taken, or across a call.

// maxAgentMaps bounds the agent's stripe-map cache.
const maxAgentMaps = 1 << 16

// maxMapRefetch bounds how often a Map fetch is repeated because a
// MAP_CHANGED for the file arrived while it was in flight.
const maxMapRefetch = 3

// mapEntry is a cached stripe map, or a fetch of one in flight.
type mapEntry struct {
	ready chan struct{} // closed when m and err are set
	m     meta.StripeMap
	err   error
	// dropped is set (under Agent.mu) when MAP_CHANGED or a new
	// registration dropped the entry while its fetch was in flight: the
	// fetcher fetches again, so that its waiters never get a map older
	// than the last MAP_CHANGED they could have seen.
	dropped bool
}

// Map returns file ino's stripe map as the MDS has it, from the agent's
// cache or by asking the MDS (MAP); one fetch per file is in flight at a
// time. A file whose data was never placed has no map: the error wraps
// fs.ErrNotExist. pnfs.ErrMDSUnreachable means the MDS is away (the cache
// outlives it: see Agent.run), pnfs.ErrUnavailable that it asked for a retry.
func (a *Agent) Map(ctx context.Context, ino uint64) (meta.StripeMap, error) {
	a.mu.Lock()
	e, ok := a.maps[ino]
	if !ok {
		e = &mapEntry{ready: make(chan struct{})}
		a.putMapLocked(ino, e)
	}
	a.mu.Unlock()
	if ok {
		select {
		case <-e.ready:
			return e.m, e.err
		case <-ctx.Done():
			return meta.StripeMap{}, fmt.Errorf("%w: waiting for the map of ino %d: %w", pnfs.ErrUnavailable, ino, ctx.Err())
		}
	}
	var m meta.StripeMap
	var err error
	for try := 0; ; try++ {
		m, err = a.fetchMap(ctx, ino)
		a.mu.Lock()
		if !e.dropped || try >= maxMapRefetch {
			e.m, e.err = m, err
			if err != nil && a.maps[ino] == e {
				delete(a.maps, ino) // the next caller asks again
			}
			close(e.ready)
			a.mu.Unlock()
			return m, err
		}
		e.dropped = false
		a.mu.Unlock()
	}
}

// putMapLocked caches e for ino, first dropping every settled entry if the
// cache is full.
func (a *Agent) putMapLocked(ino uint64, e *mapEntry) {
	if a.maps == nil {
		a.maps = map[uint64]*mapEntry{}
	}
	if len(a.maps) >= maxAgentMaps {
		for k, old := range a.maps {
			select {
			case <-old.ready:
				delete(a.maps, k)
			default:
			}
		}
	}
	a.maps[ino] = e
}

// fetchMap asks the MDS for ino's map (MAP) and notes the addresses of
// the data servers it names.
func (a *Agent) fetchMap(ctx context.Context, ino uint64) (meta.StripeMap, error) {
	a.mu.Lock()
	conn := a.conn
	a.mu.Unlock()
	if conn == nil {
		return meta.StripeMap{}, fmt.Errorf("%w: not registered with an MDS", pnfs.ErrMDSUnreachable)
	}
	a.stats.mapFetches.Add(1)
	var res ctlproto.CtlMapRes
	err := call(ctx, conn, ctlproto.CTLPROC_MAP, &ctlproto.CtlInoArgs{Ino: ino}, &res)
	if mdsAway(err, res.Status) {
		return meta.StripeMap{}, fmt.Errorf("%w: MAP of ino %d: %v", pnfs.ErrMDSUnreachable, ino, cmp.Or(err, errOf(res.Status)))
	}
	return a.mapReply(ino, "MAP", &res)
}

// mapReply turns a MAP or REPLICA_FAILED reply into a map, noting the
// peers' addresses.
func (a *Agent) mapReply(ino uint64, proc string, res *ctlproto.CtlMapRes) (meta.StripeMap, error) {
	if res.Status != ctlproto.CTL_OK {
		return meta.StripeMap{}, fmt.Errorf("cluster: %s of ino %d: %w", proc, ino, errOf(res.Status))
	}
	m, addrs, err := MapFromWire(res.Map)
	if err != nil {
		return meta.StripeMap{}, fmt.Errorf("cluster: %s of ino %d: %w", proc, ino, err)
	}
	a.mu.Lock()
	if a.peerAddrs == nil {
		a.peerAddrs = map[string][]string{}
	}
	for id, ad := range addrs {
		a.peerAddrs[id] = ad
	}
	a.mu.Unlock()
	return m, nil
}

// dropMap forgets the cached map of ino (MAP_CHANGED).
func (a *Agent) dropMap(ino uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if e, ok := a.maps[ino]; ok {
		e.dropped = true
		delete(a.maps, ino)
	}
}

// dropMapsLocked forgets every cached map; a.mu is held.
func (a *Agent) dropMapsLocked() {
	for _, e := range a.maps {
		e.dropped = true
	}
	clear(a.maps)
}

// dropMapBefore forgets the cached map of ino if it is older than gen.
func (a *Agent) dropMapBefore(ino, gen uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	e, ok := a.maps[ino]
	if !ok {
		return
	}
	select {
	case <-e.ready:
		if e.err == nil && e.m.Gen >= gen {
			return
		}
	default:
		return // a fetch in flight is newer than the caller's map
	}
	delete(a.maps, ino)
}

// adoptMap caches m for ino unless the cache has a newer one or a fetch is
// in flight; the MDS just sent it (REPLICA_FAILED).
func (a *Agent) adoptMap(ino uint64, m meta.StripeMap) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.conn == nil {
		return // not registered: MAP_CHANGED could be missed
	}
	if e, ok := a.maps[ino]; ok {
		select {
		case <-e.ready:
			if e.err == nil && e.m.Gen >= m.Gen {
				return
			}
		default:
			return
		}
	}
	e := &mapEntry{ready: make(chan struct{}), m: m}
	close(e.ready)
	a.putMapLocked(ino, e)
}

// mapAtLeast returns ino's map at generation gen or later, fetching it
// again if the cached one is older. A few tries: the first may join a
// fetch answered before the MDS changed the map, whose MAP_CHANGED has not
// arrived yet.
func (a *Agent) mapAtLeast(ctx context.Context, ino, gen uint64) (meta.StripeMap, error) {
	var m meta.StripeMap
	var err error
	for range maxMapRefetch {
		if m, err = a.Map(ctx, ino); err != nil || m.Gen >= gen {
			return m, err
		}
		a.dropMapBefore(ino, gen)
	}
	return meta.StripeMap{}, fmt.Errorf("%w: the MDS has the map of ino %d at generation %d, a peer at %d",
		pnfs.ErrUnavailable, ino, m.Gen, gen)
}

// replicaFailed tells the MDS that peer id could not be reached for a
// write or commit of ino whose map the caller had at generation gen
// (REPLICA_FAILED), and returns the map the MDS has now, which the cache
// adopts. The MDS marks id stale before answering.
func (a *Agent) replicaFailed(ctx context.Context, ino, gen uint64, id string) (meta.StripeMap, error) {
	a.mu.Lock()
	conn := a.conn
	a.mu.Unlock()
	if conn == nil {
		return meta.StripeMap{}, fmt.Errorf("%w: %w: not connected to the MDS", pnfs.ErrMDSUnreachable, pnfs.ErrUnavailable)
	}
	a.stats.replicaFailed.Add(1)
	var res ctlproto.CtlMapRes
	if err := call(ctx, conn, ctlproto.CTLPROC_REPLICA_FAILED,
		&ctlproto.CtlReplicaFailedArgs{Ino: ino, Gen: gen, DsId: id}, &res); err != nil {
		return meta.StripeMap{}, fmt.Errorf("cluster: REPLICA_FAILED of %s for ino %d: %w: %w", id, ino, pnfs.ErrMDSUnreachable, err)
	}
	m, err := a.mapReply(ino, "REPLICA_FAILED", &res)
	if err != nil {
		return meta.StripeMap{}, err
	}
	a.adoptMap(ino, m)
	return m, nil
}

// holdsRange reports whether id is a good member of the position of every
// stripe unit [off, off+n) touches.
func holdsRange(m meta.StripeMap, id string, off uint64, n int) bool {
	if n <= 0 {
		n = 1
	}
	first, last := off/m.Unit, (off+uint64(n)-1)/m.Unit
	// Positions repeat every len(DataServers) units.
	last = min(last, first+uint64(len(m.DataServers))-1)
	for u := first; u <= last; u++ {
		if !m.IsGood(m.Position(u*m.Unit), id) {
			return false
		}
	}
	return true
}

// notMember is the error of I/O on a range this data server holds no
// current copy of, or cannot tell (no map, and the MDS away): either way
// the client goes to the MDS (NFS4ERR_PNFS_NO_LAYOUT), instead of waiting
// for an MDS that may take a while.
func notMember(op string, ino, off uint64, n int, why error) error {
	if why != nil {
		return fmt.Errorf("cluster: %s of ino %d at %d+%d: %w (%w)", op, ino, off, n, pnfs.ErrNotMember, why)
	}
	return fmt.Errorf("cluster: %s of ino %d at %d+%d: %w", op, ino, off, n, pnfs.ErrNotMember)
}

// ReplicaStore is a data server's store.Backend for its NFS server: the
// data server's local store, plus the replication of what clients write
// to the other copies of each stripe unit (see above). Only WriteAt,
// ReadAt and Sync (File.Sync and Backend.Sync) look beyond the local
// store; truncating, removing and punching are the MDS's to fan out
// (OBJ_*), and the MDS's object calls go to the local store directly.
//
// For a file with one copy per unit it costs one cached map lookup per
// read or write, which checks that this data server holds the range.
type ReplicaStore struct {
	a     *Agent
	local store.Backend

	mu      sync.Mutex
	dirty   map[uint64]*replicaDirty // by inode: peers written unstable since the last commit
	syncing map[uint64]chan struct{} // by inode: closed when the Sync in flight ends
}

// replicaDirty records, for one file, the peers written unstable since
// their last REPLICA_COMMIT and the verifier each answered the first of
// those writes with.
type replicaDirty struct {
	gen   uint64             // the newest map generation the writes used
	peers map[string][8]byte // peer id -> verifier of its first unstable write
	lost  bool               // a peer answered with another verifier since: it restarted
}

var (
	_ store.Backend = (*ReplicaStore)(nil)
	_ store.File    = (*replicaFile)(nil)
)

// NewReplicaStore returns the data server's store.Backend: local, with
// writes replicated to the other copies of each stripe unit. local must be
// the agent's store (AgentConfig.Store).
func NewReplicaStore(a *Agent, local store.Backend) *ReplicaStore {
	return &ReplicaStore{a: a, local: local, dirty: map[uint64]*replicaDirty{}, syncing: map[uint64]chan struct{}{}}
}

// Open opens ino's local object. A missing object is fs.ErrNotExist (a
// hole), or created, only for a data server that holds a current copy of
// some part of the file; to any other it is pnfs.ErrNotMember, so that it
// neither answers reads with zeros for data it never had nor leaves empty
// objects behind refused writes.
func (s *ReplicaStore) Open(ino uint64, create bool) (store.File, error) {
	f, err := s.local.Open(ino, false)
	if err == nil {
		return &replicaFile{File: f, s: s, ino: ino}, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	ctx, cancel := s.context()
	defer cancel()
	m, merr := s.a.Map(ctx, ino)
	switch {
	case errors.Is(merr, fs.ErrNotExist), errors.Is(merr, pnfs.ErrMDSUnreachable):
		return nil, notMember("open", ino, 0, 0, merr)
	case merr != nil:
		return nil, merr
	case !m.Holds(s.a.cfg.ID) || m.IsStale(s.a.cfg.ID):
		return nil, notMember("open", ino, 0, 0, nil)
	case !create:
		return nil, err
	}
	if f, err = s.local.Open(ino, true); err != nil {
		return nil, err
	}
	return &replicaFile{File: f, s: s, ino: ino}, nil
}

// Remove removes the local object.
func (s *ReplicaStore) Remove(ino uint64) error {
	s.mu.Lock()
	delete(s.dirty, ino)
	s.mu.Unlock()
	return s.local.Remove(ino)
}

// Truncate truncates the local object.
func (s *ReplicaStore) Truncate(ino uint64, size uint64) error { return s.local.Truncate(ino, size) }

// Sync makes ino's data durable here and on the peers written unstable
// (see replicaFile.Sync).
func (s *ReplicaStore) Sync(ino uint64) error {
	return s.sync(ino, func() error { return s.local.Sync(ino) })
}

// StatFS reports the local store's space.
func (s *ReplicaStore) StatFS() (total, free, avail uint64, err error) { return s.local.StatFS() }

// Close does nothing: the local store belongs to the caller.
func (s *ReplicaStore) Close() error { return nil }

// replicaFile is an open local object whose writes are replicated. Once
// closed it fails before it reaches any peer, as the local object would.
type replicaFile struct {
	store.File
	s      *ReplicaStore
	ino    uint64
	closed atomic.Bool
}

func (f *replicaFile) check() error {
	if f.closed.Load() {
		return fmt.Errorf("cluster: ino %d: %w", f.ino, store.ErrClosed)
	}
	return nil
}

// Close closes the handle on the local object; it is idempotent.
func (f *replicaFile) Close() error {
	f.closed.Store(true)
	return f.File.Close()
}

// context bounds one operation: store.File has no context of its own.
func (s *ReplicaStore) context() (context.Context, context.CancelFunc) {
	return context.WithTimeout(s.a.ctx, peerCallTimeout)
}

// ReadAt reads the local object after checking that this data server is a
// good member of every unit the range touches. A block failing its
// checksum is an error wrapping both store.ErrCorrupt and pnfs.ErrNotMember:
// this copy is not current, and the client reads through the MDS, which
// reads another.
func (f *replicaFile) ReadAt(p []byte, off int64) (int, error) {
	if err := f.check(); err != nil {
		return 0, err
	}
	if off < 0 {
		return 0, fmt.Errorf("cluster: read at %d: %w", off, fs.ErrInvalid)
	}
	if err := f.checkMember("read", off, len(p)); err != nil {
		return 0, err
	}
	n, err := f.File.ReadAt(p, off)
	f.s.a.stats.clientReadBytes.Add(uint64(n))
	if errors.Is(err, store.ErrCorrupt) {
		return n, notMember("read", f.ino, uint64(off), len(p), err)
	}
	return n, err
}

// WriteAt writes p locally and to the other good members of the position
// of each unit it touches (REPLICA_WRITE, unstable, in parallel). A peer
// that cannot be reached is reported with REPLICA_FAILED, which marks it
// stale, and the write goes on with the map the MDS answers. The write
// fails with pnfs.ErrNotMember if this data server is not a good member of
// every unit it touches.
func (f *replicaFile) WriteAt(p []byte, off int64) (int, error) {
	if err := f.checkWrite(p, off); err != nil {
		return 0, err
	}
	if len(p) == 0 {
		return f.File.WriteAt(p, off)
	}
	ctx, cancel := f.s.context()
	defer cancel()
	n, err := f.s.write(ctx, f.ino, f.File, p, uint64(off))
	f.s.a.stats.clientWriteBytes.Add(uint64(n))
	return n, err
}

// checkMember fails with pnfs.ErrNotMember unless this data server is a
// good member of every unit [off, off+n) touches, by the file's current
// stripe map (a map the MDS cannot give counts as not a member: the
// client goes through the MDS).
func (f *replicaFile) checkMember(op string, off int64, n int) error {
	ctx, cancel := f.s.context()
	defer cancel()
	m, err := f.s.a.Map(ctx, f.ino)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, pnfs.ErrMDSUnreachable) {
			return notMember(op, f.ino, uint64(off), n, err)
		}
		return err
	}
	if !holdsRange(m, f.s.a.cfg.ID, uint64(off), n) {
		return notMember(op, f.ino, uint64(off), n, nil)
	}
	return nil
}

// checkWrite is what every write of the file checks first: the file is
// open, and the range lies within a file's possible size.
func (f *replicaFile) checkWrite(p []byte, off int64) error {
	if err := f.check(); err != nil {
		return err
	}
	if off < 0 || uint64(off)+uint64(len(p)) > 1<<63-1 {
		return fmt.Errorf("cluster: write at %d+%d: %w", off, len(p), fs.ErrInvalid)
	}
	return nil
}

// Sync makes the file's data durable here and on every peer written
// unstable since (REPLICA_COMMIT). A peer that cannot be reached is
// reported with REPLICA_FAILED (its copy is stale from then on, which is
// not an error); a peer whose verifier changed since it took a write
// restarted and may have lost it: Sync then returns an error wrapping
// pnfs.ErrDataLost once everything else is committed, and the server changes
// its write verifier so that clients resend.
func (f *replicaFile) Sync() error {
	if err := f.check(); err != nil {
		return err
	}
	return f.s.sync(f.ino, f.File.Sync)
}

// maxReplicaAttempts bounds how often one write or commit goes back to
// the MDS for a newer map (a peer failed, or refused with a newer one).
const maxReplicaAttempts = 4

// maxReplicaParallel bounds the peer calls one write has in flight.
const maxReplicaParallel = 16

// replicaPiece is the part of a write in one stripe unit, cut to at most
// maxIO bytes so that a REPLICA_WRITE fits one record (split, as for the
// MDS's own I/O), with the peers that took it.
type replicaPiece struct {
	piece
	done []string
}

func replicaPieces(m meta.StripeMap, off uint64, n int) []replicaPiece {
	ps := split(m, off, n)
	out := make([]replicaPiece, len(ps))
	for i, pc := range ps {
		out[i].piece = pc
	}
	return out
}

// peerResult is the outcome of one REPLICA_WRITE or REPLICA_COMMIT.
type peerResult struct {
	piece int
	id    string
	verf  [8]byte
	err   error
}

func (s *ReplicaStore) write(ctx context.Context, ino uint64, local store.File, p []byte, off uint64) (int, error) {
	self := s.a.cfg.ID
	m, err := s.a.Map(ctx, ino)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, pnfs.ErrMDSUnreachable) {
			return 0, notMember("write", ino, off, len(p), err)
		}
		return 0, err
	}
	if !holdsRange(m, self, off, len(p)) {
		return 0, notMember("write", ino, off, len(p), nil)
	}
	if m.Mirrors() == 1 {
		return s.writeLocal(ino, local, p, off)
	}
	pieces := replicaPieces(m, off, len(p))
	wroteLocal := false
	for attempt := 1; ; attempt++ {
		type job struct {
			piece int
			id    string
		}
		var jobs []job
		for i, pc := range pieces {
			for _, id := range m.Good(m.Position(pc.off)) {
				if id != self && !slices.Contains(pc.done, id) {
					jobs = append(jobs, job{i, id})
				}
			}
		}
		results := make([]peerResult, len(jobs))
		var wg sync.WaitGroup
		sem := make(chan struct{}, maxReplicaParallel)
		for j, jb := range jobs {
			wg.Go(func() {
				sem <- struct{}{}
				defer func() { <-sem }()
				pc := pieces[jb.piece]
				v, err := s.a.replicaWrite(ctx, jb.id, ino, m.Gen, pc.off, p[pc.lo:pc.hi], false)
				results[j] = peerResult{piece: jb.piece, id: jb.id, verf: v, err: err}
			})
		}
		var lerr error
		if !wroteLocal {
			_, lerr = s.writeLocal(ino, local, p, off)
			wroteLocal = lerr == nil
		}
		wg.Wait()
		if lerr != nil {
			return 0, lerr
		}
		var failed []string
		refresh := false
		for _, r := range results {
			switch {
			case r.err == nil:
				pc := &pieces[r.piece]
				pc.done = append(pc.done, r.id)
				s.noteWritten(ino, m.Gen, r.id, r.verf)
			case peerGone(r.err):
				if !slices.Contains(failed, r.id) {
					failed = append(failed, r.id)
				}
				s.a.log.Warn("cluster: a replica missed a write", "ino", ino, "peer", r.id, "err", r.err)
			case errors.Is(r.err, pnfs.ErrNotMember):
				refresh = true // the peer has a newer map than ours
			default:
				return 0, r.err
			}
		}
		if len(failed) == 0 && !refresh {
			return len(p), nil
		}
		if attempt >= maxReplicaAttempts {
			return 0, fmt.Errorf("%w: the copies of ino %d at %d+%d did not settle after %d attempts",
				pnfs.ErrUnavailable, ino, off, len(p), attempt)
		}
		if m, err = s.newerMap(ctx, ino, m, failed); err != nil {
			return 0, err
		}
		if !holdsRange(m, self, off, len(p)) {
			return 0, notMember("write", ino, off, len(p), nil)
		}
	}
}

// newerMap returns the map to go on with after the peers failed did not
// take a write or commit made with m: each is reported to the MDS, which
// marks it stale; with none failed (a peer refused with a newer map) the
// map is fetched again.
func (s *ReplicaStore) newerMap(ctx context.Context, ino uint64, m meta.StripeMap, failed []string) (meta.StripeMap, error) {
	if len(failed) == 0 {
		s.a.dropMapBefore(ino, m.Gen+1)
		return s.a.Map(ctx, ino)
	}
	for _, id := range failed {
		nm, err := s.a.replicaFailed(ctx, ino, m.Gen, id)
		if err != nil {
			// The copy is not marked stale: the write cannot be
			// acknowledged.
			return meta.StripeMap{}, err
		}
		m = nm
	}
	return m, nil
}

// peerGone reports whether a peer's error means its copy must be marked
// stale: it could not be reached, or its copy fails its checksum.
func peerGone(err error) bool { return unreachable(err) || errors.Is(err, store.ErrCorrupt) }

func (s *ReplicaStore) writeLocal(ino uint64, local store.File, p []byte, off uint64) (int, error) {
	n, err := local.WriteAt(p, int64(off))
	if errors.Is(err, store.ErrCorrupt) {
		// A partial block over a bad one: this copy needs healing, the
		// client writes through the MDS.
		return n, notMember("write", ino, off, len(p), err)
	}
	return n, err
}

// noteWritten records that peer id took an unstable write of ino,
// answering verifier v.
func (s *ReplicaStore) noteWritten(ino, gen uint64, id string, v [8]byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	d := s.dirty[ino]
	if d == nil {
		d = &replicaDirty{peers: map[string][8]byte{}}
		s.dirty[ino] = d
	}
	d.gen = max(d.gen, gen)
	if old, ok := d.peers[id]; !ok {
		d.peers[id] = v
	} else if old != v {
		d.lost = true
	}
}

// takeDirty removes and returns ino's record of peers written unstable.
func (s *ReplicaStore) takeDirty(ino uint64) *replicaDirty {
	s.mu.Lock()
	defer s.mu.Unlock()
	d := s.dirty[ino]
	delete(s.dirty, ino)
	return d
}

// putBackDirty returns peers that could not be committed to ino's record.
func (s *ReplicaStore) putBackDirty(ino uint64, d *replicaDirty, ids []string) {
	if len(ids) == 0 && !d.lost {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	cur := s.dirty[ino]
	if cur == nil {
		cur = &replicaDirty{peers: map[string][8]byte{}}
		s.dirty[ino] = cur
	}
	cur.gen = max(cur.gen, d.gen)
	cur.lost = cur.lost || d.lost
	for _, id := range ids {
		v := d.peers[id]
		if nv, ok := cur.peers[id]; ok && nv != v {
			cur.lost = true
		}
		cur.peers[id] = v
	}
}

// sync runs localSync and commits ino on the peers written unstable since
// their last commit, in parallel. Syncs of one file run one at a time, so
// that none returns while the peers' commits of another are in flight.
func (s *ReplicaStore) sync(ino uint64, localSync func() error) error {
	defer s.syncOne(ino)()
	d := s.takeDirty(ino)
	if d == nil {
		return localSync()
	}
	ctx, cancel := s.context()
	defer cancel()
	ids := make([]string, 0, len(d.peers))
	for id := range d.peers {
		ids = append(ids, id)
	}
	results := make([]peerResult, len(ids))
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Go(func() {
			v, err := s.a.replicaCommit(ctx, id, ino, d.gen)
			results[i] = peerResult{id: id, verf: v, err: err}
		})
	}
	lerr := localSync()
	wg.Wait()
	lost := d.lost
	var retry []string // peers to commit again next time
	var firstErr error
	gen := d.gen
	for _, r := range results {
		switch {
		case r.err == nil:
			if r.verf != d.peers[r.id] {
				lost = true
				s.a.log.Warn("cluster: a replica restarted before its writes were committed", "ino", ino, "peer", r.id)
			}
		case peerGone(r.err):
			// Its copy missed the commit: stale from now on, which the
			// MDS records before this commit is acknowledged.
			m, err := s.a.replicaFailed(ctx, ino, gen, r.id)
			if err != nil {
				retry = append(retry, r.id)
				firstErr = cmp.Or(firstErr, err)
				continue
			}
			gen = max(gen, m.Gen)
		case errors.Is(r.err, pnfs.ErrNotMember):
			// Its copy is stale or gone already: nothing to commit.
		default:
			retry = append(retry, r.id)
			firstErr = cmp.Or(firstErr, r.err)
		}
	}
	if lerr != nil || firstErr != nil {
		d.lost = lost
		s.putBackDirty(ino, d, retry)
		return cmp.Or(lerr, firstErr)
	}
	if lost {
		return fmt.Errorf("cluster: commit of ino %d: %w", ino, pnfs.ErrDataLost)
	}
	return nil
}

// syncOne waits for a Sync of ino in flight, marks one in flight, and
// returns the function that ends it.
func (s *ReplicaStore) syncOne(ino uint64) (done func()) {
	s.mu.Lock()
	for {
		ch, busy := s.syncing[ino]
		if !busy {
			break
		}
		s.mu.Unlock()
		<-ch
		s.mu.Lock()
	}
	ch := make(chan struct{})
	s.syncing[ino] = ch
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		delete(s.syncing, ino)
		s.mu.Unlock()
		close(ch)
	}
}
