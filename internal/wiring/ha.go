package wiring

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shoalfs/shoal/internal/cluster"
	"github.com/shoalfs/shoal/internal/leader"
	"github.com/shoalfs/shoal/internal/statuspage"
	"github.com/shoalfs/shoal/meta"
)

// Metadata servers on etcd elect one leader (internal/leader); only the
// leader listens, the others stand by in the election. The leader's
// metadata engine is fenced on its term (meta.EtcdOptions.Fence), its
// COMPOUNDs are refused once it cannot vouch for its lease
// (server.Config.Leading), and it serves data servers only while it leads
// (cluster.RegistryConfig.Leader). When the term ends (lease lost, or a
// planned step-down) the MDS stops serving and RunMDS stands it as a
// candidate again.

// UnsafeNoFencingEnv names the environment variable that, set to 1, turns
// the MDS's fencing off: no etcd compare on its transactions, no refusal
// of COMPOUNDs once its lease is gone, data servers served whatever the
// term, and no stepping down when the term is lost, so a paused leader
// that wakes up goes on serving beside the new one. It exists only so
// that test/failover can show its linearizability checker catching what
// fencing prevents; never set it anywhere else.
const UnsafeNoFencingEnv = "SHOAL_UNSAFE_NO_FENCING"

func unsafeNoFencing() bool { return os.Getenv(UnsafeNoFencingEnv) == "1" }

// leaseFileName records, in the MDS's directory, the election lease of the
// process that runs there.
const leaseFileName = "election-lease"

// joinSecretKey keeps the cluster's join secret in the metadata, so that
// every MDS that shares the metadata accepts the same data servers.
const joinSecretKey = "cluster/join-secret"

// haCounters are the process's election events, for its metrics (one MDS
// per process in production; tests read their MDS's own fields).
var haCounters struct {
	elections, stepDowns, lost, fenced atomic.Uint64
	leading                            atomic.Bool
	term                               atomic.Uint64
}

// haCollector exports haCounters.
type haCollector struct{ events, leading, term *prometheus.Desc }

func newHACollector() *haCollector {
	return &haCollector{
		events:  prometheus.NewDesc("shoal_mds_election_events_total", "MDS election events of this process: elected, stepped_down (planned), lost (lease ran out), fenced_txn (metadata transactions refused because this MDS no longer led).", []string{"event"}, nil),
		leading: prometheus.NewDesc("shoal_mds_leader", "1 while this MDS leads, 0 while it stands by.", nil, nil),
		term:    prometheus.NewDesc("shoal_mds_term", "The term this MDS last led in (its election key's create revision).", nil, nil),
	}
}

func (c *haCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.events
	ch <- c.leading
	ch <- c.term
}
func (c *haCollector) Collect(ch chan<- prometheus.Metric) {
	for _, e := range []struct {
		name string
		n    *atomic.Uint64
	}{{"elected", &haCounters.elections}, {"stepped_down", &haCounters.stepDowns}, {"lost", &haCounters.lost}, {"fenced_txn", &haCounters.fenced}} {
		ch <- prometheus.MustNewConstMetric(c.events, prometheus.CounterValue, float64(e.n.Load()), e.name)
	}
	l := 0.0
	if haCounters.leading.Load() {
		l = 1
	}
	ch <- prometheus.MustNewConstMetric(c.leading, prometheus.GaugeValue, l)
	ch <- prometheus.MustNewConstMetric(c.term, prometheus.GaugeValue, float64(haCounters.term.Load()))
}

// election is an elected MDS's term and what it needs to show and end it.
type election struct {
	cli    *clientv3.Client
	prefix string
	term   *leader.Term
	log    *slog.Logger
	// info is what the MDS publishes in the election.
	info leader.Info
	// fenced counts this MDS's metadata transactions refused by the fence.
	fenced   atomic.Uint64
	stepDown func()
}

var _ cluster.HA = (*election)(nil)

