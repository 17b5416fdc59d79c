package cluster

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/shoalfs/shoal/meta"
	"github.com/shoalfs/shoal/store"
)

// Tests of healing, drains of replicated files and the replication
// section of status, on a real registry and real agents over loopback.

// healUnit is the stripe unit of these tests: one checksum block, so
// that a test crosses many units cheaply.
const healUnit = 64 << 10

// healCluster is a test cluster of data servers ds0..dsN-1 (joined in that
// order) on checksummed stores, an MDS Striped placing new files with k
// copies, and an Admin whose healer runs only when the test says so
// (heal) unless the cluster was made with a heal interval. The registry's
// clock is the test's (DownAfter is the default, 10s).
type healCluster struct {
	*testCluster
	s    *Striped
	a    *Admin
	dirs map[string]string // data server id -> its store's directory
}

// newHealCluster starts the cluster; interval is AdminConfig.HealInterval
// (negative: the test runs the healer's passes itself).
func newHealCluster(t *testing.T, n, k int, interval time.Duration) *healCluster {
	t.Helper()
	hc := &healCluster{testCluster: newClusterWith(t, 0, &testCluster{clock: &testClock{}}), dirs: map[string]string{}}
	hc.s = hc.striped(healUnit)
	hc.s.SetDefaultMirrors(k)
	hc.reg.SetMaps(hc.s)
	for i := range n {
		hc.add(fmt.Sprintf("ds%d", i))
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	if err := hc.reg.WaitFor(ctx, n); err != nil {
		t.Fatal(err)
	}
	hc.a = NewAdmin(AdminConfig{Registry: hc.reg, Striped: hc.s, HealInterval: interval, Logger: discardLogger(),
		FileSize: func(_ context.Context, ino uint64) (uint64, error) {
			// Written through Striped alone: the largest object is the
			// file's size.
			f, _ := hc.s.Open(ino, false)
			defer f.Close()
			n, err := f.Size()
			return uint64(n), err
		}})
	if interval < 0 {
		hc.a.heal = newHealer(hc.a) // not started
	}
	t.Cleanup(hc.a.Close)
	return hc
}

// add starts data server id on a new checksummed store.
func (hc *healCluster) add(id string) {
	hc.t.Helper()
	dir := hc.t.TempDir()
	st, err := store.NewLocal(dir, store.LocalOptions{Checksums: true})
	if err != nil {
		hc.t.Fatal(err)
	}
	hc.dirs[id] = dir
	hc.startAgent(id, st)
}

// stop closes data server id's agent and waits until it is out of service.
func (hc *healCluster) stop(id string) {
	hc.t.Helper()
	a, _ := hc.agent(id)
	a.Close()
	hc.nextEvent(Left, id)
}

// restart starts data server id again on its store.
func (hc *healCluster) restart(id string) {
	hc.t.Helper()
	_, st := hc.agent(id)
	hc.startAgent(id, st)
	hc.nextEvent(Joined, id)
}

// heal runs one pass of the healer.
func (hc *healCluster) heal() {
	hc.a.heal.pass(hc.t.Context())
}

// mdsMap returns ino's map as the metadata engine has it.
func (hc *healCluster) mdsMap(ino uint64) meta.StripeMap {
	hc.t.Helper()
	m, err := hc.meta.StripeMap(context.Background(), meta.Ino(ino))
	if err != nil {
		hc.t.Fatal(err)
	}
	return m
}

// status returns the admin status.
func (hc *healCluster) status() *Status {
	hc.t.Helper()
	st, err := hc.a.Status(hc.t.Context())
	if err != nil {
		hc.t.Fatal(err)
	}
	return st
}

// checkHolds verifies that every good member of each position of m holds
// that position's units of data (written at 0) in its own store.
func (hc *healCluster) checkHolds(ino uint64, m meta.StripeMap, data []byte) {
	hc.t.Helper()
	objs := map[string][]byte{}
	for _, id := range m.All() {
		_, st := hc.agent(id)
		objs[id] = localObject(hc.t.(*testing.T), st, ino)
	}
	size := uint64(len(data))
	for off := uint64(0); off < size; off += m.Unit {
		end := min(off+m.Unit, size)
		p := m.Position(off)
		for _, id := range m.Good(p) {
			obj := objs[id]
			if uint64(len(obj)) < end || !bytes.Equal(obj[off:end], data[off:end]) {
				hc.t.Errorf("unit at %d (position %d, members %q): %s does not hold its copy", off, p, m.Members(p), id)
			}
		}
	}
}

// positionsOf returns how many positions of m data server id is a member
// of.
func positionsOf(m meta.StripeMap, id string) int {
	n := 0
	for p := range m.DataServers {
		if slices.Contains(m.Members(p), id) {
			n++
		}
	}
	return n
}

// sameIDs reports whether a and b hold the same ids, in any order.
func sameIDs(a, b []string) bool {
	return slices.Equal(slices.Sorted(slices.Values(a)), slices.Sorted(slices.Values(b)))
}

// countingLimiter counts the bytes a copy asked leave to write.
type countingLimiter struct {
	mu     sync.Mutex
	tokens int64
	calls  int
	most   int
}

func (c *countingLimiter) WaitN(_ context.Context, n int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.tokens += int64(n)
	c.calls++
	c.most = max(c.most, n)
	return nil
}

// TestHealResyncsStaleCopy: a copy that missed a write while its data
// server was away is stale; once the data server is back the healer copies
// every unit of its positions from the good copies, each byte through the
// bandwidth limiter, and clears it from Stale.
func TestHealResyncsStaleCopy(t *testing.T) {
	hc := newHealCluster(t, 3, 2, -1)
	lim := &countingLimiter{}
	hc.a.heal.lim = lim
	ino := hc.newFile()
	size := 7*healUnit + 1000
	writeAll(t, hc.s, ino, pattern(size, 1), 0)
	placed := hc.mdsMap(ino)
	if placed.Mirrors() != 2 {
		t.Fatalf("map %+v: want 2 copies", placed)
	}

	hc.stop("ds1")
	data := pattern(size, 2)
	writeAll(t, hc.s, ino, data, 0)
	if m := hc.mdsMap(ino); !m.IsStale("ds1") {
		t.Fatalf("map after a write that ds1 missed: %+v", m)
	}
	hc.restart("ds1")
	st := hc.status()
	if r := st.Replication; r.Files != 1 || r.DegradedFiles != 1 || r.DegradedStripes != 2 || r.StaleCopies != 1 || r.UnhealableFiles != 0 {
		t.Fatalf("replication status before healing: %+v", r)
	}

	hc.heal()
	m := hc.mdsMap(ino)
	if h := hc.a.heal.status(); h.LastErr != "" {
		t.Errorf("healer: %s", h.LastErr)
	}
	if m.Degraded() || m.Gen <= placed.Gen || !slices.Equal(m.DataServers, placed.DataServers) ||
		!slices.EqualFunc(m.Replicas, placed.Replicas, slices.Equal) {
		t.Fatalf("map after healing %+v; placed %+v", m, placed)
	}
	hc.checkHolds(ino, m, data)
	// ds1's copy is now the good ones' byte for byte.
	_, st1 := hc.agent("ds1")
	for p := range m.DataServers {
		if !slices.Contains(m.Members(p), "ds1") {
			continue
		}
		for _, other := range m.Members(p) {
			_, sto := hc.agent(other)
			a, b := localObject(t, st1, ino), localObject(t, sto, ino)
			for off := uint64(0); off < uint64(size); off += healUnit {
				end := min(off+healUnit, uint64(size))
				if m.Position(off) == p && !bytes.Equal(a[off:end], b[off:end]) {
					t.Errorf("unit at %d: ds1 and %s differ", off, other)
				}
			}
		}
	}
	want := int64(bytesOn(m, uint64(size), "ds1"))
	rep := hc.status().Replication
	if rep.DegradedFiles != 0 || rep.StaleCopies != 0 || rep.Heal == nil || rep.Heal.Files != 1 || rep.Heal.Bytes != want {
		t.Fatalf("replication status after healing: %+v (heal %+v); want %d bytes healed", rep, rep.Heal, want)
	}
	if lim.tokens != want || lim.most > healBurst {
		t.Errorf("limiter gave %d bytes in %d calls of at most %d; want %d bytes in calls of at most %d",
			lim.tokens, lim.calls, lim.most, want, healBurst)
	}
	if got := readAll(t, hc.s, ino, size, 0); !bytes.Equal(got, data) {
		t.Error("the file reads wrong after healing")
	}
	// Nothing left to do.
	hc.heal()
	if m2 := hc.mdsMap(ino); m2.Gen != m.Gen {
		t.Errorf("a second pass changed the map: %+v", m2)
	}
}

// TestHealReplacesLostMember: a data server out of service for longer
// than DownAfter is replaced at each of its positions by one that is not a
// member there yet; with three data servers and two copies every position
// ends on the two survivors. A second loss then still leaves a good copy
// of every position, and the file reads back whole.
func TestHealReplacesLostMember(t *testing.T) {
	hc := newHealCluster(t, 3, 2, -1)
	ino := hc.newFile()
	size := 9*healUnit + 4321
	data := pattern(size, 3)
	writeAll(t, hc.s, ino, data, 0)
	placed := hc.mdsMap(ino)

	hc.stop("ds2")
	hc.heal()
	if m := hc.mdsMap(ino); m.Gen != placed.Gen {
		t.Fatalf("healed a data server that is not down yet: %+v", m)
	}
	hc.clock.advance(DefaultDownAfter + time.Second)
	if r := hc.status().Replication; r.DegradedFiles != 1 || r.DegradedStripes != 2 || r.UnhealableFiles != 0 {
		t.Fatalf("replication status with ds2 down: %+v", r)
	}
	hc.heal()
	m := hc.mdsMap(ino)
	for p := range m.DataServers {
		if got := m.Members(p); len(got) != 2 || !sameIDs(got, []string{"ds0", "ds1"}) {
			t.Errorf("position %d members %q; want ds0 and ds1", p, got)
		}
	}
	if m.Degraded() || m.Holds("ds2") {
		t.Fatalf("map after healing: %+v", m)
	}
	hc.checkHolds(ino, m, data)
	if r := hc.status().Replication; r.DegradedFiles != 0 || r.Heal.Files != 1 {
		t.Fatalf("replication status after healing: %+v (heal %+v)", r, r.Heal)
	}

	hc.stop("ds1")
	if got := readAll(t, hc.s, ino, size, 0); !bytes.Equal(got, data) {
		t.Fatal("the file reads wrong with ds1 away")
	}
	hc.clock.advance(DefaultDownAfter + time.Second)
	if got := readAll(t, hc.s, ino, size, 0); !bytes.Equal(got, data) {
		t.Fatal("the file reads wrong with ds1 down")
	}
	// Nowhere to put the second copies: the map stays as it is.
	hc.heal()
	if m2 := hc.mdsMap(ino); m2.Gen != m.Gen {
		t.Fatalf("map changed with no data server to heal onto: %+v", m2)
	}
	if r := hc.status().Replication; r.DegradedFiles != 1 || r.DegradedStripes != 3 || r.UnhealableFiles != 0 {
		t.Fatalf("replication status with ds1 down too: %+v", r)
	}
	got := hc.metrics()
	for name, want := range map[string]float64{
		"shoal_cluster_replicated_files":      1,
		"shoal_cluster_degraded_files":        1,
		"shoal_cluster_degraded_stripes":      3,
		"shoal_cluster_unhealable_files":      0,
		"shoal_cluster_healed_files_total":    1,
		"shoal_cluster_heal_bytes_total":      float64(bytesOn(placed, uint64(size), "ds2")),
		"shoal_cluster_heal_rate_limit_bytes": DefaultHealRate,
	} {
		if v, ok := got[name]; !ok || v != want {
			t.Errorf("%s = %v (exported: %v); want %v", name, v, ok, want)
		}
	}
}

// metrics gathers the admin's Prometheus metrics without labels.
func (hc *healCluster) metrics() map[string]float64 {
	hc.t.Helper()
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(NewCollector(hc.a)); err != nil {
		hc.t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		hc.t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if len(m.GetLabel()) > 0 {
				continue
			}
			switch {
			case m.GetGauge() != nil:
				out[mf.GetName()] = m.GetGauge().GetValue()
			case m.GetCounter() != nil:
				out[mf.GetName()] = m.GetCounter().GetValue()
			}
		}
	}
	return out
}

