package client

import (
	"testing"
	"time"
)

// oldDelayBudget is how long the client used to retry NFS4ERR_DELAY: 30
// retries with a backoff of 10 ms doubling to 1 s, about 24 s whatever the
// lease. With the usual 90 s lease that gave up long before the server
// revoked a dead client it was waiting for.
func oldDelayBudget() time.Duration {
	var total time.Duration
	for d, i := 10*time.Millisecond, 0; i < 30; d, i = min(2*d, time.Second), i+1 {
		total += d
	}
	return total
}

func TestDelayBudget(t *testing.T) {
	for _, tc := range []struct {
		name  string
		lease time.Duration
		want  time.Duration
	}{
		{"unknown lease uses the default", 0, 2*defaultLease + delayMargin},
		{"negative lease uses the default", -time.Second, 2*defaultLease + delayMargin},
		{"one second", time.Second, 2*time.Second + delayMargin},
		{"three seconds", 3 * time.Second, 6*time.Second + delayMargin},
		{"default 90 s lease", 90 * time.Second, 180*time.Second + delayMargin},
		{"long lease", 10 * time.Minute, 20*time.Minute + delayMargin},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := delayBudget(tc.lease)
			if got != tc.want {
				t.Fatalf("delayBudget(%v) = %v, want %v", tc.lease, got, tc.want)
			}
			// The server revokes an unresponsive holder at most about a
			// lease after its last renewal; the budget must outlast two.
			lease := tc.lease
			if lease <= 0 {
				lease = defaultLease
			}
			if got <= 2*lease {
				t.Fatalf("delayBudget(%v) = %v, not more than two leases", tc.lease, got)
			}
		})
	}
	// The regression: with the usual lease the old fixed budget gave up
	// before the server could revoke a dead layout holder.
	if old, got := oldDelayBudget(), delayBudget(90*time.Second); got <= 180*time.Second || got <= old || old >= 90*time.Second {
		t.Fatalf("90 s lease: budget %v, old budget %v; want more than 180 s and the old one under a lease", got, old)
	}
}
