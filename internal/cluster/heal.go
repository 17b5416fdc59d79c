package cluster

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/shoalfs/shoal/meta"
)

// Healing: the MDS brings every replicated file back to its full count of
// good copies, in the background.
//
// A file's map is degraded when it names stale copies (members that missed
// a change) or members that are lost: removed from the cluster, or out of
// service for longer than RegistryConfig.DownAfter. The healer scans every
// map every HealInterval, and at once when a data server comes back into
// service, changes state, or has been out of service for DownAfter (Kick
// starts a scan too). For each degraded file it computes the map the file
// should have and moves to it (Striped.move, under the file's layout hold
// and move lock, the copies limited to HealRate bytes per second):
//
//   - a stale member that is in service is resynced: every unit of each
//     position it holds is copied to it from a good member, and it leaves
//     Stale;
//   - a lost member is replaced, at each position it holds, by an Active
//     data server in service that is not a member of that position yet
//     (the one with the fewest positions of the file first), which gets
//     the position's units from a good member.
//
// Nothing is healed from nothing: a position without a good member in
// service is left as it is, and the file is reported as one that cannot
// heal (Status.Replication) until a good copy comes back. A position
// whose lost member has no data server to replace it stays degraded, with
// the good copies it has.
//
// Files are healed one at a time. A drain or rebalance moving the same
// file meanwhile takes the same move lock, and whichever switches the map
// second fails its generation check (meta.ErrConflict); the healer then
// reads the map again and starts over.

// DefaultHealRate is AdminConfig.HealRate's default, in bytes per second.
const DefaultHealRate = 64 << 20

// DefaultHealInterval is AdminConfig.HealInterval's default.
const DefaultHealInterval = 5 * time.Second

// healBurst is the most bytes the heal limiter lets through at once: one
// copy call.
const healBurst = maxIO

// healMaxBackoff bounds how long a file whose heal failed waits before the
// next try.
const healMaxBackoff = 5 * time.Minute

// HealStatus is the healer's progress, as `shoal admin status` shows it.
type HealStatus struct {
	Running bool   `json:"running"`               // healing a file now
	Current uint64 `json:"current_ino,omitempty"` // the file being healed
	Files   int64  `json:"files_healed"`          // since the MDS started
	Bytes   int64  `json:"bytes_copied"`          // copied and verified, since the MDS started
	Failed  int64  `json:"failed"`                // heals that failed (retried later)
	// Rate is the copy bandwidth limit in bytes per second; -1: none.
	Rate      int64     `json:"rate"`
	LastPass  time.Time `json:"last_pass,omitzero"` // end of the last full scan
	LastErr   string    `json:"last_error,omitempty"`
	LastErrAt time.Time `json:"last_error_at,omitzero"`
}

// healer is the MDS's healing loop.
type healer struct {
	a        *Admin
	s        *Striped
	r        *Registry
	lim      limiter // nil: no limit
	interval time.Duration

	kick   chan struct{}
	cancel context.CancelFunc
	done   chan struct{}
	unsub  func()

	mu      sync.Mutex
	st      HealStatus
	backoff map[uint64]healRetry // files whose last heal failed
	timers  map[*time.Timer]struct{}
	closed  bool
}

type healRetry struct {
	next  time.Time
	delay time.Duration
}

// newHealer returns the healer of a's cluster, not started.
func newHealer(a *Admin) *healer {
	h := &healer{a: a, s: a.cfg.Striped, r: a.cfg.Registry, interval: a.cfg.HealInterval,
		kick: make(chan struct{}, 1), done: make(chan struct{}),
		backoff: map[uint64]healRetry{}, timers: map[*time.Timer]struct{}{}}
	if h.interval == 0 {
		h.interval = DefaultHealInterval
	}
	switch r := a.cfg.HealRate; {
	case r < 0:
		h.st.Rate = -1
	case r == 0:
		h.st.Rate = DefaultHealRate
	default:
		h.st.Rate = r
	}
	if h.st.Rate > 0 {
		h.lim = rate.NewLimiter(rate.Limit(h.st.Rate), healBurst)
	}
	return h
}

// start runs the healing loop until stop.
func (h *healer) start() {
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	h.unsub = h.r.Subscribe(h.event)
	go h.loop(ctx)
}

// stop ends the loop (a heal in progress is abandoned before its map
// switches) and waits for it.
func (h *healer) stop() {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return
	}
	h.closed = true
	for t := range h.timers {
		t.Stop()
	}
	clear(h.timers)
	h.mu.Unlock()
	if h.cancel == nil {
		return
	}
	h.unsub()
	h.cancel()
	<-h.done
}

