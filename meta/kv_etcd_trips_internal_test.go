package meta

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/shoalfs/shoal/meta/etcdtest"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/peer"
)

// peerLog records which member answered each KV request of a client.
type peerLog struct {
	mu        sync.Mutex
	peers     map[string]int // remote address -> requests
	futureRev int            // requests answered ErrFutureRev
}

func (l *peerLog) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	var p peer.Peer
	err := invoker(ctx, method, req, reply, cc, append(opts, grpc.Peer(&p))...)
	if method != "/etcdserverpb.KV/Range" && method != "/etcdserverpb.KV/Txn" {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if p.Addr != nil {
		l.peers[p.Addr.String()]++
	}
	if errors.Is(rpctypes.Error(err), rpctypes.ErrFutureRev) {
		l.futureRev++
	}
	return err
}

// take returns the counts since the last take and resets them.
func (l *peerLog) take() (map[string]int, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	p, f := l.peers, l.futureRev
	l.peers, l.futureRev = map[string]int{}, 0
	return p, f
}

// TestEtcdPinLeader: on a cluster of three members the engine sends its
// reads and commits to the leader only (so no read waits for a member
// that has not applied the engine's last commit), goes on through the
// others when the leader stops, and then sends everything to the new
// leader.
func TestEtcdPinLeader(t *testing.T) {
	c := etcdtest.Start(t, 3, etcdtest.Options{NoFsync: true})
	log := &peerLog{peers: map[string]int{}}
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(log.intercept)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	kv := openTestEtcdKV(t, c, "/pin", EtcdOptions{Client: cli})
	lead := waitLeader(t, c, -1)
	if ep := pinnedTo(kv); ep != c.Endpoints[lead] {
		t.Errorf("pinned to %q, want the leader m%d (%s)", ep, lead, c.Endpoints[lead])
	}

	id := 0
	work := func(n int) {
		t.Helper()
		for range n {
			if err := kv.Update(incr("count", id)); err != nil {
				t.Fatal(err)
			}
			id++
			if got, _ := readState(t, kv, "count"); got != id {
				t.Fatalf("count %d after %d increments", got, id)
			}
		}
	}
	log.take()
	work(30)
	peers, future := log.take()
	if len(peers) != 1 || peers[c.Endpoints[lead]] == 0 || future != 0 {
		t.Errorf("requests by member %v (%d answered ErrFutureRev); want all to the leader %s", peers, future, c.Endpoints[lead])
	}

	t.Logf("stopping the leader m%d", lead)
	c.Stop(lead)
	work(10) // through the others, while the members elect a new leader
	newLead := waitLeader(t, c, lead)
	// The engine finds the new leader in the background; requests meanwhile
	// go round robin.
	for i := 0; ; i++ {
		if pinnedTo(kv) == c.Endpoints[newLead] {
			break
		}
		if i == 200 {
			t.Fatalf("not pinned to the new leader m%d after 200 updates", newLead)
		}
		work(1)
		time.Sleep(10 * time.Millisecond)
	}
	log.take()
	work(30)
	peers, future = log.take()
	if len(peers) != 1 || peers[c.Endpoints[newLead]] == 0 || future != 0 {
		t.Errorf("after the election: requests by member %v (%d answered ErrFutureRev); want all to the new leader %s", peers, future, c.Endpoints[newLead])
	}
}

// pinnedTo returns the endpoint the engine's requests go to, "" if none.
func pinnedTo(kv *etcdKV) string {
	if kv.pinner == nil {
		return ""
	}
	if pin := kv.pinner.cur.Load(); pin != nil {
		return pin.endpoint
	}
	return ""
}

