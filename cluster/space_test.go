package cluster

import (
	"testing"

	"github.com/shoalfs/shoal/meta"
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
