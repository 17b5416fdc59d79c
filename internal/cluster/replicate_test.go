package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shoalfs/shoal/internal/ctlproto"
	"github.com/shoalfs/shoal/internal/rpc"
	"github.com/shoalfs/shoal/internal/xdr"
	"github.com/shoalfs/shoal/meta"
	"github.com/shoalfs/shoal/pnfs"
	"github.com/shoalfs/shoal/store"
)

// Tests of the MDS's half of replicated stripes: placement with mirrors,
// I/O through Striped over every copy, layouts, and the MAP and
// REPLICA_FAILED calls, on a real registry and real agents over loopback.

// mirrorUnit is the stripe unit of these tests: small, so that a test
// crosses many units cheaply.
const mirrorUnit = 64 << 10

// mirrorCluster is a test cluster of data servers ds0..dsN-1 (joined in
// that order, so Placement lists them so), each advertising an address of
// its own so that a layout's device shows which data servers it names,
// and an MDS Striped placing new files with k copies that answers MAP and
// REPLICA_FAILED and records layout recalls.
type mirrorCluster struct {
	*testCluster
	s *Striped

	mu       sync.Mutex
	recalled map[uint64]int
	corrupt  map[string]*corruptingStore
}

// newMirrorCluster starts n data servers; those named in corrupt read
// through a corruptingStore.
func newMirrorCluster(t *testing.T, n, k int, corrupt ...string) *mirrorCluster {
	t.Helper()
	mc := &mirrorCluster{testCluster: newCluster(t, 0), recalled: map[uint64]int{}, corrupt: map[string]*corruptingStore{}}
	mc.s = mc.striped(mirrorUnit)
	mc.s.SetDefaultMirrors(k)
	mc.s.SetRecall(func(ino uint64) {
		mc.mu.Lock()
		mc.recalled[ino]++
		mc.mu.Unlock()
	})
	mc.reg.SetMaps(mc.s)
	stores := make([]*store.Local, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { stores[i], _ = store.NewLocal(t.TempDir(), store.LocalOptions{}) })
	}
	wg.Wait()
	for i, st := range stores {
		if st == nil {
			t.Fatal("store.NewLocal failed")
		}
		id := fmt.Sprintf("ds%d", i)
		cfg := mc.agentConfig(id, st)
		cfg.Addrs = []string{mirrorAddr(id)}
		if slices.Contains(corrupt, id) {
			cs := &corruptingStore{Backend: st}
			mc.corrupt[id] = cs
			cfg.Store = cs
		}
		mc.startAgentWith(cfg, st)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	if err := mc.reg.WaitFor(ctx, n); err != nil {
		t.Fatal(err)
	}
	return mc
}

// mirrorAddr is the address data server id advertises in a mirrorCluster.
// Nothing dials it: the MDS calls data servers back over their control
// connections.
func mirrorAddr(id string) string { return "192.0.2.1:" + id }

// recalls returns how many times ino's layouts were recalled.
func (mc *mirrorCluster) recalls(ino uint64) int {
	mc.mu.Lock()
	defer mc.mu.Unlock()
	return mc.recalled[ino]
}

// stop closes data server id's agent and waits until the registry has
// taken it out of service.
func (mc *mirrorCluster) stop(id string) {
	mc.t.Helper()
	a, _ := mc.agent(id)
	a.Close()
	mc.nextEvent(Left, id)
}

// restart starts data server id again on its store.
func (mc *mirrorCluster) restart(id string) {
	mc.t.Helper()
	_, st := mc.agent(id)
	cfg := mc.agentConfig(id, st)
	cfg.Addrs = []string{mirrorAddr(id)}
	mc.startAgentWith(cfg, st)
	mc.nextEvent(Joined, id)
}

// mdsMap returns ino's map as the metadata engine has it.
func (mc *mirrorCluster) mdsMap(ino uint64) meta.StripeMap {
	mc.t.Helper()
	m, err := mc.meta.StripeMap(context.Background(), meta.Ino(ino))
	if err != nil {
		mc.t.Fatal(err)
	}
	return m
}

// layoutOf returns the data server of each stripe index of ino's layout,
// through the device's addresses as GETDEVICEINFO would give them.
func (mc *mirrorCluster) layoutOf(ino uint64) ([]string, error) {
	mc.t.Helper()
	l, err := mc.s.Layout(context.Background(), ino)
	if err != nil {
		return nil, err
	}
	addrs, ok := mc.s.Device(l.Device)
	if !ok || len(addrs) != int(l.Count) {
		mc.t.Fatalf("device of ino %d's layout: %v, %v (count %d)", ino, addrs, ok, l.Count)
	}
	ids := make([]string, len(addrs))
	for i, a := range addrs {
		for _, ds := range mc.reg.DataServers() {
			if slices.Equal(a, []string{mirrorAddr(ds.ID)}) {
				ids[i] = ds.ID
			}
		}
	}
	return ids, nil
}

