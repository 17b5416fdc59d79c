package meta

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/shoalfs/shoal/meta/etcdtest"
)

func openTestEtcdKV(t *testing.T, c *etcdtest.Cluster, prefix string, opts EtcdOptions) *etcdKV {
	t.Helper()
	opts.Endpoints, opts.Prefix = c.Endpoints, prefix
	kv, err := openEtcdKV(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { kv.Close() })
	return kv
}

func scanKeys(tx kvTxn, prefix, start string, limit int) ([]string, error) {
	var got []string
	err := tx.Scan([]byte(prefix), []byte(start), func(k, v []byte) bool {
		got = append(got, string(k)+"="+string(v))
		return len(got) < limit
	})
	return got, err
}

// TestEtcdScan checks paging and the merge of buffered writes into scans:
// a scan inside an Update sees the transaction's own puts and deletes, in
// key order, across page boundaries.
func TestEtcdScan(t *testing.T) {
	c := etcdtest.Start(t, 1, etcdtest.Options{NoFsync: true})
	kv := openTestEtcdKV(t, c, "/scan", EtcdOptions{ScanPage: 2})
	stored := []string{"a", "b1", "b3", "b5", "b7", "c"}
	if err := kv.Update(func(tx kvTxn) error {
		for _, k := range stored {
			if err := tx.Put([]byte(k), []byte("s")); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name          string
		puts, dels    []string
		prefix, start string
		limit         int
		want          string
	}{
		{name: "stored", prefix: "b", limit: 10, want: "[b1=s b3=s b5=s b7=s]"},
		{name: "start", prefix: "b", start: "b4", limit: 10, want: "[b5=s b7=s]"},
		{name: "start before prefix", prefix: "b", start: "a", limit: 10, want: "[b1=s b3=s b5=s b7=s]"},
		{name: "all", limit: 10, want: "[a=s b1=s b3=s b5=s b7=s c=s]"},
		{name: "limit", prefix: "b", limit: 3, want: "[b1=s b3=s b5=s]"},
		{name: "empty", prefix: "d", limit: 10, want: "[]"},
		{name: "puts interleaved", puts: []string{"b0", "b4", "b8", "a0", "d"}, prefix: "b", limit: 10,
			want: "[b0=w b1=s b3=s b4=w b5=s b7=s b8=w]"},
		{name: "overwrite", puts: []string{"b3", "b7"}, prefix: "b", limit: 10, want: "[b1=s b3=w b5=s b7=w]"},
		{name: "deletes", dels: []string{"b1", "b5", "b9"}, prefix: "b", limit: 10, want: "[b3=s b7=s]"},
		{name: "delete all", dels: []string{"b1", "b3", "b5", "b7"}, puts: []string{"b6"}, prefix: "b", limit: 10, want: "[b6=w]"},
		{name: "puts only", puts: []string{"x2", "x1"}, prefix: "x", limit: 10, want: "[x1=w x2=w]"},
		{name: "merge with start", puts: []string{"b2", "b6"}, dels: []string{"b5"}, prefix: "b", start: "b3", limit: 10,
			want: "[b3=s b6=w b7=s]"},
		{name: "merge with limit", puts: []string{"b2"}, prefix: "b", limit: 2, want: "[b1=s b2=w]"},
	} {
		t.Run(c.name, func(t *testing.T) {
			errAbort := errors.New("abort")
			var got []string
			err := kv.Update(func(tx kvTxn) error {
				for _, k := range c.puts {
					tx.Put([]byte(k), []byte("w"))
				}
				for _, k := range c.dels {
					tx.Delete([]byte(k))
				}
				var err error
				got, err = scanKeys(tx, c.prefix, c.start, c.limit)
				if err != nil {
					return err
				}
				return errAbort // leave the stored keys as they are
			})
			if !errors.Is(err, errAbort) {
				t.Fatal(err)
			}
			if fmt.Sprint(got) != c.want {
				t.Fatalf("got %v, want %s", got, c.want)
			}
			if len(c.puts)+len(c.dels) == 0 { // a View must agree
				if err := kv.View(func(tx kvTxn) error {
					got, err = scanKeys(tx, c.prefix, c.start, c.limit)
					return err
				}); err != nil || fmt.Sprint(got) != c.want {
					t.Fatalf("view: got %v %v, want %s", got, err, c.want)
				}
			}
		})
	}
}

// TestEtcdCounters runs read-modify-write increments from several stores
// (as separate processes would) and goroutines: with serializable
// transactions no increment is lost, and each pair of counters moves
// together.
func TestEtcdCounters(t *testing.T) {
	c := etcdtest.Start(t, 1, etcdtest.Options{NoFsync: true})
	const stores, workers, per = 3, 3, 15
	var wg sync.WaitGroup
	errc := make(chan error, stores*workers)
	for s := range stores {
		kv := openTestEtcdKV(t, c, "/counters", EtcdOptions{MaxRetries: 1000})
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range per {
					err := kv.Update(func(tx kvTxn) error {
						for _, k := range []string{"x", "y"} {
							v, err := tx.Get([]byte(k))
							if err != nil {
								return err
							}
							n := 0
							if v != nil {
								fmt.Sscan(string(v), &n)
							}
							if err := tx.Put([]byte(k), fmt.Append(nil, n+1)); err != nil {
								return err
							}
						}
						return tx.Put(fmt.Appendf(nil, "by/%d", s), []byte{1})
					})
					if err != nil {
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
	kv := openTestEtcdKV(t, c, "/counters", EtcdOptions{})
	if err := kv.View(func(tx kvTxn) error {
		for _, k := range []string{"x", "y"} {
			v, err := tx.Get([]byte(k))
			if err != nil {
				return err
			}
			if want := fmt.Sprint(stores * workers * per); string(v) != want {
				return fmt.Errorf("%s = %s, want %s", k, v, want)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// TestEtcdDeleteConflict: a transaction that read a key which another
// transaction deletes before the first commits must not commit on its
// stale read. A compare on the read key's mod revision would miss this
// (a deleted key has none); the generation key catches it.
func TestEtcdDeleteConflict(t *testing.T) {
	c := etcdtest.Start(t, 1, etcdtest.Options{NoFsync: true})
	a := openTestEtcdKV(t, c, "/delconflict", EtcdOptions{})
	b := openTestEtcdKV(t, c, "/delconflict", EtcdOptions{})
	if err := a.Update(func(tx kvTxn) error { return tx.Put([]byte("k"), []byte("v")) }); err != nil {
		t.Fatal(err)
	}
	runs := 0
	err := a.Update(func(tx kvTxn) error {
		runs++
		v, err := tx.Get([]byte("k"))
		if err != nil {
			return err
		}
		if runs == 1 {
			// Another process deletes k after this snapshot was taken.
			if err := b.Update(func(tx kvTxn) error { return tx.Delete([]byte("k")) }); err != nil {
				return err
			}
		}
		return tx.Put([]byte("saw"), append([]byte("k="), v...))
	})
	if err != nil {
		t.Fatal(err)
	}
	if runs != 2 {
		t.Fatalf("fn ran %d times, want 2 (conflict, then rerun)", runs)
	}
	if err := a.View(func(tx kvTxn) error {
		v, err := tx.Get([]byte("saw"))
		if err != nil || string(v) != "k=" {
			return fmt.Errorf("saw = %q %v, want the rerun's view (k absent)", v, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// TestEtcdResolve exercises the decision taken when a commit's reply is
// lost: whether the commit happened is read from etcd's history of the
// generation key, after fencing so that an in-flight commit cannot land
// later.
func TestEtcdResolve(t *testing.T) {
	c := etcdtest.Start(t, 1, etcdtest.Options{NoFsync: true})
	kv := openTestEtcdKV(t, c, "/resolve", EtcdOptions{})
	ctx := context.Background()
	genRev := func() int64 {
		t.Helper()
		r, err := kv.cli.Get(ctx, kv.gen)
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Kvs) == 0 {
			return 0
		}
		return r.Kvs[0].ModRevision
	}
	commit := func(rev int64, nonce []byte) bool {
		t.Helper()
		r, err := kv.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(kv.gen), "=", rev)).
			Then(clientv3.OpPut(kv.data+"k", "v"), clientv3.OpPut(kv.gen, string(nonce))).Commit()
		if err != nil {
			t.Fatal(err)
		}
		return r.Succeeded
	}
	lost := errors.New("reply lost")

	// The commit landed: resolve reports success.
	rev, nonce := genRev(), newNonce()
	if !commit(rev, nonce) {
		t.Fatal("commit failed")
	}
	if err := kv.resolve(ctx, rev, nonce, lost); err != nil {
		t.Fatalf("landed commit: %v", err)
	}

	// The commit had not landed: resolve reports a conflict (so fn runs
	// again), and the fence keeps the old request from landing later.
	rev, nonce = genRev(), newNonce()
	if err := kv.resolve(ctx, rev, nonce, lost); !errors.Is(err, errConflict) {
		t.Fatalf("lost commit: %v, want errConflict", err)
	}
	if commit(rev, nonce) {
		t.Fatal("a commit on the fenced revision succeeded")
	}

	// Another writer committed first: not ours.
	rev = genRev()
	if !commit(rev, newNonce()) {
		t.Fatal("commit failed")
	}
	if err := kv.resolve(ctx, rev, newNonce(), lost); !errors.Is(err, errConflict) {
		t.Fatalf("other writer's commit: %v, want errConflict", err)
	}
}

// TestEtcdLimits: transactions beyond etcd's limits fail whole, with
// ErrTxnTooLarge, and write nothing; the largest allowed ones commit.
func TestEtcdLimits(t *testing.T) {
	c := etcdtest.Start(t, 1, etcdtest.Options{NoFsync: true})
	kv := openTestEtcdKV(t, c, "/limits", EtcdOptions{})
	puts := func(n, size int) func(kvTxn) error {
		return func(tx kvTxn) error {
			for i := range n {
				if err := tx.Put(fmt.Appendf(nil, "k%03d", i), bytes.Repeat([]byte{'x'}, size)); err != nil {
					return err
				}
			}
			return nil
		}
	}
	for _, c := range []struct {
		name    string
		n, size int
		ok      bool
	}{
		{"127 ops", 127, 10, true}, // plus the generation key: etcd's default of 128
		{"128 ops", 128, 10, false},
		{"1 MiB value", 1, 1 << 20, true},
		{"2 MiB value", 1, 2 << 20, false},
		{"100 x 16 KiB", 100, 16 << 10, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := kv.Update(puts(c.n, c.size))
			if c.ok != (err == nil) || !c.ok && !errors.Is(err, ErrTxnTooLarge) {
				t.Fatalf("err = %v, want ok %v", err, c.ok)
			}
			if err := kv.Update(func(tx kvTxn) error {
				var keys []string
				err := tx.Scan(nil, nil, func(k, _ []byte) bool { keys = append(keys, string(k)); return true })
				if err != nil {
					return err
				}
				if want := map[bool]int{true: c.n, false: 0}[c.ok]; len(keys) != want {
					return fmt.Errorf("%d keys stored (%s), want %d", len(keys), strings.Join(keys[:min(len(keys), 3)], " "), want)
				}
				for _, k := range keys {
					tx.Delete([]byte(k))
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestEtcdLostReplies gives commits a deadline so short that many time
// out, some after etcd applied them and some before: each Update must
// still take effect exactly once if it reports success, never twice, and
// always atomically.
func TestEtcdLostReplies(t *testing.T) {
	c := etcdtest.Start(t, 1, etcdtest.Options{NoFsync: true})
	kv := openTestEtcdKV(t, c, "/lost", EtcdOptions{MaxRetries: 1000})
	kv.commitTimeout = 300 * time.Microsecond
	const n = 50
	var ok []int
	runs := 0
	for id := range n {
		err := kv.Update(func(tx kvTxn) error {
			runs++
			key := fmt.Appendf(nil, "done/%03d", id)
			if v, err := tx.Get(key); err != nil {
				return err
			} else if v != nil {
				return fmt.Errorf("update %d applied twice", id)
			}
			v, err := tx.Get([]byte("count"))
			if err != nil {
				return err
			}
			cnt := 0
			if v != nil {
				fmt.Sscan(string(v), &cnt)
			}
			if err := tx.Put([]byte("count"), fmt.Append(nil, cnt+1)); err != nil {
				return err
			}
			return tx.Put(key, []byte{1})
		})
		if err != nil && strings.Contains(err.Error(), "applied twice") {
			t.Fatal(err)
		}
		if err == nil {
			ok = append(ok, id)
		}
	}
	// Nothing else writes, so every rerun follows a commit resolved as
	// not applied.
	t.Logf("%d of %d updates succeeded; %d lost replies: %d commits had been applied, %d had not",
		len(ok), n, kv.resolved.Load(), kv.resolved.Load()-int64(runs-n), runs-n)
	if err := kv.View(func(tx kvTxn) error {
		var done []string
		if err := tx.Scan([]byte("done/"), nil, func(k, _ []byte) bool { done = append(done, string(k)); return true }); err != nil {
			return err
		}
		v, err := tx.Get([]byte("count"))
		if err != nil {
			return err
		}
		if want := fmt.Sprint(len(done)); string(v) != want && !(v == nil && len(done) == 0) {
			return fmt.Errorf("count %s, but %d updates applied", v, len(done))
		}
		for _, id := range ok {
			if !slices.Contains(done, fmt.Sprintf("done/%03d", id)) {
				return fmt.Errorf("update %d reported success but is not applied", id)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// countingKV counts the requests of an etcd client, so tests can check how
// many round trips a batch took, and can run a hook before each Txn (to
// write between the Txns of one batch).
type countingKV struct {
	clientv3.KV
	gets, txns atomic.Int64
	// linearGets counts the Gets that are linearisable (a quorum round
	// trip on a cluster of several members).
	linearGets atomic.Int64
	beforeTxn  func(n int64) // n counts from 1; may be nil
}

func (c *countingKV) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	c.gets.Add(1)
	if !clientv3.OpGet(key, opts...).IsSerializable() {
		c.linearGets.Add(1)
	}
	return c.KV.Get(ctx, key, opts...)
}

func (c *countingKV) Txn(ctx context.Context) clientv3.Txn {
	n := c.txns.Add(1)
	if c.beforeTxn != nil {
		c.beforeTxn(n)
	}
	return c.KV.Txn(ctx)
}

// openCountingEtcdKV opens a store whose client requests are counted.
func openCountingEtcdKV(t *testing.T, c *etcdtest.Cluster, prefix string, opts EtcdOptions) (*etcdKV, *countingKV) {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	ck := &countingKV{KV: cli.KV}
	cli.KV = ck
	opts.Client = cli
	return openTestEtcdKV(t, c, prefix, opts), ck
}

// showVals formats values with absent ones as <nil> and empty ones as "".
func showVals(vals [][]byte) string {
	var b strings.Builder
	for i, v := range vals {
		if i > 0 {
			b.WriteByte(' ')
		}
		if v == nil {
			b.WriteString("<nil>")
		} else {
			fmt.Fprintf(&b, "%q", v)
		}
	}
	return b.String()
}

func byteKeys(keys ...string) [][]byte {
	out := make([][]byte, len(keys))
	for i, k := range keys {
		out[i] = []byte(k)
	}
	return out
}

// getEach reads keys with one Get each, the reference GetMany must match.
func getEach(tx kvTxn, keys [][]byte) ([][]byte, error) {
	vals := make([][]byte, len(keys))
	for i, k := range keys {
		v, err := tx.Get(k)
		if err != nil {
			return nil, err
		}
		vals[i] = v
	}
	return vals, nil
}

// TestEtcdGetMany checks that GetMany reads what Get would, buffered
// writes included, in one Txn per MaxTxnOps keys and no other requests.
func TestEtcdGetMany(t *testing.T) {
	c := etcdtest.Start(t, 1, etcdtest.Options{NoFsync: true})
	const ops = 4
	kv, ck := openCountingEtcdKV(t, c, "/getmany", EtcdOptions{MaxTxnOps: ops})
	var all []string
	for i := range 10 {
		all = append(all, fmt.Sprintf("k%02d", i))
	}
	// Stored directly: more keys than one Update may write here.
	for _, k := range append(all, "empty") {
		v := "v" + k[1:]
		if k == "empty" {
			v = ""
		}
		if _, err := kv.cli.Put(context.Background(), kv.data+k, v); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		name       string
		puts, dels []string
		keys       []string
		want       string
		txns       int64 // etcd Txns GetMany may send
	}{
		{name: "none", want: ""},
		{name: "one", keys: []string{"k03"}, want: `"v03"`, txns: 1},
		{name: "absent", keys: []string{"k00", "nope", "k05", "zz"}, want: `"v00" <nil> "v05" <nil>`, txns: 1},
		{name: "empty value", keys: []string{"empty", "k01"}, want: `"" "v01"`, txns: 1},
		{name: "duplicates", keys: []string{"k02", "k02", "nope", "nope"}, want: `"v02" "v02" <nil> <nil>`, txns: 1},
		{name: "chunks", keys: all, want: `"v00" "v01" "v02" "v03" "v04" "v05" "v06" "v07" "v08" "v09"`, txns: 3},
		{name: "exact chunks", keys: all[:2*ops], want: `"v00" "v01" "v02" "v03" "v04" "v05" "v06" "v07"`, txns: 2},
		{name: "buffered", puts: []string{"k01", "new"}, dels: []string{"k02", "nope"}, keys: []string{"k01", "k02", "k03", "new", "nope"},
			want: `"w" <nil> "v03" "w" <nil>`, txns: 1},
		{name: "all buffered", puts: []string{"k01"}, dels: []string{"k02"}, keys: []string{"k02", "k01"}, want: `<nil> "w"`},
		{name: "buffered across chunks", puts: []string{"k00", "k09"}, dels: []string{"k05"}, keys: all,
			want: `"w" "v01" "v02" "v03" "v04" <nil> "v06" "v07" "v08" "w"`, txns: 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			check := func(tx kvTxn) error {
				keys := byteKeys(c.keys...)
				txns, gets := ck.txns.Load(), ck.gets.Load()
				got, err := tx.(kvBatchGetter).GetMany(keys)
				if err != nil {
					return err
				}
				if n := ck.txns.Load() - txns; n != c.txns || ck.gets.Load() != gets {
					return fmt.Errorf("GetMany sent %d Txns and %d Gets, want %d and 0", n, ck.gets.Load()-gets, c.txns)
				}
				if len(got) != len(keys) || showVals(got) != c.want {
					return fmt.Errorf("GetMany = %s, want %s", showVals(got), c.want)
				}
				each, err := getEach(tx, keys)
				if err != nil {
					return err
				}
				if showVals(each) != showVals(got) {
					return fmt.Errorf("GetMany = %s, Get = %s", showVals(got), showVals(each))
				}
				return nil
			}
			errAbort := errors.New("abort")
			err := kv.Update(func(tx kvTxn) error {
				for _, k := range c.puts {
					tx.Put([]byte(k), []byte("w"))
				}
				for _, k := range c.dels {
					tx.Delete([]byte(k))
				}
				if err := check(tx); err != nil {
					return err
				}
				return errAbort // leave the stored keys as they are
			})
			if !errors.Is(err, errAbort) {
				t.Fatalf("update: %v", err)
			}
			if len(c.puts)+len(c.dels) == 0 {
				if err := kv.View(check); err != nil {
					t.Fatalf("view: %v", err)
				}
			}
		})
	}
}

// TestEtcdGetManyBytes: batches are also split to keep each Txn request
// under MaxTxnBytes.
func TestEtcdGetManyBytes(t *testing.T) {
	c := etcdtest.Start(t, 1, etcdtest.Options{NoFsync: true})
	kv, ck := openCountingEtcdKV(t, c, "/getmanybytes", EtcdOptions{})
	var keys []string
	for i := range 7 {
		keys = append(keys, fmt.Sprintf("%040d", i))
		if _, err := kv.cli.Put(context.Background(), kv.data+keys[i], fmt.Sprint("v", i)); err != nil {
			t.Fatal(err)
		}
	}
	// Two keys fit in one request, three do not.
	op := etcdOpOverhead + len(kv.data) + 40
	kv.opts.MaxTxnBytes = etcdTxnOverhead + 2*op + op/2
	if err := kv.View(func(tx kvTxn) error {
		got, err := tx.(kvBatchGetter).GetMany(byteKeys(keys...))
		if err != nil {
			return err
		}
		if want := `"v0" "v1" "v2" "v3" "v4" "v5" "v6"`; showVals(got) != want {
			return fmt.Errorf("GetMany = %s, want %s", showVals(got), want)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if n := ck.txns.Load(); n != 4 {
		t.Fatalf("GetMany of 7 keys sent %d Txns, want 4 of at most 2 keys", n)
	}
}

// TestEtcdGetManySnapshot: GetMany reads the transaction's snapshot, in
// every Txn of a batch, whether an earlier Get or GetMany itself fixed
// it: writes committed after the snapshot are not seen.
func TestEtcdGetManySnapshot(t *testing.T) {
	c := etcdtest.Start(t, 1, etcdtest.Options{NoFsync: true})
	kv, ck := openCountingEtcdKV(t, c, "/getmanysnap", EtcdOptions{MaxTxnOps: 3})
	other := openTestEtcdKV(t, c, "/getmanysnap", EtcdOptions{})
	keys := byteKeys("a", "b", "c", "d", "e", "f", "g", "h")
	reset := func() {
		t.Helper()
		if err := other.Update(func(tx kvTxn) error {
			for _, k := range keys {
				if err := tx.Put(k, []byte("old")); err != nil {
					return err
				}
			}
			return tx.Delete([]byte("h"))
		}); err != nil {
			t.Fatal(err)
		}
	}
	// change commits, through another store, a write to every key but
	// the first: c..g change, b goes away, h appears.
	change := func() error {
		return other.Update(func(tx kvTxn) error {
			for _, k := range keys[2:] {
				if err := tx.Put(k, []byte("new")); err != nil {
					return err
				}
			}
			return tx.Delete([]byte("b"))
		})
	}
	const old = `"old" "old" "old" "old" "old" "old" "old" <nil>`
	const cur = `"old" <nil> "new" "new" "new" "new" "new" "new"`
	for _, c := range []struct {
		name   string
		update bool
		// first is what fixes the snapshot: "get" (a Get before the
		// batch), "batch" (GetMany's own first Txn) or "" (the Update's
		// read of the generation key).
		first string
	}{
		{name: "view after get", first: "get"},
		{name: "view first read", first: "batch"},
		{name: "update", update: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			reset()
			var got, after []string
			runs := 0
			fn := func(tx kvTxn) error {
				runs++
				if c.first == "get" {
					if _, err := tx.Get([]byte("zz")); err != nil {
						return err
					}
				}
				changed := false
				if runs == 1 {
					if c.first == "batch" {
						// Between the first Txn of the batch and the second.
						start := ck.txns.Load()
						ck.beforeTxn = func(n int64) {
							if n == start+2 && !changed {
								changed = true
								if err := change(); err != nil {
									t.Error(err)
								}
							}
						}
						defer func() { ck.beforeTxn = nil }()
					} else if err := change(); err != nil {
						return err
					}
				}
				vals, err := tx.(kvBatchGetter).GetMany(keys)
				if err != nil {
					return err
				}
				got = append(got, showVals(vals))
				if c.first == "batch" && runs == 1 && !changed {
					return errors.New("the hook did not run between two Txns of the batch")
				}
				if vals, err = getEach(tx, keys); err != nil {
					return err
				}
				after = append(after, showVals(vals))
				if c.update {
					return tx.Put([]byte("x"), []byte("1"))
				}
				return nil
			}
			var err error
			if c.update {
				err = kv.Update(fn)
			} else {
				err = kv.View(fn)
			}
			if err != nil {
				t.Fatal(err)
			}
			if got[0] != old || after[0] != old {
				t.Fatalf("first run read %s by GetMany and %s by Get, want the snapshot %s", got[0], after[0], old)
			}
			if c.update {
				// The commit conflicts with the change, and the rerun
				// reads the new state.
				if runs != 2 || got[1] != cur {
					t.Fatalf("%d runs, reads %v, want 2 runs, the second reading %s", runs, got, cur)
				}
			} else if runs != 1 {
				t.Fatalf("view ran %d times", runs)
			}
		})
	}
}

// TestReadDirDamaged: ReadDir reads dentries and inodes in batches, yet on
// a damaged directory it fails with the error that reading entry by entry
// meets first, on both stores alike.
func TestReadDirDamaged(t *testing.T) {
	c := etcdtest.Start(t, 1, etcdtest.Options{NoFsync: true})
	ctx := context.Background()
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	// A damage changes the stored records of entries e00..e09.
	type damage struct {
		what  string // "dentry", "inode", "seq" or "garbage-dentry", "garbage-inode"
		entry int
	}
	for _, c2 := range []struct {
		name    string
		damages []damage
		want    string // in the error; %d stands for the inode number of damages[0]
		stale   bool
	}{
		{name: "no dentry", damages: []damage{{"dentry", 5}}, want: `("e05") has no dentry`},
		{name: "no inode", damages: []damage{{"inode", 3}}, want: "inode %d: ", stale: true},
		{name: "inode before dentry", damages: []damage{{"inode", 3}, {"dentry", 5}}, want: "inode %d: ", stale: true},
		{name: "dentry before inode", damages: []damage{{"inode", 5}, {"dentry", 3}}, want: `("e03") has no dentry`},
		{name: "wrong seq", damages: []damage{{"seq", 4}, {"inode", 6}}, want: `("e04") has no dentry`},
		{name: "garbage inode", damages: []damage{{"garbage-inode", 2}, {"dentry", 8}}, want: "inode %d: "},
		{name: "garbage dentry", damages: []damage{{"garbage-dentry", 2}, {"inode", 8}}, want: "dentry"},
		{name: "last entry", damages: []damage{{"inode", 9}}, want: "inode %d: ", stale: true},
	} {
		t.Run(c2.name, func(t *testing.T) {
			stores := map[string]kvStore{
				"etcd": openTestEtcdKV(t, c, "/damaged/"+strings.ReplaceAll(c2.name, " ", "-"), EtcdOptions{MaxTxnOps: 8}), // 2 batches
			}
			bkv, err := openBoltKV(t.TempDir()+"/meta.db", BoltOptions{NoSync: true})
			if err != nil {
				t.Fatal(err)
			}
			defer bkv.Close()
			stores["bolt"] = bkv
			errs := map[string]string{}
			for name, kv := range stores {
				e := newKVEngine(kv)
				if err := e.Init(ctx); err != nil {
					t.Fatal(err)
				}
				d, _, err := e.Create(ctx, RootIno, "d", CreateArgs{Type: TypeDirectory}, now)
				if err != nil {
					t.Fatal(err)
				}
				var inos []Ino
				for i := range 10 {
					n, _, err := e.Create(ctx, d.Ino, fmt.Sprintf("e%02d", i), CreateArgs{Type: TypeRegular}, now)
					if err != nil {
						t.Fatal(err)
					}
					inos = append(inos, n.Ino)
				}
				if err := kv.Update(func(tx kvTxn) error {
					for _, dm := range c2.damages {
						dk := dentryKey(d.Ino, fmt.Sprintf("e%02d", dm.entry))
						ik := inodeKey(inos[dm.entry])
						switch dm.what {
						case "dentry":
							tx.Delete(dk)
						case "inode":
							tx.Delete(ik)
						case "garbage-dentry":
							tx.Put(dk, []byte{0xff})
						case "garbage-inode":
							tx.Put(ik, []byte{0xff})
						case "seq":
							v, err := tx.Get(dk)
							if err != nil {
								return err
							}
							de, err := decodeDentry(v)
							if err != nil {
								return err
							}
							de.seq += 1000
							tx.Put(dk, de.encode())
						}
					}
					return nil
				}); err != nil {
					t.Fatal(err)
				}
				_, _, err = e.ReadDir(ctx, d.Ino, 0, 100)
				if err == nil {
					t.Fatalf("%s: readdir of a damaged directory succeeded", name)
				}
				want := c2.want
				if strings.Contains(want, "%d") {
					want = fmt.Sprintf(want, inos[c2.damages[0].entry])
				}
				if !strings.Contains(err.Error(), want) || errors.Is(err, ErrStale) != c2.stale {
					t.Fatalf("%s: readdir: %v, want an error with %q (stale %v)", name, err, want, c2.stale)
				}
				errs[name] = err.Error()
			}
			if errs["bolt"] != errs["etcd"] {
				t.Fatalf("errors differ: bolt %q, etcd %q", errs["bolt"], errs["etcd"])
			}
		})
	}
}
