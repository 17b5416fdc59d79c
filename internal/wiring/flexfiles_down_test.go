package wiring

import (
	"bytes"
	"log/slog"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shoalfs/shoal/internal/cluster"
	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/wiretest"
	"github.com/shoalfs/shoal/server"
)

// TestFlexFilesWriteLayoutWithCopyDown covers a read/write flexfiles
// layout handed out while a data server holding a copy of the file is out
// of service. The layout leaves that copy out, so the client writes only
// the other mirror; the copy must be marked stale then, or it would count
// as good again when its data server returned, holding the bytes from
// before the write (nothing forwards a flexfiles write to it, and no
// client reports an error about a mirror it was never given). After the
// data server returns, healing resyncs the copy, and both mirrors read
// back the new bytes.
func TestFlexFilesWriteLayoutWithCopyDown(t *testing.T) {
	dir := t.TempDir()
	f := false
	reg := prometheus.NewRegistry()
	c, err := Start(ctxT(t), Config{
		Dir: dir, DataServers: 3, Listen: "127.0.0.1:0", Mirrors: 2,
		Exports: []*server.Export{{Path: "/", RootSquash: &f, Layout: server.LayoutFlexFiles, FlexStripe: server.FlexStripeOff}},
		Lease:   30 * time.Second, InlineMax: -1, HealInterval: time.Hour,
		// The data server is not replaced while it is away: its copy
		// is resynced when it returns.
		DownAfter: time.Hour,
		Metrics:   reg,
		Logger:    slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	s := newFlexSession(t, c, "flex-down")
	open, fh := s.create("d")
	ino := inoOf(t, c, "d")
	byAddr := map[string]*flexDS{}
	dsIndex := map[string]int{}
	for i, d := range c.DS {
		dsIndex[d.Addr.String()] = i
	}

	// writeAll writes data through every mirror of a read/write layout
	// and commits it (LAYOUTCOMMIT), then returns the layout.
	writeAll := func(what string, data []byte, mirrors int) nfs4.FfLayout4 {
		t.Helper()
		var ls nfs4.Stateid4
		var ff nfs4.FfLayout4
		waitFor(t, what+": a read/write layout", func() bool {
			st, nls, nff := s.layoutGet(fh, open, nfs4.LAYOUTIOMODE4_RW, 0, ^uint64(0), 0)
			ls, ff = nls, nff
			return st == nfs4.NFS4_OK
		})
		if len(ff.FflMirrors) != mirrors {
			t.Fatalf("%s: layout with %d mirrors, want %d", what, len(ff.FflMirrors), mirrors)
		}
		devs := flexDevices(t, s, ff, byAddr)
		for _, m := range ff.FflMirrors {
			ds := m.FfmDataServers[0]
			if st := devs[ds.FfdsDeviceid].write(t, ds.FfdsFhVers[0], ds.FfdsStateid, 0, data); st != nfs4.NFS4_OK {
				t.Fatalf("%s: WRITE at %s: %v", what, devs[ds.FfdsDeviceid].addr, st)
			}
			devs[ds.FfdsDeviceid].commit(t, ds.FfdsFhVers[0])
		}
		res, err := s.cl.Compound(putFH(fh), op(nfs4.NfsArgop4{Argop: nfs4.OP_LAYOUTCOMMIT, Oplayoutcommit: &nfs4.LAYOUTCOMMIT4args{
			LocaLength: uint64(len(data)), LocaStateid: ls,
			LocaLastWriteOffset: nfs4.Newoffset4{NoNewoffset: true, NoOffset: ptr(uint64(len(data) - 1))},
			LocaLayoutupdate:    nfs4.Layoutupdate4{LouType: nfs4.LAYOUT4_FLEX_FILES},
		}}))
		if status(t, res, err) != nfs4.NFS4_OK {
			t.Fatalf("%s: LAYOUTCOMMIT: %v", what, wiretest.Check(res))
		}
		if st := s.layoutReturn(fh, ls, nil); st != nfs4.NFS4_OK {
			t.Fatalf("%s: LAYOUTRETURN: %v", what, st)
		}
		return ff
	}

	before := randomBytes(t, 1<<20)
	ff := writeAll("before", before, 2)
	devs := flexDevices(t, s, ff, byAddr)
	downAddr := devs[ff.FflMirrors[1].FfmDataServers[0].FfdsDeviceid].addr
	down := dsIndex[downAddr]
	downID := c.DS[down].Agent.ID()
	byAddr[downAddr].cl.Close()
	delete(byAddr, downAddr)
	if err := c.DS[down].Close(); err != nil {
		t.Fatalf("stopping data server %s: %v", downID, err)
	}
	waitFor(t, "the data server out of service", func() bool {
		d, ok := c.MDS.Registry.DataServer(downID)
		return ok && !d.Up
	})

	// A layout for writing now: one mirror, and the copy it leaves out
	// is stale from then on.
	after := randomBytes(t, 1<<20)
	ff = writeAll("while a copy is down", after, 1)
	for _, ds := range ff.FflMirrors[0].FfmDataServers {
		if flexDevices(t, s, ff, byAddr)[ds.FfdsDeviceid].addr == downAddr {
			t.Fatalf("the layout names the data server that is out of service")
		}
	}
	if m, _, err := c.MDS.Striped.FileMap(ctxT(t), ino); err != nil || !m.IsStale(downID) {
		t.Fatalf("after a write layout left out the copy on %s: map %+v, %v; want that copy stale", downID, m, err)
	}
	wantMetric(t, reg, "shoal_pnfs_flex_copies_staled_total", map[string]string{"ds": downID, "reason": "layout_left_out"}, 1)

	// The data server returns; healing resyncs its copy.
	secret, err := cluster.ReadJoinSecret(c.MDS.JoinSecretFile)
	if err != nil {
		t.Fatal(err)
	}
	d, err := StartDS(ctxT(t), DSConfig{Listen: "127.0.0.1:0", Dir: filepath.Join(dir, "ds"+strconv.Itoa(down)),
		MDS: []string{c.MDS.Addr.String()}, JoinSecret: secret, Lease: 30 * time.Second, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatalf("restarting data server %s: %v", downID, err)
	}
	c.mu.Lock()
	c.DS[down] = d
	c.mu.Unlock()
	if err := c.MDS.Registry.WaitFor(ctxT(t), len(c.DS)); err != nil {
		t.Fatal(err)
	}
	c.MDS.Admin.Kick()
	waitFor(t, "the copy healed", func() bool {
		m, _, err := c.MDS.Striped.FileMap(ctxT(t), ino)
		return err == nil && !m.Degraded()
	})
	var ls nfs4.Stateid4
	waitFor(t, "a read layout with both copies", func() bool {
		st, nls, nff := s.layoutGet(fh, open, nfs4.LAYOUTIOMODE4_READ, 0, ^uint64(0), 0)
		ls, ff = nls, nff
		return st == nfs4.NFS4_OK && len(ff.FflMirrors) == 2
	})
	devs = flexDevices(t, s, ff, byAddr)
	for j, m := range ff.FflMirrors {
		ds := m.FfmDataServers[0]
		got := devs[ds.FfdsDeviceid].read(t, ds.FfdsFhVers[0], ls, 0, 1<<20)
		if !bytes.Equal(got, after) {
			what := "an older"
			if bytes.Equal(got, before) {
				what = "the pre-outage"
			}
			t.Fatalf("mirror %d (%s) reads back %s version of the file", j, devs[ds.FfdsDeviceid].addr, what)
		}
	}
}

// TestFlexFilesExportFlags: flex_no_io_thru_mds sets
// FF_FLAGS_NO_IO_THRU_MDS in the export's layouts (without it the flags
// are 0: TestFlexFilesMirrors), and a negative flex_recall_delay is
// refused.
func TestFlexFilesExportFlags(t *testing.T) {
	f := false
	c, err := Start(ctxT(t), Config{
		Dir: t.TempDir(), DataServers: 2, Listen: "127.0.0.1:0", Mirrors: 2,
		Exports: []*server.Export{{Path: "/", RootSquash: &f, Layout: server.LayoutFlexFiles, FlexStripe: server.FlexStripeOff,
			FlexNoIOThruMDS: true, FlexRecallDelay: 5 * time.Second}},
		Lease: 30 * time.Second, InlineMax: -1, HealInterval: time.Hour, Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	s := newFlexSession(t, c, "flex-flags")
	open, fh := s.create("f")
	_, ff := s.mustLayoutGet(fh, open, nfs4.LAYOUTIOMODE4_RW)
	if ff.FflFlags != nfs4.FF_FLAGS_NO_IO_THRU_MDS {
		t.Fatalf("ffl_flags %#x, want FF_FLAGS_NO_IO_THRU_MDS (%#x)", ff.FflFlags, nfs4.FF_FLAGS_NO_IO_THRU_MDS)
	}

	_, err = Start(ctxT(t), Config{
		Dir: t.TempDir(), DataServers: 1, Listen: "127.0.0.1:0",
		Exports: []*server.Export{{Path: "/", Layout: server.LayoutFlexFiles, FlexRecallDelay: -time.Second}},
		Logger:  slog.New(slog.DiscardHandler),
	})
	if err == nil || !strings.Contains(err.Error(), "flex_recall_delay") {
		t.Fatalf("a negative flex_recall_delay: %v, want it refused", err)
	}
}
