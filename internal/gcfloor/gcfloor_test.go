package gcfloor

import (
	"runtime"
	"runtime/debug"
	"testing"
	"time"
)

// TestStart: with GOGC in the environment Start leaves the collector
// alone; without it, after a collection the percentage gives a small live
// heap a goal near the floor, and it falls back to 100 once the floor is
// below twice the live heap.
func TestStart(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))

	t.Setenv("GOGC", "100")
	if Start(DefaultFloor) {
		t.Fatal("Start with GOGC set: true, want false")
	}
	if Percent() != 0 {
		t.Fatalf("Percent after a refused Start = %d, want 0 (never set)", Percent())
	}
	t.Setenv("GOGC", "")

	const floor = 256 << 20
	if !Start(floor) {
		t.Fatal("Start without GOGC: false")
	}
	waitPercent(t, func(p int) bool { return p > 200 }, "a 256 MiB floor over a small heap")
	// A floor far below the live heap: back to GOGC=100.
	Start(1)
	waitPercent(t, func(p int) bool { return p == 100 }, "a 1-byte floor")
	if got := debug.SetGCPercent(100); got != 100 {
		t.Errorf("the runtime's GC percent is %d, want the 100 Percent reports", got)
	}
}

// waitPercent runs collections (whose finalizers adjust the percentage)
// until ok(Percent()), at most 200 times.
func waitPercent(t *testing.T, ok func(int) bool, what string) {
	t.Helper()
	for range 200 {
		runtime.GC()
		if ok(Percent()) {
			return
		}
		time.Sleep(5 * time.Millisecond) // let the finalizer goroutine run
	}
	t.Fatalf("%s: GC percent %d after 200 collections", what, Percent())
}
