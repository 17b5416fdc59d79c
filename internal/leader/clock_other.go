//go:build !linux

package leader

import "time"

var clockStart = time.Now()

// leaseClock is the clock the leader measures its lease on: Go's
// monotonic clock, which never steps (see clock_linux.go for Linux, where
// a clock that also counts suspended time is used).
func leaseClock() time.Duration { return time.Since(clockStart) }
