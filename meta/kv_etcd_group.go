package meta

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Group commit on etcd.
//
// A commit to etcd costs a quorum round: on a cluster of three members,
// the leader's fsync plus a network round trip to a follower and that
// follower's fsync. The engine's own transactions are serialised in this
// process anyway (any two concurrent Updates conflict, see etcdKV), so
// concurrent callers can share that round without weakening anything: the
// first caller to find no commit in flight becomes the committer, and
// callers arriving while it works queue up and are committed together by
// the next round, as bbolt's group commit does (boltKV.commitLoop). No
// caller waits for a timer, so the latency of a lone caller is unchanged.
//
// A round (tryBatch) reads the generation key once, which fixes one
// snapshot revision R for the whole group. After a commit of its own it
// does not even read it: the commit's revision is a snapshot in which it
// knows gen's mod revision, and a linearisable read (a quorum round trip
// on a cluster of several members) is saved. The round then runs the
// calls one after the other, each against R overlaid with the writes of
// the calls before it (etcdTxn.base): call i sees exactly the state calls
// 0..i-1 left, as if they had committed alone. A call whose function
// returns an error contributes no writes (its buffered writes never enter
// the overlay), so the calls after it see the state it would have left
// had it run and failed alone. The union of the
// writes, the generation key's new nonce included, is one etcd Txn whose
// condition is the one every call would have had on its own: the
// generation key still at R's mod revision and, with a fence, the
// leader's key at its create revision. The conditions of the calls are
// identical, so their AND is that condition, and there is no way for the
// Txn to hold for one call and not another. If it fails, none of the
// calls committed, and the whole group runs again on a fresh snapshot (a
// conflict; kvStore allows fn to run more than once) or fails with
// ErrFenced (the fence, which would refuse each of them alone). A lost
// reply is resolved for the group as for one call: the group's nonce
// either replaced the generation or never will.
//
// Running the calls one after the other would pay their reads one after
// the other too, a round trip each. So a round first runs all its calls
// at once, each alone on the snapshot, only to read (readAhead), and the
// real run in order then finds what it reads in the round's cache of the
// snapshot: what every call reads costs about one round trip for the
// round, not one per call.
//
// etcd refuses a Txn with more than --max-txn-ops operations or
// --max-request-bytes, so a round takes calls only while the union of
// their writes fits (EtcdOptions.MaxTxnOps, MaxTxnBytes); the call that
// would overflow it and those after it wait for the next round. A call
// that does not fit even alone fails with ErrTxnTooLarge, as without
// grouping. Writes of several calls to one key (the parent directory of
// creates in the same directory, the inode counter) merge into one
// operation, which is part of the saving.

// etcdCall is one Update waiting in a group commit.
type etcdCall struct {
	fn func(kvTxn) error
	// res is fn's result in the last round that ran it.
	res  error
	done chan error
}

// group queues fn for the next group commit and waits for it.
func (s *etcdKV) group(fn func(kvTxn) error) error {
	c := &etcdCall{fn: fn, done: make(chan error, 1)}
	s.gmu.Lock()
	s.pending = append(s.pending, c)
	lead := !s.running
	s.running = true
	s.gmu.Unlock()
	if lead {
		s.commitLoop()
	}
	return <-c.done
}

// commitLoop runs in the goroutine of the caller that found no round in
// flight; it commits rounds until no call is pending. The goroutine's own
// call is in the first round, so it returns only after its own commit, and
// while calls keep arriving it keeps committing them: the price of not
// needing a goroutine of its own, and bounded by the arrival of work.
func (s *etcdKV) commitLoop() {
	for {
		s.gmu.Lock()
		n := min(len(s.pending), s.opts.MaxBatch)
		if n == 0 {
			s.running = false
			s.gmu.Unlock()
			return
		}
		batch := s.pending[:n:n]
		s.pending = append([]*etcdCall(nil), s.pending[n:]...)
		s.gmu.Unlock()
		s.commitGroup(batch)
	}
}

// commitGroup commits batch in as few rounds as etcd's limits allow and
// answers every call.
func (s *etcdKV) commitGroup(batch []*etcdCall) {
	for len(batch) > 0 {
		var n int
		err := s.retry("update", func() error {
			var err error
			n, err = s.tryBatch(batch)
			return err
		})
		if err != nil && len(batch) > 1 && rejected(err) {
			// etcd rejected the round's request for a reason the
			// limits did not foresee (so nothing of it committed):
			// each call alone finds out its own outcome.
			for _, c := range batch {
				c.done <- s.retry("update", func() error {
					_, err := s.tryBatch([]*etcdCall{c})
					if err == nil {
						err = c.res
					}
					return err
				})
			}
			s.groupStats(len(batch), true)
			return
		}
		if err != nil {
			// Fenced, closed, or given up on: the same for every
			// call, and an outcome that may be unknown, so not one
			// to retry call by call.
			for _, c := range batch {
				c.done <- err
			}
			return
		}
		for _, c := range batch[:n] {
			c.done <- c.res
		}
		s.groupStats(n, false)
		batch = batch[n:]
	}
}

