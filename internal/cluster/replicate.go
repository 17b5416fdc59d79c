package cluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/shoalfs/shoal/internal/ctlproto"
	"github.com/shoalfs/shoal/internal/rpc"
	"github.com/shoalfs/shoal/meta"
	"github.com/shoalfs/shoal/pnfs"
	"github.com/shoalfs/shoal/store"
)

// Replicated stripes: the one place where a file's stripe map changes.
//
// Every change of a map (a copy marked stale, a stale copy resynced, a
// member replaced by healing, a move by drain or rebalance) goes through
// replaceMap: a compare-and-swap on the map's generation in the metadata
// engine, then MAP_CHANGED to every connected data server (they cache maps
// to know where the other copies of a unit are), then a recall of the
// file's layouts so clients see the new members.

// mapChangedWait bounds how long replaceMap waits for the data servers to
// drop their cached copies of a changed map.
const mapChangedWait = 5 * time.Second

// SetRecall installs the function that recalls every layout of a file
// (the MDS's server recalls them with CB_LAYOUTRECALL); replaceMap calls
// it after a map changed.
func (s *Striped) SetRecall(recall func(ino uint64)) {
	s.hookMu.Lock()
	defer s.hookMu.Unlock()
	s.recall = recall
}

// SetOnStale installs a function called after copies of file ino were
// marked stale (the healer's Kick: a stale copy in service can be
// resynced at once). It must not block.
func (s *Striped) SetOnStale(fn func(ino uint64)) {
	s.hookMu.Lock()
	defer s.hookMu.Unlock()
	s.onStale = fn
}

// replaceMap switches ino's map from old to nm (compare-and-swap on
// old.Gen, meta.ErrConflict if it changed meanwhile) and makes everyone
// who may hold the old one drop it.
func (s *Striped) replaceMap(ctx context.Context, ino uint64, old, nm meta.StripeMap) (meta.StripeMap, error) {
	got, err := s.maps.ReplaceStripeMap(ctx, meta.Ino(ino), old.Gen, nm)
	if err != nil {
		if errors.Is(err, meta.ErrConflict) {
			s.forget(ino)
		}
		return meta.StripeMap{}, fmt.Errorf("cluster: changing the map of ino %d: %w", ino, err)
	}
	s.forget(ino)
	s.remember(ino, got)
	s.announce(ctx, ino)
	s.hookMu.Lock()
	recall := s.recall
	s.hookMu.Unlock()
	if recall != nil {
		recall(ino)
	}
	return got, nil
}

// announce sends MAP_CHANGED(ino) to every connected data server and
// waits (bounded) for their answers. A data server that misses it has
// either lost its connection, and drops every cached map when it
// registers again, or is stuck, and is taken out of service by the
// heartbeat monitor.
func (s *Striped) announce(ctx context.Context, ino uint64) {
	ctx, cancel := context.WithTimeout(ctx, mapChangedWait)
	defer cancel()
	conns := s.r.connected()
	var wg sync.WaitGroup
	for id, conn := range conns {
		wg.Go(func() {
			var res ctlproto.CtlStatusRes
			err := call(ctx, conn, ctlproto.CTLPROC_MAP_CHANGED, &ctlproto.CtlInoArgs{Ino: ino}, &res)
			if err == nil {
				err = errOf(res.Status)
			}
			if err != nil {
				s.r.log.Debug("cluster: MAP_CHANGED not acknowledged", "ds", id, "ino", ino, "err", err)
			}
		})
	}
	wg.Wait()
}

// markStale records that id's copy of ino missed a change, unless the map
// already says so or id holds no copy any more, and returns the current
// map. It must finish before the change it is about is acknowledged.
//
// It refuses (an error wrapping errLastCopy, the map unchanged) when some
// position where id holds a good copy has no other good copy in service: a
// stale mark is per file, so marking id would leave that position with no
// copy anyone may read (or none that can be read now), although id's copy
// of it is intact. The change id missed then fails as it would with one
// copy, and is retried until the copies are back.
func (s *Striped) markStale(ctx context.Context, ino uint64, id string) (meta.StripeMap, error) {
	m, refused, err := s.markStaleAll(ctx, ino, []string{id})
	if err == nil && len(refused) > 0 {
		err = fmt.Errorf("cluster: marking %s stale in ino %d: %w", id, ino, errLastCopy)
	}
	return m, err
}

