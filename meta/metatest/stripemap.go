package metatest

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/shoalfs/shoal/meta"
)

// testStripeMaps covers the stripe-map records: first placement wins,
// replacement is a compare-and-swap on Gen, bad maps and non-files are
// refused, maps survive a reopen, are listed in inode order, and go away
// with their inode.
func testStripeMaps(t *testing.T, v *env) {
	f := v.create(meta.RootIno, "f", meta.TypeRegular)
	g := v.create(meta.RootIno, "g", meta.TypeRegular)
	d := v.create(meta.RootIno, "d", meta.TypeDirectory)
	m1 := meta.StripeMap{Unit: 1 << 20, First: 1, DataServers: []string{"ds-a", "ds-b", "ds-c"}}

	if _, err := v.e.StripeMap(v.ctx, f.Ino); !errors.Is(err, meta.ErrNotFound) {
		t.Fatalf("StripeMap before placement: %v, want ErrNotFound", err)
	}
	for _, tc := range []struct {
		name string
		ino  meta.Ino
		m    meta.StripeMap
		want error
	}{
		{"directory", d.Ino, m1, meta.ErrInval},
		{"missing inode", 1 << 40, m1, meta.ErrStale},
		{"zero unit", f.Ino, meta.StripeMap{DataServers: []string{"a"}}, meta.ErrInval},
		{"no data servers", f.Ino, meta.StripeMap{Unit: 4096}, meta.ErrInval},
		{"first out of range", f.Ino, meta.StripeMap{Unit: 4096, First: 2, DataServers: []string{"a", "b"}}, meta.ErrInval},
		{"id too long", f.Ino, meta.StripeMap{Unit: 4096, DataServers: []string{string(make([]byte, 256))}}, meta.ErrInval},
		{"empty id", f.Ino, meta.StripeMap{Unit: 4096, DataServers: []string{""}}, meta.ErrInval},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := v.e.PlaceStripeMap(v.ctx, tc.ino, tc.m)
			wantErr(t, "PlaceStripeMap", err, tc.want)
		})
	}

	got, err := v.e.PlaceStripeMap(v.ctx, f.Ino, m1)
	if err != nil || !got.Equal(m1) || got.Gen != 1 {
		t.Fatalf("PlaceStripeMap = %+v, %v; want %+v at gen 1", got, err, m1)
	}
	other := meta.StripeMap{Unit: 4096, DataServers: []string{"ds-z"}}
	if got, err := v.e.PlaceStripeMap(v.ctx, f.Ino, other); err != nil || !got.Equal(m1) {
		t.Fatalf("second PlaceStripeMap = %+v, %v; want the first map kept", got, err)
	}
	// A data server may hold several stripe positions.
	m2 := meta.StripeMap{Unit: 1 << 20, First: 0, DataServers: []string{"ds-b", "ds-c", "ds-b"}}
	if _, err := v.e.ReplaceStripeMap(v.ctx, f.Ino, 7, m2); !errors.Is(err, meta.ErrConflict) {
		t.Fatalf("ReplaceStripeMap at a wrong generation: %v, want ErrConflict", err)
	}
	if _, err := v.e.ReplaceStripeMap(v.ctx, g.Ino, 1, m2); !errors.Is(err, meta.ErrConflict) {
		t.Fatalf("ReplaceStripeMap of an unplaced file: %v, want ErrConflict", err)
	}
	r, err := v.e.ReplaceStripeMap(v.ctx, f.Ino, 1, m2)
	if err != nil || !r.Equal(m2) || r.Gen != 2 {
		t.Fatalf("ReplaceStripeMap = %+v, %v; want %+v at gen 2", r, err, m2)
	}
	if _, err := v.e.PlaceStripeMap(v.ctx, g.Ino, m1); err != nil {
		t.Fatal(err)
	}

	v.reopen()
	if got, err := v.e.StripeMap(v.ctx, f.Ino); err != nil || !got.Equal(m2) || got.Gen != 2 {
		t.Fatalf("after reopen: %+v, %v; want %+v at gen 2", got, err, m2)
	}
	list, err := v.e.StripeMaps(v.ctx, 0, 10)
	if err != nil || len(list) != 2 || list[0].Ino != f.Ino || list[1].Ino != g.Ino ||
		!list[0].Map.Equal(m2) || !list[1].Map.Equal(m1) {
		t.Fatalf("StripeMaps = %+v, %v", list, err)
	}
	if list, err := v.e.StripeMaps(v.ctx, f.Ino, 10); err != nil || len(list) != 1 || list[0].Ino != g.Ino {
		t.Fatalf("StripeMaps after %d = %+v, %v", f.Ino, list, err)
	}
	if list, err := v.e.StripeMaps(v.ctx, 0, 1); err != nil || len(list) != 1 || list[0].Ino != f.Ino {
		t.Fatalf("StripeMaps max 1 = %+v, %v", list, err)
	}

	// Unlinking makes an orphan, which keeps its map (an open file's data
	// is still there); freeing the orphan deletes the map with the inode.
	if _, _, err := v.e.Remove(v.ctx, meta.RootIno, "f", v.tick()); err != nil {
		t.Fatal(err)
	}
	if _, err := v.e.StripeMap(v.ctx, f.Ino); err != nil {
		t.Fatalf("orphan's stripe map: %v", err)
	}
	if _, err := v.e.FreeOrphan(v.ctx, f.Ino); err != nil {
		t.Fatal(err)
	}
	if list, err := v.e.StripeMaps(v.ctx, 0, 10); err != nil || len(list) != 1 || list[0].Ino != g.Ino {
		t.Fatalf("StripeMaps after freeing %d = %+v, %v", f.Ino, list, err)
	}
}

