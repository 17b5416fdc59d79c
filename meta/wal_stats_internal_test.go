package meta

import (
	"testing"
	"time"
)

// TestSyncHistogram: durations land in the bucket whose bound is the
// first at or above them (above every bound: the last), and SyncQuantile
// reads the quantiles back within their bucket.
func TestSyncHistogram(t *testing.T) {
	var h syncHist
	if len(h.counts) != len(LogSyncBuckets)+1 {
		t.Fatalf("%d counters for %d bounds", len(h.counts), len(LogSyncBuckets))
	}
	for _, d := range []time.Duration{
		10 * time.Microsecond, 90 * time.Microsecond, 95 * time.Microsecond, 100 * time.Microsecond,
		110 * time.Microsecond, 3 * time.Second,
	} {
		h.observe(d)
	}
	b, sum := h.snapshot()
	l := LogStats{SyncBuckets: b, SyncTime: sum}
	for _, tc := range []struct {
		bucket int // index into counts
		want   uint64
	}{
		{0, 1},                   // 10 µs: ≤ 20 µs
		{4, 3},                   // 90, 95, 100 µs: (80, 100] µs
		{5, 1},                   // 110 µs: (100, 120] µs
		{len(LogSyncBuckets), 1}, // 3 s: above 1 s
	} {
		if b[tc.bucket] != tc.want {
			t.Errorf("bucket %d holds %d, want %d (all: %v)", tc.bucket, b[tc.bucket], tc.want, b)
		}
	}
	if want := 3*time.Second + 405*time.Microsecond; sum != want {
		t.Errorf("sum %v, want %v", sum, want)
	}
	for _, tc := range []struct {
		q      float64
		lo, hi time.Duration
	}{
		{0.5, 80 * time.Microsecond, 100 * time.Microsecond},
		{0.1, 0, 20 * time.Microsecond},
		{0.99, time.Second, time.Second},
	} {
		if got := l.SyncQuantile(tc.q); got < tc.lo || got > tc.hi {
			t.Errorf("quantile %v = %v, want in [%v, %v]", tc.q, got, tc.lo, tc.hi)
		}
	}
	if got := (LogStats{}).SyncQuantile(0.5); got != 0 {
		t.Errorf("quantile of no syncs = %v", got)
	}
}
