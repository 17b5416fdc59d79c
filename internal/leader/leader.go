// Package leader elects the one active metadata server among several that
// share an etcd cluster, and tells the winner for how long it may still
// act as leader.
//
// # Election
//
// The election is etcd's own (go.etcd.io/etcd/client/v3/concurrency): each
// candidate puts a key under Prefix(p) ("<p>election/<lease>") bound to a
// lease of its own, and the candidate whose key has the lowest create
// revision leads. That create revision is the leader's term: it only grows,
// and no two leaders ever share one. A candidate's value is its Info
// (JSON), so observers (`shoal admin status`, the service-address
// supervisor, data servers) see who leads and where.
//
// # Why a local deadline as well
//
// etcd decides when a lease expires, but a leader that was paused (SIGSTOP,
// a long GC pause, a partition) learns that only when it talks to etcd
// again, and in between it could still answer clients from what it holds in
// memory. So the leader keeps its lease alive itself (KeepAliveOnce, every
// third of the TTL) and remembers when it sent the last keepalive that etcd
// answered, on a clock that neither steps nor stops in a suspend
// (leaseClock). etcd cannot expire the lease earlier than TTL after it
// received that keepalive, which is after it was sent; so until sent+TTL
// (less a margin for clock rate differences) no other candidate can have
// won, and after it the leader must not act. The etcd metadata engine
// also serves reads from its cache only while that holds (meta's "The
// read cache"). Term.Valid answers exactly that, and
// every metadata transaction is in addition conditional on the leader's key
// still having its create revision (Term.Fence), so a write that was
// already on its way when leadership ended cannot land.
package leader

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// DefaultTTL is the leadership lease: how long after a leader's last
// successful keepalive another candidate may take over.
const DefaultTTL = 3 * time.Second

// clockMargin is how much of the TTL the leader gives up to allow for its
// clock running slower than etcd's.
const clockMargin = 200 * time.Millisecond

// Info is what a candidate publishes as its election value.
type Info struct {
	// Node names the MDS (its host, by default): the service-address
	// supervisor on the same host matches it.
	Node string `json:"node"`
	// Addr is the address the MDS serves NFS and data servers on.
	Addr string `json:"addr"`
	// Serving says whether the leader listens already (Term.Proclaim):
	// the service-address supervisor moves the address only then.
	Serving bool `json:"serving"`
}

// Prefix is the election's key prefix under a Shoal etcd prefix (which
// ends in "/").
func Prefix(shoalPrefix string) string {
	if !strings.HasSuffix(shoalPrefix, "/") {
		shoalPrefix += "/"
	}
	return shoalPrefix + "election/"
}

// Candidate is one entry of the election: the leader or a standby.
type Candidate struct {
	Info
	// Term is the create revision of the candidate's key; the leader's is
	// the current term.
	Term uint64 `json:"term"`
	// Leader is true for the candidate that leads.
	Leader bool `json:"leader"`
	// TTL is the time left on the candidate's lease, as etcd sees it (the
	// "last seen" of a standby: it is renewed every third of the lease).
	TTL time.Duration `json:"ttl"`
	Key string        `json:"key"`
}

// Candidates lists the election's entries, the leader first.
func Candidates(ctx context.Context, cli *clientv3.Client, shoalPrefix string) ([]Candidate, error) {
	resp, err := cli.Get(ctx, Prefix(shoalPrefix), clientv3.WithPrefix(),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		return nil, fmt.Errorf("leader: list candidates: %w", err)
	}
	out := make([]Candidate, 0, len(resp.Kvs))
	for i, kv := range resp.Kvs {
		c := Candidate{Term: uint64(kv.CreateRevision), Leader: i == 0, Key: string(kv.Key)}
		if err := json.Unmarshal(kv.Value, &c.Info); err != nil {
			c.Node = "?" // not ours, or damaged: still listed
		}
		if kv.Lease != 0 {
			if ttl, err := cli.TimeToLive(ctx, clientv3.LeaseID(kv.Lease)); err == nil && ttl.TTL > 0 {
				c.TTL = time.Duration(ttl.TTL) * time.Second
			}
		}
		out = append(out, c)
	}
	return out, nil
}

// Current returns the leader, or ok false when there is none.
func Current(ctx context.Context, cli *clientv3.Client, shoalPrefix string) (c Candidate, ok bool, err error) {
	resp, err := cli.Get(ctx, Prefix(shoalPrefix), clientv3.WithFirstCreate()...)
	if err != nil {
		return Candidate{}, false, fmt.Errorf("leader: current: %w", err)
	}
	if len(resp.Kvs) == 0 {
		return Candidate{}, false, nil
	}
	kv := resp.Kvs[0]
	c = Candidate{Term: uint64(kv.CreateRevision), Leader: true, Key: string(kv.Key)}
	_ = json.Unmarshal(kv.Value, &c.Info)
	return c, true, nil
}

