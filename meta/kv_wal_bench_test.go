package meta

import (
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkWALCommitSync measures a synced commit of the log: an Update of
// three keys, which returns once the record is durable. rec=500 is a
// remove-sized record (BenchmarkRemove in internal/wiring writes 510-520
// bytes of log per delete), so that about eight fit in a 4 KiB block;
// rec=4500, the size of a small file's create with its inline data, starts
// a new block with every commit. procs=4 commits from four goroutines at once, as
// four clients' removes do, so that fdatasyncs are shared. log=fallocate
// gives the log file its size the way it was done before spares
// (fallocate'd, unwritten extents), log=prewritten writes it full of
// zeros at open (wal_spare.go). Besides ns/op it reports the fdatasyncs per
// commit and the median fdatasync as timed inside (LogStats.SyncBuckets).
//
//	go test ./meta -run '^$' -bench BenchmarkWALCommitSync -benchtime 4000x -count 3
func BenchmarkWALCommitSync(b *testing.B) {
	for _, rec := range []int{500, 4500} {
		for _, mode := range []struct {
			name      string
			fallocate bool
		}{{"fallocate", true}, {"prewritten", false}} {
			for _, procs := range []int{1, 4} {
				b.Run(fmt.Sprintf("rec=%d/log=%s/procs=%d", rec, mode.name, procs), func(b *testing.B) {
					benchWALCommitSync(b, mode.fallocate, procs, rec)
				})
			}
		}
	}
}

// benchWALCommitSync commits records of about rec bytes.
func benchWALCommitSync(b *testing.B, fallocate bool, procs, rec int) {
	kv, err := openWALKV(filepath.Join(b.TempDir(), "kv.db"), BoltOptions{WAL: true, fallocateLog: fallocate}, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer kv.Close()
	val := make([]byte, max(rec/3-25, 1))
	commit := func(i int64) error {
		return kv.Update(func(tx kvTxn) error {
			for j := range 3 {
				if err := tx.Put([]byte(fmt.Sprintf("k%010d/%d", i, j)), val); err != nil {
					return err
				}
			}
			return nil
		})
	}
	before := kv.logStats()
	var next atomic.Int64
	errs := make(chan error, procs)
	var wg sync.WaitGroup
	b.ResetTimer()
	for range procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				if err := commit(i); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	close(errs)
	if err := <-errs; err != nil {
		b.Fatal(err)
	}
	after := kv.logStats()
	d := LogStats{Syncs: after.Syncs - before.Syncs, SyncBuckets: make([]uint64, len(after.SyncBuckets))}
	for i := range d.SyncBuckets {
		d.SyncBuckets[i] = after.SyncBuckets[i] - before.SyncBuckets[i]
	}
	b.ReportMetric(float64(d.Syncs)/float64(b.N), "syncs/op")
	b.ReportMetric(float64(d.SyncQuantile(0.5))/float64(time.Microsecond), "sync-p50-µs")
	b.ReportMetric(float64(d.SyncQuantile(0.9))/float64(time.Microsecond), "sync-p90-µs")
	if d.Syncs > 0 {
		b.ReportMetric(float64((after.SyncTime-before.SyncTime)/time.Microsecond)/float64(d.Syncs), "sync-mean-µs")
	}
	b.ReportMetric(float64(after.Bytes-before.Bytes)/float64(b.N), "log-B/op")
}
