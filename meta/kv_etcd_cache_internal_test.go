package meta

import (
	"context"
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shoalfs/shoal/meta/etcdtest"
)

// TestEtcdCacheDoubt: a commit whose outcome is unknown (its reply lost,
// and etcd gone before resolve could tell whether it landed) could still
// land later, under what the cache holds; so from then on the engine must
// not answer from its cache (here it fails: etcd is down), although its
// lease proof still says it owns the prefix. With the doubt taken out of
// leaseHeld, the lookup is answered from memory and the test fails.
func TestEtcdCacheDoubt(t *testing.T) {
	c := etcdtest.Start(t, 1, etcdtest.Options{NoFsync: true})
	ctx := context.Background()
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	r, err := cli.Put(ctx, "/doubt/election/a", "x")
	if err != nil {
		t.Fatal(err)
	}
	kv, ck := openCountingEtcdKV(t, c, "/doubt", EtcdOptions{MaxRetries: 2, RequestTimeout: time.Second,
		Fence: &EtcdFence{Key: "/doubt/election/a", CreateRevision: r.Header.Revision, Valid: func() error { return nil }}})
	e := newKVEngine(kv)
	e.cache = newReadCache(kv.leaseHeld)
	if err := e.Init(ctx); err != nil {
		t.Fatal(err)
	}
	f, _, err := e.Create(ctx, RootIno, "f", CreateArgs{Type: TypeRegular}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	// g is what the cache must stop answering: the failed update below
	// does not touch it (f's own entries it drops anyway).
	if _, _, err := e.Create(ctx, RootIno, "g", CreateArgs{Type: TypeRegular}, time.Time{}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Lookup(ctx, RootIno, "g"); err != nil {
		t.Fatal(err)
	}
	if _, _, ok := e.cachedLookup(RootIno, "g"); !ok {
		t.Fatal("g is not in the cache")
	}
	// The next Txn is the SetAttr's commit (its read is a Get): etcd
	// goes away as it is sent.
	ck.beforeTxn = func(int64) { c.Stop(0) }
	if _, err := e.SetAttr(ctx, f.Ino, SetAttr{Mask: SetSize, Size: 1}, time.Time{}); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("setattr with etcd gone: %v, want ErrUnavailable", err)
	}
	if !kv.doubt.Load() {
		t.Fatal("a commit of unknown outcome left no doubt")
	}
	if nd, err := e.Lookup(ctx, RootIno, "g"); err == nil {
		t.Fatalf("lookup answered %+v with a commit in doubt and etcd down: from the cache", nd)
	}
}
