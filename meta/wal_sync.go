package meta

import (
	"errors"
	"math"
	"runtime"
	"runtime/metrics"
	"time"
)

// Group commit of the log's fdatasyncs.
//
// A synced change is answered once an fdatasync that began after its
// record was written has ended. Concurrent callers share fdatasyncs in
// rounds (syncRound): cur is the fdatasync running, with w the last
// record it covers (read when it starts: a record written after it
// started may or may not reach the disk with it); next is the one that
// starts when cur ends, gathering every caller whose record cur does not
// cover. A caller waits for exactly one round and is woken once, when
// that round's fdatasync has ended, not by the end of each fdatasync
// before it. The callers' own goroutines run the fdatasyncs, so a change
// made while the log is idle syncs without a hand-off to another
// goroutine:
//
//   - a caller that finds no fdatasync running starts one (next, if
//     Await's callers wait there, else a new round) and runs it;
//   - a caller whose record the running one does not cover joins next;
//     the first to join leads it: it waits for cur to end and then
//     starts next, unless a caller that found nothing running has
//     started it already.
//
// A round without a leader (only Await's callers wait for it) starts
// when a synced caller or the commit interval's timer asks.
//
// Before its fdatasync, a round yields the processor once if other
// goroutines are ready to run (lingerForJoiners): those that are about
// to commit (a round of the commit loop, a COMPOUND between its change
// and its sync) then write their records first and join this round
// instead of waiting for it to end and paying for the next. While it
// yields, the round covers every record written (w is MaxUint64, and
// fixed just before the fdatasync), so a caller arriving then joins it.
// With nothing else ready to run it starts at once, and a lone caller
// pays nothing. Measured with BenchmarkWALCommitSync (rec=500, procs=4,
// on a loaded 2-core VM): 0.41 fdatasyncs per commit without the yield,
// 0.28 with it, a fifth fewer context switches, no slower; procs=1
// unchanged. Yielding whenever, ready goroutines or not, cost a lone
// caller a thread wake-up per commit (runtime.Gosched wakes an idle P).
//
// syncMu guards cur, next, the rounds' fields, syncFile and syncClosed;
// it is never held during an fdatasync.

// syncRound is one fdatasync of the log and the callers waiting for it.
type syncRound struct {
	done   chan struct{} // closed when the round ended (err set)
	w      uint64        // the last record it covers; set when it starts
	state  roundState
	leader bool  // a caller waits to start it once cur ends
	err    error // the fdatasync failed, or the store closed first
}

type roundState uint8

const (
	roundWaiting roundState = iota // next: gathering callers
	roundRunning                   // cur: its fdatasync runs
	roundDone                      // done is closed
)

// Sync returns once every record written so far, and so every change a
// reader can see, is durable.
func (s *walKV) Sync() error { return s.syncTo(s.written.Load()) }

// syncTo returns once the record with sequence number target, and every
// one before it, is durable; target must be written already. A burst of
// commits from many callers costs about two fdatasyncs.
func (s *walKV) syncTo(target uint64) error {
	if locked, err := s.lockSyncs(target); !locked {
		return err
	}
	for c := s.cur; c != nil; c = s.cur {
		if c.w >= target {
			s.syncMu.Unlock()
			return s.waitRound(c)
		}
		r := s.nextRound()
		if r.leader {
			s.syncMu.Unlock()
			return s.waitRound(r)
		}
		r.leader = true
		s.syncMu.Unlock()
		<-c.done
		s.syncMu.Lock()
		if r.state != roundWaiting {
			// Started by a caller that found nothing running (and
			// maybe ended), or ended by a failure or Close.
			s.syncMu.Unlock()
			return s.waitRound(r)
		}
		if s.syncClosed {
			// Close began while cur ran; stopSyncs ends r.
			s.syncMu.Unlock()
			return s.syncFailure()
		}
		r.leader = false // still next: the loop starts it
	}
	// Nothing runs, and syncClosed is unset: start next.
	return s.runRound(s.nextRound())
}

// lockSyncs is how syncTo and Await begin: it returns with syncMu held
// (locked) if record target still has to be waited for, and otherwise
// with what the caller returns: nil when it is durable already (or the
// store never syncs: syncNoop), or why no sync can be done.
func (s *walKV) lockSyncs(target uint64) (locked bool, err error) {
	if s.durable.Load() >= target {
		return false, nil
	}
	if !s.sync {
		return false, s.syncNoop()
	}
	s.syncMu.Lock()
	if s.durable.Load() >= target {
		s.syncMu.Unlock()
		return false, nil
	}
	if s.syncClosed {
		s.syncMu.Unlock()
		return false, s.syncFailure()
	}
	return true, nil
}

// nextRound returns next, made if there is none. With syncMu held.
func (s *walKV) nextRound() *syncRound {
	if s.next == nil {
		s.next = &syncRound{done: make(chan struct{})}
	}
	return s.next
}

