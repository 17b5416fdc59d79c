// Package gcfloor keeps the Go garbage collector's heap goal at or above a
// floor, so that a server with a small live heap does not collect many
// times a second.
//
// With the default GOGC=100 the collector runs whenever the heap doubles
// its live size. A metadata server's live heap is small (tens of MB) and
// every NFS operation allocates a few hundred objects, so at a few
// thousand operations a second it collected continuously: on Shoal's MDS
// the collector took about a quarter of the CPU of a create, stat and
// remove (server.BenchmarkSmallFileOps: 260 CPU-µs per iteration at
// GOGC=100, 188 at GOGC=400). A fixed higher GOGC would multiply a large
// heap too; a floor costs at most the floor in memory: after every
// collection the GC percentage is set so that the next goal is
// max(floor, 2 × live), which is GOGC=100 once the live heap passes half
// the floor.
//
// An explicit GOGC in the environment wins: Start then does nothing.
package gcfloor

import (
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"sync/atomic"
)

// DefaultFloor is the heap goal servers keep at least: 128 MiB.
const DefaultFloor = 128 << 20

// maxPercent bounds the percentage a tiny live heap gets.
const maxPercent = 5000

var (
	once    sync.Once
	floor   atomic.Int64
	percent atomic.Int64
)

// Start keeps the heap goal at or above floor bytes for the rest of the
// process's life (a later call changes the floor). It returns false, and
// does nothing, if GOGC is set in the environment.
func Start(floorBytes int64) bool {
	if os.Getenv("GOGC") != "" {
		return false
	}
	floor.Store(floorBytes)
	once.Do(func() {
		percent.Store(100)
		adjust()
		armAfterGC()
	})
	return true
}

// Percent is the GC percentage Start set last (0 before it set one).
func Percent() int { return int(percent.Load()) }

// sentinel is allocated so that its finalizer runs after the next
// collection; the finalizer adjusts the percentage and arms the next one.
type sentinel struct{ _ [16]byte }

func armAfterGC() {
	s := &sentinel{}
	runtime.SetFinalizer(s, func(*sentinel) {
		adjust()
		armAfterGC()
	})
}

var liveSample = []metrics.Sample{{Name: "/gc/heap/live:bytes"}}

// adjust sets the GC percentage from the live heap the last collection
// found.
func adjust() {
	s := liveSample[:1:1]
	metrics.Read(s) // only called from one goroutine at a time: the finalizer's, or Start's before it is armed
	var live uint64
	if s[0].Value.Kind() == metrics.KindUint64 {
		live = s[0].Value.Uint64()
	}
	p := int64(100)
	if f := floor.Load(); live > 0 && uint64(f) > 2*live {
		p = min(int64(uint64(f)*100/live)-100, maxPercent)
	}
	if p != percent.Load() {
		percent.Store(p)
		debug.SetGCPercent(int(p))
	}
}
