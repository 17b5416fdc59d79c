package flexv3

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/shoalfs/shoal/meta"
)

// Stale copies.
//
// A client that reports its I/O to one of a file's data files failing
// (LAYOUTERROR, or ff_ioerr4 in LAYOUTRETURN: server.CopyFailer) may
// have written the other mirrors and not that one, so that copy is
// marked stale (MarkStale): layouts, reads and writes through the MDS
// leave it out until healing (heal.go) has copied a good mirror onto it.
//
// The mark must survive an MDS restart, and it cannot be kept on the
// stale copy's own data server: that server is the one that failed, and
// may be unreachable when the mark is made. It is kept in the MDS's
// metadata, in the record Shoal keeps for its own data servers' copies:
// the file's meta.StripeMap. A file on NFSv3 data servers gets a map only
// when a copy first goes stale: one position (the whole file is one data
// file per mirror), its members the file's data servers in mirror order
// (serverID), Stale the stale ones. A file without a map has every copy
// good. No other part of an MDS with NFSv3 data servers reads stripe maps
// (no cluster.Striped runs, and inline data is off), so the map means
// here only what this file says.

// Maps is the part of the metadata engine (meta.Engine) that keeps the
// stale marks.
type Maps interface {
	StripeMap(ctx context.Context, ino meta.Ino) (meta.StripeMap, error)
	PlaceStripeMap(ctx context.Context, ino meta.Ino, m meta.StripeMap) (meta.StripeMap, error)
	ReplaceStripeMap(ctx context.Context, ino meta.Ino, gen uint64, m meta.StripeMap) (meta.StripeMap, error)
	StripeMaps(ctx context.Context, after meta.Ino, max int) ([]meta.FileStripeMap, error)
}

var _ Maps = meta.Engine(nil)

// ErrLastCopy: the copy a client reports failing is the file's only good
// one, so it is not marked stale.
var ErrLastCopy = errors.New("flexv3: the last good copy")

// serverID names data server si in stripe maps: its address and export,
// so that a changed configuration never makes a mark name another server.
func (s *Store) serverID(si int) string {
	return "nfs3:" + s.servers[si].cfg.Addr + s.servers[si].cfg.Path
}

// SetMaps gives the store the metadata engine that keeps stale marks.
// Without one (nil) no copy is ever stale and MarkStale fails. Call it
// before the store serves.
func (s *Store) SetMaps(m Maps) { s.maps = m }

// SetRecall sets what recalls a file's layouts (server.Server's
// RecallLayouts): called when a copy goes stale and before a heal.
func (s *Store) SetRecall(fn func(ino uint64)) { s.recall = fn }

// staleOf reads which of the mirrors placed on servers are stale.
func (s *Store) staleOf(ctx context.Context, ino uint64, servers []int) ([]bool, error) {
	out := make([]bool, len(servers))
	if s.maps == nil {
		return out, nil
	}
	m, err := s.maps.StripeMap(ctx, meta.Ino(ino))
	if errors.Is(err, meta.ErrNotFound) {
		return out, nil
	}
	if err != nil {
		return nil, fmt.Errorf("flexv3: stale copies of file %d: %w", ino, err)
	}
	for j, si := range servers {
		out[j] = m.IsStale(s.serverID(si))
	}
	return out, nil
}

// mapFor is the stripe map recording file ino's mirrors, with stale the
// ids of the stale ones.
func (s *Store) mapFor(servers []int, stale []string) meta.StripeMap {
	m := meta.StripeMap{Unit: 1 << 20, DataServers: []string{s.serverID(servers[0])}}
	if len(servers) > 1 {
		var r []string
		for _, si := range servers[1:] {
			r = append(r, s.serverID(si))
		}
		m.Replicas = [][]string{r}
	}
	m.Stale = stale
	return m
}

