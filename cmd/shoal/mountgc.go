package main

import (
	"os"
	"strconv"

	"github.com/shoalfs/shoal/internal/gcfloor"
)

// mountGCFloor is the heap goal `shoal mount` keeps at least: 64 MiB.
//
// The mount's live heap is a few MB (its nodes, the entry cache, the
// client library's state), and every FUSE request allocates: a REMOVE
// COMPOUND alone is about 5 KB in the client. At GOGC=100 the mount
// collected about ten times per 2,000 small-file creates and two or three
// times per 2,000 deletes, and each collection costs more than its own
// CPU: it empties go-fuse's sync.Pool of request read buffers (MaxWrite,
// 1 MiB each), which are then allocated and zeroed again, and the
// runtime's scavenger returns the freed pages to the kernel, to be faulted
// back in (a page fault costs about 2.5 µs on the 2-CPU VM measured). With
// the floor, a 2,000-file phase runs without a collection or with one
// (docs/benchmarks.md, "Async deletes through the mount: two speeds").
// Half the servers' floor: a client's memory is its user's.
const mountGCFloor = 64 << 20

// mountGC gives the mount process a heap-goal floor (internal/gcfloor),
// as serverGC does for servers. GOGC in the environment turns it off;
// SHOAL_GC_FLOOR_MB sets the floor, as for the servers.
func mountGC() {
	floor := int64(mountGCFloor)
	if v, err := strconv.ParseInt(os.Getenv("SHOAL_GC_FLOOR_MB"), 10, 64); err == nil {
		floor = v << 20
	}
	gcfloor.Start(floor)
}