// checkLayout verifies that ino's layout names, for each position of m,
// its first good member in service, and so no stale or out-of-service one.
func (mc *mirrorCluster) checkLayout(ino uint64, m meta.StripeMap) {
	mc.t.Helper()
	ids, err := mc.layoutOf(ino)
	if err != nil {
		mc.t.Fatalf("Layout: %v", err)
	}
	for p, id := range ids {
		var want string
		for _, g := range m.Good(p) {
			if mc.reg.inService(g) {
				want = g
				break
			}
		}
		if id != want || m.IsStale(id) || !mc.reg.inService(id) {
			mc.t.Errorf("layout of ino %d names %s at position %d (members %q, stale %q); want %s",
				ino, id, p, m.Members(p), m.Stale, want)
		}
	}
}

// objects returns every data server's object ino, read from its store.
func (mc *mirrorCluster) objects(t *testing.T, ino uint64) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	for j, a := range mc.agents {
		out[a.ID()] = localObject(t, mc.stores[j], ino)
	}
	return out
}

// checkCopies verifies that every stripe unit of data, written at off, is
// at the file offset of every member of its position in holders (nil: all
// good members), and that data servers holding no copy of the position
// have nothing there.
func checkCopies(t *testing.T, objs map[string][]byte, m meta.StripeMap, data []byte, off uint64, holders func(p int) []string) {
	t.Helper()
	if holders == nil {
		holders = m.Good
	}
	end := off + uint64(len(data))
	for k := off / m.Unit; k*m.Unit < end; k++ {
		lo, hi := max(k*m.Unit, off), min((k+1)*m.Unit, end)
		p := m.Position(lo)
		for id, obj := range objs {
			var got []byte
			if uint64(len(obj)) > lo {
				got = obj[lo:min(hi, uint64(len(obj)))]
			}
			switch {
			case slices.Contains(holders(p), id):
				if !bytes.Equal(got, data[lo-off:hi-off]) {
					t.Errorf("unit %d (position %d): %s does not hold its copy", k, p, id)
				}
			case !slices.Contains(m.Members(p), id) && bytes.ContainsFunc(got, func(r rune) bool { return r != 0 }):
				t.Errorf("unit %d (position %d, members %q): %s has data there", k, p, m.Members(p), id)
			}
		}
	}
}

// corruptingStore is a data server's store whose reads fail their
// checksum (an error wrapping store.ErrCorrupt, as store.Local's with
// checksums) while bad is set.
type corruptingStore struct {
	store.Backend
	bad atomic.Bool
}

func (c *corruptingStore) Open(ino uint64, create bool) (store.File, error) {
	f, err := c.Backend.Open(ino, create)
	if err != nil {
		return nil, err
	}
	return corruptingFile{File: f, bad: &c.bad}, nil
}

type corruptingFile struct {
	store.File
	bad *atomic.Bool
}

func (f corruptingFile) ReadAt(p []byte, off int64) (int, error) {
	if f.bad.Load() {
		return 0, fmt.Errorf("test: block at %d: %w", off, store.ErrCorrupt)
	}
	return f.File.ReadAt(p, off)
}

// TestPlaceMap: position p of a new file's map is held by the placement's
// data servers p, p+1, ... (mod n), as many as the file's copies, at
// most one per data server; one copy is the single-copy map of before.
func TestPlaceMap(t *testing.T) {
	ids := []string{"a", "b", "c", "d"}
	for _, tt := range []struct {
		name    string
		n, k    int
		ino     uint64
		want    [][]string // members by position
		wantOne bool       // Replicas nil
	}{
		{"one copy", 3, 1, 7, [][]string{{"a"}, {"b"}, {"c"}}, true},
		{"two of three", 3, 2, 7, [][]string{{"a", "b"}, {"b", "c"}, {"c", "a"}}, false},
		{"three of three", 3, 3, 8, [][]string{{"a", "b", "c"}, {"b", "c", "a"}, {"c", "a", "b"}}, false},
		{"three of four", 4, 3, 9, [][]string{{"a", "b", "c"}, {"b", "c", "d"}, {"c", "d", "a"}, {"d", "a", "b"}}, false},
		{"more copies than data servers", 2, 3, 5, [][]string{{"a", "b"}, {"b", "a"}}, false},
		{"one data server", 1, 3, 5, [][]string{{"a"}}, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m := placeMap(mirrorUnit, tt.ino, ids[:tt.n], tt.k)
			if m.Unit != mirrorUnit || m.First != uint32(tt.ino%uint64(tt.n)) || !slices.Equal(m.DataServers, ids[:tt.n]) ||
				(m.Replicas == nil) != tt.wantOne || len(m.Stale) != 0 {
				t.Fatalf("placeMap = %+v", m)
			}
			for p, want := range tt.want {
				if got := m.Members(p); !slices.Equal(got, want) {
					t.Errorf("position %d members %q, want %q", p, got, want)
				}
			}
		})
	}
}

