package main

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"
	"time"

	"github.com/shoalfs/shoal/internal/gcfloor"
)

// TestMountGC: mountGC gives the process the mount's heap-goal floor, and
// SHOAL_GC_FLOOR_MB overrides it. The test binary's live heap is a few
// MB, so a floor of 64 MiB or more raises the GC percentage above 100 and
// a 1 MiB floor leaves it at 100.
func TestMountGC(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	t.Setenv("GOGC", "") // gcfloor treats an empty GOGC as unset
	runtime.GC()
	live := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(live)
	if live[0].Value.Kind() != metrics.KindUint64 || live[0].Value.Uint64() > mountGCFloor/4 {
		t.Skipf("live heap %v: too large to tell the floor from GOGC=100", live[0].Value)
	}
	cases := []struct {
		name, env string
		ok        func(p int) bool
	}{
		{"a 1 MiB floor", "1", func(p int) bool { return p == 100 }},
		{"the default floor", "", func(p int) bool { return p > 100 }},
		{"back to 1 MiB", "1", func(p int) bool { return p == 100 }},
		{"a 512 MiB floor", "512", func(p int) bool { return p > 200 }},
		{"1 MiB again, to leave the test binary near GOGC=100", "1", func(p int) bool { return p == 100 }},
	}
	for _, c := range cases {
		t.Setenv("SHOAL_GC_FLOOR_MB", c.env)
		mountGC()
		ok := false
		for range 200 { // collections run gcfloor's finalizer, which sets the percentage
			runtime.GC()
			if ok = c.ok(gcfloor.Percent()); ok {
				break
			}
			time.Sleep(5 * time.Millisecond) // let the finalizer goroutine run
		}
		if !ok {
			t.Fatalf("%s (SHOAL_GC_FLOOR_MB=%q): GC percent %d after 200 collections", c.name, c.env, gcfloor.Percent())
		}
	}
}