// rejected reports whether err is etcd refusing a round for good: not
// committed, and not going to be on a retry.
func rejected(err error) bool {
	var se *storeError
	return errors.As(err, &se) && !errors.Is(err, ErrUnavailable) && !retryable(err)
}

// groupStats counts rounds for tests and benchmarks.
func (s *etcdKV) groupStats(calls int, fallback bool) {
	s.rounds.Add(1)
	s.roundCalls.Add(int64(calls))
	if fallback {
		s.fallbacks.Add(1)
	}
}

// tryBatch runs one round: it reads the generation key, runs the calls in
// order over one snapshot and commits the writes of calls[:n] in one Txn,
// leaving calls[n:] for a later round because their writes would not fit.
// Each call's own result is in its res. An error fails the round as a
// whole (nothing committed, except when resolve says otherwise and
// returns nil): a conflict or transient error to retry, ErrFenced, or a
// store error.
func (s *etcdKV) tryBatch(calls []*etcdCall) (n int, err error) {
	if len(calls) == 1 {
		// A lone call first assumes the entries it does not know to be
		// absent (kv_etcd_known.go); if that was wrong, it runs again
		// reading them.
		n, err = s.tryRound(calls, true)
		if !errors.Is(err, errAssumed) {
			return n, err
		}
	}
	return s.tryRound(calls, false)
}

