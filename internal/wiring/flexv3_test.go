package wiring

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shoalfs/shoal/client"
	"github.com/shoalfs/shoal/internal/flexv3"
	"github.com/shoalfs/shoal/internal/ganeshatest"
	"github.com/shoalfs/shoal/internal/nfs3"
	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/wiretest"
	"github.com/shoalfs/shoal/internal/xdr"
	"github.com/shoalfs/shoal/server"
)

// TestFlexFilesNFSv3 runs an MDS whose flexfiles data servers are two
// real NFS-Ganesha NFSv3 servers (MDSConfig.FlexV3), at the wire: the
// layout (anonymous stateid, NFSv3 handles, synthetic ids, a mirror on
// each server), the devices (NFSv3, loosely coupled), a client's writes
// to both data files with the layout's credentials, reads and writes
// through the MDS landing in the data files, fencing (the old ids are
// refused by Ganesha, a new layout carries new ones) and REMOVE taking
// the data files with it.
// startV3Cluster starts two NFS-Ganesha NFSv3 servers in a network
// namespace of the test's own and an MDS whose flexfiles export keeps its
// data on them (MDSConfig.FlexV3, as shoal mds --flex-v3-server builds it).
func startV3Cluster(t *testing.T, lease time.Duration) (*Cluster, *ganeshatest.Netns, []*ganeshatest.Server) {
	t.Helper()
	return startV3ClusterWith(t, Config{Lease: lease})
}

