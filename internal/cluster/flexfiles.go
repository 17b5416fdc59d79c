package cluster

import (
	"context"
	"fmt"
	"slices"

	"github.com/shoalfs/shoal/meta"
	"github.com/shoalfs/shoal/pnfs"
)

// Flexible files layouts (RFC 8435) over the same stripe maps as the files
// layout.
//
// A file's stripe map fixes which data servers hold each position's
// copies; a flexfiles layout presents those copies as mirrors: mirror j
// names, for every position in stripe order (starting at the map's
// First), the j-th good member of that position that is in service, each
// as a device of its own (one data server). The client writes every
// mirror itself, so the data servers must not forward those writes: the
// layout's filehandles say so (package server, fhFlex), and the data
// server writes them through ReplicaStore.LocalCopy. The copies are the
// ones the files layout's replication keeps, so healing, scrub, drain and
// rebalance see no difference; a copy a client reports failing
// (CopyFailed) is marked stale exactly like one a data server could not
// reach.

// FlexLayout returns file ino's flexfiles layout, placing the file's data
// first if it has no stripe map: over every data server in the placement
// (width 0), or over width data servers per copy (width 1 gives one data
// server per mirror, for clients that cannot stripe inside a mirror). A
// file placed before keeps its map; the caller checks the stripe count it
// can hand out. As many mirrors as every position has good copies in
// service; with a position that has none the file gets no layout, as for
// Layout.
//
// A layout for writing (write) first marks stale every good copy whose
// data server is out of service (staleOutOfService): the layout leaves
// such a copy out, so the client's writes miss it, and nothing else
// would mark it. With the files layout the data server that takes a
// write forwards it to every copy and reports the one it cannot reach
// (REPLICA_FAILED); a flexfiles client writes only the mirrors it is
// given. Unmarked, the copy would count as good again once its data
// server returned, holding the bytes from before these writes.
//
// For the same reason a layout for writing names every good copy in
// service. When the positions of a striped file have different numbers
// of them (a copy on one data server is stale, and that data server holds
// copies of some positions only), as many mirrors as the poorest position
// has would leave out good copies of the others, and those copies would
// miss the client's writes while still counting as good; staleness is
// per data server and file, not per position, so they cannot be marked
// either (the same data server may hold the last good copy of another
// position). Nor can the file go without a layout for writing: Linux 7.2
// with FF_FLAGS_NO_IO_THRU_MDS answered NFS4ERR_LAYOUTUNAVAILABLE by
// waiting two minutes for the next LAYOUTGET, not by writing through the
// MDS. So a layout for writing has as many mirrors as the richest
// position, and in a poorer position the extra mirrors name its good
// copies again: the client writes those twice, the same bytes to the
// same place. Layouts for reading have as many mirrors as the poorest
// position.
func (s *Striped) FlexLayout(ctx context.Context, ino uint64, width int, write bool) (pnfs.FlexLayout, error) {
	m, err := s.placeWidth(ctx, ino, width)
	if err != nil {
		return pnfs.FlexLayout{}, err
	}
	var staled []string
	if write {
		if m, staled, err = s.staleOutOfService(ctx, ino, m); err != nil {
			return pnfs.FlexLayout{}, err
		}
	}
	n := len(m.DataServers)
	good := make([][]string, n)
	k := meta.MaxMirrors
	for p := range n {
		good[p] = slices.DeleteFunc(m.Good(p), func(id string) bool { return !s.r.inService(id) })
		k = min(k, len(good[p]))
	}
	if k == 0 {
		// Layout says why (no good copy, or the copies out of service).
		if _, err := s.layoutIDs(ino, m); err != nil {
			return pnfs.FlexLayout{Staled: staled}, err
		}
		return pnfs.FlexLayout{Staled: staled}, fmt.Errorf("cluster: flexfiles layout of ino %d: %w", ino, pnfs.ErrUnavailable)
	}
	if write {
		for p := range n {
			k = max(k, len(good[p]))
		}
	}
	fl := pnfs.FlexLayout{Unit: m.Unit, Mirrors: make([][][16]byte, k), Staled: staled}
	for j := range k {
		fl.Mirrors[j] = make([][16]byte, n)
		for i := range n {
			p := (int(m.First) + i) % n
			fl.Mirrors[j][i] = s.devices.id([]string{good[p][j%len(good[p])]})
		}
	}
	return fl, nil
}