// campaign stands the MDS as a candidate and returns once it leads, with
// the fenced metadata engine of its term.
func campaign(ctx context.Context, cfg *MDSConfig, events *statuspage.EventLog) (*election, meta.Engine, error) {
	opts, err := meta.ParseEtcdURL(cfg.MetaURL)
	if err != nil {
		return nil, nil, err
	}
	cli, err := meta.DialEtcd(ctx, opts)
	if err != nil {
		return nil, nil, err
	}
	e := &election{cli: cli, prefix: opts.NormalizedPrefix(), log: cfg.Logger.With("role", "election")}
	node := cfg.Node
	if node == "" {
		node, _ = os.Hostname()
	}
	// The lease of this directory's previous MDS process: that process is
	// gone (`shoal mds` holds a lock on its directory while it runs, so a
	// stopped one would still hold it and this one would not have
	// started), so its term, if it led, ends now rather than when its
	// lease runs out: a crash that systemd restarts costs a restart, not
	// a lease.
	leaseFile := filepath.Join(cfg.Dir, leaseFileName)
	if b, err := os.ReadFile(leaseFile); err == nil {
		if id, err := strconv.ParseInt(strings.TrimSpace(string(b)), 16, 64); err == nil {
			if err := leader.Revoke(ctx, cli, id); err != nil {
				e.log.Warn("ending the previous process's term", "err", err)
			} else {
				e.log.Info("ended the term of this directory's previous MDS process", "lease", fmt.Sprintf("%x", id))
			}
		}
	}
	addr := cfg.Advertise
	if addr == "" {
		addr = cfg.Listen
	}
	e.info = leader.Info{Node: node, Addr: addr}
	e.log.Info("standing for election", "node", node, "addr", addr, "lease", cfg.LeaderLease)
	e.term, err = leader.Campaign(ctx, leader.Config{
		OnLease: func(id int64) {
			if err := os.WriteFile(leaseFile, []byte(fmt.Sprintf("%x\n", id)), 0o600); err != nil {
				e.log.Warn("recording the election lease", "err", err)
			}
		},
		Client: cli, Prefix: e.prefix, Info: e.info, TTL: cfg.LeaderLease,
		Logger: e.log,
		OnStandby: func(place uint64) {
			e.log.Info("standing by: another MDS leads", "candidate", place)
			events.Add(statuspage.Event{Kind: "mds standby", Subject: node, Detail: fmt.Sprintf("waiting in line (candidate %d)", place)})
		},
	})
	if err != nil {
		cli.Close()
		return nil, nil, err
	}
	opts.Client = cli
	if unsafeNoFencing() {
		e.log.Error("FENCING IS OFF (" + UnsafeNoFencingEnv + "=1): this MDS will go on serving after it loses its term; for tests only")
		eng, err := meta.OpenEtcd(ctx, opts)
		if err != nil {
			e.end(false)
			return nil, nil, err
		}
		haCounters.leading.Store(true)
		haCounters.term.Store(e.term.Number())
		return e, eng, nil
	}
	opts.Fence = &meta.EtcdFence{
		Key: e.term.Key(), CreateRevision: int64(e.term.Number()), Valid: e.term.Check,
		OnFenced: func() {
			e.fenced.Add(1)
			haCounters.fenced.Add(1)
			e.log.Warn("metadata transaction refused: this MDS no longer leads", "term", e.term.Number())
			events.Add(statuspage.Event{Kind: "mds fenced", Subject: node, Detail: fmt.Sprintf("a metadata transaction of term %d was refused", e.term.Number())})
		},
	}
	eng, err := meta.OpenEtcd(ctx, opts)
	if err != nil {
		e.end(false)
		return nil, nil, err
	}
	haCounters.elections.Add(1)
	haCounters.leading.Store(true)
	haCounters.term.Store(e.term.Number())
	events.Add(statuspage.Event{Kind: "mds elected", Subject: node, Detail: fmt.Sprintf("term %d", e.term.Number())})
	return e, eng, nil
}

// leaderOf is the registry's view of the election (RegistryConfig.Leader):
// nil (always leading, term 0) for an MDS that is not elected.
func leaderOf(e *election) func() (uint64, bool) {
	if e == nil || unsafeNoFencing() {
		return nil
	}
	return func() (uint64, bool) { return e.term.Number(), e.term.Valid() }
}

// end gives the term up: resigned at once when the MDS stopped cleanly (a
// standby need not wait for the lease), else left to expire.
func (e *election) end(resign bool) {
	haCounters.leading.Store(false)
	if resign {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		if err := e.term.Resign(ctx); err != nil {
			e.log.Warn("resigning the election", "err", err)
		}
		cancel()
	} else {
		e.term.Close()
	}
	e.cli.Close()
}

// serving tells the election (and so `shoal vip`) that the leader listens
// now, so that the service address moves to it.
func (e *election) serving(ctx context.Context) error {
	info := e.info
	info.Serving = true
	return e.term.Proclaim(ctx, info)
}

func (e *election) StepDown() error {
	if e.stepDown == nil {
		return errors.New("not serving yet")
	}
	go e.stepDown()
	return nil
}

