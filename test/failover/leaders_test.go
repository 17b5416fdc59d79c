package failover

import (
	"context"
	"fmt"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/shoalfs/shoal/client"
)

func dial(t testing.TB, addr string) *client.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, addr, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func create(ctx context.Context, c *client.Client, path, data string) error {
	f, err := c.Open(ctx, path, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write([]byte(data)); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// TestNeverTwoLeaders: a second and a third `shoal mds` started on the
// same etcd prefix while one leads stand by: they accept no connection,
// so they answer no NFS request and no data server; `shoal admin status`
// shows one leader and two standbys.
func TestNeverTwoLeaders(t *testing.T) {
	w := NewWorld(t, shoalBin)
	w.StartEtcd(3)
	first := w.AddMDS()
	leader := w.WaitLeader(nil, 30*time.Second)
	if leader != first {
		t.Fatalf("%s leads, want the first started", leader.Node)
	}
	w.WaitSecret(10 * time.Second)
	second, third := w.AddMDS(), w.AddMDS()
	// Both are up (their metrics answer) and stand by.
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, err := w.Status()
		if err == nil && st.HA != nil && len(st.HA.Nodes) == 3 {
			leaders := 0
			for _, n := range st.HA.Nodes {
				if n.Leader {
					leaders++
					if n.Node != first.Node {
						t.Fatalf("status names %s leader", n.Node)
					}
				}
			}
			if leaders != 1 {
				t.Fatalf("status lists %d leaders: %+v", leaders, st.HA.Nodes)
			}
			if len(st.HA.Etcd) != 3 {
				t.Fatalf("status lists %d etcd members, want 3", len(st.HA.Etcd))
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("status never listed 3 MDS nodes: %+v %v", st, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, m := range []*MDS{second, third} {
		if v, err := m.Metric("shoal_mds_leader"); err != nil || v != 0 {
			t.Fatalf("%s: shoal_mds_leader = %v, %v; want 0 (standing by)", m.Node, v, err)
		}
		if m.Listens() {
			t.Fatalf("standby %s accepts connections on %s", m.Node, m.Addr)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := client.Dial(ctx, m.Addr, client.Options{})
		cancel()
		if err == nil {
			t.Fatalf("a client session was opened at standby %s", m.Node)
		}
	}
	c := dial(t, first.Addr)
	if err := create(context.Background(), c, "/through-the-leader", "x"); err != nil {
		t.Fatal(err)
	}
}

// TestPausedLeaderChangesNothing: the leader is stopped (SIGSTOP) while a
// client creates files through it; a standby takes over after the
// leadership lease; the client goes on at the new leader. The stopped
// leader is then continued: it must change nothing. Every create it had
// acknowledged before the pause is there; the create that was in flight
// at the pause lands at most once (and only if it was committed before
// the pause); nothing the paused leader did after waking is in the
// namespace; and it counts the requests it refused and stops serving.
func TestPausedLeaderChangesNothing(t *testing.T) {
	w := NewWorld(t, shoalBin)
	w.StartEtcd(3)
	old := w.AddMDS()
	w.WaitLeader(nil, 30*time.Second)
	w.WaitSecret(10 * time.Second)
	w.AddMDS()

	ctx := context.Background()
	c := dial(t, w.MDSAddrs())
	if err := c.Mkdir(ctx, "/p", 0o755); err != nil {
		t.Fatal(err)
	}
	var (
		mu       sync.Mutex
		acked    []string
		inflight string
	)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 100000; i++ {
			select {
			case <-stop:
				return
			default:
			}
			name := fmt.Sprintf("/p/f%05d", i)
			mu.Lock()
			inflight = name
			mu.Unlock()
			cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
			err := create(cctx, c, name, name)
			cancel()
			mu.Lock()
			inflight = ""
			if err == nil {
				acked = append(acked, name)
			}
			mu.Unlock()
			if err != nil {
				return // the old leader refused or went away
			}
		}
	}()
	time.Sleep(500 * time.Millisecond)
	old.P.Signal(syscall.SIGSTOP)
	paused := time.Now()
	// No new create after the pause: the one in flight is the only one
	// that may still be acknowledged (by the new leader, to which the
	// client moves on, or never).
	close(stop)
	mu.Lock()
	ackedAtPause := len(acked)
	pending := inflight
	mu.Unlock()
	if ackedAtPause == 0 {
		t.Fatal("no create was acknowledged before the pause")
	}
	nl := w.WaitLeader(old, 30*time.Second)
	t.Logf("paused %s with %d creates acknowledged (%q in flight); %s leads %v later",
		old.Node, ackedAtPause, pending, nl.Node, time.Since(paused).Round(time.Millisecond))
	c2 := dial(t, nl.Addr)
	if err := create(ctx, c2, "/after-takeover", "new leader"); err != nil {
		t.Fatal(err)
	}

	// Wake the old leader: whatever it had in flight must be refused.
	old.P.Signal(syscall.SIGCONT)
	select {
	case <-done:
	case <-time.After(90 * time.Second):
		t.Fatal("the client's create at the resumed old leader did not end")
	}
	mu.Lock()
	ackedAll := append([]string(nil), acked...)
	mu.Unlock()
	if len(ackedAll) > ackedAtPause+1 {
		t.Fatalf("the old leader acknowledged %d creates after its pause", len(ackedAll)-ackedAtPause)
	}
	// It stops serving, and says why.
	deadline := time.Now().Add(30 * time.Second)
	for old.Listens() {
		if time.Now().After(deadline) {
			t.Fatal("the old leader still listens 30 s after waking")
		}
		time.Sleep(50 * time.Millisecond)
	}
	lost, _ := old.Metric(`shoal_mds_election_events_total{event="lost"}`)
	fenced, _ := old.Metric(`shoal_mds_election_events_total{event="fenced_txn"}`)
	t.Logf("old leader after waking: lost=%v fenced transactions=%v", lost, fenced)
	if lost < 1 {
		t.Fatalf("the old leader did not count its lost term (lost=%v)", lost)
	}

	ents, err := c2.ReadDir(ctx, "/p")
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, e := range ents {
		have["/p/"+e.Name] = true
	}
	for _, name := range ackedAll {
		if !have[name] {
			t.Errorf("acknowledged create %s is missing at the new leader", name)
		}
		delete(have, name)
	}
	for name := range have {
		if name != pending {
			t.Errorf("%s is at the new leader but was never acknowledged nor in flight at the pause", name)
		}
	}
	if _, err := c2.Stat(ctx, "/after-takeover"); err != nil {
		t.Fatal(err)
	}
}