// Kick makes the healer scan the stripe maps now (or right after the scan
// it is doing): call it when a copy was marked stale.
func (h *healer) Kick() {
	select {
	case h.kick <- struct{}{}:
	default:
	}
}

// event kicks the healer when a data server comes back (its stale copies
// can be resynced), changes state (a removed one is replaced), or has been
// out of service for DownAfter (it is replaced).
func (h *healer) event(ev Event) {
	switch ev.Kind {
	case Joined, Changed:
		h.Kick()
	case Left:
		h.mu.Lock()
		defer h.mu.Unlock()
		if h.closed {
			return
		}
		var t *time.Timer
		t = time.AfterFunc(h.r.downAfter+100*time.Millisecond, func() {
			h.mu.Lock()
			delete(h.timers, t)
			h.mu.Unlock()
			h.Kick()
		})
		h.timers[t] = struct{}{}
	}
}

func (h *healer) loop(ctx context.Context) {
	defer close(h.done)
	t := time.NewTimer(h.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-h.kick:
		case <-t.C:
		}
		h.pass(ctx)
		t.Reset(h.interval)
	}
}

// pass scans every stripe map once and heals the degraded files.
func (h *healer) pass(ctx context.Context) {
	before := h.status()
	defer func() {
		after := h.status()
		if after.Files != before.Files || after.Failed != before.Failed {
			h.a.log.Info("cluster: healing pass", "healed", after.Files-before.Files, "bytes", after.Bytes-before.Bytes,
				"failed", after.Failed-before.Failed)
		}
	}()
	v := h.r.liveView()
	err := h.s.eachMap(ctx, func(fm meta.FileStripeMap) bool {
		v = v.fresh(h.r)
		if _, change, _ := healTarget(fm.Map, v, uint64(fm.Ino)); change && h.due(uint64(fm.Ino)) {
			h.heal(ctx, uint64(fm.Ino), fm.Map, v)
		}
		return ctx.Err() == nil
	})
	h.mu.Lock()
	defer h.mu.Unlock()
	if err != nil && ctx.Err() == nil {
		h.st.LastErr, h.st.LastErrAt = "scanning stripe maps: "+err.Error(), time.Now()
		h.a.log.Warn("cluster: healer cannot scan the stripe maps", "err", err)
		return
	}
	if ctx.Err() == nil {
		h.st.LastPass = time.Now()
	}
}

// due reports whether file ino may be healed now: not waiting after a
// failure.
func (h *healer) due(ino uint64) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	b, ok := h.backoff[ino]
	return !ok || !time.Now().Before(b.next)
}

// heal moves file ino from m to the map healing wants, reading the map
// again when it changed meanwhile.
func (h *healer) heal(ctx context.Context, ino uint64, m meta.StripeMap, v *liveView) {
	h.mu.Lock()
	h.st.Running, h.st.Current = true, ino
	h.mu.Unlock()
	defer func() {
		h.mu.Lock()
		h.st.Running, h.st.Current = false, 0
		h.mu.Unlock()
	}()
	for attempt := 0; ; attempt++ {
		nm, change, _ := healTarget(m, v, ino)
		if !change {
			return
		}
		st, err := h.s.move(ctx, ino, m, nm, h.a.cfg.Hold, h.lim)
		h.mu.Lock()
		h.st.Bytes += st.Bytes
		h.mu.Unlock()
		switch {
		case err == nil, errors.Is(err, errLeftover):
			if err != nil {
				h.a.log.Warn("cluster: healed a file but could not remove all its old copies", "ino", ino, "err", err)
			}
			h.a.log.Debug("cluster: healed a file", "ino", ino, "gen", m.Gen+1, "bytes", st.Bytes,
				"members", nm.DataServers, "replicas", nm.Replicas, "stale", nm.Stale)
			h.mu.Lock()
			h.st.Files++
			delete(h.backoff, ino)
			h.mu.Unlock()
			return
		case errors.Is(err, meta.ErrNotFound), errors.Is(err, meta.ErrStale), ctx.Err() != nil:
			return // gone, or the healer stops
		case errors.Is(err, meta.ErrConflict) && attempt < 3:
			h.s.forget(ino)
			cur, ok, err := h.s.Map(ctx, ino)
			if err != nil || !ok {
				return
			}
			m, v = cur, h.r.liveView()
			continue
		}
		h.a.log.Warn("cluster: could not heal a file; will try again", "ino", ino, "err", err)
		h.mu.Lock()
		defer h.mu.Unlock()
		h.st.Failed++
		h.st.LastErr, h.st.LastErrAt = err.Error(), time.Now()
		b := h.backoff[ino]
		b.delay = min(max(2*b.delay, h.interval), healMaxBackoff)
		b.next = time.Now().Add(b.delay)
		if len(h.backoff) >= maxCachedMaps {
			clear(h.backoff)
		}
		h.backoff[ino] = b
		return
	}
}

