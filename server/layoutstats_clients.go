package server

import (
	"cmp"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/xdr"
	"github.com/shoalfs/shoal/server/internal/state"
)

// The I/O statistics a flexfiles client reports (RFC 8435 §9.2.2,
// ff_layoutupdate4 in LAYOUTSTATS and in the ff_iostats4 of LAYOUTRETURN)
// per client and data server, for the status page (Server.LayoutStats),
// and per data server, for the Prometheus collector. Like io_info4, the
// ff_io_latency4 counts are running totals since the client got its
// layout: only what grew since the source's previous report is added.
// The files layout's LAYOUTSTATS carries io_info4 only (its
// layoutupdate4 body is the layout type's, empty for files), and counts
// bytes and operations alone.

// maxClientDSStats bounds layoutReports.clients: past it the totals start
// again (clients and data servers come and go; a busy MDS sees a few
// hundred of each).
const maxClientDSStats = 1 << 14

// clientDSKey names the I/O of one client to one data server.
type clientDSKey struct {
	client state.ClientID
	ds     string
}

// ioTotals is reported I/O in one direction. Fractions come from reports
// about ranges that span several data servers (DeviceSharer).
type ioTotals struct {
	bytes, ops float64
	// completed, completion and busy come from ff_io_latency4: the
	// operations completed, the sum of their completion times and the
	// time the client had operations outstanding (both in seconds).
	completed, completion, busy float64
	notDelivered                float64
}

// clientDSStats is one client's reported I/O to one data server.
type clientDSStats struct {
	read, write ioTotals
	updated     time.Time
}

// lastReport is what one source (statsSource) reported last.
type lastReport struct {
	io  [2]nfs4.IoInfo4
	lat [2]nfs4.FfIoLatency4
}

// LayoutIOStat is what a client reported of its I/O to one data server
// through layouts, since the MDS started (Server.LayoutStats).
type LayoutIOStat struct {
	Client      uint64
	DS          string
	Read, Write LayoutIO
	// Updated is when the last report counted here came.
	Updated time.Time
}

// LayoutIO is one direction of a LayoutIOStat. Completed, Latency, Busy
// and NotDelivered come from flexfiles clients only (ff_layoutupdate4).
type LayoutIO struct {
	Bytes, Ops uint64
	// Completed is the number of operations the client saw complete;
	// Latency is their mean completion time.
	Completed uint64
	Latency   time.Duration
	// Busy is the time the client had I/O outstanding to the data
	// server.
	Busy time.Duration
	// NotDelivered is the bytes requested but not delivered.
	NotDelivered uint64
}

func nfsSeconds(t nfs4.Nfstime4) float64 {
	return float64(t.Seconds) + float64(t.Nseconds)/1e9
}

// fsIncrease is increase for times in seconds.
func fsIncrease(prev, now float64) float64 {
	if now >= prev {
		return now - prev
	}
	return now
}

// latencyUpdate returns the ff_layoutupdate4 a report carries, if any: the
// body of a LAYOUTSTATS' layoutupdate4 of type FLEX_FILES (nil if it has
// none or it does not decode), or an ff_iostats4's own.
func latencyUpdate(lu nfs4.Layoutupdate4) *nfs4.FfLayoutupdate4 {
	if lu.LouType != nfs4.LAYOUT4_FLEX_FILES || len(lu.LouBody) == 0 {
		return nil
	}
	var u nfs4.FfLayoutupdate4
	if err := xdr.Unmarshal(lu.LouBody, &u); err != nil {
		return nil
	}
	return &u
}

// addClientStats adds a report's growth to client id's totals for each
// data server of sh (weights: parts of the range). prev is the source's
// previous report, cur this one; lat is false when the report carries no
// ff_layoutupdate4. The caller holds r.mu.
func (r *layoutReports) addClientStats(id state.ClientID, sh map[string]uint64, total uint64, prev, cur lastReport, lat bool, now time.Time) {
	for ds, w := range sh {
		k := clientDSKey{id, ds}
		st := r.clients[k]
		if st == nil {
			if len(r.clients) >= maxClientDSStats {
				clear(r.clients)
			}
			st = &clientDSStats{}
			r.clients[k] = st
		}
		st.updated = now
		part := float64(w) / float64(total)
		for i, t := range [2]*ioTotals{&st.read, &st.write} {
			lk := layoutIOKey{ds, [2]string{"read", "write"}[i]}
			t.bytes += float64(increase(prev.io[i].IiBytes, cur.io[i].IiBytes)) * part
			t.ops += float64(increase(prev.io[i].IiCount, cur.io[i].IiCount)) * part
			if !lat {
				continue
			}
			p, c := prev.lat[i], cur.lat[i]
			completed := float64(increase(p.FfilOpsCompleted, c.FfilOpsCompleted)) * part
			completion := fsIncrease(nfsSeconds(p.FfilAggregateCompletionTime), nfsSeconds(c.FfilAggregateCompletionTime)) * part
			busy := fsIncrease(nfsSeconds(p.FfilTotalBusyTime), nfsSeconds(c.FfilTotalBusyTime)) * part
			lost := float64(increase(p.FfilBytesNotDelivered, c.FfilBytesNotDelivered)) * part
			t.completed += completed
			t.completion += completion
			t.busy += busy
			t.notDelivered += lost
			d := r.latency[lk]
			d.completed += completed
			d.completion += completion
			d.busy += busy
			d.notDelivered += lost
			r.latency[lk] = d
		}
	}
}

