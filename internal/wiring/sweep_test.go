package wiring

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/wiretest"
	"github.com/shoalfs/shoal/meta"
	"github.com/shoalfs/shoal/server"
)

// TestSweepAfterMDSCrash: a cluster whose MDS answers metadata changes
// before they are durable (sync: false). A client creates files and
// writes their data through the MDS to the data servers (UNSTABLE: no
// operation that waits for the metadata log), then the MDS's machine
// crashes before the log's next fdatasync. The data servers, other
// machines, keep the objects; the MDS's disk comes back as it was at its
// last fdatasync (the test copied its metadata files then, the way the
// crash leaves them: the database and the log files of the unclean run).
// After the restart the MDS must sweep exactly the objects of the lost
// creates from every data server, at the end of the grace period, leave
// the files that survived intact, count what it removed, and clear the
// mark so that the next start does not sweep again.
func TestSweepAfterMDSCrash(t *testing.T) {
	const (
		lease      = 2 * time.Second // grace ends soon after the restart
		stripeUnit = 64 << 10
		kept, lost = 3, 4
	)
	dir := t.TempDir()
	f := false
	exports := []*server.Export{{Path: "/", RootSquash: &f}}
	ctx := ctxT(t)
	c, err := Start(ctx, Config{
		Dir: dir, DataServers: 2, Listen: "127.0.0.1:0", Exports: exports, Lease: lease,
		StripeUnit: stripeUnit, InlineMax: -1, Async: true, CommitInterval: time.Hour,
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	cl, err := wiretest.Setup(ctx, c.MDS.Addr.String(), []byte("sweep-client"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()

	// The client writes the first stripe unit of each file to the data
	// server its layout names, as the kernel client does: nothing of it
	// goes through the MDS, whose LAYOUTGET (which places the file's
	// data) is answered early like the OPEN that created the file.
	data := bytes.Repeat([]byte("sweep me "), stripeUnit/9)
	dsClients := map[string]*wiretest.Client{}
	defer func() {
		for _, d := range dsClients {
			d.Close()
		}
	}()
	// commit: LAYOUTCOMMIT the size (which waits for the metadata log,
	// as a stable operation does).
	write := func(name string, commit bool) meta.Ino {
		t.Helper()
		sid, fh := createMDS(t, cl, name)
		res, err := cl.Compound(putFH(fh), layoutGet(sid, nfs4.LAYOUTIOMODE4_RW))
		if st := status(t, res, err); st != nfs4.NFS4_OK {
			t.Fatalf("LAYOUTGET %s: %v", name, st)
		}
		layoutSid := res.Resarray[2].Oplayoutget.LogrResok4.LogrStateid
		fl, addrs := layoutOf(t, cl, sid, fh)
		idx := int(fl.NflFirstStripeIndex) % len(addrs)
		dsFH := fl.NflFhList[0]
		if len(fl.NflFhList) > 1 {
			dsFH = fl.NflFhList[idx]
		}
		d := dsClients[addrs[idx]]
		if d == nil {
			if d, err = wiretest.Setup(ctx, addrs[idx], []byte("sweep-client")); err != nil {
				t.Fatal(err)
			}
			dsClients[addrs[idx]] = d
		}
		res, err = d.Compound(putFH(dsFH), op(nfs4.NfsArgop4{Argop: nfs4.OP_WRITE, Opwrite: &nfs4.WRITE4args{
			Stateid: sid, Stable: nfs4.FILE_SYNC4, Data: data}}))
		if st := status(t, res, err); st != nfs4.NFS4_OK {
			t.Fatalf("DS WRITE %s: %v", name, st)
		}
		if commit {
			res, err = cl.Compound(putFH(fh), op(nfs4.NfsArgop4{Argop: nfs4.OP_LAYOUTCOMMIT, Oplayoutcommit: &nfs4.LAYOUTCOMMIT4args{
				LocaLength: uint64(len(data)), LocaStateid: layoutSid,
				LocaLastWriteOffset: nfs4.Newoffset4{NoNewoffset: true, NoOffset: ptr(uint64(len(data) - 1))},
				LocaLayoutupdate:    nfs4.Layoutupdate4{LouType: nfs4.LAYOUT4_NFSV4_1_FILES},
			}}))
			if st := status(t, res, err); st != nfs4.NFS4_OK {
				t.Fatalf("LAYOUTCOMMIT %s: %v", name, st)
			}
		}
		nd, err := c.MDS.Server.Meta().Lookup(ctx, meta.RootIno, name)
		if err != nil {
			t.Fatal(err)
		}
		return nd.Ino
	}
	var keptInos, lostInos []uint64
	for i := range kept {
		keptInos = append(keptInos, uint64(write("kept"+strconv.Itoa(i), true)))
	}
	// The durable point: everything so far is on the MDS's disk.
	if err := c.MDS.Server.Meta().(meta.Syncer).Sync(ctx); err != nil {
		t.Fatal(err)
	}
	disk := copyMetaFiles(t, filepath.Join(dir, "mds"))
	before := c.MDS.Server.Stats().Log.Syncs
	for i := range lost {
		lostInos = append(lostInos, uint64(write("lost"+strconv.Itoa(i), false)))
	}
	if syncs := c.MDS.Server.Stats().Log.Syncs; syncs != before {
		t.Fatalf("the metadata log was synced %d times after the durable point: the lost creates would have survived", syncs-before)
	}
	onDS := func() []uint64 {
		var all []uint64
		for i := range c.DS {
			all = append(all, dsObjects(t, c, i)...)
		}
		return all
	}
	for _, ino := range append(slices.Clone(keptInos), lostInos...) {
		if objs := onDS(); !slices.Contains(objs, ino) {
			t.Fatalf("the data servers hold objects %v, not %d: the test proves nothing", objs, ino)
		}
	}

	// The crash: the MDS stops, and its disk is what it was at the last
	// fdatasync.
	addr := c.MDS.Addr.String()
	cl.Close()
	if err := c.MDS.Close(); err != nil {
		t.Fatal(err)
	}
	restoreMetaFiles(t, filepath.Join(dir, "mds"), disk)
	reg := prometheus.NewRegistry()
	m, err := StartMDS(MDSConfig{
		Listen: addr, Dir: filepath.Join(dir, "mds"), Exports: exports, Lease: lease,
		StripeUnit: stripeUnit, InlineMax: -1, Async: true, CommitInterval: time.Hour,
		Logger: slog.New(slog.DiscardHandler), Metrics: reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	c.MDS = m
	c.mu.Unlock()
	if err := m.Registry.WaitFor(ctx, len(c.DS)); err != nil {
		t.Fatal(err)
	}
	for i := range lost {
		if _, err := m.Server.Meta().Lookup(ctx, meta.RootIno, "lost"+strconv.Itoa(i)); err == nil {
			t.Fatal("a lost create survived the crash: the test proves nothing")
		}
	}
	if _, ok, err := meta.SweepMark(ctx, m.Server.Meta()); err != nil || !ok {
		t.Fatalf("no sweep mark after the crash (%v)", err)
	}

	rep := waitSweep(t, m.Server)
	if !rep.Complete || rep.Removed != lost || rep.Failed != 0 {
		t.Fatalf("sweep: %+v, want the %d objects of the lost files removed", rep, lost)
	}
	objs := onDS()
	for _, ino := range lostInos {
		if slices.Contains(objs, ino) {
			t.Errorf("a data server still holds the object of lost inode %d", ino)
		}
	}
	for _, ino := range keptInos {
		if !slices.Contains(objs, ino) {
			t.Errorf("the object of kept inode %d is gone", ino)
		}
	}
	// Both data servers were swept: the lost files' objects were on both.
	if n := len(dsClients); n != 2 {
		t.Errorf("the files' data went to %d data servers, want both", n)
	}
	wantMetric(t, reg, "shoal_data_sweep_objects_total", map[string]string{"result": "removed"}, lost)
	wantMetric(t, reg, "shoal_data_sweep_runs_total", map[string]string{"outcome": "complete"}, 1)
	if _, ok, err := meta.SweepMark(ctx, m.Server.Meta()); err != nil || ok {
		t.Fatalf("the sweep mark survived a complete sweep (%v)", err)
	}

	// The files that survived read back whole.
	cl2, err := wiretest.Setup(ctx, addr, []byte("sweep-reader"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl2.Close()
	for i := range kept {
		res, err := cl2.Compound(op(nfs4.NfsArgop4{Argop: nfs4.OP_PUTROOTFH}),
			openOp(cl2.ClientID, nfs4.OPEN4_SHARE_ACCESS_READ, nfs4.OpenClaim4{Claim: nfs4.CLAIM_NULL, File: ptr(nfs4.Component4("kept" + strconv.Itoa(i)))}, false),
			op(nfs4.NfsArgop4{Argop: nfs4.OP_GETFH}))
		if st := status(t, res, err); st != nfs4.NFS4_OK {
			t.Fatalf("OPEN kept%d: %v", i, st)
		}
		got, err := readMDS(t, cl2, res.Resarray[2].Opopen.Resok4.Stateid, res.Resarray[3].Opgetfh.Resok4.Object)
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("kept%d after the sweep: %d bytes (want %d), %v", i, len(got), len(data), err)
		}
	}

	// On demand (`shoal admin sweep`): nothing left to remove.
	rep, err = m.Server.SweepUnowned(ctx)
	if err != nil || rep.Removed != 0 || rep.Unowned != 0 || !rep.Complete {
		t.Fatalf("sweep on demand after the sweep: %+v, %v", rep, err)
	}
}

// TestSweepOnDemandRemovesLateObject: an object written to a data server
// for a file already freed (a client's write through an old layout can
// land after the free) is swept by `shoal admin sweep`; an object of a
// file created after the sweep read the inode counter is never looked
// at.
func TestSweepOnDemandRemovesLateObject(t *testing.T) {
	dir := t.TempDir()
	c := startClusterIn(t, dir, 1, 10*time.Second)
	ctx := ctxT(t)
	eng := c.MDS.Server.Meta()
	st, err := eng.StatFS(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// A number below the counter that no file has: the leftover.
	nd, _, err := eng.Create(ctx, meta.RootIno, "gone", meta.CreateArgs{Type: meta.TypeDirectory, Mode: 0o755}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := eng.Remove(ctx, meta.RootIno, "gone", time.Time{}); err != nil {
		t.Fatal(err)
	}
	late := uint64(nd.Ino)
	// A number at or above any counter the sweep can read: never swept.
	future := uint64(st.NextIno) + 1<<30
	for _, ino := range []uint64{late, future} {
		fl, err := c.DS[0].Store.Open(ino, true)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := fl.WriteAt([]byte("late"), 0); err != nil {
			t.Fatal(err)
		}
		fl.Close()
	}
	rep, err := c.MDS.Server.SweepUnowned(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Removed != 1 || !rep.Complete {
		t.Fatalf("sweep: %+v, want the one late object removed", rep)
	}
	objs := dsObjects(t, c, 0)
	if slices.Contains(objs, late) || !slices.Contains(objs, future) {
		t.Fatalf("after the sweep the data server holds %v (late %d, future %d)", objs, late, future)
	}
}

func dsObjects(t *testing.T, c *Cluster, i int) []uint64 {
	t.Helper()
	inos, eof, err := c.DS[i].Store.Page(0, 1<<20)
	if err != nil || !eof {
		t.Fatalf("listing data server %d: eof %v, %v", i, eof, err)
	}
	return inos
}

// waitSweep waits (boundedly) until srv has finished a sweep.
func waitSweep(t *testing.T, srv *server.Server) server.SweepReport {
	t.Helper()
	for i := 0; ; i++ {
		if rep, ok := srv.LastSweep(); ok {
			return rep
		}
		if i == 600 {
			t.Fatal("no sweep within 60 s of the restart")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// copyMetaFiles copies the metadata database and its log files in dir:
// what a crash leaves on the disk if it happens now and everything up to
// here was synced.
func copyMetaFiles(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{}
	for _, e := range ents {
		if n := e.Name(); n == "meta.db" || strings.HasPrefix(n, "meta.db-wal-") {
			b, err := os.ReadFile(filepath.Join(dir, n))
			if err != nil {
				t.Fatal(err)
			}
			files[n] = b
		}
	}
	if len(files) < 2 {
		t.Fatalf("metadata files in %s: %d, want the database and a log", dir, len(files))
	}
	return files
}

// restoreMetaFiles puts the metadata files of dir back as copyMetaFiles
// found them, and removes the others.
func restoreMetaFiles(t *testing.T, dir string, files map[string][]byte) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if n := e.Name(); n == "meta.db" || strings.HasPrefix(n, "meta.db-wal") {
			if err := os.Remove(filepath.Join(dir, n)); err != nil {
				t.Fatal(err)
			}
		}
	}
	for n, b := range files {
		if err := os.WriteFile(filepath.Join(dir, n), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSweepWithDataServerDown: a data server out of service cannot be
// listed, so the sweep is incomplete (and says which one): the mark of an
// unclean start would stay for the next start. The data servers in
// service are swept all the same.
func TestSweepWithDataServerDown(t *testing.T) {
	dir := t.TempDir()
	c := startClusterIn(t, dir, 2, 10*time.Second)
	ctx := ctxT(t)
	eng := c.MDS.Server.Meta()
	nd, _, err := eng.Create(ctx, meta.RootIno, "gone", meta.CreateArgs{Type: meta.TypeDirectory, Mode: 0o755}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := eng.Remove(ctx, meta.RootIno, "gone", time.Time{}); err != nil {
		t.Fatal(err)
	}
	fl, err := c.DS[0].Store.Open(uint64(nd.Ino), true)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fl.WriteAt([]byte("late"), 0); err != nil {
		t.Fatal(err)
	}
	fl.Close()
	down := c.DS[1].Agent.ID()
	if err := c.DS[1].Close(); err != nil {
		t.Fatal(err)
	}
	// Bounded wait until the registry has seen the connection go.
	for i := 0; ; i++ {
		if ds, ok := c.MDS.Registry.DataServer(down); ok && !ds.Up {
			break
		}
		if i == 300 {
			t.Fatalf("data server %s still in service 30 s after it closed", down)
		}
		time.Sleep(100 * time.Millisecond)
	}
	rep, err := c.MDS.Server.SweepUnowned(ctx)
	if err == nil || rep.Complete || !strings.Contains(err.Error(), down) {
		t.Fatalf("sweep with %s down: %+v, %v; want incomplete, naming it", down, rep, err)
	}
	if rep.Removed != 1 || slices.Contains(dsObjects(t, c, 0), uint64(nd.Ino)) {
		t.Fatalf("sweep with a data server down: %+v; want the object on the other one removed", rep)
	}
}
