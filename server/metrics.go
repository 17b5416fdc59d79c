package server

import (
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/meta"
)

// counters are the server's activity counters. They are plain atomics on
// the request path; Stats snapshots them for tests and tools, and a
// Prometheus collector exports them (Config.Metrics).
type counters struct {
	ops      [nfs4.OP_REMOVEXATTR + 1]atomic.Uint64
	opErrors [nfs4.OP_REMOVEXATTR + 1]atomic.Uint64
	// opNanos is the time spent running each operation (decoding and
	// encoding excluded): with ops, the mean latency an operator needs
	// to see which operation a workload waits on.
	opNanos    [nfs4.OP_REMOVEXATTR + 1]atomic.Uint64
	readBytes  atomic.Uint64
	writeBytes atomic.Uint64
	recalls    atomic.Uint64 // CB_LAYOUTRECALL sent
	fences     atomic.Uint64
	// notLeading counts COMPOUNDs refused because the server was no
	// longer sure it leads (Config.Leading).
	notLeading atomic.Uint64

	delegGranted  atomic.Uint64 // OPEN or WANT_DELEGATION replies with a delegation
	delegRecalled atomic.Uint64 // CB_RECALL answered by the client
	delegReturned atomic.Uint64 // DELEGRETURN
	delegRevoked  atomic.Uint64 // revoked after an unanswered recall
	cbGetattr     atomic.Uint64 // CB_GETATTR answers used

	// syncedReplies and earlyReplies count COMPOUNDs answered after the
	// metadata log was durable and, for async exports, before
	// (durability.go).
	syncedReplies atomic.Uint64
	earlyReplies  atomic.Uint64
}

func (c *counters) op(op nfs4.NfsOpnum4, st nfs4.Nfsstat4) {
	if int(op) < len(c.ops) {
		c.ops[op].Add(1)
		if st != nfs4.NFS4_OK {
			c.opErrors[op].Add(1)
		}
	}
}

func (c *counters) opTime(op nfs4.NfsOpnum4, d time.Duration) {
	if int(op) < len(c.opNanos) {
		c.opNanos[op].Add(uint64(d))
	}
}

// Stats is a snapshot of a server's counters.
type Stats struct {
	// Ops counts operations by name ("READ", "LAYOUTGET", ...).
	Ops map[string]uint64
	// ReadBytes and WriteBytes count READ and WRITE payload bytes.
	ReadBytes, WriteBytes uint64
	// LayoutRecalls counts CB_LAYOUTRECALLs sent; Fences counts clients
	// fenced at the data servers after not returning recalled layouts.
	LayoutRecalls, Fences uint64
	// NotLeading counts COMPOUNDs answered NFS4ERR_DELAY because the
	// server could not vouch that it still leads (Config.Leading).
	NotLeading uint64
	// Delegations granted, recalled (CB_RECALL delivered), returned and
	// revoked, and outstanding now.
	DelegGranted, DelegRecalled, DelegReturned, DelegRevoked uint64
	Delegations                                              int
	// Replay records (replay.go): retransmissions answered from a record
	// of another server instance; records written with a namespace
	// change; deleted once their reply was known to have arrived;
	// deleted for their age.
	ReplaysAnswered, ReplaysWritten, ReplaysRetired, ReplaysExpired uint64
	// SyncedReplies counts COMPOUNDs answered once the metadata log was
	// durable, EarlyReplies those of async exports answered before
	// (durability.go).
	SyncedReplies, EarlyReplies uint64
	// Log is the metadata engine's write-ahead log: records written and
	// fdatasyncs (zero for engines without one).
	Log meta.LogStats
}

// Stats returns a snapshot of the server's counters.
func (s *Server) Stats() Stats {
	st := Stats{Ops: map[string]uint64{}}
	for i := range s.counters.ops {
		if n := s.counters.ops[i].Load(); n > 0 {
			st.Ops[opLabel(nfs4.NfsOpnum4(i))] = n
		}
	}
	st.ReadBytes = s.counters.readBytes.Load()
	st.WriteBytes = s.counters.writeBytes.Load()
	st.LayoutRecalls = s.counters.recalls.Load()
	st.Fences = s.counters.fences.Load()
	st.NotLeading = s.counters.notLeading.Load()
	st.DelegGranted = s.counters.delegGranted.Load()
	st.DelegRecalled = s.counters.delegRecalled.Load()
	st.DelegReturned = s.counters.delegReturned.Load()
	st.DelegRevoked = s.counters.delegRevoked.Load()
	st.Delegations = s.st.m.Delegations()
	if b := s.replays; b != nil {
		st.ReplaysAnswered = b.answered.Load()
		st.ReplaysWritten = b.written.Load()
		st.ReplaysRetired = b.dropped.Load()
		st.ReplaysExpired = b.expired.Load()
	}
	st.SyncedReplies = s.counters.syncedReplies.Load()
	st.EarlyReplies = s.counters.earlyReplies.Load()
	if s.syncer != nil {
		st.Log = s.syncer.LogStats()
	}
	return st
}

