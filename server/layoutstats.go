package server

import (
	"context"
	"encoding/hex"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/server/internal/state"
)

// LAYOUTERROR and LAYOUTSTATS (RFC 7862 §15.6, §15.7): what clients tell
// the metadata server about their I/O to the data servers of a layout.
// Both are accepted under the client's layout stateid of the current file
// and recorded per data server, for the Prometheus collector
// (shoal_pnfs_layout_errors_total, shoal_pnfs_layoutstats_*); each error
// is also logged. For the files layout neither changes a layout: a client
// that cannot reach a data server does its I/O through the MDS anyway, and
// the cluster takes an unreachable data server out of service by itself.
// For a flexfiles layout, whose client writes every copy itself, an error
// marks the failing copy stale (flexfiles.go, copyFailed).
//
// A report names a device and a byte range. A files-layout device lists
// several data servers, so the range decides which of them the report is
// about (DeviceSharer): an error counts once for each data server the
// range touches, and the I/O of a LAYOUTSTATS is divided between them by
// their part of the range. A server whose DataServers cannot attribute
// records under ds="unknown".

// DeviceSharer is an optional capability of DataServers: attributing a
// byte range of a file on a device to the device's data servers, with
// their parts of the range (cluster.Striped.Shares). ok is false for an
// unknown device.
type DeviceSharer interface {
	Shares(ctx context.Context, ino uint64, device [16]byte, off, length uint64) (shares map[string]uint64, ok bool)
}

// unknownDS is the ds label of reports that name no known device.
const unknownDS = "unknown"

// maxStatsSources bounds layoutReports.last.
const maxStatsSources = 1 << 16

type layoutErrorKey struct{ ds, status, op string }

type layoutIOKey struct{ ds, dir string }

type staleKey struct{ ds, reason string }

// Reasons a flexfiles copy was marked stale (the reason label of
// shoal_pnfs_flex_copies_staled_total).
const (
	// staleReport: a client reported its I/O to the copy failing
	// (LAYOUTERROR, or ff_ioerr4 in LAYOUTRETURN).
	staleReport = "client_report"
	// staleLeftOut: a layout for writing left the copy out, its data
	// server being out of service (cluster.Striped.FlexLayout).
	staleLeftOut = "layout_left_out"
)

// statsSource is what one LAYOUTSTATS stream reports on: a client's I/O
// to one device for one file.
type statsSource struct {
	client state.ClientID
	file   state.FileID
	device [16]byte
}

// layoutReports records LAYOUTERROR and LAYOUTSTATS.
type layoutReports struct {
	mu     sync.Mutex
	errors map[layoutErrorKey]uint64
	bytes  map[layoutIOKey]float64
	ops    map[layoutIOKey]float64
	// staled counts the flexfiles copies marked stale, by data server
	// and reason (staleReport, staleLeftOut).
	staled map[staleKey]uint64
	// last holds the totals each source reported last: clients report
	// totals since they got the layout (Linux sends its running counts),
	// so only the increase since the previous report is new I/O.
	last map[statsSource]lastReport
	// clients holds the totals by client and data server, latency the
	// ff_io_latency4 totals by data server (layoutstats_clients.go).
	clients map[clientDSKey]*clientDSStats
	latency map[layoutIOKey]ioTotals
}

func newLayoutReports() *layoutReports {
	return &layoutReports{errors: map[layoutErrorKey]uint64{}, bytes: map[layoutIOKey]float64{},
		ops: map[layoutIOKey]float64{}, staled: map[staleKey]uint64{}, last: map[statsSource]lastReport{},
		clients: map[clientDSKey]*clientDSStats{}, latency: map[layoutIOKey]ioTotals{}}
}

// shares returns the data servers a report on device of file ino's range
// is about.
func (s *Server) shares(ctx context.Context, ino uint64, device [16]byte, off, length uint64) map[string]uint64 {
	if d, ok := s.pnfs.ds.(DeviceSharer); ok {
		if sh, ok := d.Shares(ctx, ino, device, off, length); ok && len(sh) > 0 {
			return sh
		}
	}
	return map[string]uint64{unknownDS: 1}
}

// statusLabel and opLabelOf keep the label values to the protocol's names
// (a client picks these numbers).
func statusLabel(st nfs4.Nfsstat4) string {
	if n := st.String(); !strings.HasPrefix(n, "Nfsstat4(") {
		return n
	}
	return "other"
}

