package meta

import (
	"encoding/binary"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"
)

// syncModel is what a disk holds that loses, at a power cut, everything
// of the log that no finished fdatasync covered. It is built from the
// log's own fdatasyncs (walKV.syncHook): when one begins, the records it
// covers (up to its w) are read back from the file, so they must be
// there whole; when it succeeds, they are durable.
type syncModel struct {
	t        *testing.T
	mu       sync.Mutex
	file     *walFile
	pos      int64             // where the next record to read back starts
	seen     uint64            // the last record read back
	seqOf    map[string]uint64 // key -> the record that wrote it
	durableW uint64            // the last record a finished fdatasync covered
	acked    []string          // changes answered, in order
}

func newSyncModel(t *testing.T) *syncModel {
	return &syncModel{t: t, seqOf: map[string]uint64{}}
}

func (m *syncModel) hook(f *walFile, w uint64, synced bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if synced {
		m.durableW = max(m.durableW, w)
		return
	}
	if m.file != f {
		if m.file != nil {
			m.t.Errorf("the log switched files: the model reads one")
		}
		m.file, m.pos = f, walHeaderLen
	}
	for m.seen < w {
		hdr := make([]byte, walRecHdrLen)
		if _, err := f.f.ReadAt(hdr, m.pos); err != nil {
			m.t.Errorf("read back the log at %d: %v", m.pos, err)
			return
		}
		rec := make([]byte, walPad(walRecHdrLen+int(binary.LittleEndian.Uint32(hdr))))
		if _, err := f.f.ReadAt(rec, m.pos); err != nil {
			m.t.Errorf("read back the log at %d: %v", m.pos, err)
			return
		}
		r, n, err := decodeWALRecord(rec)
		if err != nil || r.seq != m.seen+1 {
			m.t.Errorf("an fdatasync covering record %d began, but record %d is not whole in the log at %d (seq %d, %v)", w, m.seen+1, m.pos, r.seq, err)
			return
		}
		for _, op := range r.ops {
			m.seqOf[string(op.key)] = r.seq
		}
		m.seen, m.pos = r.seq, m.pos+int64(n)
	}
}

func (m *syncModel) ack(key string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.acked = append(m.acked, key)
	return len(m.acked)
}

// cut returns the changes answered so far and the last record durable.
func (m *syncModel) cut() ([]string, uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string(nil), m.acked...), m.durableW
}

// TestWALSyncRoundsPowerCut: callers that commit at once (synced
// updates; deferred ones followed by Sync; deferred ones followed by
// Await, which the commit interval's timer serves) share fdatasyncs in
// rounds (wal_sync.go), and none is answered before an fdatasync that
// covers its record has ended. At a moment chosen while they run, the
// test notes the changes answered and what the disk holds
// (syncModel), lets the callers finish, and cuts the power at that
// moment: every record written after it is dropped, as the page cache
// would lose it. The reopened store must hold every change answered
// before the cut.
func TestWALSyncRoundsPowerCut(t *testing.T) {
	const writers, each = 6, 120
	for _, cutAt := range []int{40, 300, 600} {
		t.Run(fmt.Sprintf("cut after %d answers", cutAt), func(t *testing.T) {
			s := newWALTestStore(t, BoltOptions{fallocateLog: true, CommitInterval: time.Millisecond})
			m := newSyncModel(t)
			s.kv.syncHook = m.hook
			cutNow := make(chan struct{})
			var once sync.Once
			var wg sync.WaitGroup
			errs := make(chan error, writers)
			for w := range writers {
				wg.Go(func() {
					for i := range each {
						k := fmt.Sprintf("w%d/%03d", w, i)
						put := func(tx kvTxn) error { return tx.Put([]byte(k), []byte("v")) }
						var err error
						switch w % 3 {
						case 0:
							err = s.kv.Update(put)
						case 1:
							if err = s.kv.UpdateDeferred(put); err == nil {
								err = s.kv.Sync()
							}
						case 2:
							if err = s.kv.UpdateDeferred(put); err == nil {
								err = s.kv.Await()
							}
						}
						if err != nil {
							errs <- fmt.Errorf("%s: %w", k, err)
							return
						}
						if m.ack(k) == cutAt {
							once.Do(func() { close(cutNow) })
						}
					}
				})
			}
			finished := make(chan struct{})
			go func() { wg.Wait(); close(finished) }()
			select {
			case <-cutNow:
			case <-finished: // a writer failed
			}
			acked, durableW := m.cut()
			<-finished
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			m.mu.Lock()
			for _, k := range acked {
				if seq, ok := m.seqOf[k]; !ok || seq > durableW {
					t.Fatalf("%s answered before the cut, but its record (%d, read back: %v) is not covered by a finished fdatasync (up to %d)", k, seq, ok, durableW)
				}
			}
			m.mu.Unlock()
			st := s.kv.logStats()
			t.Logf("cut with %d answered, records up to %d durable; %d records, %d fdatasyncs in all", len(acked), durableW, st.Appends, st.Syncs)

			s.crash()
			for _, g := range s.walFiles() {
				data, err := os.ReadFile(walFileName(s.path, g))
				if err != nil {
					t.Fatal(err)
				}
				for _, off := range s.recordOffsets(g) {
					rec, n, err := decodeWALRecord(data[off:])
					if err != nil {
						t.Fatal(err)
					}
					if rec.seq > durableW {
						s.patch(g, off, make([]byte, n))
					}
				}
			}
			s.open(nil)
			if err := s.kv.View(func(tx kvTxn) error {
				for _, k := range acked {
					v, err := tx.Get([]byte(k))
					if err != nil {
						return err
					}
					if string(v) != "v" {
						return fmt.Errorf("%s, answered before the power cut, is lost", k)
					}
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
		})
	}
}