// waitLeader waits (bounded) until the running members agree on a leader
// other than not, and returns it.
func waitLeader(t *testing.T, c *etcdtest.Cluster, not int) int {
	t.Helper()
	for range 200 {
		if l := c.Leader(); l >= 0 && l != not {
			return l
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("members do not agree on a leader")
	return -1
}

// TestEtcdPinLostInFlight: requests in flight on the pinned connection
// when the engine drops the pin are retried through the other members,
// and their commits count exactly once.
func TestEtcdPinLostInFlight(t *testing.T) {
	c := etcdtest.Start(t, 3, etcdtest.Options{NoFsync: true})
	kv := openTestEtcdKV(t, c, "/pinlost", EtcdOptions{Endpoints: c.Endpoints})
	if pinnedTo(kv) == "" {
		t.Fatal("no pin")
	}
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- kv.Update(incr("count", i))
		}()
		if i%8 == 0 {
			if pin := kv.pinner.cur.Load(); pin != nil {
				kv.unpin(pin) // as when its connection fails
			}
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n, _ := readState(t, kv, "count"); n != 64 {
		t.Fatalf("count %d after 64 increments", n)
	}
}

// TestEtcdHints: a Lookup of a name the engine created or read costs one
// request (the entry and the inode it led to, together), a Remove one
// read and the commit; and a hint gone stale (another engine replaced
// the entry) costs a second read but never a wrong answer.
func TestEtcdHints(t *testing.T) {
	c := etcdtest.Start(t, 1, etcdtest.Options{NoFsync: true})
	ctx := context.Background()
	kv, ck := openCountingEtcdKV(t, c, "/hints", EtcdOptions{})
	e := newKVEngine(kv)
	if err := e.Init(ctx); err != nil {
		t.Fatal(err)
	}
	other := newKVEngine(openTestEtcdKV(t, c, "/hints", EtcdOptions{}))
	d, _, err := e.Create(ctx, RootIno, "d", CreateArgs{Type: TypeDirectory, Mode: 0o755}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	inos := map[string]Ino{}
	for i := range 4 {
		name := fmt.Sprint("f", i)
		n, _, err := e.Create(ctx, d.Ino, name, CreateArgs{Type: TypeRegular, Mode: 0o644}, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		inos[name] = n.Ino
	}
	requests := func() int64 { return ck.gets.Load() + ck.txns.Load() }

	for name, ino := range inos {
		r := requests()
		n, err := e.Lookup(ctx, d.Ino, name)
		if err != nil || n.Ino != ino {
			t.Fatalf("lookup %s: %+v %v, want inode %d", name, n, err, ino)
		}
		if got := requests() - r; got != 1 {
			t.Errorf("lookup %s after its create: %d requests, want 1", name, got)
		}
	}

	// Another engine replaces f0 by a new file: e's hint for f0 is stale.
	if _, _, err := other.Remove(ctx, d.Ino, "f0", time.Time{}); err != nil {
		t.Fatal(err)
	}
	f0, _, err := other.Create(ctx, d.Ino, "f0", CreateArgs{Type: TypeRegular, Mode: 0o600}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if f0.Ino == inos["f0"] {
		t.Fatal("the new f0 has the old one's inode")
	}
	r := requests()
	n, err := e.Lookup(ctx, d.Ino, "f0")
	if err != nil || n.Ino != f0.Ino || n.Attr.Mode != f0.Attr.Mode {
		t.Fatalf("lookup of the replaced f0: %+v %v, want %+v", n, err, f0)
	}
	if got := requests() - r; got != 2 {
		t.Errorf("lookup with a stale hint: %d requests, want 2", got)
	}
	r = requests()
	if n, err := e.Lookup(ctx, d.Ino, "f0"); err != nil || n.Ino != f0.Ino {
		t.Fatalf("lookup f0 again: %+v %v", n, err)
	}
	if got := requests() - r; got != 1 {
		t.Errorf("lookup once the hint is learnt again: %d requests, want 1", got)
	}

	// The first commit after another engine's reads the generation key
	// (TestEtcdReadRevisions); the next is the case to count.
	if _, _, err := e.Remove(ctx, d.Ino, "f1", time.Time{}); err != nil {
		t.Fatal(err)
	}
	r = requests()
	if _, _, err := e.Remove(ctx, d.Ino, "f2", time.Time{}); err != nil {
		t.Fatal(err)
	}
	if got := requests() - r; got != 2 {
		t.Errorf("remove: %d requests, want 2 (one read, the commit)", got)
	}
	for _, name := range []string{"f1", "f2"} {
		if _, err := e.Lookup(ctx, d.Ino, name); !errors.Is(err, ErrNotFound) {
			t.Fatalf("lookup of removed %s: %v", name, err)
		}
	}
}

// TestEtcdGroupFirstReads: a round of calls that each start with a
// Prefetch reads what they all prefetch in one request, and commits in
// another.
func TestEtcdGroupFirstReads(t *testing.T) {
	c := etcdtest.Start(t, 1, etcdtest.Options{NoFsync: true})
	kv, ck := openCountingEtcdKV(t, c, "/firstreads", EtcdOptions{})
	const calls = 40
	fns := make([]func(kvTxn) error, calls)
	for i := range fns {
		f := incr("count", i)
		fns[i] = func(tx kvTxn) error {
			if err := prefetch(tx, fmt.Appendf(nil, "done/%04d", i), []byte("count")); err != nil {
				return err
			}
			return f(tx)
		}
	}
	before := ck.gets.Load() + ck.txns.Load()
	for i, err := range runGrouped(t, kv, fns) {
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	requests := ck.gets.Load() + ck.txns.Load() - before
	if r := kv.rounds.Load(); r != 2 {
		t.Fatalf("%d rounds, want 2", r)
	}
	// The first call alone: the generation key, its prefetch, its
	// commit; then the other 39 together: one read, one commit.
	if requests != 5 {
		t.Errorf("%d requests for %d calls in 2 rounds, want 5", requests, calls)
	}
	if n, done := readState(t, kv, "count"); n != calls || len(done) != calls {
		t.Errorf("count %d, %d marked done; want %d", n, len(done), calls)
	}
}