// TestHealNeverFromNothing: a position whose every copy is lost cannot
// heal. The file is reported, and its map is left alone: no data server is
// handed a position it has no copy of.
func TestHealNeverFromNothing(t *testing.T) {
	hc := newHealCluster(t, 3, 2, -1)
	ino := hc.newFile()
	size := 6 * healUnit
	data := pattern(size, 4)
	writeAll(t, hc.s, ino, data, 0)
	placed := hc.mdsMap(ino)
	hc.stop("ds0")
	hc.stop("ds1")
	hc.clock.advance(DefaultDownAfter + time.Second)
	hc.heal()
	if m := hc.mdsMap(ino); m.Gen != placed.Gen {
		t.Fatalf("map changed: %+v; placed %+v", m, placed)
	}
	st := hc.status()
	if r := st.Replication; r.DegradedFiles != 1 || r.UnhealableFiles != 1 || !slices.Equal(r.Unhealable, []uint64{ino}) {
		t.Fatalf("replication status: %+v", r)
	}
	if st.UnavailableFiles != 1 || len(st.Unavailable) != 1 || !sameIDs(st.Unavailable[0].Down, []string{"ds0", "ds1"}) {
		t.Fatalf("unavailable files: %d %+v", st.UnavailableFiles, st.Unavailable)
	}
	// The copies come back: nothing is lost, nothing to heal.
	hc.restart("ds0")
	hc.restart("ds1")
	hc.heal()
	if m := hc.mdsMap(ino); m.Gen != placed.Gen {
		t.Fatalf("map changed: %+v", m)
	}
	if got := readAll(t, hc.s, ino, size, 0); !bytes.Equal(got, data) {
		t.Fatal("the file reads wrong")
	}
}

