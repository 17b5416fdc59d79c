package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"

	"github.com/shoalfs/shoal/meta"
)

// flipByte damages byte off of data server id's object ino on disk, under
// its store's checksums.
func (hc *healCluster) flipByte(id string, ino uint64, off int64) {
	hc.t.Helper()
	path := filepath.Join(hc.dirs[id], "data", fmt.Sprintf("%02x", ino&0xff), strconv.FormatUint(ino, 10))
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		hc.t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, off); err != nil {
		hc.t.Fatal(err)
	}
	b[0] ^= 0xff
	if _, err := f.WriteAt(b, off); err != nil {
		hc.t.Fatal(err)
	}
}

// scrub runs a scrub job to its end and returns it.
func (hc *healCluster) scrub() *Job {
	hc.t.Helper()
	if _, err := hc.a.Admin(hc.t.Context(), "scrub", nil); err != nil {
		hc.t.Fatal(err)
	}
	hc.a.mu.Lock()
	j := hc.a.job
	hc.a.mu.Unlock()
	<-j.done
	hc.a.mu.Lock()
	defer hc.a.mu.Unlock()
	return j.snapshot()
}

// TestScrubRepairsBadCopies: scrub finds a copy whose blocks fail their
// checksums (in the middle of the file and in its partial last block) and
// a sound copy that differs from the first member's, rewrites each from a
// good copy, and reports them; a second scrub finds nothing.
func TestScrubRepairsBadCopies(t *testing.T) {
	hc := newHealCluster(t, 3, 2, -1)
	ino := hc.newFile()
	const unit = healUnit
	size := 7*unit + 1000
	data := pattern(size, 7)
	writeAll(t, hc.s, ino, data, 0)
	m := hc.mdsMap(ino)
	type finding struct {
		off     uint64
		ds      string
		problem string
	}
	var want []finding
	// A bad block of a replica in unit 1.
	x := m.Members(m.Position(unit))[1]
	hc.flipByte(x, ino, unit+100)
	want = append(want, finding{unit, x, "corrupt"})
	// The partial last block of the first member of unit 7.
	y := m.Members(m.Position(7 * unit))[0]
	hc.flipByte(y, ino, 7*unit+10)
	want = append(want, finding{7 * unit, y, "corrupt"})
	// A replica of unit 3 written behind the MDS's back: sound, but not
	// what the first member holds.
	z := m.Members(m.Position(3 * unit))[1]
	_, stz := hc.agent(z)
	f, err := stz.Open(ino, false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("XXXXX"), 3*unit+5); err != nil {
		t.Fatal(err)
	}
	f.Close()
	want = append(want, finding{3 * unit, z, "differs"})

	j := hc.scrub()
	if j.Err != "" || j.Failed != 0 || j.Files != 1 || j.Chunks != 8 || j.Bad != 3 || j.Repaired != 3 || j.Bytes != 2*unit+1000 {
		t.Fatalf("scrub job %+v", j)
	}
	var got []finding
	for _, f := range j.Findings {
		if f.Ino != ino || !f.Repaired || f.Err != "" || f.Length != min(unit, uint64(size)-f.Offset) {
			t.Errorf("finding %+v", f)
		}
		got = append(got, finding{f.Offset, f.DS, f.Problem})
	}
	cmp := func(a, b finding) int { return int(a.off) - int(b.off) }
	slices.SortFunc(got, cmp)
	slices.SortFunc(want, cmp)
	if !slices.Equal(got, want) {
		t.Fatalf("findings %+v; want %+v", got, want)
	}
	hc.checkHolds(ino, m, data)
	for _, id := range m.All() {
		_, st := hc.agent(id)
		if bad, err := st.Verify(ino); err != nil || len(bad) > 0 {
			t.Errorf("%s: blocks %v still fail their checksums (%v)", id, bad, err)
		}
	}
	_, sty := hc.agent(y)
	if obj := localObject(t, sty, ino); len(obj) != size {
		t.Errorf("%s's object is %d bytes after the repair of its last block; want %d", y, len(obj), size)
	}
	if m2 := hc.mdsMap(ino); m2.Gen != m.Gen {
		t.Errorf("the map changed: %+v", m2)
	}

	if j := hc.scrub(); j.Bad != 0 || j.Chunks != 8 || j.Err != "" {
		t.Fatalf("second scrub %+v", j)
	}
	if sc := hc.status().Replication.Scrub; sc != (ScrubTotals{Files: 2, Chunks: 16, Bad: 3, Repaired: 3}) {
		t.Errorf("scrub totals %+v", sc)
	}
}

// TestScrubNoSoundCopy: a chunk whose every copy fails its checksums is
// reported and left alone: there is nothing to repair it from, and marking
// a copy stale would not bring the data back.
func TestScrubNoSoundCopy(t *testing.T) {
	hc := newHealCluster(t, 3, 2, -1)
	ino := hc.newFile()
	size := 4 * healUnit
	writeAll(t, hc.s, ino, pattern(size, 8), 0)
	m := hc.mdsMap(ino)
	off := uint64(2 * healUnit)
	members := m.Members(m.Position(off))
	for _, id := range members {
		hc.flipByte(id, ino, int64(off)+1)
	}
	j := hc.scrub()
	if j.Bad != 2 || j.Repaired != 0 || len(j.Findings) != 2 {
		t.Fatalf("scrub job %+v", j)
	}
	for _, f := range j.Findings {
		if f.Offset != off || f.Problem != "corrupt" || f.Repaired || f.Err == "" || !slices.Contains(members, f.DS) {
			t.Errorf("finding %+v", f)
		}
	}
	if m2 := hc.mdsMap(ino); m2.Gen != m.Gen || m2.Degraded() {
		t.Errorf("the map changed: %+v", m2)
	}
}

