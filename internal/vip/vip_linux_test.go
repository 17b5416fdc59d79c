package vip

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"

	"github.com/shoalfs/shoal/meta/etcdtest"
)

// testLease is the supervisors' lease in these tests: short, so that a
// failover takes seconds, but well above etcd's minimum (2s with the
// embedded server's default election timeout) and long enough that two
// busy cores renew it in time.
const testLease = 3 * time.Second

// rig is one test's world: the namespaces, one etcd, and a ledger of
// every address change.
type rig struct {
	t      *testing.T
	nw     *network
	etcd   *etcdtest.Cluster
	prefix string
	ledger *ledger
	cli    *clientv3.Client // the test's own client, for campaigns and checks
}

func newRig(t *testing.T) *rig { return newRigN(t, 1) }

// newRigN is a rig with an etcd cluster of members members.
func newRigN(t *testing.T, members int) *rig {
	nw := newNetwork(t)
	r := &rig{t: t, nw: nw, etcd: etcdtest.Start(t, members, etcdtest.Options{NoFsync: true}), prefix: "/viptest", ledger: newLedger(t)}
	r.cli = r.client(r.etcd.Endpoints...)
	return r
}

func (r *rig) client(endpoints ...string) *clientv3.Client {
	r.t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { cli.Close() })
	return cli
}

func (r *rig) clientAt(endpoint string) *clientv3.Client {
	if endpoint == "" {
		return r.client(r.etcd.Endpoints...)
	}
	return r.client(endpoint)
}

// supervisor is a Supervisor running in the test process for one host.
type supervisor struct {
	*Supervisor
	reg    *prometheus.Registry
	net    *ledgerNet
	cancel context.CancelFunc
	done   chan error
}

// start runs a supervisor for h, named node, reaching etcd at endpoint
// (all the members if ""). It is stopped when the test ends if the test
// did not stop it.
func (r *rig) start(h *host, node, endpoint string, onAdd func()) *supervisor {
	r.t.Helper()
	ln := &ledgerNet{Net: h.net, host: node, l: r.ledger, onAdd: onAdd}
	reg := prometheus.NewRegistry()
	s, err := New(Config{
		Client: r.clientAt(endpoint), Prefix: r.prefix, Node: node, Address: serviceAddr, Net: ln,
		Lease: testLease, AnnounceInterval: 300 * time.Millisecond,
		Logger:     slog.New(slog.NewTextHandler(tWriter{r.t}, &slog.HandlerOptions{Level: slog.LevelDebug})).With("host", node),
		Registerer: reg,
	})
	if err != nil {
		r.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	sv := &supervisor{Supervisor: s, reg: reg, net: ln, cancel: cancel, done: make(chan error, 1)}
	go func() { sv.done <- s.Run(ctx) }()
	r.t.Cleanup(func() { sv.stop(r.t) })
	return sv
}

// stop stops the supervisor and waits for Run to return; the second call
// does nothing.
func (sv *supervisor) stop(t *testing.T) {
	t.Helper()
	if sv.done == nil {
		return
	}
	sv.cancel()
	select {
	case err := <-sv.done:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("supervisor did not stop within 30s")
	}
	sv.done = nil
}

// metric returns the value of a supervisor's metric, with reason the
// label value of shoal_vip_releases_total ("" for the others).
func (sv *supervisor) metric(t *testing.T, name, reason string) float64 {
	t.Helper()
	mfs, err := sv.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			match := reason == ""
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "reason" && lp.GetValue() == reason {
					match = true
				}
			}
			if !match {
				continue
			}
			switch {
			case m.Gauge != nil:
				return m.GetGauge().GetValue()
			case m.Counter != nil:
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("no metric %s{reason=%q}", name, reason)
	return 0
}

// tWriter sends the supervisors' log lines to the test log.
type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// candidate is an MDS in the election, as the test plays it.
type candidate struct {
	el   *concurrency.Election
	sess *concurrency.Session
}

// campaign makes node a candidate, with the election value an MDS writes,
// and returns once node leads.
func (r *rig) campaign(node string) *candidate {
	r.t.Helper()
	c := <-r.campaignAsync(node)
	if c == nil {
		r.t.Fatalf("campaign %s failed", node)
	}
	return c
}

// campaignAsync makes node a candidate and delivers it once it leads (nil
// if the campaign failed, which the test log says).
func (r *rig) campaignAsync(node string) <-chan *candidate {
	r.t.Helper()
	sess, err := concurrency.NewSession(r.cli)
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { sess.Close() })
	// NewElection appends "/" itself.
	el := concurrency.NewElection(sess, strings.TrimSuffix(ElectionPrefix(r.prefix), "/"))
	val, err := json.Marshal(Leader{Node: node, Addr: "10.9.0.100:2049", Term: 1})
	if err != nil {
		r.t.Fatal(err)
	}
	ch := make(chan *candidate, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		if err := el.Campaign(ctx, string(val)); err != nil {
			r.t.Logf("campaign %s: %v", node, err)
			ch <- nil
			return
		}
		ch <- &candidate{el: el, sess: sess}
	}()
	return ch
}