// testStripeMapPlaceRace places different maps on one file from several
// goroutines: exactly one wins and everyone gets it back.
func testStripeMapPlaceRace(t *testing.T, v *env) {
	f := v.create(meta.RootIno, "f", meta.TypeRegular)
	const n = 8
	got := make([]meta.StripeMap, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			got[i], errs[i] = v.e.PlaceStripeMap(v.ctx, f.Ino,
				meta.StripeMap{Unit: 65536, DataServers: []string{fmt.Sprintf("ds-%d", i)}})
		})
	}
	wg.Wait()
	stored, err := v.e.StripeMap(v.ctx, f.Ino)
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if errs[i] != nil || !got[i].Equal(stored) {
			t.Fatalf("placer %d got %+v, %v; stored %+v", i, got[i], errs[i], stored)
		}
	}
}

// sameMap reports whether got is want down to the layout of every field
// (Equal treats Stale as a set and ignores Gen; a record must also keep
// the order of Stale and the nil-ness of Replicas).
func sameMap(got, want meta.StripeMap) bool {
	if !got.Equal(want) || got.Gen != want.Gen || (got.Replicas == nil) != (want.Replicas == nil) ||
		got.Mirrors() != want.Mirrors() || len(got.Stale) != len(want.Stale) {
		return false
	}
	for i := range got.Stale {
		if got.Stale[i] != want.Stale[i] {
			return false
		}
	}
	return true
}

