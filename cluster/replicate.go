package cluster

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/shoalfs/shoal/internal/ctlproto"
	"github.com/shoalfs/shoal/internal/rpc"
	"github.com/shoalfs/shoal/meta"
)

// Replicated stripes: the one place where a file's stripe map changes.
//
// Every change of a map (a copy marked stale, a stale copy resynced, a
// member replaced by healing, a move by drain or rebalance) goes through
// replaceMap: a compare-and-swap on the map's generation in the metadata
// engine, then MAP_CHANGED to every connected data server (they cache maps
// to know where the other copies of a unit are), then a recall of the
// file's layouts so clients see the new members.

// ErrNotMember says a data server holds no current copy of the range a
// client asked it for: it is not a member of the range's position, or its
// copy is stale. The client does the I/O through the MDS instead.
var ErrNotMember = errors.New("cluster: this data server holds no current copy")

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
func (s *Striped) markStale(ctx context.Context, ino uint64, id string) (meta.StripeMap, error) {
	for attempt := 0; ; attempt++ {
		s.forget(ino)
		cur, ok, err := s.Map(ctx, ino)
		if err != nil {
			return meta.StripeMap{}, err
		}
		if !ok {
			return meta.StripeMap{}, fmt.Errorf("cluster: marking %s stale in ino %d: %w", id, ino, meta.ErrNotFound)
		}
		if !cur.Holds(id) || cur.IsStale(id) {
			return cur, nil
		}
		nm := cur.Clone()
		nm.Stale = append(nm.Stale, id)
		got, err := s.replaceMap(ctx, ino, cur, nm)
		if err == nil {
			s.r.log.Warn("cluster: a copy of a file missed a change and is stale until healed", "ino", ino, "ds", id, "gen", got.Gen)
			return got, nil
		}
		if !errors.Is(err, meta.ErrConflict) || attempt >= 8 {
			return meta.StripeMap{}, err
		}
	}
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