// Term is one leadership: from the won election until it is lost or
// resigned.
type Term struct {
	cli     *clientv3.Client
	session *concurrency.Session
	elec    *concurrency.Election
	lease   clientv3.LeaseID
	ttl     time.Duration
	log     *slog.Logger

	key string
	rev int64

	// deadline is the time on leaseClock until which the lease is known
	// to be alive (last acknowledged keepalive's send time + TTL - margin).
	deadline atomic.Int64
	lostOnce sync.Once
	lost     chan struct{}
	cause    atomic.Pointer[error]
	cancel   context.CancelFunc
	done     chan struct{}
}

// Config configures Campaign.
type Config struct {
	Client *clientv3.Client
	// Prefix is Shoal's etcd prefix (meta.EtcdOptions.Prefix).
	Prefix string
	Info   Info
	// TTL is the leadership lease (DefaultTTL if zero); etcd rounds it up
	// to whole seconds and to its own minimum.
	TTL    time.Duration
	Logger *slog.Logger
	// OnStandby, if set, is called once the candidate's key is in place
	// and it waits for the leaders before it to go.
	OnStandby func(term uint64)
	// OnLease, if set, is told the candidate's lease as soon as it is
	// granted, before the candidate's key exists: a caller that can later
	// prove this candidate dead (its process gone) may then end its term
	// at once with Revoke instead of waiting for the lease to run out.
	OnLease func(id int64)
}

// Revoke ends the lease of a candidate known to be dead (Config.OnLease),
// deleting its election key, so that a standby leads at once. Only for a
// candidate whose process is gone: a live one would go on believing it
// leads until its local deadline. A lease that no longer exists is not an
// error.
func Revoke(ctx context.Context, cli *clientv3.Client, id int64) error {
	if _, err := cli.Revoke(ctx, clientv3.LeaseID(id)); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return fmt.Errorf("leader: revoke lease %x: %w", id, err)
	}
	return nil
}

