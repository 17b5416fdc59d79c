package client_test

import (
	"bytes"
	"context"
	"io"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shoalfs/shoal/client"
	"github.com/shoalfs/shoal/client/clienttest"
	"github.com/shoalfs/shoal/internal/wiring"
	"github.com/shoalfs/shoal/server"
)

// The flexible files layout (RFC 8435) end to end: Shoal's client against
// Shoal's MDS and data servers on loopback, with an export that hands out
// flexfiles layouts. The client writes every mirror itself, so the data
// servers' own NFS counters carry one copy of every byte per mirror, and
// no data server forwards (cluster.AgentStats.ReplicaWriteBytes).

// startFlex runs n data servers and an MDS whose export hands out
// flexfiles layouts with the given number of mirrors, striped inside a
// mirror or not (server.Export.FlexStripe).
func startFlex(tb testing.TB, n, mirrors int, stripe string) *wiring.Cluster {
	tb.Helper()
	return startFlexMetrics(tb, n, mirrors, stripe, nil)
}

// startFlexMetrics is startFlex with the MDS's metrics registered in reg.
func startFlexMetrics(tb testing.TB, n, mirrors int, stripe string, reg prometheus.Registerer) *wiring.Cluster {
	tb.Helper()
	noSquash := false
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := wiring.Start(ctx, wiring.Config{
		Dir: tb.TempDir(), DataServers: n, Listen: "127.0.0.1:0", Mirrors: mirrors,
		Exports: []*server.Export{{Path: "/", RootSquash: &noSquash, Layout: server.LayoutFlexFiles, FlexStripe: stripe}},
		Lease:   10 * time.Second, InlineMax: -1,
		Logger: quietLogger(), Metrics: reg,
	})
	if err != nil {
		tb.Fatalf("wiring.Start: %v", err)
	}
	tb.Cleanup(func() { c.Close() })
	return c
}

// dsWritten returns each data server's NFS WRITE payload bytes and the
// bytes it forwarded to other data servers.
func dsWritten(c *wiring.Cluster) (written []uint64, forwarded uint64) {
	for _, d := range c.DS {
		written = append(written, d.Server.Stats().WriteBytes)
		forwarded += d.Agent.Stats().ReplicaWriteBytes
	}
	return written, forwarded
}

func sum(v []uint64) (s uint64) {
	for _, x := range v {
		s += x
	}
	return s
}

// TestFlexFilesMirroredIO writes a file through flexfiles layouts of 1
// and 2 mirrors, unstriped and striped inside each mirror, reads it back
// through a second Client, and checks from the data servers' own
// counters that the client sent every copy and no data server forwarded.
func TestFlexFilesMirroredIO(t *testing.T) {
	const size = 8 << 20
	for _, tc := range []struct {
		name        string
		dss         int
		mirrors     int
		stripe      string
		wantWritten int // data servers that must have taken bytes
	}{
		{"1 mirror", 2, 1, server.FlexStripeOff, 1},
		{"2 mirrors", 2, 2, server.FlexStripeOff, 2},
		{"2 mirrors striped over 2", 4, 2, server.FlexStripeOn, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cl := startFlex(t, tc.dss, tc.mirrors, tc.stripe)
			c := dialer(cl.MDS.Addr.String(), client.Options{})(t)
			defer c.Close()
			ctx := t.Context()
			want := make([]byte, size)
			pattern(want, 0)
			f, err := c.Open(ctx, "/f", os.O_CREATE|os.O_RDWR|os.O_TRUNC, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			copies, err := client.CopiesOf(ctx, f, 0)
			if err != nil {
				t.Fatal(err)
			}
			if len(copies) != tc.mirrors || len(slices.Compact(slices.Sorted(slices.Values(copies)))) != tc.mirrors {
				t.Fatalf("offset 0 on %v, want %d copies on distinct data servers", copies, tc.mirrors)
			}
			if n, err := f.WriteAt(want, 0); n != size || err != nil {
				t.Fatalf("WriteAt = %d, %v", n, err)
			}
			if err := f.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			written, forwarded := dsWritten(cl)
			st := c.Stats()
			t.Logf("data servers took %v, forwarded %d; client %+v", written, forwarded, st)
			if got, w := sum(written), uint64(tc.mirrors*size); got != w {
				t.Errorf("data servers took %d bytes from clients, want %d (%d copies of %d)", got, w, tc.mirrors, size)
			}
			if forwarded != 0 {
				t.Errorf("data servers forwarded %d bytes; the client writes every copy itself", forwarded)
			}
			if took := len(written) - len(slices.DeleteFunc(slices.Clone(written), func(v uint64) bool { return v > 0 })); took != tc.wantWritten {
				t.Errorf("%d data servers took bytes (%v), want %d", took, written, tc.wantWritten)
			}
			if st.DSWriteBytes != uint64(tc.mirrors*size) || st.MDSIOBytes != 0 || st.LayoutErrors != 0 || st.Failovers != 0 {
				t.Errorf("client stats %+v: want %d bytes to data servers, none through the MDS, no errors", st, tc.mirrors*size)
			}

			r := dialer(cl.MDS.Addr.String(), client.Options{})(t)
			defer r.Close()
			got := readWhole(t, r, "/f", size)
			if !bytes.Equal(got, want) {
				t.Fatal("read back different data")
			}
			if rs := r.Stats(); rs.DSReadBytes != size || rs.MDSIOBytes != 0 {
				t.Errorf("reader stats %+v: want %d bytes from data servers (one copy), none through the MDS", rs, size)
			}
		})
	}
}