// TestHealLoop: the healer runs by itself and heals a file once a data
// server has been out of service for DownAfter.
func TestHealLoop(t *testing.T) {
	hc := newHealCluster(t, 4, 2, 20*time.Millisecond)
	ino := hc.newFile()
	size := 5*healUnit + 7
	data := pattern(size, 5)
	writeAll(t, hc.s, ino, data, 0)
	hc.stop("ds1")
	hc.clock.advance(DefaultDownAfter + time.Second)
	eventually(t, "the healer to replace ds1", func() bool {
		m := hc.mdsMap(ino)
		return !m.Holds("ds1") && !m.Degraded()
	})
	m := hc.mdsMap(ino)
	for p := range m.DataServers {
		if got := m.Members(p); len(got) != 2 || got[0] == got[1] {
			t.Errorf("position %d members %q", p, got)
		}
	}
	hc.checkHolds(ino, m, data)
	if got := readAll(t, hc.s, ino, size, 0); !bytes.Equal(got, data) {
		t.Fatal("the file reads wrong after healing")
	}
}

// TestHealRate: the healer's bandwidth limit as configured.
func TestHealRate(t *testing.T) {
	reg := newTestRegistry(t, testRegistryConfig(newFakeChecker()))
	for _, tc := range []struct {
		name string
		rate int64
		want int64 // bytes/s; -1: no limiter
	}{
		{"default", 0, DefaultHealRate},
		{"set", 10 << 20, 10 << 20},
		{"unlimited", -1, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := NewAdmin(AdminConfig{Registry: reg, HealRate: tc.rate, HealInterval: -1})
			h := newHealer(a)
			if h.status().Rate != tc.want {
				t.Errorf("rate %d; want %d", h.status().Rate, tc.want)
			}
			switch l := h.lim.(type) {
			case nil:
				if tc.want != -1 {
					t.Errorf("no limiter; want %d bytes/s", tc.want)
				}
			case *rate.Limiter:
				if l.Limit() != rate.Limit(tc.want) || l.Burst() != healBurst {
					t.Errorf("limiter %v/s burst %d; want %d/s burst %d", l.Limit(), l.Burst(), tc.want, healBurst)
				}
			default:
				t.Errorf("limiter %T", l)
			}
		})
	}
}

