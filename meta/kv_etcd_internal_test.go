package meta

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

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