func (c *candidate) resign(t *testing.T) {
	t.Helper()
	if err := c.el.Resign(context.Background()); err != nil {
		t.Fatalf("resign: %v", err)
	}
}

// claimLease returns the lease the claim key is held under, and its value.
func (r *rig) claimLease() (clientv3.LeaseID, string) {
	r.t.Helper()
	resp, err := r.cli.Get(context.Background(), ClaimKey(r.prefix, serviceAddr))
	if err != nil {
		r.t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		return 0, ""
	}
	return clientv3.LeaseID(resp.Kvs[0].Lease), string(resp.Kvs[0].Value)
}

// leaseAlive reports whether etcd still has the lease.
func (r *rig) leaseAlive(id clientv3.LeaseID) bool {
	r.t.Helper()
	alive, err := r.leaseAliveErr(id)
	if err != nil {
		r.t.Fatal(err)
	}
	return alive
}

func (r *rig) leaseAliveErr(id clientv3.LeaseID) (bool, error) {
	resp, err := r.cli.TimeToLive(context.Background(), id)
	if err != nil {
		return false, err
	}
	return resp.TTL >= 0, nil // -1: expired or revoked
}

// addWhileAlive returns an onAdd hook that notes, before each add, whether
// lease id is still alive in etcd (or could not be asked), and the flag it
// sets.
func (r *rig) addWhileAlive(id func() clientv3.LeaseID) (func(), *atomic.Bool) {
	var bad atomic.Bool
	return func() {
		if alive, err := r.leaseAliveErr(id()); alive || err != nil {
			r.t.Logf("add while lease %x alive=%v (err %v)", id(), alive, err)
			bad.Store(true)
		}
	}, &bad
}

// TestLeaderHolds: with A's MDS leading, A's supervisor claims the
// address, announces it to the client namespace, and B's never adds it.
func TestLeaderHolds(t *testing.T) {
	r := newRig(t)
	capture := newARPCapture(t, r.nw.c)
	a := r.start(r.nw.a, "A", r.etcd.Endpoints[0], nil)
	b := r.start(r.nw.b, "B", r.etcd.Endpoints[0], nil)
	r.campaign("A")
	await(t, "A holds the address", func() bool { return r.nw.a.holds(t) })
	capture.waitAnnouncement(t, serviceAddr.Addr(), r.nw.a.mac)

	if r.nw.b.holds(t) {
		t.Error("B holds the address too")
	}
	if id, owner := r.claimLease(); id == 0 || owner != "A" {
		t.Errorf("claim key: lease %x owner %q, want A's", id, owner)
	}
	for _, m := range []struct {
		sv           *supervisor
		name, reason string
		want         float64
	}{
		{a, "shoal_vip_holding", "", 1},
		{a, "shoal_vip_claims_total", "", 1},
		{b, "shoal_vip_holding", "", 0},
		{b, "shoal_vip_claims_total", "", 0},
	} {
		if got := m.sv.metric(t, m.name, m.reason); got != m.want {
			t.Errorf("%s of %s = %v, want %v", m.name, m.sv.cfg.Node, got, m.want)
		}
	}
	a.stop(t)
	if r.nw.a.holds(t) {
		t.Error("A still holds the address after its supervisor stopped")
	}
	if id, _ := r.claimLease(); id != 0 {
		t.Errorf("claim key still held under lease %x after A's supervisor stopped", id)
	}
}