// TestHealTarget: the map healing wants, position by position.
func TestHealTarget(t *testing.T) {
	ds := func(id string, up bool, state State, out time.Duration) DataServer {
		return DataServer{ID: id, Up: up, State: state, Since: time.Unix(1000, 0).Add(-out)}
	}
	view := func(dss ...DataServer) *liveView {
		v := &liveView{ds: map[string]DataServer{}, now: time.Unix(1000, 0), downAfter: 10 * time.Second}
		for _, d := range dss {
			v.ds[d.ID] = d
			if d.Up && d.State == Active {
				v.place = append(v.place, d.ID)
			}
		}
		return v
	}
	three := meta.StripeMap{Unit: 1, DataServers: []string{"a", "b", "c"}, Replicas: [][]string{{"b"}, {"c"}, {"a"}}, Gen: 4}
	for _, tc := range []struct {
		name   string
		m      meta.StripeMap
		v      *liveView
		want   meta.StripeMap // zero: unchanged
		stuck  bool
		health mapHealth
	}{
		{name: "healthy", m: three, v: view(ds("a", true, Active, 0), ds("b", true, Active, 0), ds("c", true, Active, 0))},
		{
			name:   "away, not down yet",
			m:      three,
			v:      view(ds("a", true, Active, 0), ds("b", false, Active, 9*time.Second), ds("c", true, Active, 0)),
			health: mapHealth{},
		},
		{
			name:   "down: replaced by the only one left",
			m:      three,
			v:      view(ds("a", true, Active, 0), ds("b", false, Active, time.Minute), ds("c", true, Active, 0)),
			want:   meta.StripeMap{Unit: 1, DataServers: []string{"a", "a", "c"}, Replicas: [][]string{{"c"}, {"c"}, {"a"}}},
			health: mapHealth{degraded: 2},
		},
		{
			name: "removed: replaced by the spare with the fewest positions",
			m:    three,
			v: view(ds("a", true, Active, 0), ds("b", true, Removed, 0), ds("c", true, Active, 0),
				ds("d", true, Active, 0), ds("e", true, Draining, 0)),
			want:   meta.StripeMap{Unit: 1, DataServers: []string{"a", "d", "c"}, Replicas: [][]string{{"d"}, {"c"}, {"a"}}},
			health: mapHealth{degraded: 2},
		},
		{
			name: "stale in service: resynced",
			m: meta.StripeMap{Unit: 1, DataServers: []string{"a", "b", "c"}, Replicas: [][]string{{"b"}, {"c"}, {"a"}},
				Stale: []string{"c"}},
			v:      view(ds("a", true, Active, 0), ds("b", true, Active, 0), ds("c", true, Active, 0)),
			want:   three,
			health: mapHealth{degraded: 2},
		},
		{
			name: "stale and away: waits",
			m: meta.StripeMap{Unit: 1, DataServers: []string{"a", "b", "c"}, Replicas: [][]string{{"b"}, {"c"}, {"a"}},
				Stale: []string{"c"}},
			v:      view(ds("a", true, Active, 0), ds("b", true, Active, 0), ds("c", false, Active, time.Second)),
			health: mapHealth{degraded: 2, unavailable: nil},
		},
		{
			name: "stale and down: replaced, no longer stale",
			m: meta.StripeMap{Unit: 1, DataServers: []string{"a", "b", "c"}, Replicas: [][]string{{"b"}, {"c"}, {"a"}},
				Stale: []string{"c"}},
			v:      view(ds("a", true, Active, 0), ds("b", true, Active, 0), ds("c", false, Active, time.Minute), ds("d", true, Active, 0)),
			want:   meta.StripeMap{Unit: 1, DataServers: []string{"a", "b", "d"}, Replicas: [][]string{{"b"}, {"d"}, {"a"}}},
			health: mapHealth{degraded: 2},
		},
		{
			name:   "no good copy in service: stuck",
			m:      three,
			v:      view(ds("a", false, Active, time.Minute), ds("b", false, Active, time.Minute), ds("c", true, Active, 0), ds("d", true, Active, 0)),
			want:   meta.StripeMap{Unit: 1, DataServers: []string{"a", "d", "c"}, Replicas: [][]string{{"b"}, {"c"}, {"d"}}},
			stuck:  true,
			health: mapHealth{degraded: 3, unavailable: []int{0}},
		},
		{
			name: "stale copy whose other position has no source: stuck",
			m: meta.StripeMap{Unit: 1, DataServers: []string{"a", "b", "c"}, Replicas: [][]string{{"b"}, {"c"}, {"a"}},
				Stale: []string{"b"}},
			v:      view(ds("a", false, Active, time.Second), ds("b", true, Active, 0), ds("c", true, Active, 0)),
			stuck:  true,
			health: mapHealth{degraded: 2, unavailable: []int{0}},
		},
		{
			name:   "one copy: nothing to heal from",
			m:      meta.StripeMap{Unit: 1, DataServers: []string{"a", "b"}},
			v:      view(ds("a", true, Active, 0), ds("b", false, Active, time.Minute), ds("c", true, Active, 0)),
			stuck:  true,
			health: mapHealth{degraded: 1, unavailable: []int{1}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nm, change, stuck := healTarget(tc.m, tc.v, 0)
			want := tc.want
			if want.DataServers == nil {
				want = tc.m
			}
			if !nm.Equal(want) || change != !want.Equal(tc.m) || stuck != tc.stuck {
				t.Errorf("healTarget = %+v, change %v, stuck %v; want %+v, stuck %v", nm, change, stuck, want, tc.stuck)
			}
			if h := health(tc.m, tc.v); h.degraded != tc.health.degraded || !slices.Equal(h.unavailable, tc.health.unavailable) {
				t.Errorf("health = %+v; want %+v", h, tc.health)
			}
		})
	}
}

