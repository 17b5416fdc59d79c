package wiring

import (
	"bytes"
	"crypto/rand"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shoalfs/shoal/internal/cluster"
	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/wiretest"
	"github.com/shoalfs/shoal/internal/xdr"
	"github.com/shoalfs/shoal/server"
)

// Regression tests for the membership bugs of issue 10, each on a real
// in-process cluster over loopback. test/membership runs the same story
// with real processes.

// writeMDS writes data at off of the file fh through the MDS, stable.
func writeMDS(t *testing.T, cl *wiretest.Client, sid nfs4.Stateid4, fh []byte, off uint64, data []byte) {
	t.Helper()
	for pos := 0; pos < len(data); pos += 1 << 20 {
		end := min(pos+1<<20, len(data))
		res, err := cl.Compound(putFH(fh), op(nfs4.NfsArgop4{Argop: nfs4.OP_WRITE, Opwrite: &nfs4.WRITE4args{
			Stateid: sid, Offset: off + uint64(pos), Stable: nfs4.FILE_SYNC4, Data: data[pos:end]}}))
		if st := status(t, res, err); st != nfs4.NFS4_OK {
			t.Fatalf("WRITE at %d: %v", off+uint64(pos), st)
		}
	}
}

// readMDS reads the whole file fh through the MDS.
func readMDS(t *testing.T, cl *wiretest.Client, sid nfs4.Stateid4, fh []byte) ([]byte, error) {
	t.Helper()
	var out []byte
	for {
		res, err := cl.Compound(putFH(fh), op(nfs4.NfsArgop4{Argop: nfs4.OP_READ, Opread: &nfs4.READ4args{
			Stateid: sid, Offset: uint64(len(out)), Count: 1 << 20}}))
		if err != nil {
			t.Fatal(err)
		}
		if res.Status != nfs4.NFS4_OK {
			return out, &wiretest.ErrStatus{Status: res.Status}
		}
		r := res.Resarray[2].Opread.Resok4
		out = append(out, r.Data...)
		if r.Eof {
			return out, nil
		}
	}
}

// createMDS creates and opens name through the MDS.
func createMDS(t *testing.T, cl *wiretest.Client, name string) (nfs4.Stateid4, []byte) {
	t.Helper()
	res, err := cl.Compound(
		op(nfs4.NfsArgop4{Argop: nfs4.OP_PUTROOTFH}),
		openOp(cl.ClientID, nfs4.OPEN4_SHARE_ACCESS_BOTH, nfs4.OpenClaim4{Claim: nfs4.CLAIM_NULL, File: ptr(nfs4.Component4(name))}, true),
		op(nfs4.NfsArgop4{Argop: nfs4.OP_GETFH}),
	)
	if status(t, res, err) != nfs4.NFS4_OK {
		t.Fatalf("OPEN %s: %v", name, wiretest.Check(res))
	}
	return res.Resarray[2].Opopen.Resok4.Stateid, bytes.Clone(res.Resarray[3].Opgetfh.Resok4.Object)
}

// layoutOf gets a read layout of fh and its device's addresses by stripe
// index.
func layoutOf(t *testing.T, cl *wiretest.Client, sid nfs4.Stateid4, fh []byte) (nfs4.Nfsv41FileLayout4, []string) {
	t.Helper()
	res, err := cl.Compound(putFH(fh), layoutGet(sid, nfs4.LAYOUTIOMODE4_READ))
	if status(t, res, err) != nfs4.NFS4_OK {
		t.Fatalf("LAYOUTGET: %v", wiretest.Check(res))
	}
	var fl nfs4.Nfsv41FileLayout4
	if err := xdr.Unmarshal(res.Resarray[2].Oplayoutget.LogrResok4.LogrLayout[0].LoContent.LocBody, &fl); err != nil {
		t.Fatal(err)
	}
	res, err = cl.Compound(op(nfs4.NfsArgop4{Argop: nfs4.OP_GETDEVICEINFO, Opgetdeviceinfo: &nfs4.GETDEVICEINFO4args{
		GdiaDeviceId: fl.NflDeviceid, GdiaLayoutType: nfs4.LAYOUT4_NFSV4_1_FILES, GdiaMaxcount: 1 << 16}}))
	if status(t, res, err) != nfs4.NFS4_OK {
		t.Fatalf("GETDEVICEINFO: %v", wiretest.Check(res))
	}
	var da nfs4.Nfsv41FileLayoutDsAddr4
	if err := xdr.Unmarshal(res.Resarray[1].Opgetdeviceinfo.GdirResok4.GdirDeviceAddr.DaAddrBody, &da); err != nil {
		t.Fatal(err)
	}
	addrs := make([]string, len(da.NfldaStripeIndices))
	for i, mp := range da.NfldaStripeIndices {
		addrs[i] = fromUaddr(t, da.NfldaMultipathDsList[mp][0].NaRAddr)
	}
	return fl, addrs
}

