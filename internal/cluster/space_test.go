package cluster

import (
	"bytes"
	"testing"

	"github.com/shoalfs/shoal/meta"
	"github.com/shoalfs/shoal/store"
)

func TestExtents(t *testing.T) {
	// Three positions of 10-byte units, first unit at position 1: position
	// 0 holds units 2, 5, 8, ... (bytes 20-29, 50-59, ...).
	m := meta.StripeMap{Unit: 10, First: 1, DataServers: []string{"a", "b", "c"}}
	x := extentsOf(m, 0)
	if x != (extents{unit: 10, stride: 30, phase: 20}) {
		t.Fatalf("extentsOf position 0 = %+v", x)
	}
	for _, tc := range []struct {
		x      extents
		pos    uint64
		lo, hi uint64
	}{
		{x, 0, 20, 30},
		{x, 20, 20, 30},
		{x, 25, 25, 30},
		{x, 30, 50, 60},
		{x, 59, 59, 60},
		{x, 60, 80, 90},
		{extentsOf(m, 1), 0, 0, 10},
		{extentsOf(m, 1), 10, 30, 40},
		{extents{}, 7, 7, maxOff},
		{x, maxOff - 5, maxOff, maxOff},
	} {
		if lo, hi := tc.x.at(tc.pos); lo != tc.lo || hi != tc.hi {
			t.Errorf("%+v.at(%d) = [%d, %d), want [%d, %d)", tc.x, tc.pos, lo, hi, tc.lo, tc.hi)
		}
	}
	for _, w := range []struct {
		unit, stride, phase uint64
		ok                  bool
	}{
		{0, 0, 0, true},
		{10, 30, 20, true},
		{10, 5, 0, false},
		{10, 35, 0, false},
		{10, 30, 30, false},
		{1, 1 << 63, 0, false},
	} {
		if _, ok := extentsFrom(extents{w.unit, w.stride, w.phase}.wire()); ok != w.ok {
			t.Errorf("extentsFrom(%d, %d, %d) ok = %v", w.unit, w.stride, w.phase, ok)
		}
	}
}

// TestMirroredSpaceMemberDown: PunchHole and Allocate reach every good copy
// and mark the copies they miss stale, as a write does; Seek fails over
// to another good copy of a position.
func TestMirroredSpaceMemberDown(t *testing.T) {
	mc := newMirrorCluster(t, 3, 2)
	ino := mc.newFile()
	const u = mirrorUnit
	data := pattern(6*u, 1)
	writeAll(t, mc.s, ino, data, 0)
	mc.stop("ds1")
	f, err := mc.s.Open(ino, true)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// Seek with a copy down: every position still has a good copy.
	if got, err := f.Seek(0, store.SeekHole); got != 6*u || err != nil {
		t.Errorf("Seek(0, SeekHole) with ds1 down = %d, %v; want %d", got, err, 6*u)
	}
	if err := f.PunchHole(u, 2*u); err != nil {
		t.Fatalf("PunchHole with ds1 down: %v", err)
	}
	m := mc.mdsMap(ino)
	if !sameSet(m.Stale, []string{"ds1"}) {
		t.Fatalf("after PunchHole with ds1 down: stale %q, want [ds1]", m.Stale)
	}
	clear(data[u : 3*u])
	if got := readAll(t, mc.s, ino, len(data), 0); !bytes.Equal(got, data) {
		t.Error("the file reads back differently after PunchHole")
	}
	for _, tc := range []struct {
		off    int64
		whence int
		want   int64
	}{
		{0, store.SeekHole, u},
		{u, store.SeekData, 3 * u},
	} {
		if got, err := f.Seek(tc.off, tc.whence); got != tc.want || err != nil {
			t.Errorf("Seek(%d, %d) after PunchHole = %d, %v; want %d", tc.off, tc.whence, got, err, tc.want)
		}
	}
	if err := f.Allocate(6*u, 2*u); err != nil {
		t.Fatalf("Allocate with ds1 stale: %v", err)
	}
	if n, err := f.Size(); n != 8*u || err != nil {
		t.Errorf("Size after Allocate = %d, %v; want %d", n, err, 8*u)
	}
	if m2 := mc.mdsMap(ino); m2.Gen != m.Gen {
		t.Errorf("Allocate changed the map (generation %d, was %d): the stale copy is left alone", m2.Gen, m.Gen)
	}
}