// TestMirrorsPolicy: a new file gets the copies its policy says (SetMirrors),
// the default (SetDefaultMirrors) where the policy says nothing, capped at
// meta.MaxMirrors and at the data servers in service; a file's map, once
// placed, keeps its copies whatever the policy says later.
func TestMirrorsPolicy(t *testing.T) {
	mc := newMirrorCluster(t, 3, 1)
	policy := map[uint64]int{}
	var mu sync.Mutex
	mc.s.SetMirrors(func(_ context.Context, ino uint64) int {
		mu.Lock()
		defer mu.Unlock()
		return policy[ino]
	})
	for _, tt := range []struct {
		name   string
		def    int // SetDefaultMirrors
		policy int
		want   int
	}{
		{"no policy, default one copy", 1, 0, 1},
		{"no policy, default two", 2, 0, 2},
		{"policy over the default", 1, 3, 3},
		{"policy of one copy", 3, 1, 1},
		{"negative policy is the default", 2, -1, 2},
		{"default below one is one", 0, 0, 1},
		{"capped at the data servers", 1, 5, 3},
	} {
		t.Run(tt.name, func(t *testing.T) {
			mc.s.SetDefaultMirrors(tt.def)
			ino := mc.newFile()
			mu.Lock()
			policy[ino] = tt.policy
			mu.Unlock()
			m, err := mc.s.Place(context.Background(), ino)
			if err != nil {
				t.Fatal(err)
			}
			if m.Mirrors() != tt.want || m.Gen != 1 || !slices.Equal(m.DataServers, mc.reg.Placement()) {
				t.Errorf("map %+v, want %d copies", m, tt.want)
			}
			mu.Lock()
			policy[ino] = 3 - tt.want + 1
			mu.Unlock()
			if again, err := mc.s.Place(context.Background(), ino); err != nil || !again.Equal(m) || again.Gen != m.Gen {
				t.Errorf("placed again: %+v, %v", again, err)
			}
		})
	}
	mc.s.SetMirrors(nil)
	mc.s.SetDefaultMirrors(2)
	if m, err := mc.s.Place(context.Background(), mc.newFile()); err != nil || m.Mirrors() != 2 {
		t.Errorf("without a policy function: %+v, %v", m, err)
	}
}

// TestMirroredReadWrite: a write through the MDS lands on every copy of
// each unit's position and nowhere else, reads and sizes agree, the layout
// names each position's first member, and truncate and remove reach
// every copy.
func TestMirroredReadWrite(t *testing.T) {
	for _, tt := range []struct {
		name string
		n, k int
	}{
		{"2 copies over 3", 3, 2},
		{"3 copies over 3", 3, 3},
		{"2 copies over 4", 4, 2},
		{"3 copies over 4", 4, 3},
	} {
		t.Run(tt.name, func(t *testing.T) {
			mc := newMirrorCluster(t, tt.n, tt.k)
			ino := mc.newFile()
			const off = 10_001
			data := pattern((2*tt.n+1)*mirrorUnit+777, 5)
			writeAll(t, mc.s, ino, data, off)
			m := mc.mdsMap(ino)
			if m.Mirrors() != tt.k || m.Gen != 1 || len(m.Stale) != 0 {
				t.Fatalf("map after the write: %+v", m)
			}
			checkCopies(t, mc.objects(t, ino), m, data, off, nil)
			var written uint64
			for _, a := range mc.agents {
				written += a.Stats().WriteBytes
			}
			if want := uint64(tt.k * len(data)); written != want {
				t.Errorf("%d bytes written over the cluster, want %d", written, want)
			}
			end := int64(off + len(data))
			f, err := mc.s.Open(ino, false)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if size, err := f.Size(); size != end || err != nil {
				t.Errorf("Size = %d, %v; want %d", size, err, end)
			}
			for _, r := range []struct{ off, n int64 }{{0, end}, {off + mirrorUnit - 3, 2*mirrorUnit + 6}, {end - 10, 10}} {
				buf := make([]byte, r.n)
				if n, err := f.ReadAt(buf, r.off); n != len(buf) || (err != nil && !errors.Is(err, io.EOF)) {
					t.Fatalf("ReadAt(%d, %d) = %d, %v", r.n, r.off, n, err)
				}
				want := append(make([]byte, max(0, off-r.off)), data[max(0, r.off-off):r.off+r.n-off]...)
				if !bytes.Equal(buf, want) {
					t.Errorf("ReadAt(%d, %d) reads other bytes", r.n, r.off)
				}
			}
			if ids, err := mc.layoutOf(ino); err != nil || !slices.Equal(ids, m.DataServers) {
				t.Errorf("layout names %q, %v; want the first members %q", ids, err, m.DataServers)
			}
			const size = 3*mirrorUnit + 5
			if err := mc.s.Truncate(ino, size); err != nil {
				t.Fatal(err)
			}
			for id, obj := range mc.objects(t, ino) {
				if len(obj) != size {
					t.Errorf("after Truncate(%d) %s's object has %d bytes", size, id, len(obj))
				}
			}
			if err := mc.s.Remove(ino); err != nil {
				t.Fatal(err)
			}
			for j, a := range mc.agents {
				if _, err := mc.stores[j].Open(ino, false); !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("%s still has the object after Remove: %v", a.ID(), err)
				}
			}
		})
	}
}

