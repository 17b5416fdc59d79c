package meta_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/shoalfs/shoal/internal/leader"
	"github.com/shoalfs/shoal/meta"
	"github.com/shoalfs/shoal/meta/etcdtest"
	"github.com/shoalfs/shoal/meta/metatest"
)

// countingClient dials c with a client that counts its KV requests (reads
// and commits) in n.
func countingClient(t *testing.T, c *etcdtest.Cluster, n *atomic.Int64) *clientv3.Client {
	t.Helper()
	count := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if strings.HasPrefix(method, "/etcdserverpb.KV/") {
			n.Add(1)
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(count)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// campaign wins an election of its own under prefix (a fresh one, so it
// leads at once) and returns the term, resigned when the test ends.
func campaign(t *testing.T, cli *clientv3.Client, prefix string) *leader.Term {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	term, err := leader.Campaign(ctx, leader.Config{Client: cli, Prefix: prefix, Info: leader.Info{Node: prefix}, TTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = term.Resign(ctx)
	})
	return term
}

// leaderFence is the fence `shoal mds` puts on its engine for term.
func leaderFence(term *leader.Term) *meta.EtcdFence {
	return &meta.EtcdFence{Key: term.Key(), CreateRevision: int64(term.Number()), Valid: term.Check}
}

// TestEtcdLeased runs the conformance suite on etcd as an elected metadata
// server opens it: fenced on a leadership term whose lease proof turns the
// read cache on (ReadCoherence is the case about the cache).
func TestEtcdLeased(t *testing.T) {
	c := etcdtest.Start(t, 1, etcdtest.Options{NoFsync: true})
	cli, err := meta.DialEtcd(context.Background(), meta.EtcdOptions{Endpoints: c.Endpoints})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	var n atomic.Int64
	metatest.Run(t, func(t *testing.T, dir string) meta.Engine {
		t.Helper()
		// Each open leads an election of its own: a reopen of the same
		// directory need not wait for the last one's term to end.
		term := campaign(t, cli, fmt.Sprintf("/leased-election-%d", n.Add(1)))
		e, err := meta.OpenEtcd(context.Background(), meta.EtcdOptions{Client: cli, Prefix: "/leased" + dir, MaxTxnOps: 32, Fence: leaderFence(term)})
		if err != nil {
			t.Fatal(err)
		}
		return e
	})
}

// TestEtcdCacheOwnership: the etcd engine serves GetAttr and Lookup from
// its cache only while it provably owns the prefix. Engine A leads and
// caches a file; then its ownership ends, another engine B changes the
// file, and A must not answer from its cache: it asks etcd (and so sees
// B's change). Two ways to end A's ownership:
//
//   - its term ends (the lease is no longer known alive: Term.Valid fails,
//     as for a leader paused past its lease), and B is elected once etcd
//     expired A's key;
//   - A's lease proof is broken (Valid always says yes, as a leader whose
//     clock lies would), B takes over by deleting A's key, and A's next
//     commit is refused by the fence: that refusal must drop the cache.
//
// With the cache on and the checks taken out, A answers the old file from
// memory in both cases (the test then fails); the request counts show
// that A's cached reads cost no request while it owned the prefix.
func TestEtcdCacheOwnership(t *testing.T) {
	c := etcdtest.Start(t, 1, etcdtest.Options{NoFsync: true})
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		// lying: A's fence says valid whatever its lease does.
		lying bool
	}{
		{"lease ends", false},
		{"fence refuses a commit", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var reqA atomic.Int64
			cliA := countingClient(t, c, &reqA)
			cliB := countingClient(t, c, new(atomic.Int64))
			prefix := "/own-" + strings.ReplaceAll(tc.name, " ", "-")
			termA := campaign(t, cliA, prefix)
			fence := leaderFence(termA)
			if tc.lying {
				fence.Valid = func() error { return nil }
			}
			a, err := meta.OpenEtcd(ctx, meta.EtcdOptions{Client: cliA, Prefix: prefix, Fence: fence})
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			old, _, err := a.Create(ctx, meta.RootIno, "f", meta.CreateArgs{Type: meta.TypeRegular, Mode: 0o644}, time.Time{})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := a.Lookup(ctx, meta.RootIno, "f"); err != nil {
				t.Fatal(err)
			}
			before := reqA.Load()
			for range 10 {
				nd, err := a.Lookup(ctx, meta.RootIno, "f")
				if err != nil || nd.Ino != old.Ino {
					t.Fatalf("lookup while leading: %+v, %v", nd, err)
				}
				if _, err := a.GetAttr(ctx, old.Ino); err != nil {
					t.Fatal(err)
				}
			}
			if n := reqA.Load() - before; n != 0 {
				t.Fatalf("10 lookups and getattrs of a cached file while leading cost %d etcd requests, want 0", n)
			}

			// A's term ends.
			if tc.lying {
				// B deposes A as an operator would remove a leader's key.
				if _, err := cliB.Delete(ctx, termA.Key()); err != nil {
					t.Fatal(err)
				}
			} else {
				// As a crash (or a pause past the lease) would: no more
				// keepalives, and A knows its lease is no longer proven.
				termA.Close()
			}
			termB := campaign(t, cliB, prefix) // waits for A's key to go
			b, err := meta.OpenEtcd(ctx, meta.EtcdOptions{Client: cliB, Prefix: prefix, Fence: leaderFence(termB)})
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			if _, _, err := b.Remove(ctx, meta.RootIno, "f", time.Time{}); err != nil {
				t.Fatal(err)
			}
			nw, _, err := b.Create(ctx, meta.RootIno, "f", meta.CreateArgs{Type: meta.TypeRegular, Mode: 0o600}, time.Time{})
			if err != nil {
				t.Fatal(err)
			}

			if tc.lying {
				// A still believes it leads; its next commit meets the
				// fence.
				_, _, err := a.Create(ctx, meta.RootIno, "g", meta.CreateArgs{Type: meta.TypeRegular}, time.Time{})
				if !errors.Is(err, meta.ErrFenced) {
					t.Fatalf("a deposed leader's create: %v, want ErrFenced", err)
				}
			}
			// A may fail (it knows it no longer leads) or ask etcd; it
			// must not answer from memory.
			before = reqA.Load()
			nd, err := a.Lookup(ctx, meta.RootIno, "f")
			switch {
			case err == nil && nd.Ino == old.Ino:
				t.Fatalf("the deposed engine answered the old file %d from its cache; the new leader replaced it with %d", old.Ino, nw.Ino)
			case err == nil && nd.Ino != nw.Ino:
				t.Fatalf("lookup after takeover: %+v, want inode %d", nd, nw.Ino)
			case err == nil && reqA.Load() == before:
				t.Fatal("the deposed engine answered a lookup without asking etcd")
			}
			t.Logf("lookup of the replaced name: %v (inode %d, %d requests)", err, nd.Ino, reqA.Load()-before)
			want, err := b.GetAttr(ctx, old.Ino)
			if err != nil {
				t.Fatal(err)
			}
			got, err := a.GetAttr(ctx, old.Ino)
			if err == nil && (got.Nlink != want.Nlink || got.Change != want.Change) {
				t.Fatalf("the deposed engine's getattr of the removed inode: nlink %d change %d, etcd has nlink %d change %d",
					got.Nlink, got.Change, want.Nlink, want.Change)
			}
		})
	}
}

