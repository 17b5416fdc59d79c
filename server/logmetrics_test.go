package server

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestLogSyncMetrics: the metadata log's fdatasyncs are exported as a
// count and as a histogram of their durations, and the two agree: every
// fdatasync that made records durable is timed once.
func TestLogSyncMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	ts := startServer(t, Config{Metrics: reg})
	a := ts.client()
	for _, name := range []string{"m1", "m2", "m3"} {
		mustOpen(t, a, create(openArgs{name: name, access: accRead}))
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var syncs float64
	var hist struct {
		count uint64
		sum   float64
		found bool
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			switch mf.GetName() {
			case "shoal_metadata_log_syncs_total":
				syncs = m.GetCounter().GetValue()
			case "shoal_metadata_log_sync_seconds":
				h := m.GetHistogram()
				hist.count, hist.sum, hist.found = h.GetSampleCount(), h.GetSampleSum(), true
				if b := h.GetBucket(); len(b) == 0 || b[len(b)-1].GetCumulativeCount() > hist.count {
					t.Errorf("histogram buckets %v against a count of %d", b, hist.count)
				}
			}
		}
	}
	if !hist.found {
		t.Fatal("no shoal_metadata_log_sync_seconds")
	}
	if syncs < 3 || float64(hist.count) != syncs {
		t.Fatalf("shoal_metadata_log_syncs_total %v, shoal_metadata_log_sync_seconds counts %d: want equal, at least one per durable create", syncs, hist.count)
	}
	if hist.sum <= 0 {
		t.Fatalf("fdatasyncs took %v s in all", hist.sum)
	}
}