// errLastCopy: a data server cannot be marked stale in a file's map
// because its copy is the only good one in service of some position.
var errLastCopy = errors.New("cluster: the data server holds the only current copy in service of some stripe units")

// markStaleAll marks the data servers ids stale in ino's map, in one map
// change, as markStale does one. Those that cannot be marked without
// leaving a position with no good copy in service are returned in refused
// (ids are taken in order, so of two members of the same position the
// first may be marked, the second is then refused); the others are stale
// in the returned map, or hold no copy.
func (s *Striped) markStaleAll(ctx context.Context, ino uint64, ids []string) (m meta.StripeMap, refused []string, err error) {
	return s.markStaleWith(ctx, ino, ids, true)
}

// markStaleWith is markStaleAll; kick says whether the SetOnStale hook
// runs (healing at once) once the map changed.
func (s *Striped) markStaleWith(ctx context.Context, ino uint64, ids []string, kick bool) (m meta.StripeMap, refused []string, err error) {
	for attempt := 0; ; attempt++ {
		cur, ok, err := s.FileMap(ctx, ino)
		if err != nil {
			return meta.StripeMap{}, nil, err
		}
		if !ok {
			return meta.StripeMap{}, nil, fmt.Errorf("cluster: marking %q stale in ino %d: %w", ids, ino, meta.ErrNotFound)
		}
		nm := cur.Clone()
		refused = refused[:0]
		for _, id := range ids {
			switch {
			case !nm.Holds(id) || nm.IsStale(id):
			case !canMarkStale(nm, id, s.r.inService):
				refused = append(refused, id)
			default:
				nm.Stale = append(nm.Stale, id)
			}
		}
		if len(nm.Stale) == len(cur.Stale) {
			return cur, refused, nil
		}
		got, err := s.replaceMap(ctx, ino, cur, nm)
		if err == nil {
			s.r.log.Warn("cluster: copies of a file missed a change and are stale until healed",
				"ino", ino, "ds", nm.Stale[len(cur.Stale):], "gen", got.Gen)
			s.hookMu.Lock()
			onStale := s.onStale
			s.hookMu.Unlock()
			if onStale != nil && kick {
				onStale(ino)
			}
			return got, refused, nil
		}
		if !errors.Is(err, meta.ErrConflict) || attempt >= 8 {
			return meta.StripeMap{}, nil, err
		}
	}
}

// canMarkStale reports whether every position where id holds a good copy
// keeps another good copy that is in service (up) once id is stale.
func canMarkStale(m meta.StripeMap, id string, up func(id string) bool) bool {
	for p := range m.DataServers {
		good := m.Good(p)
		if slices.Contains(good, id) && !slices.ContainsFunc(good, func(o string) bool { return o != id && up(o) }) {
			return false
		}
	}
	return true
}

// inService reports whether data server id is registered and in service.
func (r *Registry) inService(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.byID[id]
	return m != nil && m.ds.inService()
}

// inService is the one rule for whether I/O on a data server can go ahead:
// it is up (registered on a live connection) and not removed.
func (d DataServer) inService() bool { return d.Up && d.State != Removed }

// ErrCorrupt: a data server's copy of the data failed its checksum
// (CTL_ERR_CORRUPT). It wraps store.ErrCorrupt, the data server's own
// verdict, so both match.
var ErrCorrupt = fmt.Errorf("cluster: a data server's copy failed its checksum: %w", store.ErrCorrupt)

