// Package procs raises GOMAXPROCS for goroutines that spend their time
// blocked in system calls, one rule for every part of the process.
//
// A goroutine in a blocking system call (read(2) of /dev/fuse, an
// fdatasync of the metadata log) keeps its P, the runtime's right to run
// Go code, until the runtime's monitor thread, sysmon, takes it away:
// after 20 µs, and only if no P is idle. With GOMAXPROCS equal to the
// CPUs of a small machine, one such goroutine leaves the rest of the
// process a P short for the length of the call, the goroutine that
// returns from it finds no P free (and parks its thread until one is),
// and sysmon, finding work, polls every 20 µs instead of backing off.
// Giving those goroutines Ps of their own costs little: Go code still
// runs on at most as many threads as there are runnable goroutines.
// Measured on 2 CPUs (docs/benchmarks.md): the FUSE mount spent 3-15%
// less CPU per unlink with a P per /dev/fuse reader, and small-file
// deletes through the mount with a synced metadata log went up about 9%
// with the MDS's GOMAXPROCS raised from 2 to 3 or 4.
//
// Reserve records a named reservation; GOMAXPROCS is the value the
// runtime chose at the first call plus the sum of the reservations. A
// name reserves at most once (the largest count asked), so starting a
// second server of the same kind in one process (tests) does not raise
// it again. Setting GOMAXPROCS turns off the runtime's own updates of it
// (from the CPU limit of the process's cgroup, Go 1.25 on).
package procs

import (
	"runtime"
	"sync"
)

var (
	mu       sync.Mutex
	base     int            // GOMAXPROCS before the first reservation
	reserved map[string]int // name -> Ps
)

// Reserve makes sure that n Ps are set aside for the goroutines name
// stands for, beyond what the runtime chose, and returns the process's
// GOMAXPROCS.
func Reserve(name string, n int) int {
	mu.Lock()
	defer mu.Unlock()
	if reserved == nil {
		base = runtime.GOMAXPROCS(0)
		reserved = map[string]int{}
	}
	if n <= reserved[name] {
		return runtime.GOMAXPROCS(0)
	}
	reserved[name] = n
	total := base
	for _, r := range reserved {
		total += r
	}
	runtime.GOMAXPROCS(total)
	return total
}
