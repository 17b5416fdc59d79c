package meta

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shoalfs/shoal/meta/etcdtest"
)

// runGrouped runs fns as concurrent Updates of kv arranged so that all but
// the first share one group commit: the first call's function waits (the
// first time it runs) until the others are queued behind its round, so
// the first round holds fns[0] alone and the next round the rest, as far
// as etcd's limits let it. It returns each call's result.
func runGrouped(t *testing.T, kv *etcdKV, fns []func(kvTxn) error) []error {
	t.Helper()
	res := make([]error, len(fns))
	release := make(chan struct{})
	var once sync.Once
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		res[0] = kv.Update(func(tx kvTxn) error {
			once.Do(func() { <-release })
			return fns[0](tx)
		})
	}()
	// The first call is in its round once it is no longer pending.
	waitFor(t, func() bool { kv.gmu.Lock(); defer kv.gmu.Unlock(); return kv.running && len(kv.pending) == 0 })
	for i := 1; i < len(fns); i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[i] = kv.Update(fns[i])
		}()
	}
	waitFor(t, func() bool { kv.gmu.Lock(); defer kv.gmu.Unlock(); return len(kv.pending) == len(fns)-1 })
	close(release)
	wg.Wait()
	return res
}

// waitFor polls cond, for at most 30 seconds.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for range 30000 {
		if cond() {
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatal("condition not reached in 30s")
}

// incr is an Update function adding 1 to the decimal counter at key and
// marking id done: two reads and two writes, like a create's.
func incr(key string, id int) func(kvTxn) error {
	return func(tx kvTxn) error {
		done := fmt.Appendf(nil, "done/%04d", id)
		if v, err := tx.Get(done); err != nil {
			return err
		} else if v != nil {
			return fmt.Errorf("update %d applied twice", id)
		}
		v, err := tx.Get([]byte(key))
		if err != nil {
			return err
		}
		n := 0
		if v != nil {
			if n, err = strconv.Atoi(string(v)); err != nil {
				return err
			}
		}
		if err := tx.Put([]byte(key), strconv.AppendInt(nil, int64(n+1), 10)); err != nil {
			return err
		}
		return tx.Put(done, []byte{1})
	}
}

// readState returns the counter at key and the ids marked done.
func readState(t *testing.T, kv *etcdKV, key string) (count int, done map[int]bool) {
	t.Helper()
	done = map[int]bool{}
	if err := kv.View(func(tx kvTxn) error {
		v, err := tx.Get([]byte(key))
		if err != nil {
			return err
		}
		if v != nil {
			if count, err = strconv.Atoi(string(v)); err != nil {
				return err
			}
		}
		return tx.Scan([]byte("done/"), nil, func(k, _ []byte) bool {
			id, _ := strconv.Atoi(string(k[len("done/"):]))
			done[id] = true
			return true
		})
	}); err != nil {
		t.Fatal(err)
	}
	return count, done
}

var errRefuse = errors.New("refused by the test")

