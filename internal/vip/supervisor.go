package vip

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Defaults of Config.
const (
	DefaultLease            = 5 * time.Second
	DefaultAnnouncements    = 3
	DefaultAnnounceInterval = time.Second
)

// Config describes one host's supervisor.
type Config struct {
	// Client is the etcd client; the supervisor does not close it.
	Client *clientv3.Client
	// Prefix is the Shoal cluster's key prefix in etcd, as in --meta
	// etcd://.../PREFIX; a "/" is appended if missing (default "/shoal/").
	Prefix string
	// Node is this host's MDS node name, as it appears in the election
	// value.
	Node string
	// Address is the service address with its prefix length, as added to
	// the interface. Only IPv4 is supported: IPv6 would need unsolicited
	// neighbour advertisements instead of gratuitous ARP.
	Address netip.Prefix
	// Net is the interface the address lives on.
	Net Net
	// Lease is the TTL of the supervisor's etcd lease (default
	// DefaultLease, rounded up to whole seconds; etcd may raise it to its
	// minimum). It bounds how long a host that lost etcd can keep the
	// address, and so how long a failover waits for a partitioned holder.
	Lease time.Duration
	// Announcements gratuitous ARPs are sent AnnounceInterval apart after
	// the address is added (defaults DefaultAnnouncements and
	// DefaultAnnounceInterval). More than one, because Linux ignores an
	// update of a neighbour entry younger than its locktime (1s).
	Announcements    int
	AnnounceInterval time.Duration
	// Logger receives the events (default slog.Default()).
	Logger *slog.Logger
	// Registerer, if set, receives the Prometheus collectors.
	Registerer prometheus.Registerer
}

// ElectionPrefix is the etcd key prefix the MDSes campaign under, for the
// cluster prefix prefix.
func ElectionPrefix(prefix string) string { return normPrefix(prefix) + "election/" }

// ClaimKey is the etcd key whose holder may carry addr. It names the IP
// without the prefix length, so that two hosts configured with different
// masks for one address still exclude each other.
func ClaimKey(prefix string, addr netip.Prefix) string {
	return normPrefix(prefix) + "vip/" + addr.Addr().String()
}

func normPrefix(p string) string {
	if p == "" {
		p = "/shoal"
	}
	if !strings.HasSuffix(p, "/") {
		p += "/"
	}
	return p
}

// addrState is what the supervisor knows of the address on its interface.
type addrState int

const (
	addrUnknown addrState = iota // on start: maybe left by a crashed run
	addrAbsent
	addrPresent
)

// observed is the etcd state the watchers report, with the revisions
// they read at.
type observed struct {
	leaderRead bool   // the election has been read at least once
	leader     string // node name of the leader; "" for none or unreadable
	claimRev   int64  // revision of the last read of the claim key
	claimLease clientv3.LeaseID
	badLeader  string // the last unreadable election value logged, to log each once
}

// Supervisor holds the service address on this host exactly while this
// host's MDS leads, and never while another host may hold it. See the
// package documentation for the protocol.
type Supervisor struct {
	cfg      Config
	log      *slog.Logger
	m        *metrics
	election string
	claimKey string
	margin   time.Duration // drop the address this long before the local deadline
	retry    time.Duration // pause before repeating a failed step

	keeper *keeper
	wake   chan struct{} // cap 1: something changed, reconcile

	mu  sync.Mutex // guards obs
	obs observed

	// Owned by the Run goroutine.
	addr       addrState
	keyHeld    bool             // the claim key is ours, under keyLease
	keyLease   clientv3.LeaseID // the lease the claim key was written with
	keyRev     int64            // revision at which we last saw the key as ours
	arpLeft    int
	nextARP    time.Time
	retryAt    time.Time // zero: no retry pending
	waitingFor string    // owner we last logged waiting for, to log once
}