// status returns the healer's progress.
func (h *healer) status() HealStatus {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.st
}

// healTarget returns the map healing wants for file ino, currently m,
// whether it differs from m, and whether some degraded position of m has
// no good member in service to heal from.
func healTarget(m meta.StripeMap, v *liveView, ino uint64) (nm meta.StripeMap, change, stuck bool) {
	nm = m.Clone()
	hasSource := func(p int) bool { return slices.ContainsFunc(m.Good(p), v.inService) }
	holds := func(p int, id string) bool { return slices.Contains(m.Members(p), id) }
	// Stale members in service are resynced, all their positions at once
	// (a copy is stale or not for the whole file).
	for _, id := range m.Stale {
		if !v.inService(id) {
			continue
		}
		ok := true
		for p := range m.DataServers {
			if holds(p, id) && !hasSource(p) {
				ok = false
			}
		}
		if !ok {
			stuck = true
			continue
		}
		nm.Stale = slices.DeleteFunc(nm.Stale, func(s string) bool { return s == id })
	}
	// Lost members are replaced position by position.
	count := map[string]int{} // positions of the file per data server
	for p := range nm.DataServers {
		for _, id := range nm.Members(p) {
			count[id]++
		}
	}
	n := len(v.place)
	for p := range nm.DataServers {
		for r, id := range nm.Members(p) {
			if !v.lost(id) {
				continue
			}
			if !hasSource(p) {
				stuck = true
				continue
			}
			best := ""
			for i := range n {
				// Ties go round by file and position, to spread the load.
				c := v.place[(i+int(ino%uint64(n))+p)%n]
				if nm.IsStale(c) || slices.Contains(nm.Members(p), c) {
					continue
				}
				if best == "" || count[c] < count[best] {
					best = c
				}
			}
			if best == "" {
				continue // no data server to take it: stays degraded
			}
			setMember(&nm, p, r, best)
			count[best]++
			count[id]--
		}
	}
	nm.Stale = slices.DeleteFunc(nm.Stale, func(id string) bool { return !nm.Holds(id) })
	return nm, !nm.Equal(m), stuck
}

// setMember makes id the r-th member of position p of m (0: the first,
// DataServers[p]).
func setMember(m *meta.StripeMap, p, r int, id string) {
	if r == 0 {
		m.DataServers[p] = id
		return
	}
	m.Replicas[p][r-1] = id
}

// mapHealth is what one map says about a file's copies.
type mapHealth struct {
	degraded    int   // positions with a stale or lost member
	unavailable []int // positions without a good member in service
}

// health judges m against v.
func health(m meta.StripeMap, v *liveView) mapHealth {
	var h mapHealth
	for p := range m.DataServers {
		members := m.Members(p)
		if slices.ContainsFunc(members, func(id string) bool { return m.IsStale(id) || v.lost(id) }) {
			h.degraded++
		}
		if !slices.ContainsFunc(m.Good(p), v.inService) {
			h.unavailable = append(h.unavailable, p)
		}
	}
	return h
}

// liveView is a snapshot of which data servers are in service, to judge
// many maps by.
type liveView struct {
	ds        map[string]DataServer
	place     []string // Registry.Placement
	gen       uint64
	at        time.Time // when taken (wall clock)
	now       time.Time // the registry's clock then
	downAfter time.Duration
}

// liveView takes a snapshot of r's data servers.
func (r *Registry) liveView() *liveView {
	r.mu.Lock()
	defer r.mu.Unlock()
	v := &liveView{ds: make(map[string]DataServer, len(r.ordered)), gen: r.gen, at: time.Now(),
		now: r.cfg.now(), downAfter: r.downAfter}
	for _, m := range r.ordered {
		v.ds[m.ds.ID] = m.ds
		if m.ds.Up && m.ds.State == Active {
			v.place = append(v.place, m.ds.ID)
		}
	}
	return v
}

// fresh returns v, or a new snapshot if the membership changed or v is
// more than a second old.
func (v *liveView) fresh(r *Registry) *liveView {
	if time.Since(v.at) < time.Second && r.Generation() == v.gen {
		return v
	}
	return r.liveView()
}

// inService reports whether id is in service: I/O on it can go ahead.
func (v *liveView) inService(id string) bool {
	d, ok := v.ds[id]
	return ok && d.inService()
}

// lost reports whether id's copies are lost for healing: it is removed
// (or unknown), or out of service for DownAfter.
func (v *liveView) lost(id string) bool {
	d, ok := v.ds[id]
	if !ok || d.State == Removed {
		return true
	}
	return !d.Up && v.now.Sub(d.Since) >= v.downAfter
}