// TestMirroredMemberDown: with copies out of service, reads are served by
// the other copies and layouts name those; a write (or truncate) marks
// the copies it could not reach stale, in one map change, before it
// returns, and they are never read, written or named in a layout again
// until healed, even once back in service.
func TestMirroredMemberDown(t *testing.T) {
	for _, tt := range []struct {
		name string
		n, k int
		down []string
	}{
		{"2 copies over 3, one down", 3, 2, []string{"ds1"}},
		{"2 copies over 4, one down", 4, 2, []string{"ds2"}},
		{"3 copies over 3, two down", 3, 3, []string{"ds0", "ds2"}},
		{"3 copies over 4, two down", 4, 3, []string{"ds0", "ds1"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			mc := newMirrorCluster(t, tt.n, tt.k)
			ino := mc.newFile()
			const off = 3000
			old := pattern(3*tt.n*mirrorUnit, 1)
			writeAll(t, mc.s, ino, old, off)
			for _, id := range tt.down {
				mc.stop(id)
			}
			// Reads fail over; nothing changes in the map.
			if got := readAll(t, mc.s, ino, len(old), off); !bytes.Equal(got, old) {
				t.Fatal("with copies down, the file reads back differently")
			}
			m := mc.mdsMap(ino)
			if m.Gen != 1 || len(m.Stale) != 0 {
				t.Fatalf("reads changed the map: %+v", m)
			}
			mc.checkLayout(ino, m)
			if err := mc.s.Sync(ino); err != nil {
				t.Fatalf("Sync with nothing written since the last commit: %v", err)
			}

			// A write marks the copies it missed stale before it returns.
			data := pattern(len(old), 2)
			writeAll(t, mc.s, ino, data, off)
			m = mc.mdsMap(ino)
			if !sameSet(m.Stale, tt.down) || m.Gen != 2 {
				t.Fatalf("after a write with %q down: stale %q at generation %d; want them stale at 2", tt.down, m.Stale, m.Gen)
			}
			if cached := stripeMap(t, mc.s, ino); cached.Gen != m.Gen {
				t.Errorf("Striped's cached map is at generation %d, the engine's at %d", cached.Gen, m.Gen)
			}
			if mc.recalls(ino) == 0 {
				t.Error("the map changed and the file's layouts were not recalled")
			}
			if got := readAll(t, mc.s, ino, len(data), off); !bytes.Equal(got, data) {
				t.Fatal("the file reads back differently after the write")
			}
			objs := mc.objects(t, ino)
			checkCopies(t, objs, m, data, off, nil)
			// The stale copies still hold what they held.
			checkCopies(t, objs, m, old, off, func(p int) []string {
				return slices.DeleteFunc(m.Members(p), func(id string) bool { return !slices.Contains(tt.down, id) })
			})
			mc.checkLayout(ino, m)

			// Back in service, a stale copy is still left alone.
			for _, id := range tt.down {
				mc.restart(id)
			}
			ops := func() (n uint64) {
				for _, id := range tt.down {
					a, _ := mc.agent(id)
					st := a.Stats()
					n += st.ReadOps + st.WriteOps + st.TruncateOps + st.GetSizeOps
				}
				return n
			}
			before := ops()
			data2 := pattern(len(old), 3)
			writeAll(t, mc.s, ino, data2, off)
			if got := readAll(t, mc.s, ino, len(data2), off); !bytes.Equal(got, data2) {
				t.Fatal("the file reads back differently after the third write")
			}
			if err := mc.s.Truncate(ino, off+uint64(len(data2))); err != nil {
				t.Fatal(err)
			}
			if after := ops(); after != before {
				t.Errorf("%d object calls to stale copies", after-before)
			}
			if m2 := mc.mdsMap(ino); !m2.Equal(m) || m2.Gen != m.Gen {
				t.Errorf("the map changed: %+v, was %+v", m2, m)
			}
			mc.checkLayout(ino, m)
		})
	}
}

// sameSet reports whether a and b hold the same strings.
func sameSet(a, b []string) bool {
	a, b = slices.Sorted(slices.Values(a)), slices.Sorted(slices.Values(b))
	return slices.Equal(a, b)
}