// setStale records in the metadata that the copy on server id is stale
// (stale true) or good, and returns the stale ids afterwards.
func (s *Store) setStale(ctx context.Context, ino uint64, servers []int, id string, stale bool) error {
	if s.maps == nil {
		return errors.New("flexv3: no metadata engine to keep stale marks in")
	}
	for range 5 {
		m, err := s.maps.StripeMap(ctx, meta.Ino(ino))
		if errors.Is(err, meta.ErrNotFound) {
			if !stale {
				return nil
			}
			want := s.mapFor(servers, []string{id})
			got, err := s.maps.PlaceStripeMap(ctx, meta.Ino(ino), want)
			if err != nil {
				return fmt.Errorf("flexv3: mark copy of file %d on %s stale: %w", ino, id, err)
			}
			if got.Gen == 1 && slices.Equal(got.Stale, want.Stale) {
				return nil
			}
			continue // placed by another call meanwhile: change that one
		}
		if err != nil {
			return fmt.Errorf("flexv3: stale copies of file %d: %w", ino, err)
		}
		st := slices.DeleteFunc(slices.Clone(m.Stale), func(x string) bool { return x == id })
		if stale {
			st = append(st, id)
		}
		if slices.Equal(st, m.Stale) {
			return nil
		}
		next := s.mapFor(servers, st)
		if _, err := s.maps.ReplaceStripeMap(ctx, meta.Ino(ino), m.Gen, next); errors.Is(err, meta.ErrConflict) {
			continue
		} else if err != nil {
			return fmt.Errorf("flexv3: record copies of file %d: %w", ino, err)
		}
		return nil
	}
	return fmt.Errorf("flexv3: record copies of file %d: %w", ino, meta.ErrConflict)
}

// MarkStale marks stale file ino's copy on the data server of device (a
// client reported its I/O to it failing). ds names the data server;
// marked is false when nothing changed: device is not one of the
// store's, holds no copy of the file, or its copy is stale already. It
// fails with an error wrapping ErrLastCopy, marking nothing, when every
// other copy is stale: the client must then write through the MDS. A
// marked file's layouts are recalled, so that clients come back for
// layouts without the copy, and healing is started (Healer).
func (s *Store) MarkStale(ctx context.Context, ino uint64, device [16]byte) (ds string, marked bool, err error) {
	si, ok := deviceIndex(device, len(s.servers))
	if !ok {
		return "", false, nil
	}
	ds = s.serverID(si)
	servers := s.placement(ino)
	j := slices.Index(servers, si)
	if j < 0 {
		return ds, false, nil
	}
	// The mark needs nothing from the data servers (the failing one may
	// not answer, and the file's data files may not be looked up yet):
	// the metadata says which copies are stale, and a cached entry of
	// the file is brought in line.
	//
	// One mark or heal of a file at a time: the heal lock's writer side
	// also keeps writes through the MDS out while the mark is made.
	l := s.healLock(ino)
	l.Lock()
	defer l.Unlock()
	stale, err := s.staleOf(ctx, ino, servers)
	if err != nil {
		return ds, false, err
	}
	if stale[j] {
		return ds, false, nil
	}
	others := 0 // other good copies
	for k, st := range stale {
		if k != j && !st {
			others++
		}
	}
	if others == 0 {
		return ds, false, fmt.Errorf("flexv3: copy of file %d on %s: %w", ino, ds, ErrLastCopy)
	}
	if err := s.setStale(ctx, ino, servers, ds, true); err != nil {
		return ds, false, err
	}
	s.mu.Lock()
	s.marks++
	if df := s.files[ino]; df != nil {
		df.stale[j] = true
	}
	s.mu.Unlock()
	s.metrics.staled.Inc()
	s.log().Warn("flexv3: copy marked stale until healed", "ino", ino, "ds", ds)
	if s.recall != nil {
		s.recall(ino)
	}
	s.kick()
	return ds, true, nil
}

// Stale returns the data servers (serverID) of file ino's stale copies.
func (s *Store) Stale(ctx context.Context, ino uint64) ([]string, error) {
	df, err := s.lookup(ctx, ino, false)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for j, st := range df.stale {
		if st {
			out = append(out, s.serverID(df.servers[j]))
		}
	}
	return out, nil
}