// TestEtcdGroupCommit: calls that share a round see each other's writes
// in order (a read-modify-write of one counter by every call counts
// every call once), a call that fails leaves no trace while the others
// commit, a round takes only as many calls as fit etcd's limits and
// leaves the rest to the next round, and a call too large on its own
// fails alone.
func TestEtcdGroupCommit(t *testing.T) {
	c := etcdtest.Start(t, 1, etcdtest.Options{NoFsync: true})
	const calls = 40
	for _, tc := range []struct {
		name string
		opts EtcdOptions
		// fail and huge pick the calls that return an error after
		// writing, and that write more keys than a Txn holds.
		fail, huge func(i int) bool
		rounds     int64 // 0: not checked
		minRounds  int64
	}{
		{name: "all succeed", rounds: 2},
		{name: "some fail", fail: func(i int) bool { return i%3 == 1 }, rounds: 2},
		{name: "first fails", fail: func(i int) bool { return i == 0 }, rounds: 2},
		{name: "max batch", opts: EtcdOptions{MaxBatch: 8}, rounds: 1 + 5},
		// Each call writes a new done key and the shared counter: 16
		// operations hold the generation key, the counter and 14 done
		// keys, so 39 calls take 3 rounds after the first.
		{name: "txn ops", opts: EtcdOptions{MaxTxnOps: 16}, rounds: 1 + 3},
		{name: "too large alone", opts: EtcdOptions{MaxTxnOps: 16}, huge: func(i int) bool { return i == 5 || i == 6 }, minRounds: 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kv := openTestEtcdKV(t, c, "/group/"+tc.name, tc.opts)
			fns := make([]func(kvTxn) error, calls)
			for i := range fns {
				f := incr("count", i)
				switch {
				case tc.fail != nil && tc.fail(i):
					fns[i] = func(tx kvTxn) error {
						if err := f(tx); err != nil {
							return err
						}
						return errRefuse
					}
				case tc.huge != nil && tc.huge(i):
					fns[i] = func(tx kvTxn) error {
						for k := range 20 {
							if err := tx.Put(fmt.Appendf(nil, "huge/%d/%d", i, k), []byte{1}); err != nil {
								return err
							}
						}
						return f(tx)
					}
				default:
					fns[i] = f
				}
			}
			res := runGrouped(t, kv, fns)
			want := map[int]bool{}
			for i, err := range res {
				switch {
				case tc.fail != nil && tc.fail(i):
					if !errors.Is(err, errRefuse) {
						t.Errorf("call %d: %v, want its own error", i, err)
					}
				case tc.huge != nil && tc.huge(i):
					if !errors.Is(err, ErrTxnTooLarge) {
						t.Errorf("call %d: %v, want ErrTxnTooLarge", i, err)
					}
				case err != nil:
					t.Errorf("call %d: %v", i, err)
				default:
					want[i] = true
				}
			}
			count, done := readState(t, kv, "count")
			if count != len(want) || len(done) != len(want) {
				t.Errorf("counter %d, %d calls marked done, want %d", count, len(done), len(want))
			}
			for i := range want {
				if !done[i] {
					t.Errorf("call %d succeeded but is not marked done", i)
				}
			}
			if err := kv.View(func(tx kvTxn) error {
				return tx.Scan([]byte("huge/"), nil, func(k, _ []byte) bool { t.Errorf("%s written", k); return true })
			}); err != nil {
				t.Fatal(err)
			}
			r := kv.rounds.Load()
			t.Logf("%d calls in %d rounds", kv.roundCalls.Load(), r)
			if tc.rounds != 0 && r != tc.rounds {
				t.Errorf("%d rounds, want %d", r, tc.rounds)
			}
			if r < tc.minRounds {
				t.Errorf("%d rounds, want at least %d", r, tc.minRounds)
			}
			if f := kv.fallbacks.Load(); f != 0 {
				t.Errorf("%d rounds fell back to one call at a time", f)
			}
		})
	}
}