// TestMirroredNoCopyInService: a change that some position's copies all
// missed, or that could be recorded only by leaving a position with no
// good copy in service, fails as it does with one copy: to be retried
// (pnfs.ErrUnavailable) for DownAfter, an I/O error (pnfs.ErrDataServerDown) after;
// nothing is marked stale, and what is reachable is still served.
func TestMirroredNoCopyInService(t *testing.T) {
	clock := &testClock{}
	mc := &mirrorCluster{testCluster: newClusterWith(t, 3, &testCluster{clock: clock})}
	mc.s = mc.striped(mirrorUnit)
	mc.s.SetDefaultMirrors(2)
	ino := mc.newFile()
	old := pattern(3*mirrorUnit, 1)
	writeAll(t, mc.s, ino, old, 0)
	m := mc.mdsMap(ino)
	// Position p's copies are Placement p and p+1: stopping two data
	// servers leaves one position with no copy in service, and every
	// other position's copy in service is the only one.
	a0, b0 := m.Members(0)[0], m.Members(0)[1]
	for _, id := range []string{a0, b0} {
		a, _ := mc.agent(id)
		a.Close()
		mc.nextEvent(Left, id)
	}
	f, err := mc.s.Open(ino, true)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	unitAt := func(p int) int64 {
		for k := range int64(3) {
			if m.Position(uint64(k)*mirrorUnit) == p {
				return k * mirrorUnit
			}
		}
		t.Fatalf("no unit at position %d", p)
		return 0
	}
	for _, tt := range []struct {
		name    string
		advance time.Duration
		want    error
	}{
		{"just down", 0, pnfs.ErrUnavailable},
		{"past DownAfter", DefaultDownAfter + time.Second, pnfs.ErrDataServerDown},
	} {
		t.Run(tt.name, func(t *testing.T) {
			clock.advance(tt.advance)
			for p := range 3 {
				// What a failed write reached stays there: write what
				// the file holds, so that the reads see no difference.
				_, err := f.WriteAt(old[unitAt(p):unitAt(p)+10], unitAt(p))
				if !errors.Is(err, tt.want) || (tt.want == pnfs.ErrUnavailable && errors.Is(err, pnfs.ErrDataServerDown)) {
					t.Errorf("write to position %d: %v, want %v", p, err, tt.want)
				}
				buf := make([]byte, mirrorUnit)
				n, err := f.ReadAt(buf, unitAt(p))
				if p == 0 {
					if !errors.Is(err, tt.want) {
						t.Errorf("read of position 0: %d, %v; want %v", n, err, tt.want)
					}
				} else if n != len(buf) || err != nil || !bytes.Equal(buf, old[unitAt(p):unitAt(p)+mirrorUnit]) {
					t.Errorf("read of position %d: %d, %v", p, n, err)
				}
			}
			if err := mc.s.Truncate(ino, uint64(len(old))); !errors.Is(err, tt.want) {
				t.Errorf("Truncate: %v, want %v", err, tt.want)
			}
			if _, err := mc.s.Layout(context.Background(), ino); !errors.Is(err, tt.want) {
				t.Errorf("Layout: %v, want %v", err, tt.want)
			}
			if m2 := mc.mdsMap(ino); m2.Gen != 1 || len(m2.Stale) != 0 {
				t.Errorf("the map changed: %+v", m2)
			}
		})
	}
}

// TestMirroredSyncFailure: a copy whose commit fails (it went away, or it
// restarted and lost UNSTABLE writes) is marked stale and the commit
// succeeds, the other copies holding the data; with one copy the commit
// fails as before.
func TestMirroredSyncFailure(t *testing.T) {
	for _, tt := range []struct {
		name    string
		k       int
		fail    func(mc *mirrorCluster, id string)
		viaFile bool  // stripedFile.Sync, else Striped.Sync
		want    error // nil: the copy is marked stale
	}{
		{"copy down, Striped.Sync", 2, func(mc *mirrorCluster, id string) { mc.stop(id) }, false, nil},
		{"copy down, file Sync", 3, func(mc *mirrorCluster, id string) { mc.stop(id) }, true, nil},
		{"copy restarted, Striped.Sync", 2, forgetVerifier, false, nil},
		{"copy restarted, file Sync", 2, forgetVerifier, true, nil},
		{"one copy, down", 1, func(mc *mirrorCluster, id string) { mc.stop(id) }, false, pnfs.ErrUnavailable},
		{"one copy, restarted", 1, forgetVerifier, true, pnfs.ErrDataLost},
	} {
		t.Run(tt.name, func(t *testing.T) {
			mc := newMirrorCluster(t, 3, tt.k)
			ino := mc.newFile()
			f, err := mc.s.Open(ino, true)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			data := pattern(3*mirrorUnit, 4)
			if _, err := f.WriteAt(data, 0); err != nil {
				t.Fatal(err)
			}
			victim := mc.mdsMap(ino).DataServers[1]
			tt.fail(mc, victim)
			if tt.viaFile {
				err = f.Sync()
			} else {
				err = mc.s.Sync(ino)
			}
			m := mc.mdsMap(ino)
			if tt.want != nil {
				if !errors.Is(err, tt.want) || len(m.Stale) != 0 {
					t.Fatalf("Sync = %v, stale %q; want %v", err, m.Stale, tt.want)
				}
				return
			}
			if err != nil || !slices.Equal(m.Stale, []string{victim}) {
				t.Fatalf("Sync = %v, stale %q; want %s stale", err, m.Stale, victim)
			}
			if got := readAll(t, mc.s, ino, len(data), 0); !bytes.Equal(got, data) {
				t.Error("the file reads back differently")
			}
			if err := mc.s.Sync(ino); err != nil {
				t.Errorf("second Sync: %v", err)
			}
		})
	}
}