// TestEtcdCacheOff: without a lease proof (no fence, or a fence without
// Valid) or with NoReadCache, every Lookup asks etcd, so that an engine
// another metadata server may write behind never answers from memory.
func TestEtcdCacheOff(t *testing.T) {
	c := etcdtest.Start(t, 1, etcdtest.Options{NoFsync: true})
	ctx := context.Background()
	for i, tc := range []struct {
		name  string
		fence func(*leader.Term) *meta.EtcdFence
		off   bool
	}{
		{"no fence", func(*leader.Term) *meta.EtcdFence { return nil }, false},
		{"fence without Valid", func(term *leader.Term) *meta.EtcdFence {
			return &meta.EtcdFence{Key: term.Key(), CreateRevision: int64(term.Number())}
		}, false},
		{"NoReadCache", leaderFence, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var n atomic.Int64
			cli := countingClient(t, c, &n)
			prefix := fmt.Sprintf("/off-%d", i)
			e, err := meta.OpenEtcd(ctx, meta.EtcdOptions{Client: cli, Prefix: prefix, Fence: tc.fence(campaign(t, cli, prefix)), NoReadCache: tc.off})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			if _, _, err := e.Create(ctx, meta.RootIno, "f", meta.CreateArgs{Type: meta.TypeRegular}, time.Time{}); err != nil {
				t.Fatal(err)
			}
			for range 3 {
				before := n.Load()
				if _, err := e.Lookup(ctx, meta.RootIno, "f"); err != nil {
					t.Fatal(err)
				}
				if n.Load() == before {
					t.Fatal("a lookup was answered without asking etcd")
				}
			}
		})
	}
}