// TestLeaderMoves: when A's MDS resigns and B's takes over, A drops the
// address before B adds it, and the client's neighbour cache follows to
// B's hardware address. When B resigns with nobody else campaigning, B
// drops it too.
func TestLeaderMoves(t *testing.T) {
	r := newRig(t)
	a := r.start(r.nw.a, "A", r.etcd.Endpoints[0], nil)
	b := r.start(r.nw.b, "B", r.etcd.Endpoints[0], nil)
	leaderA := r.campaign("A")
	await(t, "A holds the address", func() bool { return r.nw.a.holds(t) })
	r.nw.c.setNeighbour(t, serviceAddr.Addr(), r.nw.a.mac)

	next := r.campaignAsync("B")
	leaderA.resign(t)
	// Poll both hosts until B holds it. A is read before and after B, so
	// "held by both" means A held it over an interval in which B did.
	moved := false
	for range 3000 { // 30s at most
		a1, bHolds, a2 := r.nw.a.holds(t), r.nw.b.holds(t), r.nw.a.holds(t)
		if a1 && bHolds && a2 {
			t.Fatalf("A and B both hold the address; ledger: %v", r.ledger.log())
		}
		if bHolds && !a2 {
			moved = true
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !moved {
		t.Fatalf("the address did not move to B; ledger: %v", r.ledger.log())
	}
	leaderB := <-next
	if leaderB == nil {
		t.Fatal("B's campaign failed")
	}
	await(t, "the client caches B's hardware address for the service address", func() bool {
		return r.nw.c.neighbour(t, serviceAddr.Addr()).String() == r.nw.b.mac.String()
	})
	if got := a.metric(t, "shoal_vip_releases_total", reasonNotLeader); got != 1 {
		t.Errorf("A's releases{not_leader} = %v, want 1", got)
	}

	leaderB.resign(t)
	await(t, "B drops the address with no leader", func() bool { return !r.nw.b.holds(t) })
	await(t, "B deletes its claim", func() bool { id, _ := r.claimLease(); return id == 0 })
	if r.nw.a.holds(t) {
		t.Error("A holds the address with no leader")
	}
	if got := b.metric(t, "shoal_vip_holding", ""); got != 0 {
		t.Errorf("B's holding = %v after dropping", got)
	}
}

// TestPartition: A's supervisor loses etcd while A holds the address. It
// removes the address by its local deadline, while etcd still has its
// lease, and B, once its MDS leads, adds the address only after that
// lease has expired.
func TestPartition(t *testing.T) {
	r := newRig(t)
	link := newProxy(t, r.etcd.Endpoints[0])
	a := r.start(r.nw.a, "A", link.addr(), nil)
	leaderA := r.campaign("A")
	await(t, "A holds the address", func() bool { return r.nw.a.holds(t) })
	leaseA, _ := r.claimLease()
	if leaseA == 0 {
		t.Fatal("no claim key while A holds the address")
	}
	onAdd, bAddedWhileLeaseAlive := r.addWhileAlive(func() clientv3.LeaseID { return leaseA })
	r.start(r.nw.b, "B", r.etcd.Endpoints[0], onAdd)

	link.cut()
	await(t, "A drops the address", func() bool { return !r.nw.a.holds(t) })
	if !r.leaseAlive(leaseA) {
		t.Error("A dropped the address only after etcd expired its lease")
	}
	if got := a.metric(t, "shoal_vip_releases_total", reasonDeadline); got != 1 {
		t.Errorf("A's releases{deadline} = %v, want 1", got)
	}

	// A's MDS loses the election too (the test's session is not cut),
	// and B's wins it.
	next := r.campaignAsync("B")
	leaderA.resign(t)
	if <-next == nil {
		t.Fatal("B's campaign failed")
	}
	await(t, "B holds the address", func() bool { return r.nw.b.holds(t) })
	if bAddedWhileLeaseAlive.Load() {
		t.Error("B added the address while A's lease was alive")
	}
	if r.nw.a.holds(t) {
		t.Error("A holds the address again")
	}
}

// TestStaleAddress: a supervisor restarted after a crash finds the
// address on its interface and removes it before anything else, whether
// another host leads now or this one does (and the crashed run's claim
// must first expire).
func TestStaleAddress(t *testing.T) {
	t.Run("other host leads", func(t *testing.T) {
		r := newRig(t)
		r.start(r.nw.b, "B", r.etcd.Endpoints[0], nil)
		r.campaign("B")
		await(t, "B holds the address", func() bool { return r.nw.b.holds(t) })
		ip(t, "-n", r.nw.a.name, "addr", "add", serviceAddr.String(), "dev", "eth0")

		a := r.start(r.nw.a, "A", r.etcd.Endpoints[0], nil)
		await(t, "A removes the stale address", func() bool { return !r.nw.a.holds(t) })
		if got := a.metric(t, "shoal_vip_releases_total", reasonStale); got != 1 {
			t.Errorf("A's releases{stale} = %v, want 1", got)
		}
		if !r.nw.b.holds(t) {
			t.Error("B lost the address")
		}
	})
	t.Run("this host leads", func(t *testing.T) {
		r := newRig(t)
		// The crashed run's claim: the key under a lease nobody renews
		// any more, and the address on A's interface.
		grant, err := r.cli.Grant(context.Background(), int64(testLease/time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := r.cli.Put(context.Background(), ClaimKey(r.prefix, serviceAddr), "A", clientv3.WithLease(grant.ID)); err != nil {
			t.Fatal(err)
		}
		ip(t, "-n", r.nw.a.name, "addr", "add", serviceAddr.String(), "dev", "eth0")
		r.campaign("A")

		onAdd, addedWhileOldLeaseAlive := r.addWhileAlive(func() clientv3.LeaseID { return grant.ID })
		r.start(r.nw.a, "A", r.etcd.Endpoints[0], onAdd)
		await(t, "A holds the address under its own claim", func() bool {
			id, _ := r.claimLease()
			return id != 0 && id != grant.ID && r.nw.a.holds(t)
		})
		if ev := r.ledger.log(); len(ev) < 2 || ev[0] != "A del" || ev[1] != "A add" {
			t.Errorf("ledger %v, want the stale address removed before it is added", ev)
		}
		if addedWhileOldLeaseAlive.Load() {
			t.Error("A added the address while the crashed run's claim was alive")
		}
	})
}

// TestNetlink: the Net operations are idempotent, as the supervisor
// relies on, remove the address whatever its prefix length, and treat a
// missing interface as one without the address.
func TestNetlink(t *testing.T) {
	nw := newNetwork(t)
	h := nw.a
	other := netip.MustParsePrefix("10.9.0.100/32") // same IP, another mask
	for _, step := range []struct {
		name string
		do   func() error
		want bool // h carries the service address afterwards
	}{
		{"add", func() error { return h.net.AddAddr(serviceAddr) }, true},
		{"add again", func() error { return h.net.AddAddr(serviceAddr) }, true},
		{"delete", func() error { return h.net.DelAddr(serviceAddr) }, false},
		{"delete again", func() error { return h.net.DelAddr(serviceAddr) }, false},
		{"add with another mask", func() error { return h.net.AddAddr(other) }, true},
		{"delete with the configured mask", func() error { return h.net.DelAddr(serviceAddr) }, false},
	} {
		if err := step.do(); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		if got := h.holds(t); got != step.want {
			t.Fatalf("after %s: holds = %v, want %v", step.name, got, step.want)
		}
	}

	missing, err := NewNetlink(h.ns, "nosuch0")
	if err != nil {
		t.Fatal(err)
	}
	defer missing.Close()
	if has, err := missing.HasAddr(serviceAddr); has || err != nil {
		t.Errorf("HasAddr on a missing interface = %v, %v; want false, nil", has, err)
	}
	if err := missing.DelAddr(serviceAddr); err != nil {
		t.Errorf("DelAddr on a missing interface: %v", err)
	}
	if err := missing.AddAddr(serviceAddr); err == nil {
		t.Error("AddAddr on a missing interface succeeded")
	}
	if err := missing.Announce(serviceAddr.Addr()); err == nil {
		t.Error("Announce on a missing interface succeeded")
	}
}

// TestEtcdMemberLoss: with a three-member etcd, stopping the member that
// leads etcd does not cost A the address for good: its client moves to
// another member, and A holds the address at the end under a live claim,
// while B, which follows the same election, never adds it.
func TestEtcdMemberLoss(t *testing.T) {
	r := newRigN(t, 3)
	r.start(r.nw.a, "A", "", nil)
	b := r.start(r.nw.b, "B", "", nil)
	r.campaign("A")
	await(t, "A holds the address", func() bool { return r.nw.a.holds(t) })

	lead := r.etcd.Leader()
	if lead < 0 {
		t.Fatal("etcd has no leader")
	}
	r.etcd.Stop(lead)
	// The test's own client may have used the stopped member too; a
	// claim written under a lease etcd still has, with A's address on,
	// is the end state.
	await(t, "A holds the address under a live claim", func() bool {
		id, owner := r.claimLease()
		return owner == "A" && id != 0 && r.leaseAlive(id) && r.nw.a.holds(t)
	})
	if got := b.metric(t, "shoal_vip_claims_total", ""); got != 0 {
		t.Errorf("B claimed the address %v times", got)
	}
}

// TestUnreadableLeader: while the election's leader has a value that is
// not a Leader, nobody can tell whose MDS leads, and no supervisor adds the
// address; once that leader resigns, A's MDS leads and A adds it.
func TestUnreadableLeader(t *testing.T) {
	r := newRig(t)
	sess, err := concurrency.NewSession(r.cli)
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	odd := concurrency.NewElection(sess, strings.TrimSuffix(ElectionPrefix(r.prefix), "/"))
	if err := odd.Campaign(context.Background(), "A"); err != nil { // a bare name, not JSON
		t.Fatal(err)
	}
	oddKey := odd.Key()
	var addedUnderOdd atomic.Bool
	r.start(r.nw.a, "A", r.etcd.Endpoints[0], func() {
		resp, err := r.cli.Get(context.Background(), oddKey)
		if err != nil || resp.Count != 0 {
			t.Logf("A adds the address while the unreadable leader's key exists (err %v)", err)
			addedUnderOdd.Store(true)
		}
	})
	next := r.campaignAsync("A")
	await(t, "A's campaign waits behind the unreadable leader", func() bool {
		resp, err := r.cli.Get(context.Background(), ElectionPrefix(r.prefix), clientv3.WithPrefix(), clientv3.WithCountOnly())
		return err == nil && resp.Count == 2
	})
	if err := odd.Resign(context.Background()); err != nil {
		t.Fatal(err)
	}
	if <-next == nil {
		t.Fatal("A's campaign failed")
	}
	await(t, "A holds the address", func() bool { return r.nw.a.holds(t) })
	if addedUnderOdd.Load() {
		t.Error("A added the address while the leader's value was unreadable")
	}
}
