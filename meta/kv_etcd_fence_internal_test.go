package meta

import (
	"context"
	"errors"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shoalfs/shoal/meta/etcdtest"
)

// TestEtcdFence: a commit is conditional on the fence key keeping its
// create revision. Once the key is gone or recreated (the leader's term
// ended and another began), the fenced engine commits nothing more, even
// when its own snapshot is current, while an engine fenced on the new term
// commits; a conflict with the new leader is still told apart from the
// fence (a retried conflict, not ErrFenced).
func TestEtcdFence(t *testing.T) {
	c := etcdtest.Start(t, 1, etcdtest.Options{NoFsync: true})
	ctx := context.Background()
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	put := func(key string) int64 {
		t.Helper()
		r, err := cli.Put(ctx, key, "x")
		if err != nil {
			t.Fatal(err)
		}
		return r.Header.Revision
	}
	rev1 := put("/fence/election/a")
	var refused int
	old := openTestEtcdKV(t, c, "/fence", EtcdOptions{Fence: &EtcdFence{Key: "/fence/election/a", CreateRevision: rev1, OnFenced: func() { refused++ }}})
	write := func(s *etcdKV, k string) error {
		return s.Update(func(tx kvTxn) error { return tx.Put([]byte(k), []byte("v")) })
	}
	if err := write(old, "k1"); err != nil {
		t.Fatalf("commit under a standing fence: %v", err)
	}

	// The term ends: the key goes (lease expiry), a new one is created.
	if _, err := cli.Delete(ctx, "/fence/election/a"); err != nil {
		t.Fatal(err)
	}
	rev2 := put("/fence/election/b")
	if err := write(old, "k2"); !errors.Is(err, ErrFenced) {
		t.Fatalf("commit after the fence broke: %v, want ErrFenced", err)
	}
	// Even the same key recreated (same name, new create revision) does
	// not bring the old term back.
	put("/fence/election/a")
	if err := write(old, "k3"); !errors.Is(err, ErrFenced) {
		t.Fatalf("commit after the fence key was recreated: %v, want ErrFenced", err)
	}
	if refused != 2 {
		t.Fatalf("OnFenced called %d times, want 2", refused)
	}

	cur := openTestEtcdKV(t, c, "/fence", EtcdOptions{Fence: &EtcdFence{Key: "/fence/election/b", CreateRevision: rev2}})
	if err := write(cur, "k4"); err != nil {
		t.Fatalf("commit under the new term: %v", err)
	}
	if err := cur.View(func(tx kvTxn) error {
		for k, want := range map[string]bool{"k1": true, "k2": false, "k3": false, "k4": true} {
			v, err := tx.Get([]byte(k))
			if err != nil {
				return err
			}
			if (v != nil) != want {
				t.Errorf("%s present = %v, want %v", k, v != nil, want)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	// A leader whose lease is no longer valid locally does not even ask.
	invalid := openTestEtcdKV(t, c, "/fence", EtcdOptions{Fence: &EtcdFence{Key: "/fence/election/b", CreateRevision: rev2,
		Valid: func() error { return errors.New("lease ran out") }}})
	if err := write(invalid, "k5"); !errors.Is(err, ErrFenced) {
		t.Fatalf("commit with an invalid lease: %v, want ErrFenced", err)
	}
}