// startV3ClusterWith is startV3Cluster with cfg's Lease, HealInterval,
// Metrics and Dir (a temporary directory if empty).
func startV3ClusterWith(t *testing.T, cfg Config) (*Cluster, *ganeshatest.Netns, []*ganeshatest.Server) {
	t.Helper()
	if why := ganeshatest.Available(); why != "" {
		t.Skip("ganesha: " + why)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	ns, err := ganeshatest.NewNetns(ctx, fmt.Sprintf("shoal-wv3-%d", os.Getpid()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := ns.Close(); err != nil {
			t.Error(err)
		}
	})
	v3 := &flexv3.Config{Dial: ns.Dial, Mirrors: 2}
	var gs []*ganeshatest.Server
	for i := range 2 {
		g, err := ganeshatest.Start(ctx, ns, t.TempDir(), 20600+10*i)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(g.Stop)
		gs = append(gs, g)
		v3.Servers = append(v3.Servers, flexv3.Server{Addr: g.Addr(), MountAddr: g.MountAddr(), Path: g.Path, Advertise: g.Addr()})
	}
	dir := cfg.Dir
	if dir == "" {
		dir = t.TempDir()
	}
	f := false
	c, err := Start(ctx, Config{
		Dir: dir, DataServers: 0, Listen: "127.0.0.1:0",
		Exports: []*server.Export{{Path: "/", RootSquash: &f, Layout: server.LayoutFlexFiles, FlexStripe: server.FlexStripeOff}},
		Lease:   cfg.Lease, FlexV3: v3, HealInterval: cfg.HealInterval, Metrics: cfg.Metrics,
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, ns, gs
}

func TestFlexFilesNFSv3(t *testing.T) {
	c, ns, gs := startV3Cluster(t, 2*time.Second)
	ctx := ctxT(t)
	s := newFlexSession(t, c, "v3-client")
	sid, fh := s.create("f")
	st, lsid, ff := s.layoutGet(fh, sid, nfs4.LAYOUTIOMODE4_RW, 0, ^uint64(0), 0)
	if st != nfs4.NFS4_OK {
		t.Fatalf("LAYOUTGET: %v", st)
	}
	if len(ff.FflMirrors) != 2 || ff.FflFlags&nfs4.FF_FLAGS_NO_LAYOUTCOMMIT != 0 {
		t.Fatalf("layout: %d mirrors, flags %#x", len(ff.FflMirrors), ff.FflFlags)
	}
	type entry struct {
		srv      int
		fh       []byte
		uid, gid uint32
	}
	entries := func(ff nfs4.FfLayout4) []entry {
		var out []entry
		for j, m := range ff.FflMirrors {
			if len(m.FfmDataServers) != 1 {
				t.Fatalf("mirror %d: %d data servers", j, len(m.FfmDataServers))
			}
			ds := m.FfmDataServers[0]
			if ds.FfdsStateid != (nfs4.Stateid4{}) {
				t.Fatalf("mirror %d: stateid %v, want anonymous", j, ds.FfdsStateid)
			}
			res, err := s.cl.Compound(op(nfs4.NfsArgop4{Argop: nfs4.OP_GETDEVICEINFO, Opgetdeviceinfo: &nfs4.GETDEVICEINFO4args{
				GdiaDeviceId: ds.FfdsDeviceid, GdiaLayoutType: nfs4.LAYOUT4_FLEX_FILES, GdiaMaxcount: 4096}}))
			if status(t, res, err) != nfs4.NFS4_OK {
				t.Fatalf("GETDEVICEINFO: %v", wiretest.Check(res))
			}
			var da nfs4.FfDeviceAddr4
			if err := xdr.Unmarshal(res.Resarray[1].Opgetdeviceinfo.GdirResok4.GdirDeviceAddr.DaAddrBody, &da); err != nil {
				t.Fatal(err)
			}
			if v := da.FfdaVersions; len(v) != 1 || v[0].FfdvVersion != 3 || v[0].FfdvTightlyCoupled {
				t.Fatalf("device versions %+v", v)
			}
			srv := ganeshaOf(t, gs, da)
			uid, _ := strconv.ParseUint(string(ds.FfdsUser), 10, 32)
			gid, _ := strconv.ParseUint(string(ds.FfdsGroup), 10, 32)
			out = append(out, entry{srv, ds.FfdsFhVers[0], uint32(uid), uint32(gid)})
		}
		if out[0].srv == out[1].srv {
			t.Fatal("both mirrors on one data server")
		}
		return out
	}
	es := entries(ff)

	// The client's writes, as the Linux client does them: to each
	// mirror's data server over NFSv3 with the layout's ids.
	data := make([]byte, 1<<20+777)
	rand.Read(data)
	write := func(e entry, b []byte) error {
		cl, err := nfs3.Dial(ctx, gs[e.srv].Addr(), nfs3.Options{Dial: ns.Dial, UID: e.uid, GID: e.gid})
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		_, err = cl.Write(ctx, e.fh, 0, b, nfs3.FILE_SYNC)
		return err
	}
	for _, e := range es {
		if err := write(e, data); err != nil {
			t.Fatalf("write to server %d with the layout's ids: %v", e.srv, err)
		}
	}
	for _, g := range gs {
		p := filepath.Join(g.Export, dataName(t, gs))
		b, err := os.ReadFile(p)
		if err != nil || !bytes.Equal(b, data) {
			t.Fatalf("data file %s: %d bytes, %v", p, len(b), err)
		}
		fi, _ := os.Stat(p)
		if sys := fi.Sys().(*syscall.Stat_t); sys.Uid != es[0].uid || sys.Gid != es[0].gid || fi.Mode().Perm() != 0o640 {
			t.Fatalf("data file %s: uid %d gid %d mode %v", p, sys.Uid, sys.Gid, fi.Mode().Perm())
		}
	}
	// LAYOUTCOMMIT gives the MDS the size; then READ through the MDS
	// reads the data files.
	res, err := s.cl.Compound(putFH(fh), op(nfs4.NfsArgop4{Argop: nfs4.OP_LAYOUTCOMMIT, Oplayoutcommit: &nfs4.LAYOUTCOMMIT4args{
		LocaOffset: 0, LocaLength: uint64(len(data)), LocaStateid: lsid,
		LocaLastWriteOffset: nfs4.Newoffset4{NoNewoffset: true, NoOffset: ptr(nfs4.Offset4(len(data) - 1))},
		LocaLayoutupdate:    nfs4.Layoutupdate4{LouType: nfs4.LAYOUT4_FLEX_FILES},
	}}))
	if status(t, res, err) != nfs4.NFS4_OK {
		t.Fatalf("LAYOUTCOMMIT: %v", wiretest.Check(res))
	}
	res, err = s.cl.Compound(putFH(fh), op(nfs4.NfsArgop4{Argop: nfs4.OP_READ, Opread: &nfs4.READ4args{Stateid: sid, Offset: 1000, Count: 5000}}))
	if status(t, res, err) != nfs4.NFS4_OK {
		t.Fatalf("READ through the MDS: %v", wiretest.Check(res))
	}
	if got := res.Resarray[2].Opread.Resok4.Data; !bytes.Equal(got, data[1000:6000]) {
		t.Fatalf("READ through the MDS: %d bytes, not the data files'", len(got))
	}
	res, err = s.cl.Compound(putFH(fh), op(nfs4.NfsArgop4{Argop: nfs4.OP_WRITE, Opwrite: &nfs4.WRITE4args{Stateid: sid, Offset: 0, Stable: nfs4.FILE_SYNC4, Data: []byte("through the MDS")}}))
	if status(t, res, err) != nfs4.NFS4_OK {
		t.Fatalf("WRITE through the MDS: %v", wiretest.Check(res))
	}
	for _, g := range gs {
		b, _ := os.ReadFile(filepath.Join(g.Export, dataName(t, gs)))
		if !bytes.HasPrefix(b, []byte("through the MDS")) {
			t.Fatalf("WRITE through the MDS did not reach %s", g.Export)
		}
	}

	// Fencing: what revoking the client's layouts runs
	// (pnfsState.fence -> DataServers.Fence). The old ids are refused,
	// the next layout carries a new owner that works.
	if err := c.MDS.FlexV3.Fence(ctx, uint64(s.cl.ClientID)); err != nil {
		t.Fatal(err)
	}
	for _, e := range es {
		if st := nfs3.Status(write(e, []byte("x"))); st != nfs3.NFS3ERR_ACCES && st != nfs3.NFS3ERR_PERM {
			t.Fatalf("fenced ids' WRITE on server %d: %v, want an access error", e.srv, st)
		}
	}
	st, _, ff2 := s.layoutGet(fh, sid, nfs4.LAYOUTIOMODE4_RW, 0, ^uint64(0), 0)
	if st != nfs4.NFS4_OK {
		t.Fatalf("LAYOUTGET after the fence: %v", st)
	}
	for _, e := range entries(ff2) {
		if e.uid == es[0].uid {
			t.Fatal("the new layout has the fenced owner")
		}
		if err := write(e, []byte("y")); err != nil {
			t.Fatalf("new layout's WRITE on server %d: %v", e.srv, err)
		}
	}

	// The real trigger: a client that never returns a recalled layout.
	// Truncating the file recalls it; after a lease the MDS revokes it,
	// fences the client (a new owner on the data files) and truncates
	// the data files.
	s.cl.KeepLayouts = true
	st, _, ff3 := s.layoutGet(fh, sid, nfs4.LAYOUTIOMODE4_RW, 0, ^uint64(0), 0)
	if st != nfs4.NFS4_OK {
		t.Fatalf("LAYOUTGET: %v", st)
	}
	es3 := entries(ff3)
	truncate := func() nfs4.Nfsstat4 {
		res, err := s.cl.Compound(putFH(fh), op(nfs4.NfsArgop4{Argop: nfs4.OP_SETATTR, Opsetattr: &nfs4.SETATTR4args{
			Stateid: sid, ObjAttributes: nfs4.Fattr4{Attrmask: nfs4.Bitmap4{1 << nfs4.FATTR4_SIZE}, AttrVals: make([]byte, 8)}}}))
		return status(t, res, err)
	}
	if st := truncate(); st != nfs4.NFS4ERR_DELAY {
		t.Fatalf("truncate with a layout out: %v, want DELAY while recalling", st)
	}
	waitFor(t, "truncate after the layout's revocation", func() bool { return truncate() == nfs4.NFS4_OK })
	if f := c.MDS.Server.Stats().Fences; f != 1 {
		t.Fatalf("fences = %d, want 1", f)
	}
	for _, e := range es3 {
		if st := nfs3.Status(write(e, []byte("z"))); st != nfs3.NFS3ERR_ACCES && st != nfs3.NFS3ERR_PERM {
			t.Fatalf("revoked layout's WRITE on server %d: %v, want an access error", e.srv, st)
		}
	}
	for _, g := range gs {
		if fi, err := os.Stat(filepath.Join(g.Export, dataName(t, gs))); err != nil || fi.Size() != 0 {
			t.Fatalf("data file on %s after the truncate: %v, %v", g.Export, fi, err)
		}
	}

	s.close(fh, sid)
	name := dataName(t, gs)
	res, err = s.cl.Compound(op(nfs4.NfsArgop4{Argop: nfs4.OP_PUTROOTFH}), op(nfs4.NfsArgop4{Argop: nfs4.OP_REMOVE, Opremove: &nfs4.REMOVE4args{Target: []byte("f")}}))
	if status(t, res, err) != nfs4.NFS4_OK {
		t.Fatalf("REMOVE: %v", wiretest.Check(res))
	}
	// The MDS removes data asynchronously (orphans); bounded wait.
	for _, g := range gs {
		p := filepath.Join(g.Export, name)
		gone := false
		for range 200 {
			if _, err := os.Stat(p); os.IsNotExist(err) {
				gone = true
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if !gone {
			t.Fatalf("data file %s still there after REMOVE", p)
		}
	}
}

// dataName is the name of the one data file on the Ganesha servers.
func dataName(t *testing.T, gs []*ganeshatest.Server) string {
	t.Helper()
	m, _ := filepath.Glob(filepath.Join(gs[0].Export, "shoal-*"))
	if len(m) != 1 {
		t.Fatalf("data files on %s: %v, want one", gs[0].Export, m)
	}
	return filepath.Base(m[0])
}

// TestFlexFilesNFSv3Client drives the same cluster with Shoal's own
// client: its flexfiles driver speaks NFSv3 to the Ganesha data servers
// with the layout's ids (client/dataserver_v3.go). The bytes must land
// in both data files, written by the client (its data-server counters),
// and read back; after the file is fenced (`shoal admin fence-file`'s
// call) and its layout recalled, the client writes again, with a new
// layout.
func TestFlexFilesNFSv3Client(t *testing.T) {
	c, ns, gs := startV3Cluster(t, 30*time.Second)
	ctx := ctxT(t)
	ganesha := map[string]bool{}
	for _, g := range gs {
		ganesha[g.Addr()] = true
	}
	// The MDS listens on the host's loopback, the Ganeshas inside the
	// namespace.
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		if ganesha[addr] {
			return ns.Dial(ctx, network, addr)
		}
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}
	cl, err := client.Dial(ctx, c.MDS.Addr.String(), client.Options{Dial: dial})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()

	data := make([]byte, 5<<20+4321)
	rand.Read(data)
	f, err := cl.Open(ctx, "/big", os.O_CREATE|os.O_RDWR|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	st := cl.Stats()
	if st.DSWriteBytes < 2*uint64(len(data)) {
		t.Fatalf("the client wrote %d bytes to data servers, want both copies of %d", st.DSWriteBytes, len(data))
	}
	name := dataName(t, gs)
	for _, g := range gs {
		b, err := os.ReadFile(filepath.Join(g.Export, name))
		if err != nil || !bytes.Equal(b, data) {
			t.Fatalf("data file on %s: %d bytes, %v", g.Export, len(b), err)
		}
	}
	got := make([]byte, len(data))
	if _, err := f.ReadAt(got, 0); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back: %v, equal %v", err, bytes.Equal(got, data))
	}

	// Fence the file as `shoal admin fence-file` does; the client's next
	// write gets a new layout (or goes through the MDS) and lands.
	if _, err := c.MDS.FlexV3.FenceFile(ctx, inoOfData(t, name)); err != nil {
		t.Fatal(err)
	}
	c.MDS.Server.RecallLayouts(inoOfData(t, name))
	patch := []byte("after the fence")
	if _, err := f.WriteAt(patch, 4096); err != nil {
		t.Fatalf("write after the fence: %v", err)
	}
	if err := f.Close(); err != nil {
		t.Fatalf("close after the fence: %v", err)
	}
	copy(data[4096:], patch)
	for _, g := range gs {
		b, err := os.ReadFile(filepath.Join(g.Export, name))
		if err != nil || !bytes.Equal(b, data) {
			t.Fatalf("data file on %s after the fence: %d bytes, %v, equal %v", g.Export, len(b), err, bytes.Equal(b, data))
		}
	}
	t.Logf("client stats: %+v", cl.Stats())
}

func inoOfData(t *testing.T, name string) uint64 {
	t.Helper()
	ino, err := strconv.ParseUint(strings.TrimPrefix(name, "shoal-"), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return ino
}

// TestFlexFilesNFSv3LeaseExpiry: a client that holds a read/write layout
// and stops renewing its lease is purged, and the MDS fences the files
// it had layouts of: Ganesha then refuses the layout's ids.
func TestFlexFilesNFSv3LeaseExpiry(t *testing.T) {
	c, ns, gs := startV3Cluster(t, 2*time.Second)
	ctx := ctxT(t)
	s := newFlexSession(t, c, "v3-expiring")
	sid, fh := s.create("f")
	st, _, ff := s.layoutGet(fh, sid, nfs4.LAYOUTIOMODE4_RW, 0, ^uint64(0), 0)
	if st != nfs4.NFS4_OK {
		t.Fatalf("LAYOUTGET: %v", st)
	}
	ds := ff.FflMirrors[0].FfmDataServers[0]
	uid, _ := strconv.ParseUint(string(ds.FfdsUser), 10, 32)
	gid, _ := strconv.ParseUint(string(ds.FfdsGroup), 10, 32)
	name := dataName(t, gs)
	owner := func() uint32 {
		fi, err := os.Stat(filepath.Join(gs[0].Export, name))
		if err != nil {
			t.Fatal(err)
		}
		return fi.Sys().(*syscall.Stat_t).Uid
	}
	if owner() != uint32(uid) {
		t.Fatalf("data file owner %d, layout uid %d", owner(), uid)
	}
	root, err := nfs3.Mount(ctx, gs[0].MountAddr(), gs[0].Path, nfs3.Options{Dial: ns.Dial})
	if err != nil {
		t.Fatal(err)
	}
	cl, err := nfs3.Dial(ctx, gs[0].Addr(), nfs3.Options{Dial: ns.Dial})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	dfh, err := cl.Lookup(ctx, root, name)
	if err != nil {
		t.Fatal(err)
	}
	old := cl.As(uint32(uid), uint32(gid))
	if _, err := old.Write(ctx, dfh, 0, []byte("x"), nfs3.FILE_SYNC); err != nil {
		t.Fatalf("WRITE with the layout's ids: %v", err)
	}
	// The session goes silent: no SEQUENCE renews the lease.
	waitFor(t, "the expired client's files fenced", func() bool { return owner() != uint32(uid) })
	if _, err := old.Write(ctx, dfh, 0, []byte("x"), nfs3.FILE_SYNC); nfs3.Status(err) != nfs3.NFS3ERR_ACCES && nfs3.Status(err) != nfs3.NFS3ERR_PERM {
		t.Fatalf("WRITE with the expired client's ids: %v, want an access error", err)
	}
}