// TestEtcdKnownState: after its own commit, the engine starts the next
// update from what it read and wrote (kv_etcd_known.go), so a remove of
// a file it created reads nothing, and a create next to one it created
// reads nothing either (the new name is assumed absent and checked by
// the commit): the commit is their one request. When
// another engine changed the entry meanwhile (here without a fence: two
// engines on one prefix, the second opened after the first's create, and
// the commit condition alone keeps them serialisable), the stale knowledge costs a conflict and a fresh read,
// never a wrong result: A's remove takes away B's file, not the one A
// knew. Wrong assumptions of absence cost a second run, never a wrong
// answer: a create of a name that exists says so, and a remove of a name
// the engine has not seen removes it.
func TestEtcdKnownState(t *testing.T) {
	c := etcdtest.Start(t, 1, etcdtest.Options{NoFsync: true})
	ctx := context.Background()
	var n atomic.Int64
	a, err := meta.OpenEtcd(ctx, meta.EtcdOptions{Client: countingClient(t, c, &n), Prefix: "/known"})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	create := func(e meta.Engine, name string) meta.Node {
		t.Helper()
		nd, _, err := e.Create(ctx, meta.RootIno, name, meta.CreateArgs{Type: meta.TypeRegular, Mode: 0o644}, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		return nd
	}
	create(a, "f")
	before := n.Load()
	create(a, "f2")
	if got := n.Load() - before; got != 1 {
		t.Errorf("a create after a create in the same directory took %d requests, want 1 (the commit)", got)
	}
	before = n.Load()
	if _, _, err := a.Remove(ctx, meta.RootIno, "f", time.Time{}); err != nil {
		t.Fatal(err)
	}
	if got := n.Load() - before; got != 1 {
		t.Errorf("a remove right after the create took %d requests, want 1 (the commit)", got)
	}

	old := create(a, "g")
	// B opens after A's create, as a successor would (its open reads
	// linearisably; an engine's updates start from its own last
	// revision, so one opened before would not see A's file).
	b, err := meta.OpenEtcd(ctx, meta.EtcdOptions{Endpoints: c.Endpoints, Prefix: "/known"})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, _, err := b.Remove(ctx, meta.RootIno, "g", time.Time{}); err != nil {
		t.Fatal(err)
	}
	nw := create(b, "g")
	before = n.Load()
	if _, _, err := a.Remove(ctx, meta.RootIno, "g", time.Time{}); err != nil {
		t.Fatal(err)
	}
	t.Logf("remove of an entry another engine replaced: %d requests", n.Load()-before)
	if _, err := b.Lookup(ctx, meta.RootIno, "g"); !errors.Is(err, meta.ErrNotFound) {
		t.Fatalf("g after A removed it: %v, want ErrNotFound", err)
	}
	for _, ino := range []meta.Ino{old.Ino, nw.Ino} {
		if at, err := b.GetAttr(ctx, ino); err == nil && at.Nlink != 0 {
			t.Errorf("inode %d still has %d links", ino, at.Nlink)
		}
	}
	// B knows nothing of f2: its create assumes the name absent, the
	// commit finds it present, and the create runs again reading it.
	if _, _, err := b.Create(ctx, meta.RootIno, "f2", meta.CreateArgs{Type: meta.TypeRegular}, time.Time{}); !errors.Is(err, meta.ErrExist) {
		t.Fatalf("B's create of A's f2: %v, want ErrExist", err)
	}
	// Nor does a fresh engine: its remove reads the name as absent at
	// first, which no commit would check, and so runs again reading.
	c2, err := meta.OpenEtcd(ctx, meta.EtcdOptions{Endpoints: c.Endpoints, Prefix: "/known"})
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if _, _, err := c2.Remove(ctx, meta.RootIno, "f2", time.Time{}); err != nil {
		t.Fatalf("a fresh engine's remove of f2: %v", err)
	}
	if _, _, err := c2.Remove(ctx, meta.RootIno, "f2", time.Time{}); !errors.Is(err, meta.ErrNotFound) {
		t.Fatalf("the second remove of f2: %v, want ErrNotFound", err)
	}
	if ents, _, err := b.ReadDir(ctx, meta.RootIno, 0, 10); err != nil || len(ents) != 0 {
		t.Fatalf("the root after all removes: %+v, %v; want it empty", ents, err)
	}
}