// readWhole reads path whole through c.
func readWhole(t *testing.T, c *client.Client, path string, size int) []byte {
	t.Helper()
	f, err := c.Open(t.Context(), path, os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got := make([]byte, size+4096)
	n, err := f.ReadAt(got, 0)
	if n != size || err != io.EOF {
		t.Fatalf("ReadAt = %d, %v; want %d, EOF", n, err, size)
	}
	return got[:n]
}

// TestFlexFilesDataServerLoss makes the data server of one mirror fail
// while a write through a 2-mirror layout is in flight. The write must
// succeed: the client reports the failing copy with LAYOUTERROR, the MDS
// marks it stale and answers NFS4_OK, the rest goes to the other copy; the
// next layout leaves the stale copy out; every byte reads back.
//
// Two ways to fail: the data server's NFS service stops (its listener and
// connections close at once, as when the process is killed; its agent
// goes on, so the cluster notices only later), and the data server leaves
// the cluster (wiring.DS.Close), which makes the MDS recall every layout.
func TestFlexFilesDataServerLoss(t *testing.T) {
	for _, tc := range []struct {
		name string
		stop func(*wiring.DS)
		// byReport: only the client's error report can tell the MDS the
		// copy missed writes (the data server is still a member); a
		// data server that leaves has its copies taken out of service
		// by the membership change itself.
		byReport bool
	}{
		{"nfs service stops", func(d *wiring.DS) { d.Server.Close() }, true},
		// The MDS recalls every layout when a data server leaves; it used
		// to recall them as LAYOUT4_NFSV4_1_FILES only, and dropped the
		// flexfiles layouts of a client that rightly answered
		// NFS4ERR_NOMATCHING_LAYOUT (server/pnfs.go recallAll).
		{"data server leaves", func(d *wiring.DS) { d.Close() }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testDataServerLoss(t, tc.stop, tc.byReport)
		})
	}
}