func opLabelOf(op nfs4.NfsOpnum4) string {
	if n := op.String(); !strings.HasPrefix(n, "NfsOpnum4(") {
		return opLabel(op)
	}
	return "other"
}

// checkLayoutReport is what LAYOUTERROR and LAYOUTSTATS check first (on
// a pNFS server: plainOps has neither): a session, a regular file, a range that does not wrap, and
// the client's layout stateid of the file.
func (c *compound) checkLayoutReport(sid nfs4.Stateid4, off, length uint64) (state.ClientID, *object, nfs4.Nfsstat4) {
	s := c.s
	id, st := c.clientID()
	if st != nfs4.NFS4_OK {
		return 0, nil, st
	}
	o, st := c.currentFile()
	if st != nfs4.NFS4_OK {
		return 0, nil, st
	}
	if length != ^uint64(0) && off+length < off {
		return 0, nil, nfs4.NFS4ERR_INVAL
	}
	lsid, st := c.stateid(sid)
	if st != nfs4.NFS4_OK {
		return 0, nil, st
	}
	if err := s.st.m.CheckLayout(id, lsid, state.FileID(o.fh.ino)); err != nil {
		return 0, nil, statusOf(err)
	}
	return id, o, nfs4.NFS4_OK
}

func (c *compound) layoutError(a *nfs4.LAYOUTERROR4args) opReply {
	id, o, st := c.checkLayoutReport(a.LeaStateid, a.LeaOffset, a.LeaLength)
	if st != nfs4.NFS4_OK {
		return fail(st)
	}
	if !c.recordErrors(id, o, a.LeaOffset, a.LeaLength, a.LeaErrors) {
		// A client that wrote every other copy takes NFS4_OK as the
		// MDS's word that the failed copy no longer counts; if it
		// still does (the last good copy of its range, or a failure
		// that is about the client's state, not the copy), the client
		// must write through the MDS instead, which writes every good
		// copy or fails: never a write acknowledged that a good copy
		// missed. NFS4ERR_INVAL is the status RFC 7862 §15.6 allows
		// that no client retries as is.
		return fail(nfs4.NFS4ERR_INVAL)
	}
	return ok(nil)
}

// recordErrors counts and logs a client's error reports on the range
// [off, off+length) of file o (LAYOUTERROR, or the ff_ioerr4 of a
// LAYOUTRETURN), and marks a failing flexfiles copy stale. On a
// flexfiles export it reports whether every copy a failed write (WRITE,
// COMMIT) was reported against is out of service now.
func (c *compound) recordErrors(id state.ClientID, o *object, off, length uint64, errs []nfs4.DeviceError4) (writesOut bool) {
	s := c.s
	writesOut = true
	flex := len(errs) > 0 && c.fileLayoutType(o) == nfs4.LAYOUT4_FLEX_FILES
	for _, e := range errs {
		sh := s.shares(c.ctx, uint64(o.fh.ino), e.DeDeviceid, off, length)
		status, op := statusLabel(e.DeStatus), opLabelOf(e.DeOpnum)
		ids := make([]string, 0, len(sh))
		s.reports.mu.Lock()
		for ds := range sh {
			s.reports.errors[layoutErrorKey{ds, status, op}]++
			ids = append(ids, ds)
		}
		s.reports.mu.Unlock()
		c.log.Warn("pNFS client reports a data server error", "clientid", uint64(id), "ino", o.fh.ino,
			"device", hex.EncodeToString(e.DeDeviceid[:]), "ds", ids, "status", status, "op", op,
			"offset", off, "length", length)
		out := c.copyFailed(o, e.DeDeviceid, e.DeStatus)
		if flex && !out && (e.DeOpnum == nfs4.OP_WRITE || e.DeOpnum == nfs4.OP_COMMIT) {
			writesOut = false
		}
	}
	return writesOut
}

func (c *compound) layoutStats(a *nfs4.LAYOUTSTATS4args) opReply {
	id, o, st := c.checkLayoutReport(a.LsaStateid, a.LsaOffset, a.LsaLength)
	if st != nfs4.NFS4_OK {
		return fail(st)
	}
	c.recordStats(id, o, a.LsaDeviceid, a.LsaOffset, a.LsaLength, a.LsaRead, a.LsaWrite, latencyUpdate(a.LsaLayoutupdate))
	return ok(nil)
}

