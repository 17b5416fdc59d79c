package wiring

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/wiretest"
	"github.com/shoalfs/shoal/internal/xdr"
	"github.com/shoalfs/shoal/server"
)

// Flexible files layouts (RFC 8435) from the MDS, against a real cluster
// on loopback. TestFlexFilesPynfs replays the cases of pynfs's flex group
// (nfs4.1/server41tests/st_flex.py in kofemann/pynfs; pynfs itself does
// not run here), each named by its pynfs code; TestFlexFilesMirrors does
// I/O through a flexfiles layout and checks that the data servers do not
// forward, and that a copy a client reports failing is left out and healed.

// startFlexCluster starts n data servers and an MDS whose one export hands
// out flexfiles layouts, striped inside a mirror or not (Export.FlexStripe),
// with mirrors copies of every stripe unit, and no inline data.
func startFlexCluster(t *testing.T, n, mirrors int, stripe string) *Cluster {
	t.Helper()
	return startFlexClusterInline(t, n, mirrors, stripe, -1)
}

// startFlexClusterInline is startFlexCluster with server.Config.InlineMax
// inlineMax (0: the default, inline data on).
func startFlexClusterInline(t *testing.T, n, mirrors int, stripe string, inlineMax int) *Cluster {
	t.Helper()
	f := false
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := Start(ctx, Config{
		Dir: t.TempDir(), DataServers: n, Listen: "127.0.0.1:0", Mirrors: mirrors,
		Exports:   []*server.Export{{Path: "/", RootSquash: &f, Layout: server.LayoutFlexFiles, FlexStripe: stripe}},
		Lease:     30 * time.Second,
		InlineMax: inlineMax,
		// A copy a client reports failing is healed at the next heal
		// pass, not at once (cluster.Striped.CopyFailed): tests heal
		// with Admin.Kick, so no pass comes between their steps.
		HealInterval: time.Hour,
		Logger:       slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// flexSession is a pynfs "pnfs client session" on the MDS.
type flexSession struct {
	t  *testing.T
	cl *wiretest.Client
}

func newFlexSession(t *testing.T, c *Cluster, owner string) *flexSession {
	t.Helper()
	cl, err := wiretest.Setup(ctxT(t), c.MDS.Addr.String(), []byte(owner))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	return &flexSession{t: t, cl: cl}
}

// flexOpenOp is OPEN (create, unchecked) of name in the current directory,
// without a delegation.
func flexOpenOp(cl *wiretest.Client, name string) nfs4.NfsArgop4 {
	return nfs4.NfsArgop4{Argop: nfs4.OP_OPEN, Opopen: &nfs4.OPEN4args{
		ShareAccess: nfs4.OPEN4_SHARE_ACCESS_BOTH | nfs4.OPEN4_SHARE_ACCESS_WANT_NO_DELEG,
		Owner:       nfs4.OpenOwner4{Clientid: cl.ClientID, Owner: []byte("flex-" + name)},
		Openhow: nfs4.Openflag4{Opentype: nfs4.OPEN4_CREATE, How: &nfs4.Createhow4{
			Mode: nfs4.UNCHECKED4, Createattrs: &nfs4.Fattr4{}}},
		Claim: nfs4.OpenClaim4{Claim: nfs4.CLAIM_NULL, File: ptr(nfs4.Component4(name))},
	}}
}

// create is pynfs's create_file: the open stateid and filehandle.
func (s *flexSession) create(name string) (nfs4.Stateid4, []byte) {
	s.t.Helper()
	res, err := s.cl.Compound(op(nfs4.NfsArgop4{Argop: nfs4.OP_PUTROOTFH}), flexOpenOp(s.cl, name),
		op(nfs4.NfsArgop4{Argop: nfs4.OP_GETFH}))
	if status(s.t, res, err) != nfs4.NFS4_OK {
		s.t.Fatalf("OPEN %s: %v", name, wiretest.Check(res))
	}
	return res.Resarray[2].Opopen.Resok4.Stateid, res.Resarray[3].Opgetfh.Resok4.Object
}

func (s *flexSession) close(fh []byte, sid nfs4.Stateid4) {
	s.t.Helper()
	res, err := s.cl.Compound(putFH(fh), op(nfs4.NfsArgop4{Argop: nfs4.OP_CLOSE, Opclose: &nfs4.CLOSE4args{OpenStateid: sid}}))
	if status(s.t, res, err) != nfs4.NFS4_OK {
		s.t.Fatalf("CLOSE: %v", wiretest.Check(res))
	}
}

func flexLayoutGet(sid nfs4.Stateid4, mode nfs4.Layoutiomode4, off, length, minlength uint64) nfs4.NfsArgop4 {
	return nfs4.NfsArgop4{Argop: nfs4.OP_LAYOUTGET, Oplayoutget: &nfs4.LAYOUTGET4args{
		LogaLayoutType: nfs4.LAYOUT4_FLEX_FILES, LogaIomode: mode, LogaOffset: off,
		LogaLength: length, LogaMinlength: minlength, LogaStateid: sid, LogaMaxcount: 0xffff,
	}}
}

// layoutGet sends LAYOUTGET and returns the status and, on success, the
// layout stateid and the decoded ff_layout4.
func (s *flexSession) layoutGet(fh []byte, sid nfs4.Stateid4, mode nfs4.Layoutiomode4, off, length, minlength uint64) (nfs4.Nfsstat4, nfs4.Stateid4, nfs4.FfLayout4) {
	s.t.Helper()
	res, err := s.cl.Compound(putFH(fh), flexLayoutGet(sid, mode, off, length, minlength))
	if st := status(s.t, res, err); st != nfs4.NFS4_OK {
		return st, nfs4.Stateid4{}, nfs4.FfLayout4{}
	}
	lg := res.Resarray[2].Oplayoutget.LogrResok4
	return nfs4.NFS4_OK, lg.LogrStateid, s.decode(lg.LogrLayout)
}

func (s *flexSession) decode(ls []nfs4.Layout4) nfs4.FfLayout4 {
	s.t.Helper()
	if len(ls) != 1 || ls[0].LoContent.LocType != nfs4.LAYOUT4_FLEX_FILES {
		s.t.Fatalf("layouts %+v, want one LAYOUT4_FLEX_FILES", ls)
	}
	var ff nfs4.FfLayout4
	if err := xdr.Unmarshal(ls[0].LoContent.LocBody, &ff); err != nil {
		s.t.Fatalf("ff_layout4: %v", err)
	}
	return ff
}

func (s *flexSession) mustLayoutGet(fh []byte, sid nfs4.Stateid4, mode nfs4.Layoutiomode4) (nfs4.Stateid4, nfs4.FfLayout4) {
	s.t.Helper()
	st, ls, ff := s.layoutGet(fh, sid, mode, 0, ^uint64(0), 8192)
	if st != nfs4.NFS4_OK {
		s.t.Fatalf("LAYOUTGET: %v", st)
	}
	return ls, ff
}

func layoutReturn(sid nfs4.Stateid4, body []byte) nfs4.NfsArgop4 {
	return nfs4.NfsArgop4{Argop: nfs4.OP_LAYOUTRETURN, Oplayoutreturn: &nfs4.LAYOUTRETURN4args{
		LoraLayoutType: nfs4.LAYOUT4_FLEX_FILES, LoraIomode: nfs4.LAYOUTIOMODE4_ANY,
		LoraLayoutreturn: nfs4.Layoutreturn4{LrReturntype: nfs4.LAYOUTRETURN4_FILE, LrLayout: &nfs4.LayoutreturnFile4{
			LrfOffset: 0, LrfLength: ^uint64(0), LrfStateid: sid, LrfBody: body}},
	}}
}

func (s *flexSession) layoutReturn(fh []byte, sid nfs4.Stateid4, body []byte) nfs4.Nfsstat4 {
	s.t.Helper()
	res, err := s.cl.Compound(putFH(fh), layoutReturn(sid, body))
	return status(s.t, res, err)
}

func (s *flexSession) deviceInfo(dev nfs4.Deviceid4) nfs4.FfDeviceAddr4 {
	s.t.Helper()
	res, err := s.cl.Compound(op(nfs4.NfsArgop4{Argop: nfs4.OP_GETDEVICEINFO, Opgetdeviceinfo: &nfs4.GETDEVICEINFO4args{
		GdiaDeviceId: dev, GdiaLayoutType: nfs4.LAYOUT4_FLEX_FILES, GdiaMaxcount: 0xffffffff}}))
	if status(s.t, res, err) != nfs4.NFS4_OK {
		s.t.Fatalf("GETDEVICEINFO: %v", wiretest.Check(res))
	}
	gda := res.Resarray[1].Opgetdeviceinfo.GdirResok4.GdirDeviceAddr
	if gda.DaLayoutType != nfs4.LAYOUT4_FLEX_FILES {
		s.t.Fatalf("device of type %v", gda.DaLayoutType)
	}
	var da nfs4.FfDeviceAddr4
	if err := xdr.Unmarshal(gda.DaAddrBody, &da); err != nil {
		s.t.Fatalf("ff_device_addr4: %v", err)
	}
	return da
}

func wantSeqid(t *testing.T, sid nfs4.Stateid4, seqid uint32) {
	t.Helper()
	if sid.Seqid != seqid {
		t.Fatalf("layout stateid seqid %d, want %d", sid.Seqid, seqid)
	}
}

// lastDS is pynfs's "assume one mirror/storage device": the last data
// server of the last mirror.
func lastDS(t *testing.T, ff nfs4.FfLayout4) nfs4.FfDataServer4 {
	t.Helper()
	if len(ff.FflMirrors) == 0 || len(ff.FflMirrors[len(ff.FflMirrors)-1].FfmDataServers) == 0 {
		t.Fatalf("layout without data servers: %+v", ff)
	}
	m := ff.FflMirrors[len(ff.FflMirrors)-1]
	return m.FfmDataServers[len(m.FfmDataServers)-1]
}

// TestFlexFilesPynfs covers pynfs's flex group, case by case, on a
// cluster of 3 data servers with 2 copies of every stripe unit: with the
// server's default inline data (pynfs's FFLS1 asks for a layout in the
// OPEN that creates a file, which a client that is not Linux is granted:
// ops_layout.go, declineOnOpen) and without.
func TestFlexFilesPynfs(t *testing.T) {
	for _, tc := range []struct {
		name      string
		inlineMax int
	}{{"inline", 0}, {"noinline", -1}} {
		t.Run(tc.name, func(t *testing.T) {
			testFlexFilesPynfs(t, startFlexClusterInline(t, 3, 2, server.FlexStripeAuto, tc.inlineMax))
		})
	}
}

func testFlexFilesPynfs(t *testing.T, c *Cluster) {
	rw, rd := nfs4.LAYOUTIOMODE4_RW, nfs4.LAYOUTIOMODE4_READ
	all := ^uint64(0)

	t.Run("FFST1", func(t *testing.T) {
		// Layout stateid seqids: 1 for the first LAYOUTGET under an
		// open stateid, one more with each LAYOUTGET after.
		s := newFlexSession(t, c, t.Name())
		open, fh := s.create("ffst1")
		st, ls, _ := s.layoutGet(fh, open, rw, 0, 8192, 8192)
		if st != nfs4.NFS4_OK {
			t.Fatalf("LAYOUTGET: %v", st)
		}
		wantSeqid(t, ls, 1)
		for i := range 6 {
			if st, ls, _ = s.layoutGet(fh, ls, rw, uint64(i+1)*8192, 8192, 8192); st != nfs4.NFS4_OK {
				t.Fatalf("LAYOUTGET %d: %v", i+2, st)
			}
			wantSeqid(t, ls, uint32(i+2))
		}
		s.close(fh, open)
	})

	t.Run("FFGLO1", func(t *testing.T) {
		// A READ layout that decodes as ff_layout4.
		s := newFlexSession(t, c, t.Name())
		open, fh := s.create("ffglo1")
		if st, _, _ := s.layoutGet(fh, open, rd, 0, all, 4196); st != nfs4.NFS4_OK {
			t.Fatalf("LAYOUTGET: %v", st)
		}
		s.close(fh, open)
	})

	t.Run("FFLOR1", func(t *testing.T) {
		s := newFlexSession(t, c, t.Name())
		open, fh := s.create("fflor1")
		st, ls, _ := s.layoutGet(fh, open, rd, 0, all, 4196)
		if st != nfs4.NFS4_OK {
			t.Fatalf("LAYOUTGET: %v", st)
		}
		if st := s.layoutReturn(fh, ls, nil); st != nfs4.NFS4_OK {
			t.Fatalf("LAYOUTRETURN: %v", st)
		}
		s.close(fh, open)
	})

	t.Run("FFLOOS", func(t *testing.T) {
		// LAYOUTGET with an older layout seqid is served; LAYOUTRETURN
		// with one is NFS4ERR_OLD_STATEID.
		s := newFlexSession(t, c, t.Name())
		open, fh := s.create("ffloos")
		ls, _ := s.mustLayoutGet(fh, open, rw)
		wantSeqid(t, ls, 1)
		ls2, _ := s.mustLayoutGet(fh, ls, rw)
		wantSeqid(t, ls2, 2)
		ls3, _ := s.mustLayoutGet(fh, ls, rw)
		wantSeqid(t, ls3, 3)
		if st := s.layoutReturn(fh, ls, nil); st != nfs4.NFS4ERR_OLD_STATEID {
			t.Fatalf("LAYOUTRETURN with an old seqid: %v, want NFS4ERR_OLD_STATEID", st)
		}
		if st := s.layoutReturn(fh, ls3, nil); st != nfs4.NFS4_OK {
			t.Fatalf("LAYOUTRETURN with the current seqid: %v", st)
		}
		s.close(fh, open)
	})

	t.Run("FFLG2", func(t *testing.T) {
		// 1000 LAYOUTGETs alternating RW and READ, seqids in step.
		s := newFlexSession(t, c, t.Name())
		open, fh := s.create("fflg2")
		ls := open
		for i := range 1000 {
			mode := rw
			if i%2 == 1 {
				mode = rd
			}
			var st nfs4.Nfsstat4
			if st, ls, _ = s.layoutGet(fh, ls, mode, 0, all, 8192); st != nfs4.NFS4_OK {
				t.Fatalf("LAYOUTGET %d: %v", i+1, st)
			}
			wantSeqid(t, ls, uint32(i+1))
		}
		if st := s.layoutReturn(fh, ls, nil); st != nfs4.NFS4_OK {
			t.Fatalf("LAYOUTRETURN: %v", st)
		}
		s.close(fh, open)
	})

	t.Run("FFGDI1", func(t *testing.T) {
		s := newFlexSession(t, c, t.Name())
		open, fh := s.create("ffgdi1")
		ls, ff := s.mustLayoutGet(fh, open, rw)
		wantSeqid(t, ls, 1)
		da := s.deviceInfo(lastDS(t, ff).FfdsDeviceid)
		if len(da.FfdaNetaddrs) == 0 || len(da.FfdaVersions) != 1 {
			t.Fatalf("ff_device_addr4 %+v", da)
		}
		if v := da.FfdaVersions[0]; v.FfdvVersion != 4 || v.FfdvMinorversion != 1 || !v.FfdvTightlyCoupled || v.FfdvRsize == 0 || v.FfdvWsize == 0 {
			t.Fatalf("ff_device_versions4 %+v, want NFSv4.1, tightly coupled", v)
		}
		if st := s.layoutReturn(fh, ls, nil); st != nfs4.NFS4_OK {
			t.Fatalf("LAYOUTRETURN: %v", st)
		}
		s.close(fh, open)
	})

	t.Run("FFLA1", func(t *testing.T) {
		// A RW and a READ layout: the same group, another user.
		s := newFlexSession(t, c, t.Name())
		open, fh := s.create("ffla1")
		ls, ff := s.mustLayoutGet(fh, open, rw)
		wantSeqid(t, ls, 1)
		dsRW := lastDS(t, ff)
		ls, ff = s.mustLayoutGet(fh, ls, rd)
		wantSeqid(t, ls, 2)
		dsRD := lastDS(t, ff)
		if bytes.Equal(dsRW.FfdsUser, dsRD.FfdsUser) {
			t.Errorf("RW and READ layouts name the same user %q", dsRW.FfdsUser)
		}
		if !bytes.Equal(dsRW.FfdsGroup, dsRD.FfdsGroup) {
			t.Errorf("RW layout group %q, READ layout group %q", dsRW.FfdsGroup, dsRD.FfdsGroup)
		}
		s.close(fh, open)
	})

	t.Run("FFLS1", func(t *testing.T) {
		// 20 files: OPEN + LAYOUTGET (current stateid) in one
		// compound, GETDEVICEINFO, then LAYOUTRETURN carrying
		// ff_iostats4 + CLOSE in one compound.
		s := newFlexSession(t, c, t.Name())
		for i := range 20 {
			name := fmt.Sprintf("ffls1-%d", i)
			res, err := s.cl.Compound(op(nfs4.NfsArgop4{Argop: nfs4.OP_PUTROOTFH}), flexOpenOp(s.cl, name),
				op(nfs4.NfsArgop4{Argop: nfs4.OP_GETFH}), flexLayoutGet(currentStateid, rw, 0, all, 4196))
			if status(t, res, err) != nfs4.NFS4_OK {
				t.Fatalf("OPEN+LAYOUTGET %s: %v", name, wiretest.Check(res))
			}
			open, fh := res.Resarray[2].Opopen.Resok4.Stateid, res.Resarray[3].Opgetfh.Resok4.Object
			lg := res.Resarray[4].Oplayoutget.LogrResok4
			wantSeqid(t, lg.LogrStateid, 1)
			ds := lastDS(t, s.decode(lg.LogrLayout))
			da := s.deviceInfo(ds.FfdsDeviceid)
			lat := nfs4.FfIoLatency4{FfilOpsRequested: 1, FfilBytesRequested: 16384, FfilOpsCompleted: 1, FfilBytesCompleted: 16384,
				FfilTotalBusyTime: nfs4.Nfstime4{Nseconds: uint32(93089 + i)}, FfilAggregateCompletionTime: nfs4.Nfstime4{Nseconds: uint32(93089 + i)}}
			lr := nfs4.FfLayoutreturn4{FflrIostatsReport: []nfs4.FfIostats4{{
				FfisOffset: 0, FfisLength: 16384, FfisStateid: lg.LogrStateid,
				FfisWrite: nfs4.IoInfo4{IiCount: 1, IiBytes: 16384}, FfisDeviceid: ds.FfdsDeviceid,
				FfisLayoutupdate: nfs4.FfLayoutupdate4{FflAddr: da.FfdaNetaddrs[len(da.FfdaNetaddrs)-1], FflFhandle: ds.FfdsFhVers[0],
					FflWrite: lat, FflDuration: nfs4.Nfstime4{Nseconds: 3387666}, FflLocal: true},
			}}}
			res, err = s.cl.Compound(putFH(fh), layoutReturn(lg.LogrStateid, xdr.Marshal(&lr)),
				op(nfs4.NfsArgop4{Argop: nfs4.OP_CLOSE, Opclose: &nfs4.CLOSE4args{OpenStateid: open}}))
			if status(t, res, err) != nfs4.NFS4_OK {
				t.Fatalf("LAYOUTRETURN+CLOSE %s: %v", name, wiretest.Check(res))
			}
		}
	})

	// FFLS2–4 send LAYOUTSTATS with running totals that reset (FFLS2),
	// grow (FFLS3) and carry one stat twice the collection period long
	// (FFLS4); the server takes each. The rows are pynfs's shape (bytes
	// and ops read and written, busy and completion times in ns), fewer
	// and generated, and are sent without pynfs's sleeps.
	for _, tc := range []struct {
		code  string
		reset bool
		long  bool
	}{{"FFLS2", true, false}, {"FFLS3", false, false}, {"FFLS4", false, true}} {
		t.Run(tc.code, func(t *testing.T) {
			s := newFlexSession(t, c, t.Name())
			open, fh := s.create(tc.code)
			ls, ff := s.mustLayoutGet(fh, open, rw)
			wantSeqid(t, ls, 1)
			ds := lastDS(t, ff)
			da := s.deviceInfo(ds.FfdsDeviceid)
			for i := range 20 {
				k := uint64(i + 1)
				if tc.reset && i >= 7 {
					k = uint64(i - 6) // totals start again
				}
				busy := k * 15_000_000_000
				if tc.long && i == 10 {
					busy *= 2
				}
				lat := func(b uint64) nfs4.FfIoLatency4 {
					return nfs4.FfIoLatency4{FfilOpsRequested: k * 1000, FfilBytesRequested: b, FfilOpsCompleted: k*1000 - 1,
						FfilBytesCompleted: b - 4096, FfilTotalBusyTime: nfs4.Nfstime4{Seconds: int64(busy / 1e9), Nseconds: uint32(busy % 1e9)},
						FfilAggregateCompletionTime: nfs4.Nfstime4{Seconds: int64(busy / 1e8)}}
				}
				lu := nfs4.FfLayoutupdate4{FflAddr: da.FfdaNetaddrs[len(da.FfdaNetaddrs)-1], FflFhandle: ds.FfdsFhVers[0],
					FflRead: lat(k * 756789248), FflWrite: lat(k * 252579840), FflDuration: nfs4.Nfstime4{Seconds: 15}, FflLocal: true}
				res, err := s.cl.Compound(putFH(fh), op(nfs4.NfsArgop4{Argop: nfs4.OP_LAYOUTSTATS, Oplayoutstats: &nfs4.LAYOUTSTATS4args{
					LsaOffset: 0, LsaLength: all, LsaStateid: ls, LsaDeviceid: ds.FfdsDeviceid,
					LsaLayoutupdate: nfs4.Layoutupdate4{LouType: nfs4.LAYOUT4_FLEX_FILES, LouBody: xdr.Marshal(&lu)},
				}}))
				if status(t, res, err) != nfs4.NFS4_OK {
					t.Fatalf("LAYOUTSTATS %d: %v", i, wiretest.Check(res))
				}
			}
			if st := s.layoutReturn(fh, ls, nil); st != nfs4.NFS4_OK {
				t.Fatalf("LAYOUTRETURN: %v", st)
			}
			s.close(fh, open)
		})
	}

	// FFLOR<error><op>: LAYOUTRETURN carrying an ff_ioerr4 on the first
	// data server of the first mirror, then a second LAYOUTGET that may
	// be served, delayed or refused with that error, and a LAYOUTRETURN.
	// After NOSPC or FBIG on a WRITE the next LAYOUTGET is served.
	for _, tc := range []struct {
		code   string
		mode   nfs4.Layoutiomode4
		err    nfs4.Nfsstat4
		opnum  nfs4.NfsOpnum4
		second nfs4.Layoutiomode4
		strict bool // the second LAYOUTGET must succeed
	}{
		{"FFLORNXIOREAD", rd, nfs4.NFS4ERR_NXIO, nfs4.OP_READ, rd, false},
		{"FFLORNXIOWRITE", rw, nfs4.NFS4ERR_NXIO, nfs4.OP_WRITE, rw, false},
		{"FFLORSTALEREAD", rd, nfs4.NFS4ERR_STALE, nfs4.OP_READ, rw, false},
		{"FFLORSTALEWRITE", rw, nfs4.NFS4ERR_STALE, nfs4.OP_WRITE, rw, false},
		{"FFLORIOREAD", rd, nfs4.NFS4ERR_IO, nfs4.OP_READ, rw, false},
		{"FFLORIOWRITE", rw, nfs4.NFS4ERR_IO, nfs4.OP_WRITE, rw, false},
		{"FFLORSERVERFAULTREAD", rd, nfs4.NFS4ERR_SERVERFAULT, nfs4.OP_READ, rw, false},
		{"FFLORSERVERFAULTWRITE", rw, nfs4.NFS4ERR_SERVERFAULT, nfs4.OP_WRITE, rw, false},
		{"FFLORNOSPC-READ", rw, nfs4.NFS4ERR_NOSPC, nfs4.OP_WRITE, rd, true},
		{"FFLORNOSPC-WRITE", rw, nfs4.NFS4ERR_NOSPC, nfs4.OP_WRITE, rw, false},
		{"FFLORFBIG-READ", rw, nfs4.NFS4ERR_FBIG, nfs4.OP_WRITE, rw, true},
		{"FFLORFBIG-WRITE", rw, nfs4.NFS4ERR_FBIG, nfs4.OP_WRITE, rw, false},
		{"FFLORACCESSREAD", rd, nfs4.NFS4ERR_ACCESS, nfs4.OP_READ, rw, false},
		{"FFLORACCESSWRITE", rw, nfs4.NFS4ERR_ACCESS, nfs4.OP_WRITE, rw, false},
		{"FFLORDELAYREAD", rd, nfs4.NFS4ERR_DELAY, nfs4.OP_READ, rw, false},
		{"FFLORDELAYWRITE", rw, nfs4.NFS4ERR_DELAY, nfs4.OP_WRITE, rw, false},
	} {
		t.Run(tc.code, func(t *testing.T) {
			s := newFlexSession(t, c, t.Name())
			open, fh := s.create(tc.code)
			flexGetReturnError(t, s, fh, open, tc.mode, tc.err, tc.opnum)
			allowed := []nfs4.Nfsstat4{nfs4.NFS4_OK, nfs4.NFS4ERR_DELAY, tc.err}
			if tc.strict {
				allowed = allowed[:1]
			}
			flexGetReturn(t, s, fh, open, tc.second, allowed)
			s.close(fh, open)
		})
	}

	t.Run("FFLOR1K", func(t *testing.T) {
		// LAYOUTGET and LAYOUTRETURN over and over, every tenth
		// return with an error report (pynfs: 1000 rounds; 200 here).
		s := newFlexSession(t, c, t.Name())
		open, fh := s.create("fflor1k")
		for i := range 200 {
			if i%10 == 0 {
				flexGetReturnError(t, s, fh, open, rw, nfs4.NFS4ERR_ACCESS, nfs4.OP_WRITE)
				flexGetReturn(t, s, fh, open, rw, []nfs4.Nfsstat4{nfs4.NFS4_OK, nfs4.NFS4ERR_DELAY, nfs4.NFS4ERR_ACCESS})
			} else {
				flexGetReturn(t, s, fh, open, rw, []nfs4.Nfsstat4{nfs4.NFS4_OK})
			}
		}
		s.close(fh, open)
	})
}

// flexGetReturn is pynfs's layoutget_return without an error: LAYOUTGET
// answered with one of allowed, then LAYOUTRETURN of what was granted.
func flexGetReturn(t *testing.T, s *flexSession, fh []byte, open nfs4.Stateid4, mode nfs4.Layoutiomode4, allowed []nfs4.Nfsstat4) {
	t.Helper()
	st, ls, _ := s.layoutGet(fh, open, mode, 0, ^uint64(0), 4196)
	ok := false
	for _, a := range allowed {
		ok = ok || st == a
	}
	if !ok {
		t.Fatalf("LAYOUTGET: %v, want one of %v", st, allowed)
	}
	if st != nfs4.NFS4_OK {
		return
	}
	if st := s.layoutReturn(fh, ls, nil); st != nfs4.NFS4_OK {
		t.Fatalf("LAYOUTRETURN: %v", st)
	}
}

// flexGetReturnError is pynfs's layoutget_return with an error: the
// LAYOUTRETURN carries an ff_ioerr4 naming the first data server of the
// first mirror.
func flexGetReturnError(t *testing.T, s *flexSession, fh []byte, open nfs4.Stateid4, mode nfs4.Layoutiomode4, e nfs4.Nfsstat4, opnum nfs4.NfsOpnum4) {
	t.Helper()
	st, ls, ff := s.layoutGet(fh, open, mode, 0, ^uint64(0), 4196)
	if st != nfs4.NFS4_OK {
		t.Fatalf("LAYOUTGET: %v", st)
	}
	lr := nfs4.FfLayoutreturn4{FflrIoerrReport: []nfs4.FfIoerr4{{
		FfieOffset: 0, FfieLength: ^uint64(0), FfieStateid: ls,
		FfieErrors: []nfs4.DeviceError4{{DeDeviceid: ff.FflMirrors[0].FfmDataServers[0].FfdsDeviceid, DeStatus: e, DeOpnum: opnum}},
	}}}
	if st := s.layoutReturn(fh, ls, xdr.Marshal(&lr)); st != nfs4.NFS4_OK {
		t.Fatalf("LAYOUTRETURN with an error report: %v", st)
	}
}

// flexDS is a client session on one data server of a flexfiles layout.
type flexDS struct {
	addr string
	cl   *wiretest.Client
}

func (d *flexDS) write(t *testing.T, fh []byte, sid nfs4.Stateid4, off uint64, data []byte) nfs4.Nfsstat4 {
	t.Helper()
	res, err := d.cl.Compound(putFH(fh), op(nfs4.NfsArgop4{Argop: nfs4.OP_WRITE, Opwrite: &nfs4.WRITE4args{
		Stateid: sid, Offset: off, Stable: nfs4.UNSTABLE4, Data: data}}))
	return status(t, res, err)
}

func (d *flexDS) read(t *testing.T, fh []byte, sid nfs4.Stateid4, off uint64, n uint32) []byte {
	t.Helper()
	res, err := d.cl.Compound(putFH(fh), op(nfs4.NfsArgop4{Argop: nfs4.OP_READ, Opread: &nfs4.READ4args{
		Stateid: sid, Offset: off, Count: n}}))
	if status(t, res, err) != nfs4.NFS4_OK {
		t.Fatalf("READ at %s: %v", d.addr, wiretest.Check(res))
	}
	return res.Resarray[2].Opread.Resok4.Data
}

func (d *flexDS) commit(t *testing.T, fh []byte) {
	t.Helper()
	res, err := d.cl.Compound(putFH(fh), op(nfs4.NfsArgop4{Argop: nfs4.OP_COMMIT, Opcommit: &nfs4.COMMIT4args{}}))
	if status(t, res, err) != nfs4.NFS4_OK {
		t.Fatalf("COMMIT at %s: %v", d.addr, wiretest.Check(res))
	}
}

// flexDevices resolves every device of ff to a session on its data
// server (GETDEVICEINFO), one session per address.
func flexDevices(t *testing.T, s *flexSession, ff nfs4.FfLayout4, byAddr map[string]*flexDS) map[nfs4.Deviceid4]*flexDS {
	t.Helper()
	out := map[nfs4.Deviceid4]*flexDS{}
	for _, m := range ff.FflMirrors {
		for _, ds := range m.FfmDataServers {
			if out[ds.FfdsDeviceid] != nil {
				continue
			}
			da := s.deviceInfo(ds.FfdsDeviceid)
			if len(da.FfdaNetaddrs) != 1 {
				t.Fatalf("device with %d addresses", len(da.FfdaNetaddrs))
			}
			addr := fromUaddr(t, da.FfdaNetaddrs[0].NaRAddr)
			if byAddr[addr] == nil {
				cl, err := wiretest.Setup(ctxT(t), addr, []byte("flex-ds-client"))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { cl.Close() })
				byAddr[addr] = &flexDS{addr: addr, cl: cl}
			}
			out[ds.FfdsDeviceid] = byAddr[addr]
		}
	}
	return out
}

// TestFlexFilesMirrors writes a file through a flexfiles layout with 2
// copies striped over 3 data servers, the client writing every mirror:
// each data server receives exactly what the client sent it and forwards
// nothing (its own counters), and every copy reads back. A LAYOUTERROR on
// one copy then marks it stale, recalls the layout and counts in the
// metrics; the next layout leaves the copy out, its data server refuses
// I/O under the flexfiles handle, and after healing the copy is back in
// the layout with the data.
func TestFlexFilesMirrors(t *testing.T) {
	const unit = 64 << 10
	reg := prometheus.NewRegistry()
	f := false
	c, err := Start(ctxT(t), Config{
		Dir: t.TempDir(), DataServers: 3, Listen: "127.0.0.1:0", Mirrors: 2, StripeUnit: unit,
		Exports: []*server.Export{{Path: "/", RootSquash: &f, Layout: server.LayoutFlexFiles, FlexStripe: server.FlexStripeOn}},
		Lease:   30 * time.Second, InlineMax: -1, HealInterval: time.Hour, Metrics: reg,
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	s := newFlexSession(t, c, "flex-mirrors")
	open, fh := s.create("m")
	ls, ff := s.mustLayoutGet(fh, open, nfs4.LAYOUTIOMODE4_RW)
	if len(ff.FflMirrors) != 2 || ff.FflStripeUnit != unit || ff.FflFlags != 0 {
		t.Fatalf("layout: %d mirrors, stripe unit %d, flags %#x; want 2, %d, 0", len(ff.FflMirrors), ff.FflStripeUnit, ff.FflFlags, unit)
	}
	for j, m := range ff.FflMirrors {
		if len(m.FfmDataServers) != 3 {
			t.Fatalf("mirror %d stripes over %d data servers, want 3", j, len(m.FfmDataServers))
		}
		for _, ds := range m.FfmDataServers {
			if ds.FfdsStateid != ls || len(ds.FfdsFhVers) != 1 {
				t.Fatalf("mirror %d data server: stateid %+v (layout %+v), %d filehandles", j, ds.FfdsStateid, ls, len(ds.FfdsFhVers))
			}
		}
	}
	byAddr := map[string]*flexDS{}
	devs := flexDevices(t, s, ff, byAddr)
	// Stripe index i of every mirror holds the same units, on two
	// different data servers.
	for i := range 3 {
		if a, b := devs[ff.FflMirrors[0].FfmDataServers[i].FfdsDeviceid], devs[ff.FflMirrors[1].FfmDataServers[i].FfdsDeviceid]; a == b {
			t.Fatalf("stripe index %d: both mirrors on %s", i, a.addr)
		}
	}
	agentOf := map[string]int{}
	for i, d := range c.DS {
		agentOf[d.Addr.String()] = i
	}
	before := make([][2]uint64, len(c.DS))
	for i, d := range c.DS {
		st := d.Agent.Stats()
		before[i] = [2]uint64{st.ClientWriteBytes, st.ReplicaWriteBytes}
	}

	// 6 units, each written by the client to the data server of its
	// stripe index in both mirrors.
	data := randomBytes(t, 6*unit)
	sent := make([]uint64, len(c.DS))
	for k := range 6 {
		for _, m := range ff.FflMirrors {
			ds := m.FfmDataServers[k%3]
			d := devs[ds.FfdsDeviceid]
			if st := d.write(t, ds.FfdsFhVers[0], ds.FfdsStateid, uint64(k*unit), data[k*unit:(k+1)*unit]); st != nfs4.NFS4_OK {
				t.Fatalf("WRITE unit %d at %s: %v", k, d.addr, st)
			}
			sent[agentOf[d.addr]] += unit
		}
	}
	for _, d := range byAddr {
		d.commit(t, ff.FflMirrors[0].FfmDataServers[0].FfdsFhVers[0])
	}
	for i, d := range c.DS {
		st := d.Agent.Stats()
		got, fwd := st.ClientWriteBytes-before[i][0], st.ReplicaWriteBytes-before[i][1]
		t.Logf("data server %s: %d bytes from the client (sent %d), %d forwarded to it", d.Addr, got, sent[i], fwd)
		if got != sent[i] || fwd != 0 {
			t.Errorf("data server %s: took %d bytes from the client and %d from peers; the client sent it %d and nothing may be forwarded",
				d.Addr, got, fwd, sent[i])
		}
		// The same counters, as the data server exports them.
		wantMetric(t, reg, "shoal_ds_replica_write_bytes_total", map[string]string{"instance": d.Agent.ID()}, 0)
		wantMetric(t, reg, "shoal_ds_client_write_bytes_total", map[string]string{"instance": d.Agent.ID()}, float64(sent[i]))
	}
	res, err := s.cl.Compound(putFH(fh), op(nfs4.NfsArgop4{Argop: nfs4.OP_LAYOUTCOMMIT, Oplayoutcommit: &nfs4.LAYOUTCOMMIT4args{
		LocaLength: uint64(len(data)), LocaStateid: ls,
		LocaLastWriteOffset: nfs4.Newoffset4{NoNewoffset: true, NoOffset: ptr(uint64(len(data) - 1))},
		LocaLayoutupdate:    nfs4.Layoutupdate4{LouType: nfs4.LAYOUT4_FLEX_FILES},
	}}))
	if status(t, res, err) != nfs4.NFS4_OK {
		t.Fatalf("LAYOUTCOMMIT: %v", wiretest.Check(res))
	}
	// Every copy holds its units.
	readMirror := func(m nfs4.FfMirror4, devs map[nfs4.Deviceid4]*flexDS, sid nfs4.Stateid4) []byte {
		var out []byte
		for k := range 6 {
			ds := m.FfmDataServers[k%len(m.FfmDataServers)]
			out = append(out, devs[ds.FfdsDeviceid].read(t, ds.FfdsFhVers[0], sid, uint64(k*unit), unit)...)
		}
		return out
	}
	for j, m := range ff.FflMirrors {
		if got := readMirror(m, devs, ls); !bytes.Equal(got, data) {
			t.Fatalf("mirror %d reads back %d bytes that differ from what was written", j, len(got))
		}
	}

	// LAYOUTERROR: the client could not write the copy of stripe index
	// 0 in mirror 1.
	bad := ff.FflMirrors[1].FfmDataServers[0]
	badDS := devs[bad.FfdsDeviceid]
	badID := c.DS[agentOf[badDS.addr]].Agent.ID()
	res, err = s.cl.Compound(putFH(fh), op(nfs4.NfsArgop4{Argop: nfs4.OP_LAYOUTERROR, Oplayouterror: &nfs4.LAYOUTERROR4args{
		LeaOffset: 0, LeaLength: unit, LeaStateid: ls,
		LeaErrors: []nfs4.DeviceError4{{DeDeviceid: bad.FfdsDeviceid, DeStatus: nfs4.NFS4ERR_NXIO, DeOpnum: nfs4.OP_WRITE}},
	}}))
	if status(t, res, err) != nfs4.NFS4_OK {
		t.Fatalf("LAYOUTERROR: %v", wiretest.Check(res))
	}
	ino := inoOf(t, c, "m")
	m, _, err := c.MDS.Striped.FileMap(ctxT(t), ino)
	if err != nil || !m.IsStale(badID) {
		t.Fatalf("after LAYOUTERROR on %s: map %+v, %v; want that copy stale", badID, m, err)
	}
	waitFor(t, "CB_LAYOUTRECALL", func() bool { return hasLayoutRecall(s.cl, fh) })
	wantMetric(t, reg, "shoal_pnfs_layout_errors_total", map[string]string{"ds": badID, "status": "NFS4ERR_NXIO", "op": "WRITE"}, 1)
	wantMetric(t, reg, "shoal_pnfs_flex_copies_staled_total", map[string]string{"ds": badID, "reason": "client_report"}, 1)

	// The stale copy's data server refuses the flexfiles handle, even
	// under the layout that named it.
	if st := badDS.write(t, bad.FfdsFhVers[0], ls, 0, data[:unit]); st != nfs4.NFS4ERR_PNFS_NO_LAYOUT {
		t.Fatalf("WRITE to the stale copy: %v, want NFS4ERR_PNFS_NO_LAYOUT", st)
	}
	// The stale data server holds copies of two of the three stripe
	// indexes; the third still has two good copies, and a layout for
	// writing must name both (or one would miss the writes while
	// counting as good): 2 mirrors, the stripe indexes of the stale
	// copy naming their one good copy in both. A layout for reading
	// has one mirror. Neither names the stale copy.
	waitFor(t, "a write layout without the stale copy", func() bool {
		st, nls, nff := s.layoutGet(fh, open, nfs4.LAYOUTIOMODE4_RW, 0, ^uint64(0), 0)
		if st != nfs4.NFS4_OK {
			return false
		}
		ls, ff = nls, nff
		return true
	})
	if len(ff.FflMirrors) != 2 {
		t.Fatalf("write layout after the error: %d mirrors, want 2", len(ff.FflMirrors))
	}
	devs = flexDevices(t, s, ff, byAddr)
	twoCopies := 0
	for i := range 3 {
		a, b := devs[ff.FflMirrors[0].FfmDataServers[i].FfdsDeviceid], devs[ff.FflMirrors[1].FfmDataServers[i].FfdsDeviceid]
		if a == badDS || b == badDS {
			t.Fatalf("stripe index %d of the write layout names the stale copy on %s", i, badDS.addr)
		}
		if a != b {
			twoCopies++
		}
	}
	if twoCopies != 1 {
		t.Fatalf("write layout: %d stripe indexes name two different copies, want 1 (the one the stale data server holds no copy of)", twoCopies)
	}
	waitFor(t, "a read layout without the stale copy", func() bool {
		st, nls, nff := s.layoutGet(fh, open, nfs4.LAYOUTIOMODE4_READ, 0, ^uint64(0), 0)
		if st != nfs4.NFS4_OK {
			return false
		}
		ls, ff = nls, nff
		return true
	})
	if len(ff.FflMirrors) != 1 {
		t.Fatalf("layout after the error: %d mirrors, want 1", len(ff.FflMirrors))
	}
	devs = flexDevices(t, s, ff, byAddr)
	for _, ds := range ff.FflMirrors[0].FfmDataServers {
		if devs[ds.FfdsDeviceid] == badDS {
			t.Fatalf("the layout names the stale copy on %s", badDS.addr)
		}
	}

	// The other copy of the same units is the last good one: a report
	// that a WRITE to it failed cannot take it out of service, so the
	// MDS must not answer NFS4_OK (a client takes that as leave to count
	// its write done without the copy); nor for a write failure that is
	// about the client's state rather than the copy. A READ failure
	// changes no copy's data and is answered NFS4_OK.
	last := ff.FflMirrors[0].FfmDataServers[0]
	lastID := c.DS[agentOf[devs[last.FfdsDeviceid].addr]].Agent.ID()
	for _, tc := range []struct {
		name   string
		status nfs4.Nfsstat4
		op     nfs4.NfsOpnum4
		want   nfs4.Nfsstat4
	}{
		{"WRITE to the last good copy", nfs4.NFS4ERR_NXIO, nfs4.OP_WRITE, nfs4.NFS4ERR_INVAL},
		{"COMMIT to the last good copy", nfs4.NFS4ERR_IO, nfs4.OP_COMMIT, nfs4.NFS4ERR_INVAL},
		{"WRITE refused for the client's state", nfs4.NFS4ERR_BAD_STATEID, nfs4.OP_WRITE, nfs4.NFS4ERR_INVAL},
		{"READ from the last good copy", nfs4.NFS4ERR_NXIO, nfs4.OP_READ, nfs4.NFS4_OK},
	} {
		res, err = s.cl.Compound(putFH(fh), op(nfs4.NfsArgop4{Argop: nfs4.OP_LAYOUTERROR, Oplayouterror: &nfs4.LAYOUTERROR4args{
			LeaOffset: 0, LeaLength: unit, LeaStateid: ls,
			LeaErrors: []nfs4.DeviceError4{{DeDeviceid: last.FfdsDeviceid, DeStatus: tc.status, DeOpnum: tc.op}},
		}}))
		if got := status(t, res, err); got != tc.want {
			t.Fatalf("%s: LAYOUTERROR answered %v, want %v", tc.name, got, tc.want)
		}
		if m, _, err := c.MDS.Striped.FileMap(ctxT(t), ino); err != nil || m.IsStale(lastID) {
			t.Fatalf("%s: map %+v, %v; the last good copy on %s must stay good", tc.name, m, err, lastID)
		}
	}

	// Healing brings the copy back: two mirrors again, each with the data.
	c.MDS.Admin.Kick()
	waitFor(t, "the copy healed", func() bool {
		m, _, err := c.MDS.Striped.FileMap(ctxT(t), ino)
		return err == nil && !m.Degraded()
	})
	waitFor(t, "a layout with both copies", func() bool {
		st, nls, nff := s.layoutGet(fh, open, nfs4.LAYOUTIOMODE4_RW, 0, ^uint64(0), 0)
		if st != nfs4.NFS4_OK {
			return false
		}
		ls, ff = nls, nff
		return len(ff.FflMirrors) == 2
	})
	devs = flexDevices(t, s, ff, byAddr)
	for j, m := range ff.FflMirrors {
		if got := readMirror(m, devs, ls); !bytes.Equal(got, data) {
			t.Fatalf("healed: mirror %d reads back data that differs", j)
		}
	}
}

// wantMetric checks the value of the series of name with labels.
func wantMetric(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string, want float64) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if v, ok := labels[l.GetName()]; ok && v != l.GetValue() {
					continue series
				}
			}
			if got := m.GetCounter().GetValue(); got != want {
				t.Fatalf("%s%v = %v, want %v", name, labels, got, want)
			}
			return
		}
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				t.Logf("%s %v", name, m.GetLabel())
			}
		}
	}
	t.Fatalf("no series %s%v", name, labels)
}