// Campaign stands as a candidate and returns when it leads, or when ctx
// ends. While it waits it is a standby: its key is listed by Candidates.
func Campaign(ctx context.Context, cfg Config) (*Term, error) {
	if cfg.TTL <= 0 {
		cfg.TTL = DefaultTTL
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	secs := int64((cfg.TTL + time.Second - 1) / time.Second)
	// etcd starts the lease after the request left: counted from here,
	// the deadline is never later than etcd's expiry.
	sent := leaseClock()
	grant, err := cfg.Client.Grant(ctx, secs)
	if err != nil {
		return nil, fmt.Errorf("leader: grant lease: %w", err)
	}
	ttl := time.Duration(grant.TTL) * time.Second
	if cfg.OnLease != nil {
		cfg.OnLease(int64(grant.ID))
	}
	t := &Term{cli: cfg.Client, lease: grant.ID, ttl: ttl, log: cfg.Logger, lost: make(chan struct{}), done: make(chan struct{})}
	t.deadline.Store(int64(sent + ttl - clockMargin))
	kctx, cancel := context.WithCancel(context.Background())
	t.cancel = cancel
	go t.keepAlive(kctx)
	// The session keeps the same lease alive too (it cannot be told not
	// to); Term's own keepalives are what Valid trusts.
	t.session, err = concurrency.NewSession(cfg.Client, concurrency.WithLease(grant.ID), concurrency.WithContext(kctx))
	if err != nil {
		t.stop()
		return nil, fmt.Errorf("leader: session: %w", err)
	}
	// NewElection adds the "/" that ends Prefix.
	t.elec = concurrency.NewElection(t.session, strings.TrimSuffix(Prefix(cfg.Prefix), "/"))
	val, _ := json.Marshal(cfg.Info)
	if cfg.OnStandby != nil {
		go t.announceStandby(ctx, cfg)
	}
	if err := t.elec.Campaign(ctx, string(val)); err != nil {
		t.stop()
		return nil, fmt.Errorf("leader: campaign: %w", err)
	}
	t.key, t.rev = t.elec.Key(), t.elec.Rev()
	// Campaign returns once every earlier key is gone, but not whether our
	// own still stands (our lease may have run out while we waited).
	resp, err := cfg.Client.Get(ctx, t.key)
	if err != nil || len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != t.rev {
		t.stop()
		if err == nil {
			err = errors.New("our candidate key expired while waiting")
		}
		return nil, fmt.Errorf("leader: campaign: %w", err)
	}
	if !t.Valid() {
		t.stop()
		return nil, errors.New("leader: campaign: the lease ran out while waiting")
	}
	cfg.Logger.Info("leader: elected", "term", t.rev, "node", cfg.Info.Node, "lease", ttl)
	return t, nil
}

// announceStandby tells cfg.OnStandby the candidate's key once it exists,
// unless the candidate leads at once.
func (t *Term) announceStandby(ctx context.Context, cfg Config) {
	for i := 0; i < 100 && ctx.Err() == nil; i++ {
		resp, err := cfg.Client.Get(ctx, fmt.Sprintf("%s%x", Prefix(cfg.Prefix), t.lease))
		if err == nil && len(resp.Kvs) > 0 {
			cur, ok, err := Current(ctx, cfg.Client, cfg.Prefix)
			if err == nil && ok && cur.Term != uint64(resp.Kvs[0].CreateRevision) {
				cfg.OnStandby(uint64(resp.Kvs[0].CreateRevision))
			}
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// keepAlive renews the lease every third of the TTL and moves the
// deadline; when the deadline passes without a renewal, the term is lost.
func (t *Term) keepAlive(ctx context.Context) {
	defer close(t.done)
	tick := time.NewTicker(t.ttl / 3)
	defer tick.Stop()
	for {
		sent := leaseClock()
		rctx, cancel := context.WithTimeout(ctx, t.ttl/3)
		_, err := t.cli.KeepAliveOnce(rctx, t.lease)
		cancel()
		switch {
		case err == nil:
			t.deadline.Store(int64(sent + t.ttl - clockMargin))
		case errors.Is(err, context.Canceled) && ctx.Err() != nil:
			return
		case errors.Is(err, rpctypes.ErrLeaseNotFound):
			t.lose(fmt.Errorf("leader: lease expired: %w", err))
			return
		default:
			t.log.Warn("leader: lease keepalive failed", "err", err, "left", t.left())
		}
		if !t.Valid() {
			t.lose(errors.New("leader: lease not renewed before its deadline"))
			return
		}
		wait := t.left()
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-time.After(max(wait, 0)):
			// The deadline comes before the next tick: check it then.
		}
	}
}

func (t *Term) lose(err error) {
	t.lostOnce.Do(func() {
		t.cause.Store(&err)
		close(t.lost)
	})
}

// Valid reports whether the leader may still act: its lease is known to
// be alive in etcd, so nobody else can have been elected.
func (t *Term) Valid() bool {
	select {
	case <-t.lost:
		return false
	default:
	}
	return t.left() > 0
}

// left is how long the lease is still known to be alive (negative once
// it is not).
func (t *Term) left() time.Duration {
	return time.Duration(t.deadline.Load()) - leaseClock()
}

// Check returns nil while Valid, else why not.
func (t *Term) Check() error {
	if t.Valid() {
		return nil
	}
	if e := t.cause.Load(); e != nil {
		return *e
	}
	return errors.New("leader: leadership lease expired")
}

// Proclaim replaces the leader's published Info (its election value)
// without another election; the term stays.
func (t *Term) Proclaim(ctx context.Context, info Info) error {
	val, err := json.Marshal(info)
	if err != nil {
		return err
	}
	if err := t.elec.Proclaim(ctx, string(val)); err != nil {
		return fmt.Errorf("leader: proclaim: %w", err)
	}
	return nil
}

// Lost is closed when the term ends: the lease was not renewed in time or
// etcd expired it. It is not closed by Resign.
func (t *Term) Lost() <-chan struct{} { return t.lost }

// Deadline is when the leadership ends unless renewed.
func (t *Term) Deadline() time.Time { return time.Now().Add(t.left()) }

// Number is the term: the create revision of the leader's key.
func (t *Term) Number() uint64 { return uint64(t.rev) }

// Key is the leader's election key; with Number it fences transactions:
// a transaction conditional on CreateRevision(Key) == Number commits only
// while this term lasts.
func (t *Term) Key() string { return t.key }

// Resign ends the term at once: the key is deleted and the lease revoked,
// so a standby takes over without waiting for the TTL. The caller must
// have stopped acting as leader before.
func (t *Term) Resign(ctx context.Context) error {
	t.lose(errors.New("leader: resigned"))
	var err error
	if t.elec != nil {
		err = t.elec.Resign(ctx)
	}
	if _, rerr := t.cli.Revoke(ctx, t.lease); rerr != nil && err == nil && !errors.Is(rerr, rpctypes.ErrLeaseNotFound) {
		err = rerr
	}
	t.stop()
	return err
}

// Close stops renewing the lease without revoking it (the key then expires
// after the TTL): what a crash would do, minus the crash.
func (t *Term) Close() {
	t.lose(errors.New("leader: closed"))
	t.stop()
}

func (t *Term) stop() {
	t.cancel()
	<-t.done
	if t.session != nil {
		t.session.Orphan()
	}
}