// SetMirrors installs the replication policy of new files: fn returns the
// number of copies file ino's stripe units get when its data is first
// placed (the policy the metadata engine records for it). nil, or a result
// of 0 or less, means the default (SetDefaultMirrors). The result is
// capped at meta.MaxMirrors and at the number of data servers the file is
// placed over.
func (s *Striped) SetMirrors(fn func(ctx context.Context, ino uint64) int) {
	s.hookMu.Lock()
	defer s.hookMu.Unlock()
	s.mirrorsFn = fn
}

// SetDefaultMirrors sets the number of copies of the stripe units of new
// files without a policy of their own (1 if never set, or for n <= 0).
func (s *Striped) SetDefaultMirrors(n int) {
	s.hookMu.Lock()
	defer s.hookMu.Unlock()
	s.mirrors = max(n, 1)
}

// mirrorsOf returns how many copies a new file ino gets, before capping at
// the number of data servers.
func (s *Striped) mirrorsOf(ctx context.Context, ino uint64) int {
	s.hookMu.Lock()
	fn, n := s.mirrorsFn, s.mirrors
	s.hookMu.Unlock()
	if fn != nil {
		if k := fn(ctx, ino); k > 0 {
			n = k
		}
	}
	return min(max(n, 1), meta.MaxMirrors)
}

// placeMap returns the map of a new file ino over ids (rule 1 of the
// design): position p's members are ids[(p+r) mod n] for r < mirrors,
// with mirrors capped at n; stripe unit 0 is at position ino mod n.
func placeMap(unit, ino uint64, ids []string, mirrors int) meta.StripeMap {
	n := len(ids)
	m := meta.StripeMap{Unit: unit, First: uint32(ino % uint64(n)), DataServers: slices.Clone(ids)}
	if k := min(mirrors, n); k > 1 {
		m.Replicas = make([][]string, n)
		for p := range n {
			m.Replicas[p] = make([]string, k-1)
			for r := 1; r < k; r++ {
				m.Replicas[p][r-1] = ids[(p+r)%n]
			}
		}
	}
	return m
}

// Stripe maps on the wire (MAP, REPLICA_FAILED).

// mapToWire returns m as ctl_map: the members position by position, the
// stale ids and, for every id the map names, its addresses (addrs; nil for
// an id the cluster does not know).
func mapToWire(m meta.StripeMap, addrs func(id string) []string) *ctlproto.CtlMap {
	k := m.Mirrors()
	w := &ctlproto.CtlMap{
		Gen: m.Gen, Unit: m.Unit, First: m.First, Mirrors: uint32(k),
		Members: make([]ctlproto.CtlId, 0, len(m.DataServers)*k),
		Stale:   slices.Clone(m.Stale),
	}
	for p := range m.DataServers {
		w.Members = append(w.Members, m.Members(p)...)
	}
	for _, id := range m.All() {
		w.Peers = append(w.Peers, ctlproto.CtlMemberAddrs{DsId: id, Addrs: addrs(id)})
	}
	return w
}

// MapFromWire returns the stripe map a MAP or REPLICA_FAILED reply
// carries, and the addresses of the data servers it names by id. It
// checks what meta.StripeMap requires (a stripe unit, at least one
// position, First among them, 1 to meta.MaxMirrors distinct members per
// position, stale ids among the members) and fails with an error wrapping
// rpc.ErrBadReply otherwise.
func MapFromWire(w *ctlproto.CtlMap) (meta.StripeMap, map[string][]string, error) {
	bad := func(format string, args ...any) (meta.StripeMap, map[string][]string, error) {
		return meta.StripeMap{}, nil, fmt.Errorf("cluster: stripe map from the MDS: %s: %w", fmt.Sprintf(format, args...), rpc.ErrBadReply)
	}
	if w == nil {
		return bad("none")
	}
	k := int(w.Mirrors)
	if k < 1 || k > meta.MaxMirrors || len(w.Members) == 0 || len(w.Members)%k != 0 {
		return bad("%d members, %d per position", len(w.Members), w.Mirrors)
	}
	n := len(w.Members) / k
	if w.Unit == 0 || int(w.First) >= n {
		return bad("unit %d, first position %d of %d", w.Unit, w.First, n)
	}
	m := meta.StripeMap{Unit: w.Unit, First: w.First, Gen: w.Gen, DataServers: make([]string, n)}
	if k > 1 {
		m.Replicas = make([][]string, n)
	}
	for p := range n {
		members := w.Members[p*k : (p+1)*k]
		for i, id := range members {
			if id == "" || slices.Contains(members[:i], id) {
				return bad("position %d members %q", p, members)
			}
		}
		m.DataServers[p] = members[0]
		if k > 1 {
			m.Replicas[p] = slices.Clone(members[1:])
		}
	}
	for i, id := range w.Stale {
		if !m.Holds(id) || slices.Contains(w.Stale[:i], id) {
			return bad("stale %q", id)
		}
	}
	m.Stale = slices.Clone(w.Stale)
	addrs := make(map[string][]string, len(w.Peers))
	for _, p := range w.Peers {
		addrs[p.DsId] = slices.Clone(p.Addrs)
	}
	return m, addrs, nil
}

