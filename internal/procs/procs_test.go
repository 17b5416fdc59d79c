package procs

import (
	"runtime"
	"testing"
)

// TestReserve: reservations add up over names, a name counts once (its
// largest request), and GOMAXPROCS follows.
func TestReserve(t *testing.T) {
	before := runtime.GOMAXPROCS(0)
	defer func() { runtime.GOMAXPROCS(before); reserved = nil }()
	reserved = nil
	steps := []struct {
		name string
		n    int
		want int // above the runtime's own value
	}{
		{"readers", 3, 3},
		{"readers", 3, 3}, // a second mount in the process
		{"log", 1, 4},
		{"readers", 2, 4}, // smaller: the larger stays
		{"readers", 5, 6},
	}
	for i, s := range steps {
		if got := Reserve(s.name, s.n); got != before+s.want {
			t.Fatalf("step %d: Reserve(%q, %d) = %d, want %d", i, s.name, s.n, got, before+s.want)
		}
		if got := runtime.GOMAXPROCS(0); got != before+s.want {
			t.Fatalf("step %d: GOMAXPROCS %d, want %d", i, got, before+s.want)
		}
	}
}