// forgetVerifier makes Striped believe data server id restarted since it
// took the last writes: its next commit returns another boot verifier.
func forgetVerifier(mc *mirrorCluster, id string) {
	mc.s.mu.Lock()
	defer mc.s.mu.Unlock()
	v := mc.s.verf[id]
	v[0] ^= 0xff
	mc.s.verf[id] = v
}

// TestMirroredCorruptCopy: a copy whose data fails its checksum is read
// past and marked stale, unless it holds the only good copy of some other
// position: then it is left in place and a unit only it holds fails with
// ErrCorrupt.
func TestMirroredCorruptCopy(t *testing.T) {
	for _, tt := range []struct {
		name      string
		preStale  string // marked stale before the corruption
		wantStale []string
		wantErrAt int // position whose read fails, -1 none
	}{
		{"failed over and marked stale", "", []string{"ds2"}, -1},
		// p0 {ds0, ds1}, p1 {ds1, ds2}, p2 {ds2, ds0}: with ds1 stale,
		// ds2 is the only good copy of p1.
		{"only good copy of a position", "ds1", []string{"ds1"}, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			mc := newMirrorCluster(t, 3, 2, "ds2")
			ino := mc.newFile()
			// Unit k at position k: ino mod 3 is First.
			data := pattern(3*mirrorUnit, 6)
			m, err := mc.s.Place(context.Background(), ino)
			if err != nil {
				t.Fatal(err)
			}
			unitOf := func(p int) int64 { return int64((p+3-int(m.First))%3) * mirrorUnit }
			writeAll(t, mc.s, ino, data, 0)
			if tt.preStale != "" {
				if _, err := mc.s.markStale(context.Background(), ino, tt.preStale); err != nil {
					t.Fatal(err)
				}
			}
			mc.corrupt["ds2"].bad.Store(true)
			f, err := mc.s.Open(ino, false)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			for p := range 3 {
				buf := make([]byte, mirrorUnit)
				n, err := f.ReadAt(buf, unitOf(p))
				if p == tt.wantErrAt {
					if !errors.Is(err, ErrCorrupt) || !errors.Is(err, store.ErrCorrupt) {
						t.Errorf("read of position %d: %d, %v; want ErrCorrupt", p, n, err)
					}
					continue
				}
				if n != len(buf) || err != nil || !bytes.Equal(buf, data[unitOf(p):unitOf(p)+mirrorUnit]) {
					t.Errorf("read of position %d: %d, %v", p, n, err)
				}
			}
			if m := mc.mdsMap(ino); !sameSet(m.Stale, tt.wantStale) {
				t.Errorf("stale %q, want %q", m.Stale, tt.wantStale)
			}
			if tt.wantErrAt >= 0 {
				return
			}
			// Stale now: never read again.
			a, _ := mc.agent("ds2")
			before := a.Stats().ReadOps
			if got := readAll(t, mc.s, ino, len(data), 0); !bytes.Equal(got, data) {
				t.Error("the file reads back differently")
			}
			if after := a.Stats().ReadOps; after != before {
				t.Errorf("%d reads of a stale copy", after-before)
			}
			mc.checkLayout(ino, mc.mdsMap(ino))
		})
	}
}