func opLabel(op nfs4.NfsOpnum4) string { return strings.TrimPrefix(op.String(), "OP_") }

// collector exports the counters to Prometheus.
type collector struct {
	s                          *Server
	ops, opErrs, bytes, events *prometheus.Desc
	opSeconds                  *prometheus.Desc
	delegs, delegsHeld         *prometheus.Desc
	replays, replaysAnswered   *prometheus.Desc
	metaSync, commitInterval   *prometheus.Desc
	replies, logAppends        *prometheus.Desc
	logSyncs, logSyncSeconds   *prometheus.Desc
	layout                     layoutCollector
}

func newCollector(s *Server, labels prometheus.Labels) *collector {
	return &collector{
		s:      s,
		ops:    prometheus.NewDesc("shoal_nfs_ops_total", "NFSv4 operations evaluated, by operation.", []string{"op"}, labels),
		opErrs: prometheus.NewDesc("shoal_nfs_op_errors_total", "NFSv4 operations that failed, by operation.", []string{"op"}, labels),
		opSeconds: prometheus.NewDesc("shoal_nfs_op_seconds_total",
			"Time spent running NFSv4 operations, by operation (divided by shoal_nfs_ops_total: the mean latency).", []string{"op"}, labels),
		bytes:  prometheus.NewDesc("shoal_nfs_bytes_total", "READ and WRITE payload bytes.", []string{"dir"}, labels),
		events: prometheus.NewDesc("shoal_pnfs_events_total", "pNFS events: layout recalls sent, clients fenced.", []string{"event"}, labels),
		layout: newLayoutCollector(labels),
		delegs: prometheus.NewDesc("shoal_nfs_delegation_events_total",
			"Delegations granted, recalled (CB_RECALL delivered), returned and revoked, and CB_GETATTR answers used.", []string{"event"}, labels),
		delegsHeld: prometheus.NewDesc("shoal_nfs_delegations", "Delegations outstanding.", nil, labels),
		replaysAnswered: prometheus.NewDesc("shoal_mds_replays_answered_total",
			"Retransmitted namespace changes that another server instance carried out, answered from its replay record.", nil, labels),
		replays: prometheus.NewDesc("shoal_mds_replay_records_total",
			"Replay records written with namespace changes, deleted once their reply arrived (retired), deleted for their age (expired).", []string{"event"}, labels),
		metaSync: prometheus.NewDesc("shoal_metadata_sync",
			"1 if changes through the export are answered once durable (sync), 0 if once written to the metadata log (async: sync: false).", []string{"export"}, labels),
		commitInterval: prometheus.NewDesc("shoal_metadata_commit_interval_seconds",
			"Longest time a change answered early waits for the metadata log's fdatasync.", nil, labels),
		replies: prometheus.NewDesc("shoal_metadata_replies_total",
			"COMPOUNDs answered after waiting for the metadata log to be durable (synced) or, on async exports, before (early).", []string{"wait"}, labels),
		logAppends: prometheus.NewDesc("shoal_metadata_log_appends_total", "Records written to the metadata engine's write-ahead log (one per commit round).", nil, labels),
		logSyncs:   prometheus.NewDesc("shoal_metadata_log_syncs_total", "fdatasyncs of the metadata engine's write-ahead log.", nil, labels),
		logSyncSeconds: prometheus.NewDesc("shoal_metadata_log_sync_seconds",
			"Duration of the fdatasyncs that make the metadata engine's write-ahead log durable (the wait of every synced change).", nil, labels),
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.ops
	ch <- c.opErrs
	ch <- c.opSeconds
	ch <- c.bytes
	ch <- c.events
	ch <- c.delegs
	ch <- c.delegsHeld
	ch <- c.replaysAnswered
	ch <- c.replays
	ch <- c.metaSync
	ch <- c.commitInterval
	ch <- c.replies
	ch <- c.logAppends
	ch <- c.logSyncs
	ch <- c.logSyncSeconds
	c.layout.describe(ch)
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	k := &c.s.counters
	for i := range k.ops {
		if n := k.ops[i].Load(); n > 0 {
			name := opLabel(nfs4.NfsOpnum4(i))
			ch <- prometheus.MustNewConstMetric(c.ops, prometheus.CounterValue, float64(n), name)
			ch <- prometheus.MustNewConstMetric(c.opErrs, prometheus.CounterValue, float64(k.opErrors[i].Load()), name)
			ch <- prometheus.MustNewConstMetric(c.opSeconds, prometheus.CounterValue, float64(k.opNanos[i].Load())/1e9, name)
		}
	}
	ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.CounterValue, float64(k.readBytes.Load()), "read")
	ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.CounterValue, float64(k.writeBytes.Load()), "write")
	ch <- prometheus.MustNewConstMetric(c.events, prometheus.CounterValue, float64(k.recalls.Load()), "layout_recall")
	ch <- prometheus.MustNewConstMetric(c.events, prometheus.CounterValue, float64(k.fences.Load()), "fence")
	ch <- prometheus.MustNewConstMetric(c.events, prometheus.CounterValue, float64(k.notLeading.Load()), "not_leading")
	for _, e := range []struct {
		name string
		n    *atomic.Uint64
	}{{"granted", &k.delegGranted}, {"recalled", &k.delegRecalled}, {"returned", &k.delegReturned},
		{"revoked", &k.delegRevoked}, {"cb_getattr", &k.cbGetattr}} {
		ch <- prometheus.MustNewConstMetric(c.delegs, prometheus.CounterValue, float64(e.n.Load()), e.name)
	}
	ch <- prometheus.MustNewConstMetric(c.delegsHeld, prometheus.GaugeValue, float64(c.s.st.m.Delegations()))
	if b := c.s.replays; b != nil {
		ch <- prometheus.MustNewConstMetric(c.replaysAnswered, prometheus.CounterValue, float64(b.answered.Load()))
		ch <- prometheus.MustNewConstMetric(c.replays, prometheus.CounterValue, float64(b.written.Load()), "written")
		ch <- prometheus.MustNewConstMetric(c.replays, prometheus.CounterValue, float64(b.dropped.Load()), "retired")
		ch <- prometheus.MustNewConstMetric(c.replays, prometheus.CounterValue, float64(b.expired.Load()), "expired")
	}
	if c.s.ns != nil {
		for _, e := range c.s.ns.exports {
			v := 1.0
			if e.async {
				v = 0
			}
			ch <- prometheus.MustNewConstMetric(c.metaSync, prometheus.GaugeValue, v, e.Path)
		}
		ch <- prometheus.MustNewConstMetric(c.commitInterval, prometheus.GaugeValue, c.s.commitInterval().Seconds())
	}
	ch <- prometheus.MustNewConstMetric(c.replies, prometheus.CounterValue, float64(k.syncedReplies.Load()), "synced")
	ch <- prometheus.MustNewConstMetric(c.replies, prometheus.CounterValue, float64(k.earlyReplies.Load()), "early")
	if c.s.syncer != nil {
		ls := c.s.syncer.LogStats()
		ch <- prometheus.MustNewConstMetric(c.logAppends, prometheus.CounterValue, float64(ls.Appends))
		ch <- prometheus.MustNewConstMetric(c.logSyncs, prometheus.CounterValue, float64(ls.Syncs))
		if len(ls.SyncBuckets) == len(meta.LogSyncBuckets)+1 {
			cum, buckets := uint64(0), make(map[float64]uint64, len(meta.LogSyncBuckets))
			for i, le := range meta.LogSyncBuckets {
				cum += ls.SyncBuckets[i]
				buckets[le] = cum
			}
			cum += ls.SyncBuckets[len(meta.LogSyncBuckets)]
			ch <- prometheus.MustNewConstHistogram(c.logSyncSeconds, cum, ls.SyncTime.Seconds(), buckets)
		}
	}
	c.layout.collect(c.s.reports, ch)
}

// registerMetrics registers the server's collector, if configured.
func (s *Server) registerMetrics() error {
	if s.cfg.Metrics == nil {
		return nil
	}
	if err := s.cfg.Metrics.Register(newCollector(s, s.cfg.MetricLabels)); err != nil {
		return err
	}
	if s.sweep != nil {
		return s.cfg.Metrics.Register(newSweepCollector(s.sweep, s.cfg.MetricLabels))
	}
	return nil
}
