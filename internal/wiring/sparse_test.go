package wiring

import (
	"context"
	"encoding/binary"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/wiretest"
	"github.com/shoalfs/shoal/internal/xdr"
	"github.com/shoalfs/shoal/server"
)

// startSparseCluster starts a cluster of n data servers with mirrors copies
// of each stripe unit, exporting its metrics to reg (if not nil).
func startSparseCluster(t *testing.T, n, mirrors int, reg prometheus.Registerer) *Cluster {
	t.Helper()
	f := false
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := Start(ctx, Config{
		Dir: t.TempDir(), DataServers: n, Listen: "127.0.0.1:0", Mirrors: mirrors,
		Exports: []*server.Export{{Path: "/", RootSquash: &f}},
		Lease:   10 * time.Second,
		Logger:  slog.New(slog.DiscardHandler),
		Metrics: reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// openOnMDS creates and opens name for reading and writing, and returns
// its open stateid, filehandle and inode number.
func openOnMDS(t *testing.T, cl *wiretest.Client, name string) (nfs4.Stateid4, []byte, uint64) {
	t.Helper()
	res, err := cl.Compound(
		nfs4.NfsArgop4{Argop: nfs4.OP_PUTROOTFH},
		nfs4.NfsArgop4{Argop: nfs4.OP_OPEN, Opopen: &nfs4.OPEN4args{
			ShareAccess: nfs4.OPEN4_SHARE_ACCESS_BOTH,
			Owner:       nfs4.OpenOwner4{Clientid: cl.ClientID, Owner: []byte("o-" + name)},
			Openhow: nfs4.Openflag4{Opentype: nfs4.OPEN4_CREATE, How: &nfs4.Createhow4{
				Mode: nfs4.UNCHECKED4, Createattrs: &nfs4.Fattr4{}}},
			Claim: nfs4.OpenClaim4{Claim: nfs4.CLAIM_NULL, File: ptr(nfs4.Component4(name))},
		}},
		nfs4.NfsArgop4{Argop: nfs4.OP_GETFH},
		nfs4.NfsArgop4{Argop: nfs4.OP_GETATTR, Opgetattr: &nfs4.GETATTR4args{AttrRequest: nfs4.Bitmap4{1 << nfs4.FATTR4_FILEID}}},
	)
	if status(t, res, err) != nfs4.NFS4_OK {
		t.Fatalf("OPEN %s: %v", name, wiretest.Check(res))
	}
	f := res.Resarray[4].Opgetattr.Resok4.ObjAttributes
	if len(f.AttrVals) != 8 {
		t.Fatalf("fileid: %+v", f)
	}
	return res.Resarray[2].Opopen.Resok4.Stateid, res.Resarray[3].Opgetfh.Resok4.Object, binary.BigEndian.Uint64(f.AttrVals)
}

// TestPNFSSparseOps runs the sparse-file steps of server's TestSparseOps
// (SEEK, READ_PLUS, DEALLOCATE, ALLOCATE) against a pNFS metadata server,
// whose file data lives on the data servers: they must answer as `shoal
// serve` does, with one copy of each stripe unit and with two.
func TestPNFSSparseOps(t *testing.T) {
	for _, tc := range []struct {
		name             string
		dataServers, mir int
	}{
		{"3 data servers", 3, 1},
		{"2 data servers, 2 copies", 2, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := startSparseCluster(t, tc.dataServers, tc.mir, nil)
			ctx := ctxT(t)
			cl, err := wiretest.Setup(ctx, c.MDS.Addr.String(), []byte("sparse-client"))
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			sid, fh, ino := openOnMDS(t, cl, "sparse")
			wiretest.Sparse(t, cl, fh, sid)
			// Every good copy took the changes: no copy went stale.
			if m, ok, err := c.MDS.Striped.Map(ctx, ino); err != nil || !ok || m.Degraded() {
				t.Errorf("stripe map after the steps: %+v %v %v", m, ok, err)
			}
		})
	}
}

// TestPNFSLayoutErrorAndStats: the MDS accepts LAYOUTERROR and LAYOUTSTATS
// under the client's layout stateid of the file (RFC 7862 §15.6, §15.7),
// refuses other stateids and wrapping ranges, and exports what it was told
// per data server: the device and range name the data server.
func TestPNFSLayoutErrorAndStats(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := startSparseCluster(t, 3, 1, reg)
	ctx := ctxT(t)
	cl, err := wiretest.Setup(ctx, c.MDS.Addr.String(), []byte("stats-client"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	openSid, fh, ino := openOnMDS(t, cl, "f")
	res, err := cl.Compound(putFH(fh), layoutGet(openSid, nfs4.LAYOUTIOMODE4_RW))
	if status(t, res, err) != nfs4.NFS4_OK {
		t.Fatalf("LAYOUTGET: %v", wiretest.Check(res))
	}
	lg := res.Resarray[2].Oplayoutget.LogrResok4
	var fl nfs4.Nfsv41FileLayout4
	if err := xdr.Unmarshal(lg.LogrLayout[0].LoContent.LocBody, &fl); err != nil {
		t.Fatal(err)
	}
	lsid, dev := lg.LogrStateid, fl.NflDeviceid
	m, ok, err := c.MDS.Striped.Map(ctx, ino)
	if err != nil || !ok {
		t.Fatalf("stripe map: %v %v", ok, err)
	}
	const mib = 1 << 20
	dsOfUnit := func(k int) string { return m.DataServers[(k+int(m.First))%len(m.DataServers)] }
	bumped := lsid
	bumped.Seqid++

	layoutError := func(sid nfs4.Stateid4, off, length uint64) nfs4.NfsArgop4 {
		return nfs4.NfsArgop4{Argop: nfs4.OP_LAYOUTERROR, Oplayouterror: &nfs4.LAYOUTERROR4args{
			LeaOffset: off, LeaLength: length, LeaStateid: sid,
			LeaErrors: []nfs4.DeviceError4{{DeDeviceid: dev, DeStatus: nfs4.NFS4ERR_NXIO, DeOpnum: nfs4.OP_READ}},
		}}
	}
	layoutStats := func(sid nfs4.Stateid4, reads, readBytes, writes, writeBytes uint64) nfs4.NfsArgop4 {
		return nfs4.NfsArgop4{Argop: nfs4.OP_LAYOUTSTATS, Oplayoutstats: &nfs4.LAYOUTSTATS4args{
			LsaOffset: 0, LsaLength: mib, LsaStateid: sid,
			LsaRead:  nfs4.IoInfo4{IiCount: reads, IiBytes: readBytes},
			LsaWrite: nfs4.IoInfo4{IiCount: writes, IiBytes: writeBytes}, LsaDeviceid: dev,
			LsaLayoutupdate: nfs4.Layoutupdate4{LouType: nfs4.LAYOUT4_NFSV4_1_FILES},
		}}
	}
	for _, tc := range []struct {
		name string
		fh   []byte
		op   nfs4.NfsArgop4
		want nfs4.Nfsstat4
	}{
		{"LAYOUTERROR in the second unit", fh, layoutError(lsid, mib+4096, 4096), nfs4.NFS4_OK},
		{"LAYOUTERROR under the open stateid", fh, layoutError(openSid, 0, 4096), nfs4.NFS4ERR_BAD_STATEID},
		{"LAYOUTERROR under a future seqid", fh, layoutError(bumped, 0, 4096), nfs4.NFS4ERR_BAD_STATEID},
		{"LAYOUTERROR of a wrapping range", fh, layoutError(lsid, 2, ^uint64(0)-1), nfs4.NFS4ERR_INVAL},
		{"LAYOUTSTATS of the first unit", fh, layoutStats(lsid, 4, 4*4096, 2, 8192), nfs4.NFS4_OK},
		{"LAYOUTSTATS running totals", fh, layoutStats(lsid, 6, 6*4096, 2, 8192), nfs4.NFS4_OK},
		{"LAYOUTSTATS under the open stateid", fh, layoutStats(openSid, 1, 1, 1, 1), nfs4.NFS4ERR_BAD_STATEID},
		{"LAYOUTSTATS of a directory", nil, layoutStats(lsid, 1, 1, 1, 1), nfs4.NFS4ERR_ISDIR},
	} {
		first := putFH(tc.fh)
		if tc.fh == nil {
			first = nfs4.NfsArgop4{Argop: nfs4.OP_PUTROOTFH}
		}
		res, err := cl.Compound(first, tc.op)
		if got := status(t, res, err); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}

	for _, w := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"shoal_pnfs_layout_errors_total", map[string]string{"ds": dsOfUnit(1), "status": "NFS4ERR_NXIO", "op": "READ"}, 1},
		{"shoal_pnfs_layoutstats_ops_total", map[string]string{"ds": dsOfUnit(0), "dir": "read"}, 6},
		{"shoal_pnfs_layoutstats_bytes_total", map[string]string{"ds": dsOfUnit(0), "dir": "read"}, 6 * 4096},
		{"shoal_pnfs_layoutstats_bytes_total", map[string]string{"ds": dsOfUnit(0), "dir": "write"}, 8192},
		{"shoal_pnfs_layoutstats_bytes_total", map[string]string{"ds": dsOfUnit(1), "dir": "read"}, 0},
	} {
		if got := counterValue(t, reg, w.name, w.labels); got != w.want {
			t.Errorf("%s%v = %v, want %v", w.name, w.labels, got, w.want)
		}
	}
}

// counterValue returns the value of the counter name with labels (0 if
// there is none).
func counterValue(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	metrics:
		for _, m := range f.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for k, v := range labels {
				if have[k] != v {
					continue metrics
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

// TestDataServerReadPlus: a data server answers READ_PLUS as it answers
// READ (the Linux client sends it to data servers when the MDS takes it):
// the holes of its object are hole segments, and past its object the file
// size from the MDS decides between a hole and the end of the file.
func TestDataServerReadPlus(t *testing.T) {
	c := startSparseCluster(t, 3, 1, nil)
	ctx := ctxT(t)
	cl, err := wiretest.Setup(ctx, c.MDS.Addr.String(), []byte("rp-client"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	sid, fh, ino := openOnMDS(t, cl, "f")
	const k128, mib = 128 << 10, 1 << 20
	a := make([]byte, k128)
	for i := range a {
		a[i] = 'A'
	}
	res, err := cl.Compound(putFH(fh),
		nfs4.NfsArgop4{Argop: nfs4.OP_WRITE, Opwrite: &nfs4.WRITE4args{Stateid: sid, Stable: nfs4.FILE_SYNC4, Data: a}},
		nfs4.NfsArgop4{Argop: nfs4.OP_SETATTR, Opsetattr: &nfs4.SETATTR4args{Stateid: sid, ObjAttributes: wiretest.SizeAttr(2*mib + mib/2)}},
		layoutGet(sid, nfs4.LAYOUTIOMODE4_READ))
	if status(t, res, err) != nfs4.NFS4_OK {
		t.Fatalf("WRITE+SETATTR+LAYOUTGET: %v", wiretest.Check(res))
	}
	var fl nfs4.Nfsv41FileLayout4
	if err := xdr.Unmarshal(res.Resarray[4].Oplayoutget.LogrResok4.LogrLayout[0].LoContent.LocBody, &fl); err != nil {
		t.Fatal(err)
	}
	m, _, err := c.MDS.Striped.Map(ctx, ino)
	if err != nil {
		t.Fatal(err)
	}
	dsOfUnit := func(k int) string {
		id := m.DataServers[(k+int(m.First))%len(m.DataServers)]
		for _, d := range c.DS {
			if d.Agent.ID() == id {
				return d.Addr.String()
			}
		}
		t.Fatalf("no data server %s", id)
		return ""
	}
	type seg struct {
		hole      bool
		off, size uint64
	}
	for _, tc := range []struct {
		name string
		unit int
		off  uint64
		want []seg
		eof  bool
	}{
		{"data then the object's hole", 0, 0, []seg{{false, 0, k128}, {true, k128, mib - k128}}, false},
		{"past the object, inside the file", 2, 2 * mib, []seg{{true, 2 * mib, mib / 2}}, true},
	} {
		ds, err := wiretest.Setup(ctx, dsOfUnit(tc.unit), []byte("rp-client"))
		if err != nil {
			t.Fatal(err)
		}
		res, err := ds.Compound(putFH(fl.NflFhList[0]), nfs4.NfsArgop4{Argop: nfs4.OP_READ_PLUS,
			OpreadPlus: &nfs4.READPLUS4args{RpaStateid: sid, RpaOffset: tc.off, RpaCount: mib}})
		ds.Close()
		if status(t, res, err) != nfs4.NFS4_OK {
			t.Errorf("%s: READ_PLUS: %v", tc.name, wiretest.Check(res))
			continue
		}
		rp := res.Resarray[2].OpreadPlus.RpResok4
		var got []seg
		for _, s := range rp.RprContents {
			if s.RpcContent == nfs4.NFS4_CONTENT_HOLE {
				got = append(got, seg{true, s.RpcHole.DiOffset, s.RpcHole.DiLength})
				continue
			}
			got = append(got, seg{false, s.RpcData.DOffset, uint64(len(s.RpcData.DData))})
			for _, b := range s.RpcData.DData {
				if b != 'A' {
					t.Errorf("%s: data segment holds %q", tc.name, b)
					break
				}
			}
		}
		if !slices.Equal(got, tc.want) || rp.RprEof != tc.eof {
			t.Errorf("%s: segments %+v eof %v, want %+v eof %v", tc.name, got, rp.RprEof, tc.want, tc.eof)
		}
	}
}