// runRound runs round r, which is next, while no other runs: called with
// syncMu held, which it releases during the fdatasync.
func (s *walKV) runRound(r *syncRound) error {
	f := s.syncFile
	s.next, s.cur = nil, r
	r.state = roundRunning
	// Until w is fixed, r covers every record written: a caller that
	// comes meanwhile (lingerForJoiners) joins it.
	r.w = math.MaxUint64
	s.syncMu.Unlock()
	if s.othersRunnable() {
		runtime.Gosched()
	}
	s.syncMu.Lock()
	w := s.written.Load()
	r.w = w
	s.syncMu.Unlock()

	if s.syncHook != nil {
		s.syncHook(f, w, false)
	}
	start := time.Now()
	err := f.datasync()
	s.syncHist.observe(time.Since(start))
	if err != nil {
		// Before the callers are woken, so that they see why.
		s.fail(err)
	} else if s.syncHook != nil {
		s.syncHook(f, w, true)
	}

	s.syncMu.Lock()
	s.cur = nil
	if err != nil {
		s.syncClosed = true
		s.endRound(r, err)
		if n := s.next; n != nil {
			s.next = nil
			s.endRound(n, err)
		}
	} else {
		s.syncs.Add(1)
		if w > s.durable.Load() {
			s.durable.Store(w)
		}
		s.endRound(r, nil)
	}
	s.syncCond.Broadcast() // a checkpoint's switch, stopSyncs
	s.syncMu.Unlock()
	if err != nil {
		return s.syncFailure()
	}
	return nil
}

// othersRunnable reports whether goroutines other than the caller are
// ready to run, so that yielding before an fdatasync can let some of
// them join it (the runtime counts them under its scheduler lock: 0.1 to
// 0.4 µs). Only the goroutine running a round calls it, without syncMu
// (runnable is the running round's).
func (s *walKV) othersRunnable() bool {
	metrics.Read(s.runnable[:])
	v := s.runnable[0].Value
	return v.Kind() == metrics.KindUint64 && v.Uint64() > 0
}

// endRound answers r's callers. With syncMu held.
func (s *walKV) endRound(r *syncRound, err error) {
	r.err, r.state = err, roundDone
	close(r.done)
}

// waitRound waits for r's end.
func (s *walKV) waitRound(r *syncRound) error {
	<-r.done
	if r.err != nil {
		return s.syncFailure()
	}
	return nil
}

// syncNoop is syncTo for a store that never syncs (BoltOptions.NoSync):
// what is written counts as durable, as it would after an fdatasync that
// does nothing.
func (s *walKV) syncNoop() error {
	s.syncMu.Lock()
	defer s.syncMu.Unlock()
	if s.syncClosed {
		return s.syncFailure()
	}
	if w := s.written.Load(); w > s.durable.Load() {
		s.durable.Store(w)
		s.syncs.Add(1)
	}
	return nil
}

// Await returns once every record written so far is durable, like Sync,
// but without an fdatasync of its own: it waits for the next one, which
// a synced caller or the commit interval's timer starts. For work that
// may wait (freeing an orphan's data), so that it adds no fdatasyncs.
func (s *walKV) Await() error {
	target := s.written.Load()
	if locked, err := s.lockSyncs(target); !locked {
		return err
	}
	r := s.cur
	if r == nil || r.w < target {
		r = s.nextRound()
		if !r.leader && !s.flushArmed.Load() {
			s.flushArmed.Store(true)
			s.flushTimer.Reset(s.interval)
		}
	}
	s.syncMu.Unlock()
	return s.waitRound(r)
}

// syncFailure is the error of a sync that cannot be done: the store
// failed, or is closed.
func (s *walKV) syncFailure() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failed != nil {
		return s.failed
	}
	return errKVClosed
}

// armFlush makes sure the records written so far become durable within
// the commit interval, also when nobody asks for it. It runs after every
// commit round, so the common case (the timer is armed) takes no lock.
func (s *walKV) armFlush() {
	if s.flushArmed.Load() {
		return
	}
	s.syncMu.Lock()
	if !s.flushArmed.Load() && !s.syncClosed {
		s.flushArmed.Store(true)
		s.flushTimer.Reset(s.interval)
	}
	s.syncMu.Unlock()
}

// flush is the commit interval's timer: it syncs what was written.
func (s *walKV) flush() {
	s.syncMu.Lock()
	s.flushArmed.Store(false)
	closed := s.syncClosed
	s.syncMu.Unlock()
	if closed {
		return
	}
	if err := s.Sync(); err != nil && !errors.Is(err, errKVClosed) {
		s.log.Error("meta: timed sync of the write-ahead log failed", "err", err)
	}
}

// waitNoSync waits, with syncMu held, until no fdatasync runs: so that
// the file syncs go to can change (the commit loop, which has just made
// every record durable and writes none while it waits, so nobody asks
// for another meanwhile), or for Close (syncClosed set: nobody starts
// another).
func (s *walKV) waitNoSync() {
	for s.cur != nil {
		s.syncCond.Wait()
	}
}

// stopSyncs ends syncing for Close: it waits for a running fdatasync,
// stops the timer, and answers the callers still waiting for the next
// (syncFailure: the store's failure, or errKVClosed).
func (s *walKV) stopSyncs() {
	s.syncMu.Lock()
	s.syncClosed = true
	s.waitNoSync()
	s.flushTimer.Stop()
	if r := s.next; r != nil {
		s.next = nil
		s.endRound(r, errKVClosed)
	}
	s.syncMu.Unlock()
}
