package cluster

import (
	"testing"

	"github.com/shoalfs/shoal/meta"
)

// TestLinedUp: a copy stays on the data servers only if every source unit
// and the unit it is copied to are at positions with the same members.
func TestLinedUp(t *testing.T) {
	const u = 1 << 20
	ids := []string{"a", "b", "c"}
	m := func(first uint32, ds ...string) meta.StripeMap {
		return meta.StripeMap{Unit: u, First: first, DataServers: ds}
	}
	mirrored := placeMap(u, 0, ids, 2)
	for _, tc := range []struct {
		name           string
		src, dst       meta.StripeMap
		srcOff, dstOff uint64
		want           bool
	}{
		{"same map, same offsets", m(1, ids...), m(1, ids...), 0, 0, true},
		{"same map, a whole stripe further", m(1, ids...), m(1, ids...), 0, 3 * u, true},
		{"same map, one unit further", m(1, ids...), m(1, ids...), 0, u, false},
		{"first position makes up for the shift", m(1, ids...), m(0, ids...), 0, u, true},
		{"inside a unit", m(1, ids...), m(1, ids...), 5, 3*u + 5, true},
		{"offsets in different places of a unit", m(1, ids...), m(1, ids...), 0, 3*u + 5, false},
		{"other first position", m(1, ids...), m(2, ids...), 0, 0, false},
		{"other order", m(0, "a", "b", "c"), m(0, "b", "a", "c"), 0, 0, false},
		{"other data servers", m(0, ids...), m(0, "a", "b", "d"), 0, 0, false},
		{"other unit", m(0, ids...), meta.StripeMap{Unit: 2 * u, DataServers: ids}, 0, 0, false},
		{"mirrored like the source", mirrored, mirrored, 0, 0, true},
		{"mirrored source, one copy", mirrored, m(0, ids...), 0, 0, false},
	} {
		if got := linedUp(tc.src, tc.dst, tc.srcOff, tc.dstOff); got != tc.want {
			t.Errorf("%s: linedUp = %v, want %v", tc.name, got, tc.want)
		}
	}
}
