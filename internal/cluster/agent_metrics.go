package cluster

import "github.com/prometheus/client_golang/prometheus"

// AgentCollector exports a data server's own copy counters: the bytes
// its clients wrote through it and the bytes its peers forwarded to it
// (REPLICA_WRITE). With the files layout a replicated write enters one
// data server from the client and the others from that data server; with
// a flexfiles layout the client writes every copy and nothing is
// forwarded, which these two counters show side by side.
type AgentCollector struct {
	a                     *Agent
	clientWrite, replicaW *prometheus.Desc
}

var _ prometheus.Collector = (*AgentCollector)(nil)

// NewAgentCollector returns the collector of data server a; labels (role,
// instance) go on every series.
func NewAgentCollector(a *Agent, labels prometheus.Labels) *AgentCollector {
	return &AgentCollector{a: a,
		clientWrite: prometheus.NewDesc("shoal_ds_client_write_bytes_total",
			"Bytes this data server's NFS clients wrote to its store.", nil, labels),
		replicaW: prometheus.NewDesc("shoal_ds_replica_write_bytes_total",
			"Bytes other data servers forwarded to this one (REPLICA_WRITE): the copies of replicated writes it did not receive from a client.", nil, labels),
	}
}

func (c *AgentCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.clientWrite
	ch <- c.replicaW
}

func (c *AgentCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.a.Stats()
	ch <- prometheus.MustNewConstMetric(c.clientWrite, prometheus.CounterValue, float64(st.ClientWriteBytes))
	ch <- prometheus.MustNewConstMetric(c.replicaW, prometheus.CounterValue, float64(st.ReplicaWriteBytes))
}
