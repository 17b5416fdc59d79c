package meta

import (
	"sync/atomic"
	"time"
)

// LogSyncBuckets are the upper bounds, in seconds, of the buckets of
// LogStats.SyncBuckets: fine around the 50-200 µs an fdatasync of an
// overwrite or an append takes on a local SSD or virtio disk, coarse
// above for disks that are slow or busy.
var LogSyncBuckets = []float64{
	20e-6, 40e-6, 60e-6, 80e-6, 100e-6, 120e-6, 140e-6, 160e-6, 200e-6, 250e-6, 300e-6, 400e-6, 500e-6, 750e-6,
	1e-3, 2e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3, 1,
}

// syncHist counts the durations of the log's fdatasyncs by bucket, with
// atomics: it is updated on the commit path and read by metric scrapes.
type syncHist struct {
	counts [24]atomic.Uint64 // len(LogSyncBuckets) and +Inf
	nanos  atomic.Uint64
}

func (h *syncHist) observe(d time.Duration) {
	s := d.Seconds()
	i := 0
	for i < len(LogSyncBuckets) && s > LogSyncBuckets[i] {
		i++
	}
	h.counts[i].Add(1)
	h.nanos.Add(uint64(d))
}

func (h *syncHist) snapshot() (buckets []uint64, sum time.Duration) {
	buckets = make([]uint64, len(h.counts))
	for i := range h.counts {
		buckets[i] = h.counts[i].Load()
	}
	return buckets, time.Duration(h.nanos.Load())
}

// SyncQuantile estimates the q-quantile (0 < q < 1) of the fdatasync
// durations from SyncBuckets, interpolating inside the bucket it falls
// in; 0 when there were none.
func (l LogStats) SyncQuantile(q float64) time.Duration {
	var total uint64
	for _, n := range l.SyncBuckets {
		total += n
	}
	if total == 0 {
		return 0
	}
	rank := q * float64(total)
	var seen float64
	for i, n := range l.SyncBuckets {
		if n == 0 {
			continue
		}
		if seen+float64(n) < rank {
			seen += float64(n)
			continue
		}
		if i == len(LogSyncBuckets) {
			return time.Duration(LogSyncBuckets[i-1] * 1e9) // +Inf: its lower bound
		}
		lo := 0.0
		if i > 0 {
			lo = LogSyncBuckets[i-1]
		}
		s := lo + (LogSyncBuckets[i]-lo)*(rank-seen)/float64(n)
		return time.Duration(s * 1e9)
	}
	return time.Duration(LogSyncBuckets[len(LogSyncBuckets)-1] * 1e9)
}