// LayoutStats returns what clients reported of their I/O to the data
// servers (LAYOUTSTATS, LAYOUTRETURN) since the MDS started, by client and
// data server, ordered by client then data server. Nil on a server
// without layouts.
func (s *Server) LayoutStats() []LayoutIOStat {
	r := s.reports
	if r == nil {
		return nil
	}
	r.mu.Lock()
	out := make([]LayoutIOStat, 0, len(r.clients))
	for k, st := range r.clients {
		out = append(out, LayoutIOStat{Client: uint64(k.client), DS: k.ds,
			Read: st.read.export(), Write: st.write.export(), Updated: st.updated})
	}
	r.mu.Unlock()
	slices.SortFunc(out, func(a, b LayoutIOStat) int {
		return cmp.Or(cmp.Compare(a.Client, b.Client), cmp.Compare(a.DS, b.DS))
	})
	return out
}

func (t ioTotals) export() LayoutIO {
	io := LayoutIO{Bytes: uint64(t.bytes + 0.5), Ops: uint64(t.ops + 0.5), Completed: uint64(t.completed + 0.5),
		Busy: time.Duration(t.busy * 1e9), NotDelivered: uint64(t.notDelivered + 0.5)}
	if t.completed > 0 {
		io.Latency = time.Duration(t.completion / t.completed * 1e9)
	}
	return io
}

// latencyCollector exports the ff_io_latency4 totals by data server.
type latencyCollector struct {
	completed, completion, busy, notDelivered *prometheus.Desc
}

func newLatencyCollector(labels prometheus.Labels) latencyCollector {
	lv := []string{"ds", "dir"}
	return latencyCollector{
		completed: prometheus.NewDesc("shoal_pnfs_layoutstats_completed_ops_total",
			"I/O operations to a data server that flexfiles clients reported completed (ff_io_latency4).", lv, labels),
		completion: prometheus.NewDesc("shoal_pnfs_layoutstats_completion_seconds_total",
			"Sum of the completion times of the I/O operations to a data server that flexfiles clients reported (ff_io_latency4); divided by shoal_pnfs_layoutstats_completed_ops_total it is the mean latency.", lv, labels),
		busy: prometheus.NewDesc("shoal_pnfs_layoutstats_busy_seconds_total",
			"Time flexfiles clients reported having I/O outstanding to a data server (ff_io_latency4).", lv, labels),
		notDelivered: prometheus.NewDesc("shoal_pnfs_layoutstats_not_delivered_bytes_total",
			"Bytes flexfiles clients reported requested from or to a data server but not delivered (ff_io_latency4).", lv, labels),
	}
}

func (l latencyCollector) describe(ch chan<- *prometheus.Desc) {
	ch <- l.completed
	ch <- l.completion
	ch <- l.busy
	ch <- l.notDelivered
}

// collect sends r's latency totals; the caller holds r.mu.
func (l latencyCollector) collect(r *layoutReports, ch chan<- prometheus.Metric) {
	for k, d := range r.latency {
		ch <- prometheus.MustNewConstMetric(l.completed, prometheus.CounterValue, d.completed, k.ds, k.dir)
		ch <- prometheus.MustNewConstMetric(l.completion, prometheus.CounterValue, d.completion, k.ds, k.dir)
		ch <- prometheus.MustNewConstMetric(l.busy, prometheus.CounterValue, d.busy, k.ds, k.dir)
		ch <- prometheus.MustNewConstMetric(l.notDelivered, prometheus.CounterValue, d.notDelivered, k.ds, k.dir)
	}
}