// FileMap answers MAP for Registry (MapHandler): file ino's current map,
// read from the metadata engine (a data server decides by it whether it
// may take a client's write), not from Striped's cache.
func (s *Striped) FileMap(ctx context.Context, ino uint64) (meta.StripeMap, bool, error) {
	m, err := s.maps.StripeMap(ctx, meta.Ino(ino))
	if errors.Is(err, meta.ErrNotFound) {
		return meta.StripeMap{}, false, nil
	}
	if err != nil {
		return meta.StripeMap{}, false, err
	}
	s.remember(ino, m)
	return m, true, nil
}

// ReplicaFailed answers REPLICA_FAILED for Registry (MapHandler): data
// server from, a good member of file ino's map, could not reach id to copy
// a change of the file. id is marked stale (unless the map no longer names
// it as a good member: then the current map is the answer, whatever gen
// the caller had), and the new map is returned. If id holds the only good
// copy in service of some position it cannot be marked (see markStale),
// and the caller's change fails: with the error reaching id gives
// (pnfs.ErrUnavailable, or a *DownError past DownAfter), or pnfs.ErrUnavailable if
// the MDS reaches it.
// A from that is no good member gets pnfs.ErrNotMember: the change it is
// copying is not one it may accept.
func (s *Striped) ReplicaFailed(ctx context.Context, ino, gen uint64, from, id string) (meta.StripeMap, error) {
	m, ok, err := s.FileMap(ctx, ino)
	if err != nil {
		return meta.StripeMap{}, err
	}
	if !ok {
		return meta.StripeMap{}, fmt.Errorf("cluster: stripe map of ino %d: %w", ino, meta.ErrNotFound)
	}
	if from == id {
		return meta.StripeMap{}, fmt.Errorf("cluster: %s reports itself unreachable for ino %d: %w", id, ino, syscall.EINVAL)
	}
	if !m.Holds(from) || m.IsStale(from) {
		return meta.StripeMap{}, fmt.Errorf("cluster: %s reports %s unreachable for ino %d at generation %d (map at %d): %w",
			from, id, ino, gen, m.Gen, pnfs.ErrNotMember)
	}
	s.r.log.Info("cluster: a data server could not reach a copy of a file", "ino", ino, "from", from, "ds", id, "gen", gen)
	m, err = s.markStale(ctx, ino, id)
	if errors.Is(err, errLastCopy) {
		_, cerr := s.r.conn(id)
		if cerr == nil {
			cerr = pnfs.ErrUnavailable
		}
		return meta.StripeMap{}, fmt.Errorf("cluster: ino %d: %s unreachable from %s: %w: %w", ino, id, from, errLastCopy, cerr)
	}
	return m, err
}

// connected returns the live connections of the registered data servers
// by id.
func (r *Registry) connected() map[string]*rpc.Conn {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]*rpc.Conn, len(r.ordered))
	for _, m := range r.ordered {
		if m.conn != nil {
			out[m.ds.ID] = m.conn
		}
	}
	return out
}