// staleOutOfService marks stale the good copies of file ino (map m) on
// data servers out of service, and returns the map now current and the
// data servers whose copies it marked. A copy
// that is the last good one in service of some position is left as it
// is (canMarkStale): that position has no copy to write, and FlexLayout
// hands out no layout.
func (s *Striped) staleOutOfService(ctx context.Context, ino uint64, m meta.StripeMap) (meta.StripeMap, []string, error) {
	var down []string
	for p := range m.DataServers {
		for _, id := range m.Good(p) {
			if !s.r.inService(id) && !slices.Contains(down, id) {
				down = append(down, id)
			}
		}
	}
	if len(down) == 0 {
		return m, nil, nil
	}
	// No heal at once: the data servers are out of service; the
	// healer resyncs the copies when they return (a Joined event).
	nm, _, err := s.markStaleWith(ctx, ino, down, false)
	if err != nil {
		return meta.StripeMap{}, nil, fmt.Errorf("cluster: flexfiles layout of ino %d: marking the copies out of service stale: %w", ino, err)
	}
	var marked []string
	for _, id := range down {
		if nm.IsStale(id) && !m.IsStale(id) {
			marked = append(marked, id)
		}
	}
	if len(marked) > 0 {
		s.r.log.Warn("flexfiles: copies out of service left out of a layout for writing are stale until healed",
			"ino", ino, "ds", marked)
	}
	return nm, marked, nil
}

// placeWidth is Place with the width of a new file's map given: 0 is the
// whole placement (Place).
func (s *Striped) placeWidth(ctx context.Context, ino uint64, width int) (meta.StripeMap, error) {
	if width <= 0 {
		return s.Place(ctx, ino)
	}
	m, ok, err := s.Map(ctx, ino)
	if err != nil || ok {
		return m, err
	}
	ids := s.r.Placement()
	if len(ids) == 0 {
		return meta.StripeMap{}, pnfs.ErrNoDataServers
	}
	m, err = s.maps.PlaceStripeMap(ctx, meta.Ino(ino), placeNarrow(s.unit, ino, ids, s.mirrorsOf(ctx, ino), width))
	if err != nil {
		return meta.StripeMap{}, fmt.Errorf("cluster: placing ino %d: %w", ino, err)
	}
	s.remember(ino, m)
	return m, nil
}

// placeNarrow is placeMap over width positions instead of all of ids: the
// data servers taken in turn from ino mod n (so that narrow files spread
// over the cluster as wide ones do), position p's members the pool's
// (p+r)-th for r < mirrors, mirrors capped at n.
func placeNarrow(unit, ino uint64, ids []string, mirrors, width int) meta.StripeMap {
	n := len(ids)
	if width >= n {
		return placeMap(unit, ino, ids, mirrors)
	}
	k := min(max(mirrors, 1), n)
	pool := make([]string, max(width, k))
	for i := range pool {
		pool[i] = ids[(int(ino%uint64(n))+i)%n]
	}
	m := meta.StripeMap{Unit: unit, DataServers: slices.Clone(pool[:width])}
	if k > 1 {
		m.Replicas = make([][]string, width)
		for p := range width {
			m.Replicas[p] = make([]string, k-1)
			for r := 1; r < k; r++ {
				m.Replicas[p][r-1] = pool[(p+r)%len(pool)]
			}
		}
	}
	return m
}

// CopyFailed marks stale the copy of file ino on the data server of a
// flexfiles device (one data server): a client reported that its I/O to
// that copy failed (LAYOUTERROR, or an error report in LAYOUTRETURN), so
// the copy may have missed a write the client made to the other mirrors.
// The map change recalls the file's layouts; the next layout leaves the
// copy out, and healing rewrites it. It is refused, as for a data server's
// REPLICA_FAILED, when the copy is the only good one in service of some
// position (an error wrapping errLastCopy): the client's write then goes
// through the MDS, which writes every good copy or fails it. A device that is not a single data
// server's, or whose data server holds no good copy of the file, changes
// nothing (ok false).
func (s *Striped) CopyFailed(ctx context.Context, ino uint64, device [16]byte) (ds string, ok bool, err error) {
	ids, known := s.devices.members(device)
	if !known || len(ids) != 1 {
		return "", false, nil
	}
	id := ids[0]
	m, placed, err := s.FileMap(ctx, ino)
	if err != nil || !placed {
		return id, false, err
	}
	if !m.Holds(id) || m.IsStale(id) {
		return id, false, nil
	}
	// No heal at once (SetOnStale): the client that reported the copy
	// is failing against its data server now, and a heal would hold the
	// file's layouts back while it rewrites the copy onto that same data
	// server. The next heal pass (AdminConfig.HealInterval) heals it.
	_, refused, err := s.markStaleWith(ctx, ino, []string{id}, false)
	switch {
	case err != nil:
		return id, false, err
	case len(refused) > 0:
		return id, false, fmt.Errorf("cluster: ino %d: copy on %s reported failing: %w", ino, id, errLastCopy)
	}
	return id, true, nil
}