func (e *election) HAStatus(ctx context.Context) (*cluster.HAStatus, error) {
	cands, err := leader.Candidates(ctx, e.cli, e.prefix)
	if err != nil {
		return nil, err
	}
	st := &cluster.HAStatus{Term: e.term.Number(), Nodes: []cluster.MDSNode{}, Etcd: []cluster.EtcdMember{}}
	for _, c := range cands {
		st.Nodes = append(st.Nodes, cluster.MDSNode{Node: c.Node, Addr: c.Addr, Leader: c.Leader, Term: c.Term, LeaseLeft: c.TTL})
	}
	ml, err := e.cli.MemberList(ctx)
	if err != nil {
		return nil, fmt.Errorf("etcd members: %w", err)
	}
	for _, m := range ml.Members {
		em := cluster.EtcdMember{Name: m.Name, Endpoints: m.ClientURLs}
		if len(m.ClientURLs) > 0 {
			sctx, cancel := context.WithTimeout(ctx, time.Second)
			s, err := e.cli.Status(sctx, m.ClientURLs[0])
			cancel()
			if err != nil {
				em.Error = err.Error()
			} else {
				em.Healthy = len(s.Errors) == 0
				em.Leader = s.Leader == m.ID
				if !em.Healthy {
					em.Error = strings.Join(s.Errors, "; ")
				}
			}
		}
		st.Etcd = append(st.Etcd, em)
	}
	return st, nil
}

// isEtcd reports whether a metadata URL names etcd (and so an election).
func isEtcd(metaURL string) bool { return strings.HasPrefix(metaURL, "etcd://") }

// joinSecret returns the cluster's join secret: the one kept in the
// metadata, written out to file; or, for a cluster without one yet, the
// file's (created if missing), then kept in the metadata.
func joinSecret(e meta.Engine, file string) ([]byte, error) {
	ctx := context.Background()
	b, err := e.GetConfig(ctx, joinSecretKey)
	switch {
	case err == nil:
		return b, cluster.SaveJoinSecret(file, b)
	case !errors.Is(err, meta.ErrNotFound):
		return nil, fmt.Errorf("join secret: %w", err)
	}
	secret, err := cluster.LoadOrCreateJoinSecret(file)
	if err != nil {
		return nil, err
	}
	if err := e.PutConfig(ctx, joinSecretKey, secret); err != nil {
		return nil, fmt.Errorf("join secret: %w", err)
	}
	return secret, nil
}

// RunMDS runs a metadata server until ctx ends. On etcd it stands for
// election, serves while it leads, and stands again whenever its term
// ends (lease lost, or `shoal admin step-down`); onLeader is called each
// time it starts serving. On bbolt it simply serves.
func RunMDS(ctx context.Context, cfg MDSConfig, onLeader func(*MDS)) error {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Events == nil {
		cfg.Events = statuspage.NewEventLog(statuspage.DefaultEvents)
	}
	if isEtcd(cfg.MetaURL) && cfg.Metrics != nil {
		if err := cfg.Metrics.Register(newHACollector()); err != nil {
			return fmt.Errorf("metrics: %w", err)
		}
	}
	backoff := 100 * time.Millisecond
	for {
		m, err := StartMDSContext(ctx, cfg)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if !isEtcd(cfg.MetaURL) || !retryableStart(err) {
				return err
			}
			cfg.Logger.Warn("cannot stand for election or start leading; retrying", "err", err, "backoff", backoff)
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 5*time.Second)
			continue
		}
		backoff = 100 * time.Millisecond
		if onLeader != nil {
			onLeader(m)
		}
		select {
		case <-ctx.Done():
			return m.Close()
		case <-m.Done():
			m.Close()
			if !isEtcd(cfg.MetaURL) {
				return errors.New("metadata server stopped")
			}
			cfg.Logger.Info("no longer leading; standing for election again")
		}
	}
}

// retryableStart tells a failure to reach etcd or to win (retried) from a
// misconfiguration (returned).
func retryableStart(err error) bool {
	var op *net.OpError
	return errors.Is(err, meta.ErrUnavailable) || errors.Is(err, meta.ErrFenced) || errors.Is(err, errCampaign) ||
		errors.Is(err, context.DeadlineExceeded) || errors.As(err, &op)
}

// errCampaign marks a failed campaign (etcd unreachable, lease lost while
// waiting).
var errCampaign = errors.New("election")

// termMetrics registers one term's collectors and unregisters them when
// the term ends, so that the next term of the same process registers its
// own.
type termMetrics struct {
	prometheus.Registerer
	mu sync.Mutex
	cs []prometheus.Collector
}

func (t *termMetrics) Register(c prometheus.Collector) error {
	if err := t.Registerer.Register(c); err != nil {
		return err
	}
	t.mu.Lock()
	t.cs = append(t.cs, c)
	t.mu.Unlock()
	return nil
}

func (t *termMetrics) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := t.Register(c); err != nil {
			panic(err)
		}
	}
}

func (t *termMetrics) unregisterAll() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, c := range t.cs {
		t.Registerer.Unregister(c)
	}
	t.cs = nil
}