// TestMapCalls: MAP and REPLICA_FAILED as a data server sends them over
// its control connection.
func TestMapCalls(t *testing.T) {
	mc := &mirrorCluster{testCluster: newCluster(t, 3)}
	mc.s = mc.striped(mirrorUnit)
	mc.s.SetDefaultMirrors(2)
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	ino := mc.newFile()
	m0, err := mc.s.Place(ctx, ino)
	if err != nil {
		t.Fatal(err)
	}
	conns := map[string]*rpc.Conn{}
	for _, a := range mc.agents {
		conns[a.ID()] = agentConn(a)
	}
	stranger, err := rpc.Dial(ctx, "tcp", mc.addr, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer stranger.Close()

	mapCall := func(conn *rpc.Conn, ino uint64) ctlproto.CtlMapRes {
		t.Helper()
		var res ctlproto.CtlMapRes
		if err := call(ctx, conn, ctlproto.CTLPROC_MAP, &ctlproto.CtlInoArgs{Ino: ino}, &res); err != nil {
			t.Fatal(err)
		}
		return res
	}
	failedCall := func(conn *rpc.Conn, ino, gen uint64, id string) ctlproto.CtlMapRes {
		t.Helper()
		var res ctlproto.CtlMapRes
		if err := call(ctx, conn, ctlproto.CTLPROC_REPLICA_FAILED, &ctlproto.CtlReplicaFailedArgs{Ino: ino, Gen: gen, DsId: id}, &res); err != nil {
			t.Fatal(err)
		}
		return res
	}
	// Before the MDS's Striped is installed: retry later.
	if res := mapCall(conns["ds0"], ino); res.Status != ctlproto.CTL_ERR_DELAY {
		t.Errorf("MAP without a map handler: %v", res.Status)
	}
	mc.reg.SetMaps(mc.s)
	recalled := 0
	mc.s.SetRecall(func(got uint64) {
		if got == ino {
			recalled++
		}
	})

	// p0 {ds0, ds1}, p1 {ds1, ds2}, p2 {ds2, ds0}.
	for _, tt := range []struct {
		name      string
		conn      *rpc.Conn
		failed    bool   // REPLICA_FAILED, else MAP
		ino       uint64 // 0: ino
		gen       uint64
		id        string
		want      ctlproto.CtlStatus
		wantStale []string
		wantGen   uint64
	}{
		{name: "MAP", conn: conns["ds2"], wantGen: 1},
		{name: "MAP of a file never placed", conn: conns["ds0"], ino: mc.newFile(), want: ctlproto.CTL_ERR_NOENT},
		{name: "MAP of no file", conn: conns["ds0"], ino: 1 << 40, want: ctlproto.CTL_ERR_NOENT},
		{name: "MAP unregistered", conn: stranger, want: ctlproto.CTL_ERR_NOTREG},
		{name: "REPLICA_FAILED unregistered", conn: stranger, failed: true, gen: 1, id: "ds1", want: ctlproto.CTL_ERR_NOTREG},
		{name: "REPLICA_FAILED", conn: conns["ds0"], failed: true, gen: 1, id: "ds1", wantStale: []string{"ds1"}, wantGen: 2},
		{name: "REPLICA_FAILED again, old generation", conn: conns["ds2"], failed: true, gen: 1, id: "ds1", wantStale: []string{"ds1"}, wantGen: 2},
		{name: "REPLICA_FAILED from a stale copy", conn: conns["ds1"], failed: true, gen: 2, id: "ds0", want: ctlproto.CTL_ERR_NOTMEMBER},
		{name: "REPLICA_FAILED about itself", conn: conns["ds0"], failed: true, gen: 2, id: "ds0", want: ctlproto.CTL_ERR_INVAL},
		// ds2 is now the only good copy of p1: retry until it answers.
		{name: "REPLICA_FAILED about the last copy", conn: conns["ds0"], failed: true, gen: 2, id: "ds2", want: ctlproto.CTL_ERR_DELAY},
		{name: "REPLICA_FAILED about a stranger", conn: conns["ds0"], failed: true, gen: 2, id: "ds9", wantStale: []string{"ds1"}, wantGen: 2},
		{name: "REPLICA_FAILED of a file never placed", conn: conns["ds0"], failed: true, ino: mc.newFile(), gen: 1, id: "ds1", want: ctlproto.CTL_ERR_NOENT},
		{name: "MAP after", conn: conns["ds1"], wantStale: []string{"ds1"}, wantGen: 2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			target := ino
			if tt.ino != 0 {
				target = tt.ino
			}
			var res ctlproto.CtlMapRes
			if tt.failed {
				res = failedCall(tt.conn, target, tt.gen, tt.id)
			} else {
				res = mapCall(tt.conn, target)
			}
			if res.Status != tt.want {
				t.Fatalf("status %v, want %v", res.Status, tt.want)
			}
			cur := mc.mdsMap(ino)
			if tt.want != ctlproto.CTL_OK {
				return
			}
			got, addrs, err := MapFromWire(res.Map)
			if err != nil {
				t.Fatal(err)
			}
			if !got.Equal(cur) || got.Gen != cur.Gen || got.Gen != tt.wantGen || !sameSet(got.Stale, tt.wantStale) {
				t.Errorf("answered %+v; the MDS has %+v; want generation %d, stale %q", got, cur, tt.wantGen, tt.wantStale)
			}
			for p := range m0.DataServers {
				if !slices.Equal(got.Members(p), m0.Members(p)) {
					t.Errorf("position %d members %q, placed %q", p, got.Members(p), m0.Members(p))
				}
			}
			if len(addrs) != 3 {
				t.Errorf("peers %v", addrs)
			}
			for _, id := range got.All() {
				ds, _ := mc.reg.DataServer(id)
				if !slices.Equal(addrs[id], ds.Addrs) {
					t.Errorf("peer %s at %v, registered at %v", id, addrs[id], ds.Addrs)
				}
			}
		})
	}
	if recalled != 1 {
		t.Errorf("layouts recalled %d times, want once (one map change)", recalled)
	}
}