// TestFlexFilesOneServerPerMirror: with flex_stripe: off (clients before
// Linux 6.18), a new file is placed one data server wide with its 2
// copies, each mirror names one data server, and both copies take the
// whole file. The export offers only LAYOUT4_FLEX_FILES: fs_layout_types
// lists it alone, and files-layout requests are of an unknown type.
func TestFlexFilesOneServerPerMirror(t *testing.T) {
	c := startFlexCluster(t, 3, 2, server.FlexStripeOff)
	s := newFlexSession(t, c, "flex-one")

	res, err := s.cl.Compound(op(nfs4.NfsArgop4{Argop: nfs4.OP_PUTROOTFH}), op(nfs4.NfsArgop4{Argop: nfs4.OP_GETATTR,
		Opgetattr: &nfs4.GETATTR4args{AttrRequest: nfs4.Bitmap4{0, 1 << (nfs4.FATTR4_FS_LAYOUT_TYPES - 32)}}}))
	if status(t, res, err) != nfs4.NFS4_OK {
		t.Fatalf("GETATTR: %v", wiretest.Check(res))
	}
	// One attribute: a count and the layout types.
	if v := res.Resarray[2].Opgetattr.Resok4.ObjAttributes.AttrVals; !bytes.Equal(v, []byte{0, 0, 0, 1, 0, 0, 0, byte(nfs4.LAYOUT4_FLEX_FILES)}) {
		t.Fatalf("fs_layout_types %x, want LAYOUT4_FLEX_FILES alone", v)
	}

	open, fh := s.create("one")
	files := flexLayoutGet(open, nfs4.LAYOUTIOMODE4_RW, 0, ^uint64(0), 0)
	files.Oplayoutget.LogaLayoutType = nfs4.LAYOUT4_NFSV4_1_FILES
	if res, err := s.cl.Compound(putFH(fh), files); status(t, res, err) != nfs4.NFS4ERR_UNKNOWN_LAYOUTTYPE {
		t.Fatalf("files-layout LAYOUTGET on a flexfiles export: %v", res.Status)
	}
	ls, ff := s.mustLayoutGet(fh, open, nfs4.LAYOUTIOMODE4_RW)
	if len(ff.FflMirrors) != 2 || len(ff.FflMirrors[0].FfmDataServers) != 1 || len(ff.FflMirrors[1].FfmDataServers) != 1 {
		t.Fatalf("layout %+v, want 2 mirrors of one data server", ff.FflMirrors)
	}
	m, _, err := c.MDS.Striped.FileMap(ctxT(t), inoOf(t, c, "one"))
	if err != nil || len(m.DataServers) != 1 || m.Mirrors() != 2 {
		t.Fatalf("stripe map %+v, %v; want one position with 2 copies", m, err)
	}
	devs := flexDevices(t, s, ff, map[string]*flexDS{})
	data := randomBytes(t, 3<<20)
	for _, mir := range ff.FflMirrors {
		ds := mir.FfmDataServers[0]
		for off := 0; off < len(data); off += 1 << 20 {
			if st := devs[ds.FfdsDeviceid].write(t, ds.FfdsFhVers[0], ls, uint64(off), data[off:off+1<<20]); st != nfs4.NFS4_OK {
				t.Fatalf("WRITE at %d: %v", off, st)
			}
		}
		devs[ds.FfdsDeviceid].commit(t, ds.FfdsFhVers[0])
	}
	for j, mir := range ff.FflMirrors {
		ds := mir.FfmDataServers[0]
		var got []byte
		for off := 0; off < len(data); off += 1 << 20 {
			got = append(got, devs[ds.FfdsDeviceid].read(t, ds.FfdsFhVers[0], ls, uint64(off), 1<<20)...)
		}
		if !bytes.Equal(got, data) {
			t.Fatalf("mirror %d reads back %d bytes that differ", j, len(got))
		}
	}
}
