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
	descUnavailable = prometheus.NewDesc("shoal_cluster_unavailable_files", "Files with a stripe on a data server that is out of service or removed.", nil, nil)
	descPlaced      = prometheus.NewDesc("shoal_cluster_files", "Files with data placed on data servers.", nil, nil)
	descJobFiles    = prometheus.NewDesc("shoal_cluster_job_files", "Files of the current or last drain/rebalance, by outcome.", []string{"kind", "outcome"}, nil)
	descJobBytes    = prometheus.NewDesc("shoal_cluster_job_bytes", "Bytes copied by the current or last drain/rebalance.", []string{"kind"}, nil)
)

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descUp, descFiles, descBytes, descFree, descLastBeat, descUnavailable, descPlaced, descJobFiles, descJobBytes} {
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
	}
	g(descUnavailable, float64(st.UnavailableFiles))
	g(descPlaced, float64(st.Files))
	if j := st.Job; j != nil {
		g(descJobFiles, float64(j.Files), j.Kind, "found")
		g(descJobFiles, float64(j.Moved), j.Kind, "moved")
		g(descJobFiles, float64(j.Failed), j.Kind, "failed")
		g(descJobBytes, float64(j.Bytes), j.Kind)
	}
}