// recordStats takes a client's I/O statistics on device for the range
// [off, off+length) of file o (LAYOUTSTATS, or the ff_iostats4 of a
// LAYOUTRETURN): running totals since the client got the layout, and a
// flexfiles client's latencies (lu, nil if the report has none).
func (c *compound) recordStats(id state.ClientID, o *object, device [16]byte, off, length uint64, read, write nfs4.IoInfo4, lu *nfs4.FfLayoutupdate4) {
	s := c.s
	sh := s.shares(c.ctx, uint64(o.fh.ino), device, off, length)
	var total uint64
	for _, w := range sh {
		total += w
	}
	src := statsSource{client: id, file: state.FileID(o.fh.ino), device: device}
	cur := lastReport{io: [2]nfs4.IoInfo4{read, write}}
	if lu != nil {
		cur.lat = [2]nfs4.FfIoLatency4{lu.FflRead, lu.FflWrite}
	}
	now := time.Now()
	r := s.reports
	r.mu.Lock()
	defer r.mu.Unlock()
	prev, seen := r.last[src]
	if !seen && len(r.last) >= maxStatsSources {
		clear(r.last)
	}
	if lu == nil {
		cur.lat = prev.lat // a report without latencies changes none
	}
	r.last[src] = cur
	for i, dir := range [2]string{"read", "write"} {
		ops, bytes := increase(prev.io[i].IiCount, cur.io[i].IiCount), increase(prev.io[i].IiBytes, cur.io[i].IiBytes)
		for ds, w := range sh {
			part := float64(w) / float64(total)
			r.ops[layoutIOKey{ds, dir}] += float64(ops) * part
			r.bytes[layoutIOKey{ds, dir}] += float64(bytes) * part
		}
	}
	r.addClientStats(id, sh, total, prev, cur, lu != nil, now)
}

// increase is how much a reported running total grew; a total below the
// previous one starts again (a new layout).
func increase(prev, now uint64) uint64 {
	if now >= prev {
		return now - prev
	}
	return now
}

// layoutCollector exports the layout reports.
type layoutCollector struct {
	errs, bytes, ops, staled *prometheus.Desc
	latency                  latencyCollector
}

func newLayoutCollector(labels prometheus.Labels) layoutCollector {
	return layoutCollector{
		errs: prometheus.NewDesc("shoal_pnfs_layout_errors_total",
			"Errors clients reported with LAYOUTERROR, by data server, status and the operation that failed.",
			[]string{"ds", "status", "op"}, labels),
		bytes: prometheus.NewDesc("shoal_pnfs_layoutstats_bytes_total",
			"Bytes clients reported with LAYOUTSTATS as read from or written to a data server.", []string{"ds", "dir"}, labels),
		ops: prometheus.NewDesc("shoal_pnfs_layoutstats_ops_total",
			"I/O operations clients reported with LAYOUTSTATS, by data server.", []string{"ds", "dir"}, labels),
		staled: prometheus.NewDesc("shoal_pnfs_flex_copies_staled_total",
			"Copies of files marked stale through flexfiles layouts, by data server and reason: client_report (a client reported its I/O to the copy failing: LAYOUTERROR, LAYOUTRETURN) or layout_left_out (a layout for writing left the copy out, its data server being out of service).",
			[]string{"ds", "reason"}, labels),
		latency: newLatencyCollector(labels),
	}
}

func (l layoutCollector) describe(ch chan<- *prometheus.Desc) {
	ch <- l.errs
	ch <- l.bytes
	ch <- l.ops
	ch <- l.staled
	l.latency.describe(ch)
}

func (l layoutCollector) collect(r *layoutReports, ch chan<- prometheus.Metric) {
	if r == nil {
		return // a data server: no layouts of its own
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for k, n := range r.errors {
		ch <- prometheus.MustNewConstMetric(l.errs, prometheus.CounterValue, float64(n), k.ds, k.status, k.op)
	}
	for k, n := range r.bytes {
		ch <- prometheus.MustNewConstMetric(l.bytes, prometheus.CounterValue, n, k.ds, k.dir)
	}
	for k, n := range r.ops {
		ch <- prometheus.MustNewConstMetric(l.ops, prometheus.CounterValue, n, k.ds, k.dir)
	}
	for k, n := range r.staled {
		ch <- prometheus.MustNewConstMetric(l.staled, prometheus.CounterValue, float64(n), k.ds, k.reason)
	}
	l.latency.collect(r, ch)
}
