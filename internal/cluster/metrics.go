package cluster

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Collector exports `shoal admin status` as Prometheus gauges. Status
// scans every stripe map, so a scrape reuses a status up to
// collectorMaxAge old.
type Collector struct {
	a *Admin

	mu   sync.Mutex
	last *Status
	at   time.Time
}

const collectorMaxAge = 10 * time.Second

var _ prometheus.Collector = (*Collector)(nil)

// NewCollector returns the collector of a's cluster.
func NewCollector(a *Admin) *Collector { return &Collector{a: a} }

var (
	descUp          = prometheus.NewDesc("shoal_cluster_ds_up", "1 if the data server is in service.", []string{"ds", "state"}, nil)
	descFiles       = prometheus.NewDesc("shoal_cluster_ds_files", "Files with stripes on the data server.", []string{"ds"}, nil)
	descBytes       = prometheus.NewDesc("shoal_cluster_ds_bytes", "Bytes of files the data server holds.", []string{"ds"}, nil)
	descFree        = prometheus.NewDesc("shoal_cluster_ds_free_bytes", "Free space the data server reported.", []string{"ds"}, nil)
	descLastBeat    = prometheus.NewDesc("shoal_cluster_ds_last_heartbeat_seconds", "Unix time of the data server's last heartbeat.", []string{"ds"}, nil)
	descIO          = prometheus.NewDesc("shoal_cluster_ds_io_bytes_total", "Bytes the data server read from and wrote to its store since it started, from its last heartbeat.", []string{"ds", "dir"}, nil)
	descUnavailable = prometheus.NewDesc("shoal_cluster_unavailable_files", "Files with a stripe on a data server that is out of service or removed.", nil, nil)
	descPlaced      = prometheus.NewDesc("shoal_cluster_files", "Files with data placed on data servers.", nil, nil)
	descJobFiles    = prometheus.NewDesc("shoal_cluster_job_files", "Files of the current or last drain/rebalance/scrub, by outcome.", []string{"kind", "outcome"}, nil)
	descJobBytes    = prometheus.NewDesc("shoal_cluster_job_bytes", "Bytes copied by the current or last drain/rebalance/scrub.", []string{"kind"}, nil)

	descReplicated     = prometheus.NewDesc("shoal_cluster_replicated_files", "Files kept in more than one copy.", nil, nil)
	descDegraded       = prometheus.NewDesc("shoal_cluster_degraded_files", "Replicated files with a stale copy or a lost member (removed, or out of service past DownAfter).", nil, nil)
	descDegradedStripe = prometheus.NewDesc("shoal_cluster_degraded_stripes", "Stripe positions of replicated files with a stale copy or a lost member.", nil, nil)
	descStale          = prometheus.NewDesc("shoal_cluster_stale_copies", "Copies of files marked stale (one per file and data server).", nil, nil)
	descUnhealable     = prometheus.NewDesc("shoal_cluster_unhealable_files", "Degraded files with a stripe position that has no good copy in service.", nil, nil)
	descHealRunning    = prometheus.NewDesc("shoal_cluster_heal_running", "1 while the healer copies a file.", nil, nil)
	descHealBytes      = prometheus.NewDesc("shoal_cluster_heal_bytes_total", "Bytes healing copied and verified.", nil, nil)
	descHealed         = prometheus.NewDesc("shoal_cluster_healed_files_total", "Files healed.", nil, nil)
	descHealFailed     = prometheus.NewDesc("shoal_cluster_heal_failures_total", "Heals that failed (each is retried).", nil, nil)
	descHealRate       = prometheus.NewDesc("shoal_cluster_heal_rate_limit_bytes", "Healing's bandwidth limit in bytes per second (-1: none).", nil, nil)
	descScrubFiles     = prometheus.NewDesc("shoal_cluster_scrub_files_total", "Replicated files scrubs checked.", nil, nil)
	descScrubChunks    = prometheus.NewDesc("shoal_cluster_scrub_chunks_total", "Stripe chunks scrubs checked.", nil, nil)
	descScrubBad       = prometheus.NewDesc("shoal_cluster_scrub_bad_total", "Copies of chunks scrubs found corrupt or differing.", nil, nil)
	descScrubRepaired  = prometheus.NewDesc("shoal_cluster_scrub_repaired_total", "Bad copies of chunks scrubs repaired.", nil, nil)
)

var allDescs = []*prometheus.Desc{descUp, descFiles, descBytes, descFree, descLastBeat, descIO, descUnavailable, descPlaced, descJobFiles, descJobBytes,
	descReplicated, descDegraded, descDegradedStripe, descStale, descUnhealable, descHealRunning, descHealBytes, descHealed, descHealFailed,
	descHealRate, descScrubFiles, descScrubChunks, descScrubBad, descScrubRepaired}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range allDescs {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	if c.last == nil || time.Since(c.at) > collectorMaxAge {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		st, err := c.a.Status(ctx)
		cancel()
		if err == nil {
			c.last, c.at = st, time.Now()
		}
	}
	st := c.last
	c.mu.Unlock()
	if st == nil {
		return
	}
	g := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v int64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v))
	}
	for _, d := range st.DataServers {
		up := 0.0
		if d.Up {
			up = 1
		}
		g(descUp, up, d.ID, string(d.State))
		g(descFiles, float64(d.Files), d.ID)
		g(descBytes, float64(d.Bytes), d.ID)
		g(descFree, float64(d.Free), d.ID)
		if !d.LastBeat.IsZero() {
			g(descLastBeat, float64(d.LastBeat.UnixNano())/1e9, d.ID)
		}
		// Counters that restart with the data server, which Prometheus's
		// rate() takes in its stride.
		ch <- prometheus.MustNewConstMetric(descIO, prometheus.CounterValue, float64(d.ReadBytes), d.ID, "read")
		ch <- prometheus.MustNewConstMetric(descIO, prometheus.CounterValue, float64(d.WrittenBytes), d.ID, "write")
	}
	g(descUnavailable, float64(st.UnavailableFiles))
	g(descPlaced, float64(st.Files))
	rep := &st.Replication
	g(descReplicated, float64(rep.Files))
	g(descDegraded, float64(rep.DegradedFiles))
	g(descDegradedStripe, float64(rep.DegradedStripes))
	g(descStale, float64(rep.StaleCopies))
	g(descUnhealable, float64(rep.UnhealableFiles))
	if h := rep.Heal; h != nil {
		running := 0.0
		if h.Running {
			running = 1
		}
		g(descHealRunning, running)
		counter(descHealBytes, h.Bytes)
		counter(descHealed, h.Files)
		counter(descHealFailed, h.Failed)
		g(descHealRate, float64(h.Rate))
	}
	counter(descScrubFiles, rep.Scrub.Files)
	counter(descScrubChunks, rep.Scrub.Chunks)
	counter(descScrubBad, rep.Scrub.Bad)
	counter(descScrubRepaired, rep.Scrub.Repaired)
	if j := st.Job; j != nil {
		g(descJobFiles, float64(j.Files), j.Kind, "found")
		g(descJobFiles, float64(j.Moved), j.Kind, "moved")
		g(descJobFiles, float64(j.Failed), j.Kind, "failed")
		g(descJobBytes, float64(j.Bytes), j.Kind)
	}
}
