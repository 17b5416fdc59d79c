package fusemount

import (
	"runtime"

	"github.com/shoalfs/shoal/internal/procs"
)

// go-fuse serves /dev/fuse with goroutines that each read a request with
// a blocking read(2) and then handle it themselves; it keeps up to
// maxReaders of them (GOMAXPROCS when the server is made, at least 2, at
// most 16: fuse.NewServer) waiting for the next request, plus one that
// is about to. A goroutine in a blocking system call keeps its P (the
// runtime's right to run Go code) until the runtime's monitor thread,
// sysmon, takes it away: after 20 µs if no P is idle. On a small machine
// those readers are enough to hold every P: with GOMAXPROCS 2, two
// readers in read(2) leave no idle P, so sysmon retakes a P from a reader
// at nearly every request (and starts another thread to run it), the
// reader that wakes finds no P to return to (and parks its thread), and
// sysmon, having found work, keeps polling every 20 µs instead of backing
// off to 10 ms. Profiled through the mount (issue 27, small-file deletes
// from 4 processes, 2 CPUs), sysmon alone was 17% of the mount's CPU,
// with the P hand-offs and thread wakeups on top.
//
// raiseProcsForReaders gives the readers Ps of their own (internal/procs
// says why that pays): GOMAXPROCS goes up by maxReaders+1 after the
// server was made (so maxReaders stays what it was). A reader blocked in
// read(2) then leaves an idle P behind, sysmon leaves it alone (it does
// not retake a P from a system call while others are idle, for up to 10
// ms), the reader returns to its own P when the request comes, and
// sysmon backs off (its share of the mount's CPU fell to 0.4-2%). The
// idle Ps have a price: a goroutine made runnable wakes a thread to look
// for work on them (findRunnable's spinning rose from 6% to 16% of the
// mount's samples), and the garbage collector's workers scale with
// GOMAXPROCS. Net, the mount spent 3-15% less CPU per unlink and 10-17%
// less per create (docs/benchmarks.md, "The mount's CPU per metadata
// operation"). It returns the new GOMAXPROCS.
func raiseProcsForReaders() int {
	readers := min(max(runtime.GOMAXPROCS(0), 2), 16) // fuse.NewServer's maxReaders
	return procs.Reserve("fuse readers", readers+1)
}