func randomBytes(t *testing.T, n int) []byte {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// addDS starts another data server for c's MDS in dir.
func addDS(t *testing.T, c *Cluster, dir string) *DS {
	t.Helper()
	secret, err := cluster.ReadJoinSecret(c.MDS.JoinSecretFile)
	if err != nil {
		t.Fatal(err)
	}
	d, err := StartDS(ctxT(t), DSConfig{Listen: "127.0.0.1:0", Dir: dir, MDS: []string{c.MDS.Addr.String()},
		JoinSecret: secret, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// TestAddingDataServerKeepsFiles: adding a data server used to change the
// stripe width of every file, so old files read back different bytes
// (issue 10, bug 1); and a data server that joined once and went away
// stranded every file (bug 2).
func TestAddingDataServerKeepsFiles(t *testing.T) {
	c := startClusterWith(t, t.TempDir(), 2, 3*time.Second)
	cl, err := wiretest.Setup(ctxT(t), c.MDS.Addr.String(), []byte("grow"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	old := randomBytes(t, 5<<20+123)
	sidA, fhA := createMDS(t, cl, "a")
	writeMDS(t, cl, sidA, fhA, 0, old)

	d3 := addDS(t, c, filepath.Join(t.TempDir(), "ds3"))
	if err := c.MDS.Registry.WaitFor(ctxT(t), 3); err != nil {
		t.Fatal(err)
	}
	if got, err := readMDS(t, cl, sidA, fhA); err != nil || !bytes.Equal(got, old) {
		t.Fatalf("old file after a data server joined: %d bytes, %v; want the %d bytes written", len(got), err, len(old))
	}
	_, addrs := layoutOf(t, cl, sidA, fhA)
	if len(addrs) != 2 {
		t.Fatalf("old file's layout has %d data servers, want the 2 it was written on", len(addrs))
	}
	for _, a := range addrs {
		if a == d3.Addr.String() {
			t.Fatalf("old file's layout names the new data server %s", a)
		}
	}
	sidB, fhB := createMDS(t, cl, "b")
	fresh := randomBytes(t, 4<<20)
	writeMDS(t, cl, sidB, fhB, 0, fresh)
	if _, addrs := layoutOf(t, cl, sidB, fhB); len(addrs) != 3 {
		t.Fatalf("new file striped over %d data servers, want 3", len(addrs))
	}

	// The newcomer leaves for good: the old file, none of whose bytes it
	// holds, stays readable, also once the newcomer counts as down.
	if err := d3.Close(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the third data server out of service", func() bool {
		ds, _ := c.MDS.Registry.DataServer(d3.Agent.ID())
		return !ds.Up
	})
	time.Sleep(3 * time.Second) // past DownAfter
	if got, err := readMDS(t, cl, sidA, fhA); err != nil || !bytes.Equal(got, old) {
		t.Fatalf("old file after the newcomer left: %d bytes, %v", len(got), err)
	}
	// The new file has stripes there: an error, never other bytes.
	if got, err := readMDS(t, cl, sidB, fhB); wiretest.StatusOf(err) != nfs4.NFS4ERR_IO {
		t.Fatalf("file with stripes on a down data server: %d bytes, %v; want NFS4ERR_IO", len(got), err)
	}
}

// startClusterWith is startClusterIn with a short DownAfter.
func startClusterWith(t *testing.T, dir string, n int, downAfter time.Duration) *Cluster {
	t.Helper()
	f := false
	c, err := Start(ctxT(t), Config{
		Dir: dir, DataServers: n, Listen: "127.0.0.1:0", DownAfter: downAfter,
		Exports: []*server.Export{{Path: "/", RootSquash: &f}}, Lease: 30 * time.Second,
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestDataServerReadPastEOF: data servers used to answer every READ past
// the end of a file with a full buffer of zeros and eof false, so an
// O_DIRECT reader never reached the end (bug 5). Each data server must
// answer a read past the end with a short read and eof, read holes inside
// the file as zeros, and end the last stripe unit where the file ends.
func TestDataServerReadPastEOF(t *testing.T) {
	c := startClusterWith(t, t.TempDir(), 3, 0)
	cl, err := wiretest.Setup(ctxT(t), c.MDS.Addr.String(), []byte("eof"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	sid, fh := createMDS(t, cl, "f")
	const size = 5<<20 + 4321 // ends inside stripe unit 5
	data := randomBytes(t, 2<<20)
	writeMDS(t, cl, sid, fh, 0, data)
	// Units 2-4 are a hole; unit 5 holds the tail.
	tail := randomBytes(t, 4321)
	writeMDS(t, cl, sid, fh, 5<<20, tail)
	want := make([]byte, size)
	copy(want, data)
	copy(want[5<<20:], tail)

	fl, addrs := layoutOf(t, cl, sid, fh)
	dataFH := fl.NflFhList[0]
	owner := func(off uint64) string {
		return addrs[(off/uint64(fl.NflUtil)+uint64(fl.NflFirstStripeIndex))%uint64(len(addrs))]
	}
	type read struct {
		off     uint64
		count   uint32
		wantLen int
		wantEOF bool
	}
	cases := []struct {
		name string
		read
	}{
		{"first unit", read{0, 1 << 20, 1 << 20, false}},
		{"hole inside the file", read{3 << 20, 1 << 20, 1 << 20, false}},
		{"last unit ends inside it", read{5 << 20, 1 << 20, 4321, true}},
		{"at the end", read{size, 1 << 20, 0, true}},
		{"far past the end", read{64 << 20, 1 << 20, 0, true}},
	}
	clients := map[string]*wiretest.Client{}
	for _, a := range addrs {
		ds, err := wiretest.Setup(ctxT(t), a, []byte("eof-ds"))
		if err != nil {
			t.Fatal(err)
		}
		defer ds.Close()
		clients[a] = ds
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// The owner answers with the file's bytes; every other data
			// server refuses the range (it holds no copy of it) rather
			// than answer zeros. Past the end of the file, every data
			// server says so (the MDS told it the file's size).
			for a, ds := range clients {
				res, err := ds.Compound(putFH(dataFH), op(nfs4.NfsArgop4{Argop: nfs4.OP_READ, Opread: &nfs4.READ4args{
					Stateid: sid, Offset: tc.off, Count: tc.count}}))
				st := status(t, res, err)
				if a != owner(tc.off) && tc.wantLen > 0 {
					if st != nfs4.NFS4ERR_PNFS_NO_LAYOUT {
						t.Errorf("READ at %d on %s, which holds no copy of it: %v, want NFS4ERR_PNFS_NO_LAYOUT", tc.off, a, st)
					}
					continue
				}
				if st != nfs4.NFS4_OK {
					t.Fatalf("READ at %d on %s: %v", tc.off, a, st)
				}
				r := res.Resarray[2].Opread.Resok4
				if len(r.Data) != tc.wantLen || r.Eof != tc.wantEOF {
					t.Errorf("READ %d@%d on %s: %d bytes eof=%v, want %d bytes eof=%v",
						tc.count, tc.off, a, len(r.Data), r.Eof, tc.wantLen, tc.wantEOF)
				}
				if tc.wantLen > 0 && !bytes.Equal(r.Data, want[tc.off:tc.off+uint64(tc.wantLen)]) {
					t.Errorf("READ %d@%d on %s: wrong bytes", tc.count, tc.off, a)
				}
			}
		})
	}
}

// TestJoinNeedsTheSecret: any host that reached the MDS could register as
// a data server and get the filehandle key (bug 6). A data server without
// the join secret, with a wrong one, or whose directory belongs to another
// cluster is refused.
func TestJoinNeedsTheSecret(t *testing.T) {
	c := startClusterWith(t, t.TempDir(), 1, 0)
	other := startClusterWith(t, t.TempDir(), 1, 0)
	otherSecret, err := cluster.ReadJoinSecret(other.MDS.JoinSecretFile)
	if err != nil {
		t.Fatal(err)
	}
	secret, err := cluster.ReadJoinSecret(c.MDS.JoinSecretFile)
	if err != nil {
		t.Fatal(err)
	}
	// A directory that already belongs to the other cluster.
	foreign := t.TempDir()
	d, err := StartDS(ctxT(t), DSConfig{Listen: "127.0.0.1:0", Dir: foreign, MDS: []string{other.MDS.Addr.String()},
		JoinSecret: otherSecret, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	d.Close()
	for _, tc := range []struct {
		name   string
		secret []byte
		dir    string
		want   error
	}{
		{"no secret", nil, t.TempDir(), cluster.ErrAuth},
		{"wrong secret", otherSecret, t.TempDir(), cluster.ErrAuth},
		{"directory of another cluster", secret, foreign, cluster.ErrWrongCluster},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := len(c.MDS.Registry.DataServers())
			d, err := StartDS(ctxT(t), DSConfig{Listen: "127.0.0.1:0", Dir: tc.dir, MDS: []string{c.MDS.Addr.String()},
				JoinSecret: tc.secret, Logger: slog.New(slog.DiscardHandler)})
			if err == nil {
				d.Close()
				t.Fatal("data server registered")
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("StartDS: %v, want %v", err, tc.want)
			}
			if n := len(c.MDS.Registry.DataServers()); n != before {
				t.Fatalf("registry has %d data servers after a refused join, had %d", n, before)
			}
		})
	}
	// An operator without the secret gets nothing either.
	err = cluster.CallAdmin(ctxT(t), c.MDS.Addr.String(), otherSecret, "status", cluster.AdminRequest{}, nil)
	if err == nil {
		t.Fatal("admin status with a wrong secret answered")
	}
	if err := cluster.CallAdmin(ctxT(t), c.MDS.Addr.String(), secret, "status", cluster.AdminRequest{}, nil); err != nil {
		t.Fatalf("admin status with the secret: %v", err)
	}
}

// TestClusterGauges: `shoal admin status` and the MDS's Prometheus gauges
// report the same numbers.
func TestClusterGauges(t *testing.T) {
	reg := prometheus.NewRegistry()
	f := false
	c, err := Start(ctxT(t), Config{
		Dir: t.TempDir(), DataServers: 2, Listen: "127.0.0.1:0", DownAfter: time.Second,
		Exports: []*server.Export{{Path: "/", RootSquash: &f}}, Lease: 30 * time.Second,
		Logger: slog.New(slog.DiscardHandler), Metrics: reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cl, err := wiretest.Setup(ctxT(t), c.MDS.Addr.String(), []byte("gauges"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	sid, fh := createMDS(t, cl, "f")
	writeMDS(t, cl, sid, fh, 0, randomBytes(t, 3<<20+5))
	st, err := c.MDS.Admin.Status(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), "shoal_cluster_") {
			continue
		}
		for _, m := range mf.GetMetric() {
			key := mf.GetName()
			for _, l := range m.GetLabel() {
				if l.GetName() == "ds" {
					key += "/" + l.GetValue()
				}
			}
			got[key] = m.GetGauge().GetValue()
		}
	}
	if got["shoal_cluster_files"] != float64(st.Files) || st.Files != 1 {
		t.Errorf("files: gauge %v, status %d, want 1", got["shoal_cluster_files"], st.Files)
	}
	var total float64
	for _, d := range st.DataServers {
		if got["shoal_cluster_ds_up/"+d.ID] != 1 {
			t.Errorf("%s: up gauge %v", d.ID, got["shoal_cluster_ds_up/"+d.ID])
		}
		if g := got["shoal_cluster_ds_bytes/"+d.ID]; g != float64(d.Bytes) {
			t.Errorf("%s: bytes gauge %v, status %d", d.ID, g, d.Bytes)
		}
		if g := got["shoal_cluster_ds_files/"+d.ID]; g != float64(d.Files) {
			t.Errorf("%s: files gauge %v, status %d", d.ID, g, d.Files)
		}
		total += got["shoal_cluster_ds_bytes/"+d.ID]
	}
	if total != 3<<20+5 {
		t.Errorf("bytes over all data servers %v, want the file's %d", total, 3<<20+5)
	}
}
