package wiring

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/statuspage"
	"github.com/shoalfs/shoal/internal/wiretest"
	"github.com/shoalfs/shoal/internal/xdr"
	"github.com/shoalfs/shoal/server"
)

// TestLayoutStatsPage sends LAYOUTSTATS with ff_layoutupdate4 (running
// totals, twice) on a flexfiles layout, and reads what it reported back
// from the MDS's status page (HTML and /status.json, served over HTTP on
// loopback) and from its Prometheus metrics endpoint: bytes, operations
// and mean latency, per client and data server.
func TestLayoutStatsPage(t *testing.T) {
	f := false
	reg := prometheus.NewRegistry()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := Start(ctx, Config{
		Dir: t.TempDir(), DataServers: 2, Listen: "127.0.0.1:0", Mirrors: 1,
		Exports: []*server.Export{{Path: "/", RootSquash: &f, Layout: server.LayoutFlexFiles, FlexStripe: server.FlexStripeOff}},
		Lease:   30 * time.Second, HealInterval: time.Hour, Metrics: reg, Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	page := httptest.NewServer(statuspage.Handler(c.MDS.StatusSource(), slog.New(slog.DiscardHandler)))
	t.Cleanup(page.Close)
	metrics := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	t.Cleanup(metrics.Close)

	s := newFlexSession(t, c, t.Name())
	open, fh := s.create("stats")
	ls, ff := s.mustLayoutGet(fh, open, nfs4.LAYOUTIOMODE4_RW)
	ds := lastDS(t, ff)
	da := s.deviceInfo(ds.FfdsDeviceid)
	dsID := ""
	for _, d := range c.DS {
		if _, ua, err := uaddrOf(d.Addr.String()); err == nil && ua == da.FfdaNetaddrs[0].NaRAddr {
			dsID = d.Agent.ID()
		}
	}
	if dsID == "" {
		t.Fatalf("no data server at %+v", da.FfdaNetaddrs)
	}

	// Two reports of running totals: the second adds 1 MiB read in 4
	// operations of 1 ms each, and 2 MiB written in 8 of 3 ms each.
	ms := func(n uint64) nfs4.Nfstime4 {
		return nfs4.Nfstime4{Seconds: int64(n / 1000), Nseconds: uint32(n%1000) * 1e6}
	}
	report := func(k uint64) {
		t.Helper()
		lat := func(ops, bytes, each uint64) nfs4.FfIoLatency4 {
			return nfs4.FfIoLatency4{FfilOpsRequested: ops, FfilBytesRequested: bytes, FfilOpsCompleted: ops,
				FfilBytesCompleted: bytes, FfilTotalBusyTime: ms(ops * each), FfilAggregateCompletionTime: ms(ops * each)}
		}
		up := nfs4.FfLayoutupdate4{FflAddr: da.FfdaNetaddrs[0], FflFhandle: ds.FfdsFhVers[0],
			FflRead: lat(4*k, k<<20, 1), FflWrite: lat(8*k, 2*k<<20, 3), FflDuration: ms(1000 * k)}
		res, err := s.cl.Compound(putFH(fh), op(nfs4.NfsArgop4{Argop: nfs4.OP_LAYOUTSTATS, Oplayoutstats: &nfs4.LAYOUTSTATS4args{
			LsaOffset: 0, LsaLength: ^uint64(0), LsaStateid: ls,
			LsaRead:  nfs4.IoInfo4{IiCount: 4 * k, IiBytes: k << 20},
			LsaWrite: nfs4.IoInfo4{IiCount: 8 * k, IiBytes: 2 * k << 20}, LsaDeviceid: ds.FfdsDeviceid,
			LsaLayoutupdate: nfs4.Layoutupdate4{LouType: nfs4.LAYOUT4_FLEX_FILES, LouBody: xdr.Marshal(&up)},
		}}))
		if status(t, res, err) != nfs4.NFS4_OK {
			t.Fatalf("LAYOUTSTATS: %v", wiretest.Check(res))
		}
	}
	report(1)
	report(2)

	client := fmt.Sprintf("%016x", s.cl.ClientID)
	var snap statuspage.Snapshot
	if err := json.Unmarshal([]byte(get(t, page.URL+"/status.json")), &snap); err != nil {
		t.Fatal(err)
	}
	want := statuspage.LayoutIO{Client: client, DS: dsID,
		Read:  statuspage.IOStat{Bytes: 2 << 20, Ops: 8, Latency: time.Millisecond, Busy: 8 * time.Millisecond},
		Write: statuspage.IOStat{Bytes: 4 << 20, Ops: 16, Latency: 3 * time.Millisecond, Busy: 48 * time.Millisecond},
	}
	if len(snap.LayoutIO) != 1 {
		t.Fatalf("layout_io %+v, want one row", snap.LayoutIO)
	}
	got := snap.LayoutIO[0]
	if got.Updated.IsZero() {
		t.Errorf("layout_io row without a time: %+v", got)
	}
	got.Updated = time.Time{}
	if got != want {
		t.Fatalf("layout_io\n got %+v\nwant %+v", got, want)
	}

	html := get(t, page.URL+"/")
	row := html[strings.Index(html, `id="layout-io-rows"`):]
	row = row[:strings.Index(row, "</tbody>")]
	for _, cell := range []string{client, dsID, "2.0 MiB", ">8<", "1 ms", "4.0 MiB", ">16<", "3 ms"} {
		if !strings.Contains(row, cell) {
			t.Errorf("the page's client I/O table lacks %q:\n%s", cell, row)
		}
	}

	text := get(t, metrics.URL)
	for _, m := range []struct {
		name, dir string
		want      float64
	}{
		{"shoal_pnfs_layoutstats_bytes_total", "read", 2 << 20},
		{"shoal_pnfs_layoutstats_bytes_total", "write", 4 << 20},
		{"shoal_pnfs_layoutstats_ops_total", "read", 8},
		{"shoal_pnfs_layoutstats_ops_total", "write", 16},
		{"shoal_pnfs_layoutstats_completed_ops_total", "write", 16},
		{"shoal_pnfs_layoutstats_completion_seconds_total", "read", 0.008},
		{"shoal_pnfs_layoutstats_completion_seconds_total", "write", 0.048},
		{"shoal_pnfs_layoutstats_busy_seconds_total", "write", 0.048},
		{"shoal_pnfs_layoutstats_not_delivered_bytes_total", "write", 0},
	} {
		if got, ok := scraped(text, m.name, `ds="`+dsID+`"`, `dir="`+m.dir+`"`); !ok || !near(got, m.want) {
			t.Errorf("%s{ds=%s,dir=%s} = %v (found %v), want %v", m.name, dsID, m.dir, got, ok, m.want)
		}
	}
}

// uaddrOf is the universal address (RFC 5665) of host:port, as a
// device's netaddr4 names it.
func uaddrOf(hostport string) (netid, ua string, err error) {
	i := strings.LastIndex(hostport, ":")
	port, err := strconv.Atoi(hostport[i+1:])
	if i < 0 || err != nil {
		return "", "", fmt.Errorf("bad address %q", hostport)
	}
	return "tcp", fmt.Sprintf("%s.%d.%d", strings.Trim(hostport[:i], "[]"), port>>8, port&0xff), nil
}

func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %v", url, resp.StatusCode, err)
	}
	return string(b)
}

// scraped finds the value of the series of name whose labels include
// every one of labels in Prometheus's text format.
func scraped(text, name string, labels ...string) (float64, bool) {
lines:
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(line, name+"{") {
			continue
		}
		for _, l := range labels {
			if !strings.Contains(line, l) {
				continue lines
			}
		}
		v, err := strconv.ParseFloat(line[strings.LastIndex(line, " ")+1:], 64)
		return v, err == nil
	}
	return 0, false
}

func near(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 }
