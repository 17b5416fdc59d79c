package leader_test

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shoalfs/shoal/internal/leader"
	"github.com/shoalfs/shoal/meta/etcdtest"
)

func client(t *testing.T, c *etcdtest.Cluster) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

type result struct {
	term *leader.Term
	err  error
}

func campaign(t *testing.T, cli *clientv3.Client, node string, standby chan<- uint64) <-chan result {
	t.Helper()
	ch := make(chan result, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	go func() {
		term, err := leader.Campaign(ctx, leader.Config{
			Client: cli, Prefix: "/ltest", Info: leader.Info{Node: node, Addr: node + ":2049"}, TTL: 2 * time.Second,
			OnStandby: func(place uint64) {
				if standby != nil {
					standby <- place
				}
			},
		})
		if term != nil {
			t.Cleanup(term.Close)
		}
		ch <- result{term, err}
	}()
	return ch
}

// TestElection: one leader at a time; a standby takes over at once when
// the leader resigns, and only after the lease when the leader just stops
// (as a killed process does); the terms only grow; a leader that stopped
// renewing knows it is no longer valid no later than etcd expires it.
func TestElection(t *testing.T) {
	c := etcdtest.Start(t, 1, etcdtest.Options{NoFsync: true})
	cliA, cliB, cliC := client(t, c), client(t, c), client(t, c)
	ctx := context.Background()

	a := <-campaign(t, cliA, "a", nil)
	if a.err != nil {
		t.Fatal(a.err)
	}
	if !a.term.Valid() {
		t.Fatal("a fresh leader is not valid")
	}
	standB := make(chan uint64, 1)
	bch := campaign(t, cliB, "b", standB)
	select {
	case <-standB:
	case r := <-bch:
		t.Fatalf("b won while a leads: %+v", r)
	case <-time.After(20 * time.Second):
		t.Fatal("b never stood by")
	}
	cands, err := leader.Candidates(ctx, cliA, "/ltest")
	if err != nil {
		t.Fatal(err)
	}
	if len(cands) != 2 || !cands[0].Leader || cands[0].Node != "a" || cands[1].Leader || cands[1].Node != "b" {
		t.Fatalf("candidates = %+v, want a leading, b standing by", cands)
	}

	// A planned hand-over: b leads at once.
	if err := a.term.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if a.term.Valid() {
		t.Fatal("a resigned leader is still valid")
	}
	var b result
	select {
	case b = <-bch:
	case <-time.After(10 * time.Second):
		t.Fatal("b did not take over within 10 s of a's resignation")
	}
	if b.err != nil {
		t.Fatal(b.err)
	}
	if b.term.Number() <= a.term.Number() {
		t.Fatalf("term went from %d to %d", a.term.Number(), b.term.Number())
	}
	cur, ok, err := leader.Current(ctx, cliC, "/ltest")
	if err != nil || !ok || cur.Node != "b" || cur.Term != b.term.Number() {
		t.Fatalf("current = %+v %v %v, want b in term %d", cur, ok, err, b.term.Number())
	}

	// b stops renewing without resigning, as a killed process would: c
	// leads only once b's lease expired, and by then b knows it is over.
	cch := campaign(t, cliC, "c", nil)
	b.term.Close()
	stopped := time.Now()
	r := <-cch
	if r.err != nil {
		t.Fatal(r.err)
	}
	if b.term.Valid() {
		t.Fatal("b is valid while c leads")
	}
	if waited := time.Since(stopped); waited < time.Second {
		t.Fatalf("c led %v after b stopped renewing, before b's 2 s lease can have expired", waited)
	}
	select {
	case <-b.term.Lost():
	default:
		t.Fatal("b's Lost is not closed")
	}
}

// TestLostWhenCutOff: a leader whose etcd becomes unreachable is invalid
// by its local deadline, without hearing from etcd.
func TestLostWhenCutOff(t *testing.T) {
	c := etcdtest.Start(t, 1, etcdtest.Options{NoFsync: true})
	cli := client(t, c)
	r := <-campaign(t, cli, "a", nil)
	if r.err != nil {
		t.Fatal(r.err)
	}
	c.Stop(0)
	select {
	case <-r.term.Lost():
	case <-time.After(15 * time.Second):
		t.Fatal("a leader cut off from etcd still believes it leads after 15 s (lease 2 s)")
	}
	if r.term.Valid() || r.term.Check() == nil {
		t.Fatal("Lost closed but the term is valid")
	}
	if time.Now().Before(r.term.Deadline()) {
		t.Fatal("lost before its deadline")
	}
}
