package client

import (
	"bytes"
	"testing"

	"github.com/shoalfs/shoal/internal/nfs4"
)

// TestUnstableInsert checks that the set of held ranges stays sorted and
// free of overlaps, with the newest bytes at every offset, whatever order
// overlapping writes come in, and that its memory account returns to zero.
func TestUnstableInsert(t *testing.T) {
	type w struct{ off, n int }
	for _, tc := range []struct {
		name   string
		writes []w
		trunc  int // truncate to this size at the end (0: no truncate)
	}{
		{"appends", []w{{0, 10}, {10, 10}, {20, 5}}, 0},
		{"same range twice", []w{{0, 10}, {0, 10}}, 0},
		{"inside an older one", []w{{0, 100}, {40, 10}}, 0},
		{"over several", []w{{0, 10}, {20, 10}, {40, 10}, {5, 40}}, 0},
		{"over the start of one", []w{{10, 10}, {5, 10}}, 0},
		{"over the end of one", []w{{10, 10}, {15, 10}}, 0},
		{"out of order", []w{{50, 10}, {0, 10}, {25, 10}, {8, 20}}, 0},
		{"split then overwritten", []w{{0, 100}, {40, 10}, {30, 30}, {0, 1}}, 0},
		{"large", []w{{0, 3 << 20}, {1 << 20, 1}}, 0},
		{"truncated inside a range", []w{{0, 10}, {10, 10}, {30, 10}}, 15},
		{"truncated between ranges", []w{{0, 10}, {30, 10}}, 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var u unstable
			model := map[uint64]byte{}
			for i, wr := range tc.writes {
				b := bytes.Repeat([]byte{byte(i + 1)}, wr.n)
				u.insert(newHeld(uint64(wr.off), b, nfs4.Verifier4{byte(i)}))
				for j := range wr.n {
					model[uint64(wr.off+j)] = byte(i + 1)
				}
			}
			if tc.trunc > 0 {
				u.truncate(uint64(tc.trunc))
				for off := range model {
					if off >= uint64(tc.trunc) {
						delete(model, off)
					}
				}
			}
			var prevEnd uint64
			covered := 0
			for i, r := range u.ranges {
				if i > 0 && r.off < prevEnd {
					t.Fatalf("range %d at %d overlaps the one before (ending at %d)", i, r.off, prevEnd)
				}
				if len(r.data) == 0 {
					t.Fatalf("range %d at %d is empty", i, r.off)
				}
				for j, c := range r.data {
					if want := model[r.off+uint64(j)]; c != want {
						t.Fatalf("offset %d holds %d, want %d (the newest)", r.off+uint64(j), c, want)
					}
				}
				prevEnd = r.end()
				covered += len(r.data)
			}
			if covered != len(model) {
				t.Fatalf("ranges cover %d bytes, want %d", covered, len(model))
			}
			if u.heldBytes() <= 0 {
				t.Fatalf("holding %d bytes", u.heldBytes())
			}
			u.reset()
			if n := u.heldBytes(); n != 0 || len(u.ranges) != 0 {
				t.Fatalf("after reset: %d bytes in %d ranges", n, len(u.ranges))
			}
		})
	}
}

// TestUnstablePin checks that a pinned range's buffer survives the range
// being dropped until it is unpinned.
func TestUnstablePin(t *testing.T) {
	var u unstable
	u.insert(newHeld(0, []byte("hello"), nfs4.Verifier4{}))
	ps := u.pin(func(*held) bool { return true })
	u.reset()
	if u.heldBytes() == 0 {
		t.Fatal("a pinned buffer was released")
	}
	if string(ps[0].data) != "hello" {
		t.Fatalf("pinned data %q", ps[0].data)
	}
	u.unpin(ps, false)
	if n := u.heldBytes(); n != 0 {
		t.Fatalf("after unpin: %d bytes", n)
	}
}
