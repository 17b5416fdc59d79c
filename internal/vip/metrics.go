package vip

import "github.com/prometheus/client_golang/prometheus"

// Release reasons, the reason label of shoal_vip_releases_total and of
// the "address released" log line.
const (
	reasonNotLeader = "not_leader" // the election names another node, or none
	reasonDeadline  = "deadline"   // the lease was not renewed in time
	reasonLeaseLost = "lease_lost" // etcd no longer has the lease
	reasonKeyLost   = "key_lost"   // the claim key was deleted or taken
	reasonShutdown  = "shutdown"   // the supervisor is stopping
	reasonStale     = "stale"      // found on start, not claimed by this run
)

// metrics are a supervisor's Prometheus collectors.
type metrics struct {
	holding     prometheus.Gauge
	claims      prometheus.Counter
	releases    *prometheus.CounterVec
	announces   prometheus.Counter
	renewErrors prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, addr string) *metrics {
	labels := prometheus.Labels{"address": addr}
	m := &metrics{
		holding: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "shoal_vip_holding", ConstLabels: labels,
			Help: "1 while this host carries the service address.",
		}),
		claims: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "shoal_vip_claims_total", ConstLabels: labels,
			Help: "Times this host added the service address after claiming it in etcd.",
		}),
		releases: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shoal_vip_releases_total", ConstLabels: labels,
			Help: "Times this host removed the service address, by reason.",
		}, []string{"reason"}),
		announces: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "shoal_vip_gratuitous_arps_total", ConstLabels: labels,
			Help: "Gratuitous ARP announcements sent for the service address.",
		}),
		renewErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "shoal_vip_lease_renew_errors_total", ConstLabels: labels,
			Help: "Failed attempts to renew the supervisor's etcd lease.",
		}),
	}
	for _, r := range []string{reasonNotLeader, reasonDeadline, reasonLeaseLost, reasonKeyLost, reasonShutdown, reasonStale} {
		m.releases.WithLabelValues(r) // export zeros, so rate() works from the start
	}
	if reg != nil {
		reg.MustRegister(m.holding, m.claims, m.releases, m.announces, m.renewErrors)
	}
	return m
}
