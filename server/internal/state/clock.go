package state

import "time"

// Clock supplies the current time. Leases, grace and sweeping read time
// only through it so tests can move time explicitly instead of sleeping.
type Clock interface {
	Now() time.Time
}

// SystemClock is the wall clock.
type SystemClock struct{}

// Now returns time.Now().
func (SystemClock) Now() time.Time { return time.Now() }

var _ Clock = SystemClock{}
