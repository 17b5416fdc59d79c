package leader

import (
	"time"

	"golang.org/x/sys/unix"
)

// leaseClock is the clock the leader measures its lease on: CLOCK_BOOTTIME,
// which, unlike the wall clock, never steps (NTP, an operator's date) and,
// unlike CLOCK_MONOTONIC (Go's monotonic readings), keeps counting while
// the machine is suspended. Either failure would make a leader that woke
// up believe its lease still ran while etcd had expired it.
func leaseClock() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		// Not on any kernel Shoal runs on (2.6.39 and later have it).
		panic("leader: clock_gettime(CLOCK_BOOTTIME): " + err.Error())
	}
	return time.Duration(ts.Nano())
}
