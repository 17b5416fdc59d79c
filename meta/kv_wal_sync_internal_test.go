package meta

import (
	"fmt"
	"sync"
	"testing"
)

// TestWALConcurrentSyncs: callers that commit and sync at once, sharing
// fdatasyncs, with the log switching files under them (a checkpoint every
// few KiB), each return from syncTo only once their record is durable,
// and every change is there after a crash: a shared sync must not vouch
// for a record written after it started, nor the file switch happen
// under a running sync.
func TestWALConcurrentSyncs(t *testing.T) {
	s := newWALTestStore(t, BoltOptions{WALCheckpointBytes: 8 << 10})
	const writers, each = 6, 150
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				k := fmt.Sprintf("w%d/%03d", w, i)
				seq, err := s.kv.update(func(tx kvTxn) error { return tx.Put([]byte(k), []byte("v")) })
				if err == nil {
					err = s.kv.syncTo(seq)
				}
				if err == nil && s.kv.durable.Load() < seq {
					err = fmt.Errorf("%s: syncTo(%d) returned with durable %d", k, seq, s.kv.durable.Load())
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if got := s.kv.syncs.Load(); got > writers*each {
		t.Errorf("%d fdatasyncs for %d synced updates", got, writers*each)
	}
	s.crash()
	s.open(nil)
	n := 0
	if err := s.kv.View(func(tx kvTxn) error {
		return tx.Scan(nil, nil, func(k, v []byte) bool { n++; return true })
	}); err != nil {
		t.Fatal(err)
	}
	if n != writers*each {
		t.Fatalf("after a crash %d keys, want %d", n, writers*each)
	}
}