// TestMapWire: stripe maps survive ctl_map (and its XDR) unchanged, and
// MapFromWire refuses what meta.StripeMap's methods could not work with.
func TestMapWire(t *testing.T) {
	addrs := func(id string) []string {
		if id == "gone" {
			return nil
		}
		return []string{id + ":2049", "[2001:db8::1]:2049"}
	}
	for _, m := range []meta.StripeMap{
		{Unit: 4096, First: 1, DataServers: []string{"a", "b", "c"}, Gen: 1},
		{Unit: 1 << 20, First: 0, DataServers: []string{"a", "b"}, Replicas: [][]string{{"b"}, {"a"}}, Stale: []string{"b"}, Gen: 7},
		{Unit: 65536, First: 2, DataServers: []string{"a", "b", "gone"}, Replicas: [][]string{{"b", "gone"}, {"gone", "a"}, {"a", "b"}}, Stale: []string{"gone", "a"}, Gen: 1 << 40},
	} {
		t.Run(fmt.Sprint(m.DataServers, m.Replicas), func(t *testing.T) {
			w := mapToWire(m, addrs)
			if len(w.Members) != len(m.DataServers)*m.Mirrors() || w.Mirrors != uint32(m.Mirrors()) {
				t.Fatalf("ctl_map %+v", w)
			}
			var res ctlproto.CtlMapRes
			if err := xdr.Unmarshal(encodeMapRes(w), &res); err != nil {
				t.Fatal(err)
			}
			got, peers, err := MapFromWire(res.Map)
			if err != nil {
				t.Fatal(err)
			}
			if !got.Equal(m) || got.Gen != m.Gen || !slices.Equal(got.Stale, m.Stale) {
				t.Errorf("round trip: %+v, want %+v", got, m)
			}
			for _, id := range m.All() {
				if !slices.Equal(peers[id], addrs(id)) {
					t.Errorf("peer %s: %v", id, peers[id])
				}
			}
		})
	}
	good := func() *ctlproto.CtlMap {
		return &ctlproto.CtlMap{Gen: 1, Unit: 4096, First: 1, Mirrors: 2, Members: []string{"a", "b", "b", "c", "c", "a"}, Stale: []string{"c"}}
	}
	if _, _, err := MapFromWire(good()); err != nil {
		t.Fatalf("a good map: %v", err)
	}
	for _, tt := range []struct {
		name   string
		mangle func(w *ctlproto.CtlMap) *ctlproto.CtlMap
	}{
		{"none", func(*ctlproto.CtlMap) *ctlproto.CtlMap { return nil }},
		{"no copies", func(w *ctlproto.CtlMap) *ctlproto.CtlMap { w.Mirrors = 0; return w }},
		{"too many copies", func(w *ctlproto.CtlMap) *ctlproto.CtlMap {
			w.Mirrors = meta.MaxMirrors + 1
			w.Members = slices.Repeat([]string{"a"}, meta.MaxMirrors+1)
			return w
		}},
		{"no members", func(w *ctlproto.CtlMap) *ctlproto.CtlMap { w.Members, w.Stale, w.First = nil, nil, 0; return w }},
		{"members not a multiple of copies", func(w *ctlproto.CtlMap) *ctlproto.CtlMap { w.Members = w.Members[:5]; return w }},
		{"first out of range", func(w *ctlproto.CtlMap) *ctlproto.CtlMap { w.First = 3; return w }},
		{"unit 0", func(w *ctlproto.CtlMap) *ctlproto.CtlMap { w.Unit = 0; return w }},
		{"a member twice in a position", func(w *ctlproto.CtlMap) *ctlproto.CtlMap { w.Members[3] = "b"; return w }},
		{"empty id", func(w *ctlproto.CtlMap) *ctlproto.CtlMap { w.Members[0] = ""; return w }},
		{"stale not a member", func(w *ctlproto.CtlMap) *ctlproto.CtlMap { w.Stale = []string{"d"}; return w }},
		{"stale twice", func(w *ctlproto.CtlMap) *ctlproto.CtlMap { w.Stale = []string{"c", "c"}; return w }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if m, _, err := MapFromWire(tt.mangle(good())); !errors.Is(err, rpc.ErrBadReply) {
				t.Errorf("MapFromWire = %+v, %v; want rpc.ErrBadReply", m, err)
			}
		})
	}
}

func encodeMapRes(w *ctlproto.CtlMap) []byte {
	return xdr.Marshal(&ctlproto.CtlMapRes{Status: ctlproto.CTL_OK, Map: w})
}

// TestWireErrors: the statuses of replicated stripes and of failover map
// to their errors and back.
func TestWireErrors(t *testing.T) {
	for _, tt := range []struct {
		st   ctlproto.CtlStatus
		want []error
	}{
		{ctlproto.CTL_ERR_CORRUPT, []error{ErrCorrupt, store.ErrCorrupt}},
		{ctlproto.CTL_ERR_NOTMEMBER, []error{pnfs.ErrNotMember}},
		{ctlproto.CTL_ERR_NOT_LEADER, []error{ErrNotLeader}},
	} {
		err := errOf(tt.st)
		for _, w := range tt.want {
			if !errors.Is(err, w) {
				t.Errorf("errOf(%v) = %v, not %v", tt.st, err, w)
			}
		}
		if back := statusOf(fmt.Errorf("wrapped: %w", err)); back != tt.st {
			t.Errorf("statusOf(errOf(%v)) = %v", tt.st, back)
		}
	}
}