// TestDrainReplicated: draining a data server of replicated files gives
// each of its positions to a data server that is not a member there yet,
// copies the units from the good copies, and leaves nothing of the files
// on it; a rebalance then gives a new data server the positions that a
// data server held twice.
func TestDrainReplicated(t *testing.T) {
	hc := newHealCluster(t, 3, 2, -1)
	ino := hc.newFile()
	size := 8*healUnit + 99
	data := pattern(size, 6)
	writeAll(t, hc.s, ino, data, 0)
	run := func(cmd string, req AdminRequest) *Job {
		t.Helper()
		if _, err := hc.a.Admin(t.Context(), cmd, mustJSON(req)); err != nil {
			t.Fatal(err)
		}
		hc.a.mu.Lock()
		j := hc.a.job
		hc.a.mu.Unlock()
		<-j.done
		hc.a.mu.Lock()
		defer hc.a.mu.Unlock()
		return j.snapshot()
	}
	if j := run("drain", AdminRequest{DS: "ds1"}); j.Moved != 1 || j.Failed != 0 || j.Err != "" {
		t.Fatalf("drain: %+v", j)
	}
	if d, _ := hc.reg.DataServer("ds1"); d.State != Drained {
		t.Fatalf("ds1 is %s after the drain", d.State)
	}
	m := hc.mdsMap(ino)
	for p := range m.DataServers {
		if got := m.Members(p); !sameIDs(got, []string{"ds0", "ds2"}) {
			t.Errorf("position %d members %q after the drain", p, got)
		}
	}
	hc.checkHolds(ino, m, data)
	_, st1 := hc.agent("ds1")
	if obj := localObject(t, st1, ino); obj != nil {
		t.Errorf("the drained data server still holds %d bytes of the file", len(obj))
	}
	if st := hc.status(); st.DataServers[1].Files != 0 || st.DataServers[0].Bytes+st.DataServers[2].Bytes != 2*uint64(size) {
		t.Errorf("status after the drain: %+v", st.DataServers)
	}

	hc.add("ds3")
	if j := run("rebalance", AdminRequest{}); j.Moved != 1 || j.Failed != 0 {
		t.Fatalf("rebalance: %+v", j)
	}
	m = hc.mdsMap(ino)
	if len(m.DataServers) != 3 || m.Mirrors() != 2 || !m.Holds("ds3") || m.Holds("ds1") {
		t.Fatalf("map after the rebalance: %+v", m)
	}
	hc.checkHolds(ino, m, data)
	if got := readAll(t, hc.s, ino, size, 0); !bytes.Equal(got, data) {
		t.Fatal("the file reads wrong after the rebalance")
	}
	var total uint64
	for _, d := range hc.status().DataServers {
		total += d.Bytes
	}
	if total != 2*uint64(size) {
		t.Errorf("data servers hold %d bytes of a %d-byte file with 2 copies", total, size)
	}
}