// New checks cfg and returns a supervisor; Run starts it.
func New(cfg Config) (*Supervisor, error) {
	if cfg.Client == nil || cfg.Net == nil {
		return nil, errors.New("vip: Config needs Client and Net")
	}
	if cfg.Node == "" {
		return nil, errors.New("vip: Config.Node is empty")
	}
	if !cfg.Address.IsValid() || !cfg.Address.Addr().Is4() {
		return nil, fmt.Errorf("vip: service address %v: want an IPv4 address with its prefix length, such as 10.9.0.100/24", cfg.Address)
	}
	if cfg.Lease == 0 {
		cfg.Lease = DefaultLease
	}
	if cfg.Lease < time.Second {
		return nil, fmt.Errorf("vip: lease %v is shorter than a second", cfg.Lease)
	}
	if r := cfg.Lease % time.Second; r != 0 { // etcd counts TTLs in seconds
		cfg.Lease += time.Second - r
	}
	if cfg.Announcements == 0 {
		cfg.Announcements = DefaultAnnouncements
	}
	if cfg.AnnounceInterval == 0 {
		cfg.AnnounceInterval = DefaultAnnounceInterval
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	cfg.Prefix = normPrefix(cfg.Prefix)
	s := &Supervisor{
		cfg:      cfg,
		log:      cfg.Logger.With("address", cfg.Address.String(), "node", cfg.Node),
		m:        newMetrics(cfg.Registerer, cfg.Address.String()),
		election: ElectionPrefix(cfg.Prefix),
		claimKey: ClaimKey(cfg.Prefix, cfg.Address),
		// A fifth of the TTL: with the renewal every third, two
		// renewals may fail before the address goes.
		margin: cfg.Lease / 5,
		retry:  min(max(cfg.Lease/10, 100*time.Millisecond), time.Second),
		wake:   make(chan struct{}, 1),
	}
	s.keeper = &keeper{
		cli: cfg.Client, ttl: cfg.Lease, every: cfg.Lease / 3, retry: s.retry,
		log: s.log, m: s.m, changed: s.poke,
	}
	return s, nil
}

func (s *Supervisor) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *Supervisor) observed() observed {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.obs
}

// Run supervises the address until ctx ends, then removes it, deletes the
// claim and revokes the lease. It returns nil after a clean stop, or the
// error that kept it from removing the address on the way out.
func (s *Supervisor) Run(ctx context.Context) error {
	s.log.Info("vip: supervisor started", "election", s.election, "claim", s.claimKey, "lease", s.cfg.Lease)
	var wg sync.WaitGroup
	wctx, stopWorkers := context.WithCancel(ctx)
	wg.Go(func() { s.keeper.run(wctx) })
	wg.Go(func() { follow(wctx, s.cfg.Client, s.log, s.election, true, s.cfg.Lease, s.readLeader) })
	wg.Go(func() { follow(wctx, s.cfg.Client, s.log, s.claimKey, false, s.cfg.Lease, s.readClaim) })

	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		s.reconcile(ctx)
		if ctx.Err() != nil {
			break
		}
		timer.Reset(s.nextWake())
		select {
		case <-ctx.Done():
		case <-s.wake:
		case <-timer.C:
		}
	}
	stopWorkers()
	wg.Wait()
	return s.shutdown(context.WithoutCancel(ctx))
}

func (s *Supervisor) readLeader(ctx context.Context) (int64, error) {
	l, ok, rev, err := readLeader(ctx, s.cfg.Client, s.election)
	if err != nil && !errors.Is(err, errBadLeader) {
		return 0, err
	}
	bad := ""
	if err != nil {
		bad = err.Error()
	}
	if !l.serving() {
		// Elected, not listening yet: nobody holds the address
		// until it is.
		l.Node = ""
	}
	s.mu.Lock()
	changed := !s.obs.leaderRead || s.obs.leader != l.Node
	newBad := bad != "" && bad != s.obs.badLeader
	s.obs.leaderRead = true
	s.obs.leader = l.Node
	s.obs.badLeader = bad
	s.mu.Unlock()
	if newBad {
		s.log.Warn("vip: cannot tell who leads; not claiming the address", "err", err)
	}
	switch {
	case !changed || bad != "": // an unreadable leader is logged above
	case ok:
		s.log.Info("vip: leader", "leader", l.Node, "leader_addr", l.Addr, "term", l.Term)
	default:
		s.log.Info("vip: no leader")
	}
	s.poke()
	return rev, nil
}

func (s *Supervisor) readClaim(ctx context.Context) (int64, error) {
	resp, err := s.cfg.Client.Get(ctx, s.claimKey)
	if err != nil {
		return 0, fmt.Errorf("read claim %s: %w", s.claimKey, err)
	}
	s.mu.Lock()
	s.obs.claimRev = resp.Header.Revision
	s.obs.claimLease = 0
	if len(resp.Kvs) > 0 {
		s.obs.claimLease = clientv3.LeaseID(resp.Kvs[0].Lease)
	}
	s.mu.Unlock()
	s.poke()
	return resp.Header.Revision, nil
}