func testDataServerLoss(t *testing.T, stop func(*wiring.DS), byReport bool) {
	const size, part = 32 << 20, 1 << 20
	reg := prometheus.NewRegistry()
	cl := startFlexMetrics(t, 2, 2, server.FlexStripeOff, reg)
	c := dialer(cl.MDS.Addr.String(), client.Options{Logger: quietLogger()})(t)
	defer c.Close()
	ctx := t.Context()
	want := make([]byte, size)
	pattern(want, 0)
	f, err := c.Open(ctx, "/f", os.O_CREATE|os.O_RDWR|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	copies, err := client.CopiesOf(ctx, f, 0)
	if err != nil || len(copies) != 2 {
		t.Fatalf("copies %v, %v; want 2", copies, err)
	}
	// The victim is the copy reads do not prefer; the write goes to both.
	victim := -1
	for i, d := range cl.DS {
		if d.Addr.String() == copies[1] {
			victim = i
		}
	}
	if victim < 0 {
		t.Fatalf("no data server at %s", copies[1])
	}
	done := make(chan error, 1)
	go func() {
		for off := 0; off < size; off += part {
			if n, err := f.WriteAt(want[off:off+part], int64(off)); n != part || err != nil {
				done <- err
				return
			}
		}
		done <- f.Close()
	}()
	// Stop the victim once it has taken part of the file: mid-write.
	stopped := false
	for range 6000 {
		if cl.DS[victim].Server.Stats().WriteBytes >= 4*part {
			stop(cl.DS[victim])
			stopped = true
			break
		}
		select {
		case err := <-done:
			t.Fatalf("the write ended before the data server was stopped: %v", err)
		case <-time.After(5 * time.Millisecond):
		}
	}
	if !stopped {
		t.Fatal("the victim data server took no bytes in 30 s")
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("write with one mirror's data server stopped: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("write did not end")
	}
	st := c.Stats()
	staled, reported := metricSum(t, reg, "shoal_pnfs_flex_copies_staled_total"), metricSum(t, reg, "shoal_pnfs_layout_errors_total")
	t.Logf("client %+v; MDS: %v error reports, %v copies marked stale", st, reported, staled)
	if st.LayoutErrors == 0 {
		t.Errorf("no LAYOUTERROR accepted by the MDS (client stats %+v)", st)
	}
	if reported == 0 || (byReport && staled == 0) {
		t.Errorf("MDS metrics: %v error reports, %v copies marked stale by them; want both", reported, staled)
	}

	r := dialer(cl.MDS.Addr.String(), client.Options{})(t)
	defer r.Close()
	if got := readWhole(t, r, "/f", size); !bytes.Equal(got, want) {
		t.Fatal("read back different data")
	}
	rf, err := r.Open(ctx, "/f", os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer rf.Close()
	// The writer's layout may still be being recalled (the report
	// recalls it): until it is back, a LAYOUTGET hears LAYOUTTRYLATER.
	var now []string
	for range 200 {
		if now, err = client.CopiesOf(ctx, rf, 0); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil || slices.Contains(now, copies[1]) {
		t.Errorf("layout after the report names %v (%v); the stale copy on %s must be left out", now, err, copies[1])
	}
}

// metricSum is the sum of the samples of metric name in reg.
func metricSum(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			sum += m.GetCounter().GetValue()
		}
	}
	return sum
}

// TestFlexFilesSuite runs the client conformance suite on flexfiles
// exports of 1 and 2 mirrors, so that every read and write of the suite
// goes through the flexfiles driver.
func TestFlexFilesSuite(t *testing.T) {
	for _, mirrors := range []int{1, 2} {
		t.Run(map[int]string{1: "1 mirror", 2: "2 mirrors"}[mirrors], func(t *testing.T) {
			c := startFlex(t, 2, mirrors, server.FlexStripeAuto)
			clienttest.Run(t, dialer(c.MDS.Addr.String(), client.Options{}))
		})
	}
}

// BenchmarkMirroredWrite writes and syncs 8 MiB at a time, wrapping in a
// 128 MiB file, with 2 copies of every byte on 2 data servers, through
// the files layout (the client writes one copy, the data server forwards
// the other) and through flexfiles (the client writes both copies). On
// loopback on a shared machine the numbers say little about a network;
// `shoal bench` on a testbed is the measure, this is the quick check:
//
//	go test ./client -run XXX -bench MirroredWrite -benchtime 40x
func BenchmarkMirroredWrite(b *testing.B) {
	const block, span = 8 << 20, 128 << 20
	for _, tc := range []struct{ name, layout string }{
		{"files", server.LayoutFiles}, {"flexfiles", server.LayoutFlexFiles},
	} {
		b.Run(tc.name, func(b *testing.B) {
			noSquash := false
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			cl, err := wiring.Start(ctx, wiring.Config{
				Dir: b.TempDir(), DataServers: 2, Listen: "127.0.0.1:0", Mirrors: 2, InlineMax: -1,
				Exports: []*server.Export{{Path: "/", RootSquash: &noSquash, Layout: tc.layout}},
				Lease:   10 * time.Second, Logger: quietLogger(),
			})
			cancel()
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { cl.Close() })
			dctx, cancel := context.WithTimeout(b.Context(), 30*time.Second)
			c, err := client.Dial(dctx, cl.MDS.Addr.String(), client.Options{})
			cancel()
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { c.Close() })
			f, err := c.Open(b.Context(), "/bench", os.O_CREATE|os.O_RDWR|os.O_TRUNC, 0o644)
			if err != nil {
				b.Fatal(err)
			}
			defer f.Close()
			buf := make([]byte, block)
			pattern(buf, 0)
			b.SetBytes(block)
			var off int64
			for b.Loop() {
				if _, err := f.WriteAt(buf, off); err != nil {
					b.Fatal(err)
				}
				if err := f.Sync(); err != nil {
					b.Fatal(err)
				}
				off = (off + block) % span
			}
			written, forwarded := dsWritten(cl)
			b.ReportMetric(float64(forwarded)/float64(max(sum(written), 1)), "forwarded/received")
		})
	}
}