// testStripeMapsReplicas covers maps with several copies per position and
// stale copies (record version 2) next to single-copy maps (version 1):
// every map comes back intact from PlaceStripeMap, ReplaceStripeMap,
// StripeMap and StripeMaps, across a reopen, whichever version replaces
// which; and maps with bad replicas are refused.
func testStripeMapsReplicas(t *testing.T, v *env) {
	f := v.create(meta.RootIno, "f", meta.TypeRegular)
	g := v.create(meta.RootIno, "g", meta.TypeRegular)
	three := meta.StripeMap{Unit: 1 << 20, First: 2, DataServers: []string{"a", "b", "c", "d"},
		Replicas: [][]string{{"b", "c"}, {"c", "d"}, {"d", "a"}, {"a", "b"}}, Stale: []string{"d", "a"}}
	two := meta.StripeMap{Unit: 65536, First: 0, DataServers: []string{"a", "b", "a"},
		Replicas: [][]string{{"c"}, {"a"}, {"b"}}}
	one := meta.StripeMap{Unit: 4096, First: 1, DataServers: []string{"x", "y"}}
	oneStale := meta.StripeMap{Unit: 4096, First: 1, DataServers: []string{"x", "y"}, Stale: []string{"y"}}

	// Refusals first, so that f has no map yet.
	bad := []struct {
		name string
		m    meta.StripeMap
	}{
		{"first member repeated as replica", meta.StripeMap{Unit: 4096, DataServers: []string{"a", "b"},
			Replicas: [][]string{{"a"}, {"a"}}}},
		{"replica repeated in a position", meta.StripeMap{Unit: 4096, DataServers: []string{"a", "b"},
			Replicas: [][]string{{"b", "c"}, {"c", "c"}}}},
		{"uneven replica counts", meta.StripeMap{Unit: 4096, DataServers: []string{"a", "b", "c"},
			Replicas: [][]string{{"b"}, {"c", "a"}, {"a"}}}},
		{"replicas for some positions", meta.StripeMap{Unit: 4096, DataServers: []string{"a", "b", "c"},
			Replicas: [][]string{{"b"}, {"c"}}}},
		{"replicas for too many positions", meta.StripeMap{Unit: 4096, DataServers: []string{"a"},
			Replicas: [][]string{{"b"}, {"c"}}}},
		{"empty replica lists", meta.StripeMap{Unit: 4096, DataServers: []string{"a", "b"},
			Replicas: [][]string{{}, {}}}},
		{"four copies", meta.StripeMap{Unit: 4096, DataServers: []string{"a", "b"},
			Replicas: [][]string{{"b", "c", "d"}, {"c", "d", "a"}}}},
		{"empty replica id", meta.StripeMap{Unit: 4096, DataServers: []string{"a"},
			Replicas: [][]string{{""}}}},
		{"replica id too long", meta.StripeMap{Unit: 4096, DataServers: []string{"a"},
			Replicas: [][]string{{string(make([]byte, 256))}}}},
		{"stale id not a member", meta.StripeMap{Unit: 4096, DataServers: []string{"a", "b"},
			Replicas: [][]string{{"b"}, {"a"}}, Stale: []string{"z"}}},
		{"stale id not a member of a single-copy map", meta.StripeMap{Unit: 4096, DataServers: []string{"a"},
			Stale: []string{"b"}}},
		{"stale id twice", meta.StripeMap{Unit: 4096, DataServers: []string{"a", "b"},
			Replicas: [][]string{{"b"}, {"a"}}, Stale: []string{"b", "b"}}},
	}
	for _, tc := range bad {
		t.Run("refuse/"+tc.name, func(t *testing.T) {
			_, err := v.e.PlaceStripeMap(v.ctx, f.Ino, tc.m)
			wantErr(t, "PlaceStripeMap", err, meta.ErrInval)
		})
	}
	if _, err := v.e.StripeMap(v.ctx, f.Ino); !errors.Is(err, meta.ErrNotFound) {
		t.Fatalf("refused placements left a map: %v", err)
	}

	// Placement returns, and stores, a copy of the map: changing the
	// caller's slices afterwards changes nothing.
	arg := three.Clone()
	got, err := v.e.PlaceStripeMap(v.ctx, f.Ino, arg)
	want := three.Clone()
	want.Gen = 1
	if err != nil || !sameMap(got, want) {
		t.Fatalf("PlaceStripeMap = %+v, %v; want %+v", got, err, want)
	}
	arg.Replicas[0][0], arg.Stale[0], got.Replicas[1][1] = "mutated", "mutated", "mutated"
	if got, err := v.e.StripeMap(v.ctx, f.Ino); err != nil || !sameMap(got, want) || got.Mirrors() != 3 || !got.Degraded() {
		t.Fatalf("StripeMap = %+v, %v; want %+v", got, err, want)
	}
	if _, err := v.e.PlaceStripeMap(v.ctx, g.Ino, one); err != nil {
		t.Fatal(err)
	}

	// Refused replacements leave the map as it was.
	for _, tc := range bad {
		if _, err := v.e.ReplaceStripeMap(v.ctx, f.Ino, 1, tc.m); !errors.Is(err, meta.ErrInval) {
			t.Fatalf("ReplaceStripeMap with %s: %v, want ErrInval", tc.name, err)
		}
	}
	if got, err := v.e.StripeMap(v.ctx, f.Ino); err != nil || !sameMap(got, want) {
		t.Fatalf("after refused replacements: %+v, %v; want %+v", got, err, want)
	}

	// Replace through every pair of versions: three copies, two, one
	// with a stale copy (version 2 without replicas), one (version 1),
	// and back to three.
	gen := uint64(1)
	for _, next := range []meta.StripeMap{two, oneStale, one, three, one, two} {
		got, err := v.e.ReplaceStripeMap(v.ctx, f.Ino, gen, next)
		gen++
		want := next.Clone()
		want.Gen = gen
		if err != nil || !sameMap(got, want) {
			t.Fatalf("ReplaceStripeMap to %+v = %+v, %v", next, got, err)
		}
		if got, err := v.e.StripeMap(v.ctx, f.Ino); err != nil || !sameMap(got, want) {
			t.Fatalf("StripeMap after replacing with %+v = %+v, %v", next, got, err)
		}
	}
	// Clear the stale mark as healing would.
	healed := three.Clone()
	healed.Stale = nil
	if _, err := v.e.ReplaceStripeMap(v.ctx, g.Ino, 1, healed); err != nil {
		t.Fatal(err)
	}
	healed.Gen = 2
	wantF := two.Clone()
	wantF.Gen = gen

	v.reopen()
	list, err := v.e.StripeMaps(v.ctx, 0, 10)
	if err != nil || len(list) != 2 || list[0].Ino != f.Ino || list[1].Ino != g.Ino ||
		!sameMap(list[0].Map, wantF) || !sameMap(list[1].Map, healed) || list[1].Map.Degraded() {
		t.Fatalf("StripeMaps after reopen = %+v, %v; want %+v and %+v", list, err, wantF, healed)
	}
}