// TestEtcdGroupConflicts runs two engines on one prefix, as two metadata
// servers would: each groups its own callers, and the groups conflict
// with each other. Every increment must count exactly once.
func TestEtcdGroupConflicts(t *testing.T) {
	c := etcdtest.Start(t, 1, etcdtest.Options{NoFsync: true})
	kvs := []*etcdKV{
		openTestEtcdKV(t, c, "/conflict", EtcdOptions{MaxRetries: 1000}),
		openTestEtcdKV(t, c, "/conflict", EtcdOptions{MaxRetries: 1000}),
	}
	const workers, per = 4, 25
	var wg sync.WaitGroup
	errc := make(chan error, len(kvs)*workers)
	for k, kv := range kvs {
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range per {
					if err := kv.Update(incr("count", (k*workers+w)*per+i)); err != nil {
						errc <- err
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	count, done := readState(t, kvs[0], "count")
	if want := len(kvs) * workers * per; count != want || len(done) != want {
		t.Fatalf("counter %d, %d marked done, want %d", count, len(done), want)
	}
	for k, kv := range kvs {
		t.Logf("engine %d: %d calls in %d rounds", k, kv.roundCalls.Load(), kv.rounds.Load())
	}
}

// TestEtcdGroupFence: a round under a fence that broke fails every call
// in it with ErrFenced and writes nothing, and so does every later one.
func TestEtcdGroupFence(t *testing.T) {
	c := etcdtest.Start(t, 1, etcdtest.Options{NoFsync: true})
	ctx := context.Background()
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	r, err := cli.Put(ctx, "/gfence/election/a", "x")
	if err != nil {
		t.Fatal(err)
	}
	refused := 0
	kv := openTestEtcdKV(t, c, "/gfence", EtcdOptions{Fence: &EtcdFence{Key: "/gfence/election/a", CreateRevision: r.Header.Revision,
		OnFenced: func() { refused++ }}})
	const calls = 10
	fns := make([]func(kvTxn) error, calls)
	for i := range fns {
		fns[i] = incr("count", i)
	}
	// The term ends while the first call's round is open.
	first := fns[0]
	fns[0] = func(tx kvTxn) error {
		if _, err := cli.Delete(ctx, "/gfence/election/a"); err != nil {
			return err
		}
		return first(tx)
	}
	for i, err := range runGrouped(t, kv, fns) {
		if !errors.Is(err, ErrFenced) {
			t.Errorf("call %d: %v, want ErrFenced", i, err)
		}
	}
	if err := kv.Update(incr("count", calls)); !errors.Is(err, ErrFenced) {
		t.Errorf("update after the fence broke: %v, want ErrFenced", err)
	}
	if count, done := readState(t, kv, "count"); count != 0 || len(done) != 0 {
		t.Errorf("counter %d, %d marked done after fenced rounds", count, len(done))
	}
	if refused == 0 {
		t.Error("OnFenced never called")
	}
}

// TestEtcdGroupLostReplies is TestEtcdLostReplies with concurrent
// callers: a lost reply leaves the outcome of a whole round to resolve,
// and every call of it must take effect exactly once if it reports
// success, and never twice.
func TestEtcdGroupLostReplies(t *testing.T) {
	c := etcdtest.Start(t, 1, etcdtest.Options{NoFsync: true})
	kv := openTestEtcdKV(t, c, "/glost", EtcdOptions{MaxRetries: 1000})
	kv.commitTimeout = 100 * time.Microsecond
	const workers, per = 5, 10
	var mu sync.Mutex
	ok := map[int]bool{}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range per {
				id := w*per + i
				err := kv.Update(incr("count", id))
				if err != nil && !errors.Is(err, ErrUnavailable) {
					t.Errorf("update %d: %v", id, err)
				}
				if err == nil {
					mu.Lock()
					ok[id] = true
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("%d of %d updates succeeded in %d rounds; %d lost replies", len(ok), workers*per, kv.rounds.Load(), kv.resolved.Load())
	count, done := readState(t, kv, "count")
	if count != len(done) {
		t.Fatalf("counter %d but %d marked done: a round applied in part", count, len(done))
	}
	for id := range ok {
		if !done[id] {
			t.Errorf("update %d reported success but is not there", id)
		}
	}
}

// TestEtcdReadRevisions checks what spares etcd's quorum reads: an Update
// after the engine's own commit starts from that commit's revision
// without reading the generation key, a View reads serialisably, and
// neither misses a change, whether this engine made it or another
// process did (the other process's commit makes the next Update conflict
// and start afresh; a View that has seen it never reads behind it).
func TestEtcdReadRevisions(t *testing.T) {
	c := etcdtest.Start(t, 1, etcdtest.Options{NoFsync: true})
	kv, ck := openCountingEtcdKV(t, c, "/revs", EtcdOptions{})
	other := openTestEtcdKV(t, c, "/revs", EtcdOptions{})
	count := func(s *etcdKV) int {
		t.Helper()
		n, _ := readState(t, s, "count")
		return n
	}
	id := 0
	step := func(s *etcdKV) {
		t.Helper()
		if err := s.Update(incr("count", id)); err != nil {
			t.Fatal(err)
		}
		id++
	}
	step(kv) // reads gen: nothing committed by kv yet
	for i := range 3 {
		gets, linear, txns := ck.gets.Load(), ck.linearGets.Load(), ck.txns.Load()
		step(kv)
		// incr reads two keys at the snapshot revision and commits: no
		// read of gen, nothing linearisable, and "count" is known from
		// the last commit (kv_etcd_known.go), so only the new key is
		// read, serialisably.
		if g, l, x := ck.gets.Load()-gets, ck.linearGets.Load()-linear, ck.txns.Load()-txns; g != 1 || l != 0 || x != 1 {
			t.Errorf("update %d after a commit: %d gets (%d linearisable), %d txns; want 1 (0), 1", i, g, l, x)
		}
	}
	linear := ck.linearGets.Load()
	if n := count(kv); n != 4 {
		t.Fatalf("count %d after 4 updates", n)
	}
	if l := ck.linearGets.Load() - linear; l != 0 {
		t.Errorf("a View after the engine's own commit made %d linearisable reads, want 0", l)
	}

	// Another process commits: kv's next Update conflicts once and
	// counts it.
	step(other)
	txns := ck.txns.Load()
	step(kv)
	if x := ck.txns.Load() - txns; x != 2 {
		t.Errorf("update after another engine's commit took %d txns, want 2 (a conflict, then the commit)", x)
	}
	if n := count(kv); n != 6 {
		t.Fatalf("count %d, want 6", n)
	}
	// Once a View of kv has seen another commit, kv's next Update
	// starts from a fresh read of gen instead of its own commit.
	step(other)
	if n := count(kv); n != 7 {
		t.Fatalf("count %d after another engine's update, want 7", n)
	}
	txns, linear = ck.txns.Load(), ck.linearGets.Load()
	step(kv)
	if x, l := ck.txns.Load()-txns, ck.linearGets.Load()-linear; x != 1 || l != 1 {
		t.Errorf("update after a View saw another engine's commit: %d txns, %d linearisable gets; want 1, 1", x, l)
	}
	// kv has seen the other's revision; a View never reads behind it.
	if rev := kv.seen.Load(); rev == 0 {
		t.Fatal("no revision recorded as seen")
	}
	var viewRev int64
	if err := kv.View(func(tx kvTxn) error {
		_, err := tx.Get([]byte("count"))
		viewRev = tx.(*etcdTxn).rev
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if viewRev < kv.seen.Load() || viewRev < kv.snapRev {
		t.Errorf("view at revision %d, behind the seen %d", viewRev, kv.seen.Load())
	}
}