// tryRound is tryBatch's round, with entries assumed absent (assume) or
// not.
func (s *etcdKV) tryRound(calls []*etcdCall, assume bool) (n int, err error) {
	if s.fenced.Load() {
		return 0, s.refused()
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rev, genRev := s.snapRev, s.snapGen
	s.snapRev = 0 // set again below if the round leaves a usable snapshot
	if rev < s.seen.Load() {
		// A read saw a later revision (another process wrote, if
		// only outside the prefix): start from there, not before it.
		rev = 0
	}
	if rev == 0 {
		rctx, rcancel := context.WithTimeout(ctx, s.opts.RequestTimeout)
		resp, err := s.getVia(rctx, false, s.gen)
		rcancel()
		if err != nil {
			return 0, &storeError{err}
		}
		rev = resp.Header.Revision
		if len(resp.Kvs) > 0 {
			genRev = resp.Kvs[0].ModRevision
		}
		s.saw(rev)
	}
	reads := s.knownFor(genRev)
	if len(calls) > 1 {
		s.readAhead(ctx, rev, reads, calls)
	}
	var merged map[string]etcdWrite
	var size txnSize
	n = len(calls)
	var assumed map[string]bool // entries read as absent without asking
	for i, c := range calls {
		t := &etcdTxn{s: s, ctx: ctx, rev: rev, writes: map[string]etcdWrite{}, base: merged, read: reads}
		if assume {
			t.assumed = map[string]bool{}
			assumed = t.assumed
		}
		c.res = c.fn(t)
		if t.err != nil {
			return 0, t.err // fn's error, if any, came from a failed read
		}
		if len(assumed) > 0 && (c.res != nil || len(t.writes) == 0) {
			// A result no commit checks may rest on an assumption:
			// run again, reading. What was read stays good.
			s.known, s.knownGen = reads, genRev
			s.snapRev, s.snapGen = rev, genRev
			return 0, errAssumed
		}
		if c.res != nil || len(t.writes) == 0 {
			continue // what failed changed nothing
		}
		grown, ok := size.add(merged, t.writes, s.opts)
		if !ok {
			if i == 0 {
				// Too large alone: what commitOps would say.
				_, c.res = s.commitOps(t.writes)
				if c.res == nil {
					c.res = fmt.Errorf("%w: %d writes", ErrTxnTooLarge, len(t.writes))
				}
				continue
			}
			n = i
			break
		}
		size = grown
		if merged == nil {
			merged = t.writes
			continue
		}
		for k, w := range t.writes {
			merged[k] = w
		}
	}
	if len(merged) == 0 {
		// Read-only: serialisable at the snapshot revision, which is
		// still as good a start for the next round.
		s.snapRev, s.snapGen = rev, genRev
		s.keep(reads, nil, genRev)
		return n, nil
	}
	ops, err := s.commitOps(merged)
	if err != nil {
		return 0, err
	}
	nonce := newNonce()
	ops = append(ops, clientv3.OpPut(s.gen, string(nonce)))
	rctx, rcancel := context.WithTimeout(ctx, s.commitTimeout)
	conds, elseOps := s.conds(genRev), s.fenceRead()
	if len(assumed) > 0 {
		for _, k := range slices.Sorted(maps.Keys(assumed)) {
			conds = append(conds, clientv3.Compare(clientv3.CreateRevision(s.data+k), "=", 0))
		}
		// Tells a wrong assumption (gen unchanged) from a conflict.
		elseOps = append(elseOps, clientv3.OpGet(s.gen))
	}
	tr, err := s.txnVia(rctx, false, func(tx clientv3.Txn) clientv3.Txn {
		return tx.If(conds...).Then(ops...).Else(elseOps...)
	})
	rcancel()
	if err != nil {
		if !retryable(&storeError{err}) {
			// Refused as malformed or too large, most likely, but a
			// refusal is not a proof: the cache waits for a commit
			// that is.
			s.doubt.Store(true)
			return 0, &storeError{err}
		}
		err = s.resolve(ctx, genRev, nonce, err)
		switch {
		case err == nil:
			s.doubt.Store(false)
		case errors.Is(err, errConflict), errors.Is(err, ErrFenced):
			// Not committed, and never will be.
		default:
			s.doubt.Store(true)
		}
		return n, err
	}
	if !tr.Succeeded {
		if s.fenceBroken(tr) {
			return 0, s.refused()
		}
		if len(assumed) > 0 && len(tr.Responses) > 0 {
			kvs := tr.Responses[len(tr.Responses)-1].GetResponseRange().GetKvs()
			if len(kvs) > 0 && kvs[0].ModRevision == genRev {
				// Nobody committed: an entry assumed absent exists.
				// The snapshot and what was read stay good.
				s.known, s.knownGen = reads, genRev
				s.snapRev, s.snapGen = rev, genRev
				return 0, errAssumed
			}
		}
		return 0, errConflict
	}
	// The Txn's revision is the state right after it, with gen last
	// changed by it: the next round starts from there without reading
	// gen. If another process commits meanwhile, that round conflicts
	// and its retry reads gen afresh.
	s.snapRev, s.snapGen = tr.Header.Revision, tr.Header.Revision
	s.saw(tr.Header.Revision)
	s.doubt.Store(false)
	s.keep(reads, merged, tr.Header.Revision)
	s.hints.committed(merged)
	return n, nil
}

// readAhead runs the calls of a round at once, each alone on the
// snapshot at rev, for what they read: their reads fill reads, and the
// calls' real run, one after the other with the writes of those before
// (tryBatch), then finds most of what it reads there instead of paying a
// round trip per read in turn. The snapshot is the same for both runs, so
// a value read ahead is exactly what the real run would read from etcd;
// where an earlier call's write shadows it, the write wins as always.
// What the calls do here is discarded, results and errors alike (kvStore
// allows a function to run more than once): only the real run counts.
//
// Before that, each call runs up to its first read only (most operations
// start with a Prefetch of all they read first), and those first reads of
// all the calls are read in one request: the run at once then finds them
// and asks etcd only for what the calls read next, so a round of creates
// costs one read and the commit instead of one read per create.
func (s *etcdKV) readAhead(ctx context.Context, rev int64, reads *snapReads, calls []*etcdCall) {
	var first [][]byte
	for _, c := range calls {
		_ = c.fn(&etcdTxn{s: s, ctx: ctx, rev: rev, writes: map[string]etcdWrite{}, read: reads, gather: &first})
	}
	if len(first) > 0 {
		slices.SortFunc(first, bytes.Compare)
		first = slices.CompactFunc(first, bytes.Equal)
		// A failed read leaves the calls to read for themselves below.
		_, _ = (&etcdTxn{s: s, ctx: ctx, rev: rev, read: reads}).GetMany(first)
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, readAheadConc)
	for _, c := range calls {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			_ = c.fn(&etcdTxn{s: s, ctx: ctx, rev: rev, writes: map[string]etcdWrite{}, read: reads})
		}()
	}
	wg.Wait()
}

// readAheadConc bounds the calls readAhead runs at once.
const readAheadConc = 32

// txnSize tracks the operations and request bytes of a round's Txn, as
// commitOps counts them, the generation key included.
type txnSize struct{ ops, bytes int }

// add returns the size of the Txn once writes are merged into merged, and
// whether it is within etcd's limits.
func (z txnSize) add(merged, writes map[string]etcdWrite, o EtcdOptions) (txnSize, bool) {
	if z.ops == 0 {
		z = txnSize{ops: 1, bytes: etcdTxnOverhead + len(o.Prefix) + len("gen") + nonceLen}
	}
	for k, w := range writes {
		if old, ok := merged[k]; ok {
			z.bytes += len(w.val) - len(old.val)
			continue
		}
		z.ops++
		z.bytes += etcdOpOverhead + len(k) + len(w.val)
	}
	return z, z.ops <= o.MaxTxnOps && z.bytes <= o.MaxTxnBytes
}