// nextWake is how long Run may sleep before reconcile must run again
// without being poked: for a retry, the next announcement, or the local
// deadline of the address it holds.
func (s *Supervisor) nextWake() time.Duration {
	next := time.Now().Add(time.Minute)
	if !s.retryAt.IsZero() {
		next = minTime(next, s.retryAt)
	}
	if s.addr == addrPresent {
		if ls := s.keeper.get(); ls.id != 0 {
			next = minTime(next, ls.deadline.Add(-s.margin))
		}
		if s.arpLeft > 0 {
			next = minTime(next, s.nextARP)
		}
	}
	return max(time.Until(next), 0)
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// reconcile moves the host one step towards what it should hold, in the
// order that keeps the invariant: the address goes before the claim, and
// the claim comes before the address.
func (s *Supervisor) reconcile(ctx context.Context) {
	now := time.Now()
	if !s.retryAt.IsZero() && now.Before(s.retryAt) {
		// A step failed; reconcile may still drop the address, but
		// repeats nothing else before the pause is over.
		if s.addr == addrPresent {
			s.dropIfUnsafe(now)
		}
		return
	}
	s.retryAt = time.Time{}
	if s.addr == addrUnknown {
		s.removeStale()
		return
	}
	s.dropIfUnsafe(now)
	obs := s.observed()
	want := obs.leaderRead && obs.leader == s.cfg.Node
	if s.keyHeld && !want && s.addr == addrAbsent && ctx.Err() == nil {
		s.release(ctx)
		return
	}
	if want && s.addr == addrAbsent && ctx.Err() == nil {
		s.claim(ctx)
		return
	}
	if s.addr == addrPresent && s.arpLeft > 0 && !now.Before(s.nextARP) {
		s.announce()
	}
}

// failed schedules a retry of the step that failed.
func (s *Supervisor) failed() { s.retryAt = time.Now().Add(s.retry) }

// removeStale removes an address found on start: a previous run that
// crashed or was killed could not remove it, and this run holds no claim
// yet, so another host may hold the address now.
func (s *Supervisor) removeStale() {
	had, err := s.cfg.Net.HasAddr(s.cfg.Address)
	if err == nil && had {
		err = s.cfg.Net.DelAddr(s.cfg.Address)
	}
	if err != nil {
		s.log.Error("vip: cannot check for or remove a stale address; retrying", "err", err)
		s.failed()
		return
	}
	if had {
		s.m.releases.WithLabelValues(reasonStale).Inc()
		s.log.Warn("vip: address released", "reason", reasonStale)
	}
	s.addr = addrAbsent
	s.poke()
}

// keyStillOurs updates keyHeld from the lease and the claim watcher.
func (s *Supervisor) keyStillOurs(ls leaseState) bool {
	if !s.keyHeld {
		return false
	}
	if ls.id != s.keyLease {
		s.keyHeld = false // the key went with the lease it was written under
		return false
	}
	// The watcher's view counts only once it has read at or after the
	// revision at which the key was seen as ours; before that, its
	// "absent" may just be old.
	if obs := s.observed(); obs.claimRev >= s.keyRev && obs.claimLease != s.keyLease {
		s.keyHeld = false
		return false
	}
	return true
}

// dropIfUnsafe removes the address if this host should not carry it any
// more: it no longer leads, its lease is not known to be alive until the
// margin before the local deadline, or its claim is gone.
func (s *Supervisor) dropIfUnsafe(now time.Time) {
	if s.addr != addrPresent {
		return
	}
	obs := s.observed()
	ls := s.keeper.get()
	reason := ""
	switch {
	case !obs.leaderRead || obs.leader != s.cfg.Node:
		reason = reasonNotLeader
	case ls.id == 0 || ls.id != s.keyLease:
		reason = reasonLeaseLost
	case !now.Before(ls.deadline.Add(-s.margin)):
		reason = reasonDeadline
	case !s.keyStillOurs(ls):
		reason = reasonKeyLost
	default:
		return
	}
	s.drop(reason)
}

// drop removes the address. If that fails, the claim stays (so no other
// host can take the address) and the next reconcile tries again.
func (s *Supervisor) drop(reason string) {
	if err := s.cfg.Net.DelAddr(s.cfg.Address); err != nil {
		s.log.Error("vip: cannot remove the address; retrying", "reason", reason, "err", err)
		s.failed()
		return
	}
	s.addr = addrAbsent
	s.arpLeft = 0
	s.m.holding.Set(0)
	s.m.releases.WithLabelValues(reason).Inc()
	attrs := []any{"reason", reason}
	if reason == reasonDeadline {
		attrs = append(attrs, "lease_deadline", s.keeper.get().deadline.Format(time.RFC3339Nano))
	}
	s.log.Warn("vip: address released", attrs...)
	s.poke()
}

// requestCtx bounds an etcd request made on the way to holding the
// address: by the margin before the local deadline, so that a claim that
// hangs does not return after the lease may have expired.
func (s *Supervisor) requestCtx(ctx context.Context, ls leaseState) (context.Context, context.CancelFunc) {
	return context.WithDeadline(ctx, minTime(time.Now().Add(s.cfg.Lease/3), ls.deadline.Add(-s.margin)))
}

// claim takes the claim key under the supervisor's lease if nobody holds
// it, and then adds the address and schedules the announcements.
func (s *Supervisor) claim(ctx context.Context) {
	ls := s.keeper.get()
	if ls.id == 0 || !time.Now().Before(ls.deadline.Add(-s.margin)) {
		return // the keeper pokes when the lease is (re)newed
	}
	if !s.keyStillOurs(ls) {
		rctx, cancel := s.requestCtx(ctx, ls)
		resp, err := s.cfg.Client.Txn(rctx).
			If(clientv3.Compare(clientv3.CreateRevision(s.claimKey), "=", 0)).
			Then(clientv3.OpPut(s.claimKey, s.cfg.Node, clientv3.WithLease(ls.id))).
			Else(clientv3.OpGet(s.claimKey)).
			Commit()
		cancel()
		if err != nil {
			s.log.Warn("vip: claim", "key", s.claimKey, "err", err)
			s.failed()
			return
		}
		if !resp.Succeeded {
			kvs := resp.Responses[0].GetResponseRange().Kvs
			if len(kvs) == 0 || clientv3.LeaseID(kvs[0].Lease) != ls.id {
				owner := ""
				if len(kvs) > 0 {
					owner = string(kvs[0].Value)
				}
				if owner != s.waitingFor {
					s.log.Info("vip: waiting for the holder to release the address or its lease to expire", "holder", owner)
					s.waitingFor = owner
				}
				return // the claim watcher pokes when the key changes
			}
			// Ours already: written under this lease before an address
			// add failed or a deadline passed.
		}
		s.keyHeld, s.keyLease, s.keyRev = true, ls.id, resp.Header.Revision
		s.waitingFor = ""
	}
	// The Txn took time: check the deadline again, with the lease state
	// of now.
	if ls = s.keeper.get(); ls.id != s.keyLease || !time.Now().Before(ls.deadline.Add(-s.margin)) {
		return
	}
	if err := s.cfg.Net.AddAddr(s.cfg.Address); err != nil {
		// It may have been added: remove it before anything else.
		s.addr = addrUnknown
		s.log.Error("vip: cannot add the address; retrying", "err", err)
		s.failed()
		return
	}
	s.addr = addrPresent
	s.m.holding.Set(1)
	s.m.claims.Inc()
	s.arpLeft, s.nextARP = s.cfg.Announcements, time.Now()
	s.log.Info("vip: address claimed", "lease", int64(ls.id), "lease_deadline", ls.deadline.Format(time.RFC3339Nano))
	s.announce()
}

func (s *Supervisor) announce() {
	s.arpLeft--
	s.nextARP = time.Now().Add(s.cfg.AnnounceInterval)
	if err := s.cfg.Net.Announce(s.cfg.Address.Addr()); err != nil {
		s.log.Warn("vip: gratuitous ARP", "err", err)
		return
	}
	s.m.announces.Inc()
	s.log.Debug("vip: gratuitous ARP sent", "left", s.arpLeft)
}

// release deletes the claim key if it is still ours; the address is
// already gone.
func (s *Supervisor) release(ctx context.Context) {
	rctx, cancel := context.WithTimeout(ctx, s.cfg.Lease/3)
	_, err := s.cfg.Client.Txn(rctx).
		If(clientv3.Compare(clientv3.LeaseValue(s.claimKey), "=", s.keyLease)).
		Then(clientv3.OpDelete(s.claimKey)).
		Commit()
	cancel()
	if err != nil {
		// The key stays, and keeps other hosts out, until this
		// succeeds or the lease expires.
		s.log.Warn("vip: delete claim", "key", s.claimKey, "err", err)
		s.failed()
		return
	}
	s.keyHeld = false
	s.log.Info("vip: claim released")
}

// shutdown removes the address, then the claim and the lease.
func (s *Supervisor) shutdown(ctx context.Context) error {
	var err error
	if s.addr != addrAbsent {
		if err = s.cfg.Net.DelAddr(s.cfg.Address); err != nil {
			err = fmt.Errorf("vip: remove the address on shutdown: %w", err)
		} else if s.addr == addrPresent {
			s.m.holding.Set(0)
			s.m.releases.WithLabelValues(reasonShutdown).Inc()
			s.log.Warn("vip: address released", "reason", reasonShutdown)
		}
	}
	if err == nil {
		// Only once the address is gone: otherwise the lease must run
		// out (and this host's deadline pass) before another host may
		// claim.
		rctx, cancel := context.WithTimeout(ctx, s.cfg.Lease/3)
		s.keeper.revoke(rctx)
		cancel()
	}
	s.log.Info("vip: supervisor stopped")
	return err
}