// TestScrubIsAJob: one job at a time; single-copy files are not scrubbed.
func TestScrubIsAJob(t *testing.T) {
	hc := newHealCluster(t, 2, 1, -1)
	writeAll(t, hc.s, hc.newFile(), pattern(3*healUnit, 9), 0)
	if j := hc.scrub(); j.Kind != "scrub" || j.Files != 0 || j.Chunks != 0 || j.Running {
		t.Fatalf("scrub of single-copy files: %+v", j)
	}
	// A drain holds the job slot while it waits in Hold.
	release := make(chan struct{})
	held := make(chan struct{})
	var once sync.Once
	hc.a.cfg.Hold = func(ctx context.Context, ino uint64) (func(), error) {
		once.Do(func() { close(held) })
		<-release
		return func() {}, nil
	}
	if _, err := hc.a.Admin(t.Context(), "drain", mustJSON(AdminRequest{DS: "ds1"})); err != nil {
		t.Fatal(err)
	}
	<-held
	if _, err := hc.a.Admin(t.Context(), "scrub", nil); !errors.Is(err, ErrBusy) {
		t.Errorf("scrub during a drain: %v; want ErrBusy", err)
	}
	close(release)
	hc.a.mu.Lock()
	j := hc.a.job
	hc.a.mu.Unlock()
	<-j.done
}

// fakePolicies is a PolicyStore keeping policies in a map.
type fakePolicies struct {
	def int
	set map[string]int
}

func (f *fakePolicies) PolicyOf(_ context.Context, path string) (PolicyInfo, error) {
	if path == "/missing" {
		return PolicyInfo{}, fmt.Errorf("fake: %s: %w", path, meta.ErrNotFound)
	}
	if n, ok := f.set[path]; ok {
		return PolicyInfo{Path: path, Mirrors: n, Default: f.def}, nil
	}
	return PolicyInfo{Path: path, Mirrors: f.def, Inherited: true, Default: f.def}, nil
}

func (f *fakePolicies) SetPolicy(ctx context.Context, path string, mirrors int) (PolicyInfo, error) {
	if mirrors == 0 {
		delete(f.set, path)
	} else {
		f.set[path] = mirrors
	}
	return f.PolicyOf(ctx, path)
}

// TestPolicyCommand: `shoal admin policy` shows and sets a directory's
// mirror count, refusing counts out of range before the store sees them.
func TestPolicyCommand(t *testing.T) {
	reg := newTestRegistry(t, testRegistryConfig(newFakeChecker()))
	pols := &fakePolicies{def: 1, set: map[string]int{}}
	a := NewAdmin(AdminConfig{Registry: reg, Policy: pols, HealInterval: -1})
	t.Cleanup(a.Close)
	n := func(v int) *int { return &v }
	for _, tc := range []struct {
		name    string
		req     string // JSON
		want    PolicyInfo
		wantErr error
	}{
		{name: "show inherited", req: `{"path":"/a"}`, want: PolicyInfo{Path: "/a", Mirrors: 1, Inherited: true, Default: 1}},
		{name: "set", req: string(mustJSON(AdminRequest{Path: "/a", Mirrors: n(2)})), want: PolicyInfo{Path: "/a", Mirrors: 2, Default: 1}},
		{name: "show set", req: `{"path":"/a"}`, want: PolicyInfo{Path: "/a", Mirrors: 2, Default: 1}},
		{name: "most", req: `{"path":"/b","mirrors":3}`, want: PolicyInfo{Path: "/b", Mirrors: 3, Default: 1}},
		{name: "clear", req: `{"path":"/a","mirrors":0}`, want: PolicyInfo{Path: "/a", Mirrors: 1, Inherited: true, Default: 1}},
		{name: "too many", req: `{"path":"/a","mirrors":4}`, wantErr: syscall.EINVAL},
		{name: "negative", req: `{"path":"/a","mirrors":-1}`, wantErr: syscall.EINVAL},
		{name: "no path", req: `{"mirrors":2}`, wantErr: syscall.EINVAL},
		{name: "bad request", req: `{"path":`, wantErr: syscall.EINVAL},
		{name: "missing", req: `{"path":"/missing"}`, wantErr: meta.ErrNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body, err := a.Admin(t.Context(), "policy", []byte(tc.req))
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("error %v; want %v", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got PolicyInfo
			if err := json.Unmarshal(body, &got); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("policy %+v; want %+v", got, tc.want)
			}
		})
	}
	if pols.set["/a"] != 0 || pols.set["/b"] != 3 {
		t.Errorf("policies kept: %v", pols.set)
	}
	// Without a policy store the command is refused.
	b := NewAdmin(AdminConfig{Registry: reg, HealInterval: -1})
	t.Cleanup(b.Close)
	if _, err := b.Admin(t.Context(), "policy", []byte(`{"path":"/a"}`)); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("policy without a store: %v", err)
	}
}
