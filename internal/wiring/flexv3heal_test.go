package wiring

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/shoalfs/shoal/internal/flexv3"
	"github.com/shoalfs/shoal/internal/ganeshatest"
	"github.com/shoalfs/shoal/internal/nfs3"
	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/wiretest"
	"github.com/shoalfs/shoal/internal/xdr"
	"github.com/shoalfs/shoal/server"
)

// v3Mirror is one mirror of a layout on the NFSv3 data servers.
type v3Mirror struct {
	srv      int // index in the test's Ganesha servers
	dev      nfs4.Deviceid4
	fh       []byte
	uid, gid uint32
}

// ganeshaOf is the index in gs of the Ganesha a flexfiles device names.
func ganeshaOf(t *testing.T, gs []*ganeshatest.Server, da nfs4.FfDeviceAddr4) int {
	t.Helper()
	for i, g := range gs {
		if da.FfdaNetaddrs[0].NaRAddr == fmt.Sprintf("127.0.0.1.%d.%d", g.Port>>8, g.Port&0xff) {
			return i
		}
	}
	t.Fatalf("device address %v is no Ganesha's", da.FfdaNetaddrs)
	return -1
}

// v3Mirrors decodes ff's mirrors, finding each one's Ganesha by the
// device's address.
func v3Mirrors(t *testing.T, s *flexSession, gs []*ganeshatest.Server, ff nfs4.FfLayout4) []v3Mirror {
	t.Helper()
	var out []v3Mirror
	for j, m := range ff.FflMirrors {
		if len(m.FfmDataServers) != 1 {
			t.Fatalf("mirror %d: %d data servers", j, len(m.FfmDataServers))
		}
		ds := m.FfmDataServers[0]
		da := s.deviceInfo(ds.FfdsDeviceid)
		srv := ganeshaOf(t, gs, da)
		uid, _ := strconv.ParseUint(string(ds.FfdsUser), 10, 32)
		gid, _ := strconv.ParseUint(string(ds.FfdsGroup), 10, 32)
		out = append(out, v3Mirror{srv, ds.FfdsDeviceid, ds.FfdsFhVers[0], uint32(uid), uint32(gid)})
	}
	return out
}

// v3Write writes b at off of mirror m's data file as a client with the
// layout does: NFSv3 to its Ganesha with the layout's ids.
func v3Write(ctx context.Context, ns *ganeshatest.Netns, gs []*ganeshatest.Server, m v3Mirror, off uint64, b []byte) error {
	cl, err := nfs3.Dial(ctx, gs[m.srv].Addr(), nfs3.Options{Dial: ns.Dial, UID: m.uid, GID: m.gid})
	if err != nil {
		return err
	}
	defer cl.Close()
	_, err = cl.Write(ctx, m.fh, off, b, nfs3.FILE_SYNC)
	return err
}

// layoutError sends LAYOUTERROR: the client's WRITE to device failed.
func (s *flexSession) layoutError(fh []byte, lsid nfs4.Stateid4, dev nfs4.Deviceid4) nfs4.Nfsstat4 {
	s.t.Helper()
	res, err := s.cl.Compound(putFH(fh), op(nfs4.NfsArgop4{Argop: nfs4.OP_LAYOUTERROR, Oplayouterror: &nfs4.LAYOUTERROR4args{
		LeaOffset: 0, LeaLength: ^uint64(0), LeaStateid: lsid,
		LeaErrors: []nfs4.DeviceError4{{DeDeviceid: dev, DeStatus: nfs4.NFS4ERR_NXIO, DeOpnum: nfs4.OP_WRITE}},
	}}))
	return status(s.t, res, err)
}

// layoutCommit tells the MDS the file is size bytes long.
func (s *flexSession) layoutCommit(fh []byte, lsid nfs4.Stateid4, size uint64) {
	s.t.Helper()
	res, err := s.cl.Compound(putFH(fh), op(nfs4.NfsArgop4{Argop: nfs4.OP_LAYOUTCOMMIT, Oplayoutcommit: &nfs4.LAYOUTCOMMIT4args{
		LocaOffset: 0, LocaLength: size, LocaStateid: lsid,
		LocaLastWriteOffset: nfs4.Newoffset4{NoNewoffset: true, NoOffset: ptr(nfs4.Offset4(size - 1))},
		LocaLayoutupdate:    nfs4.Layoutupdate4{LouType: nfs4.LAYOUT4_FLEX_FILES},
	}}))
	if status(s.t, res, err) != nfs4.NFS4_OK {
		s.t.Fatalf("LAYOUTCOMMIT: %v", wiretest.Check(res))
	}
}

// waitLayout waits for a LAYOUTGET of mode to succeed (a recall or a
// heal in progress answers it with an error for a while).
func (s *flexSession) waitLayout(fh []byte, sid nfs4.Stateid4, mode nfs4.Layoutiomode4) (nfs4.Stateid4, nfs4.FfLayout4) {
	s.t.Helper()
	var lsid nfs4.Stateid4
	var ff nfs4.FfLayout4
	waitFor(s.t, "LAYOUTGET", func() bool {
		var st nfs4.Nfsstat4
		st, lsid, ff = s.layoutGet(fh, sid, mode, 0, ^uint64(0), 0)
		return st == nfs4.NFS4_OK
	})
	return lsid, ff
}

// dataFiles reads file name's data file on every Ganesha's export, from
// the host.
func dataFiles(t *testing.T, gs []*ganeshatest.Server, name string) [][]byte {
	t.Helper()
	var out [][]byte
	for _, g := range gs {
		b, err := os.ReadFile(filepath.Join(g.Export, name))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b)
	}
	return out
}

// TestFlexFilesNFSv3Heal: a LAYOUTERROR naming one NFSv3 data server
// marks the file's copy there stale (in the MDS's metadata: a store that
// starts afresh, as after a restart, sees it) and recalls the file's
// layouts; the last good copy cannot be marked. New layouts and I/O
// through the MDS leave the stale copy out while data is written; a heal
// copies the good copy back, and then both data files hold the same
// bytes, layouts name both mirrors again, and the old write layout's
// owner is fenced.
func TestFlexFilesNFSv3Heal(t *testing.T) {
	reg := prometheus.NewRegistry()
	c, ns, gs := startV3ClusterWith(t, Config{Lease: 30 * time.Second, HealInterval: -1, Metrics: reg})
	ctx := ctxT(t)
	st := c.MDS.FlexV3.Store()
	s := newFlexSession(t, c, "v3-heal")
	sid, fh := s.create("f")
	lsid, ff := s.mustLayoutGet(fh, sid, nfs4.LAYOUTIOMODE4_RW)
	ms := v3Mirrors(t, s, gs, ff)
	if len(ms) != 2 || ms[0].srv == ms[1].srv {
		t.Fatalf("layout mirrors %+v, want one on each Ganesha", ms)
	}
	data := make([]byte, 3<<20+333)
	rand.Read(data)
	first := bytes.Clone(data[:1<<20])
	for _, m := range ms {
		if err := v3Write(ctx, ns, gs, m, 0, first); err != nil {
			t.Fatalf("write to server %d: %v", m.srv, err)
		}
	}
	s.layoutCommit(fh, lsid, uint64(len(first)))
	name := dataName(t, gs)
	ino := inoOfData(t, name)

	// The client reports its WRITE to the second mirror failing.
	bad, good := ms[1], ms[0]
	if got := s.layoutError(fh, lsid, bad.dev); got != nfs4.NFS4_OK {
		t.Fatalf("LAYOUTERROR on the second mirror: %v", got)
	}
	badID := "nfs3:" + gs[bad.srv].Addr() + gs[bad.srv].Path
	if stale, err := st.Stale(ctx, ino); err != nil || !slices.Equal(stale, []string{badID}) {
		t.Fatalf("stale copies after LAYOUTERROR: %v, %v; want [%s]", stale, err, badID)
	}
	waitFor(t, "CB_LAYOUTRECALL", func() bool { return hasLayoutRecall(s.cl, fh) })
	wantMetric(t, reg, "shoal_flexv3_copies_staled_total", nil, 1)
	// The mark is in the MDS's metadata: a store with an empty cache
	// (what an MDS restart starts with) reads it.
	fresh, err := flexv3.New(flexv3.Config{Dial: ns.Dial, Mirrors: 2, Servers: v3Servers(gs)})
	if err != nil {
		t.Fatal(err)
	}
	fresh.SetMaps(c.MDS.Server.Meta())
	if stale, err := fresh.Stale(ctx, ino); err != nil || !slices.Equal(stale, []string{badID}) {
		t.Fatalf("stale copies seen by a fresh store: %v, %v", stale, err)
	}
	fresh.Close()

	// New layouts name the good copy only; the client writes through
	// it, and through the MDS.
	lsid, ff = s.waitLayout(fh, sid, nfs4.LAYOUTIOMODE4_RW)
	ms1 := v3Mirrors(t, s, gs, ff)
	if len(ms1) != 1 || ms1[0].srv != good.srv {
		t.Fatalf("write layout with a stale copy: %+v, want the good copy on server %d only", ms1, good.srv)
	}
	// The good copy is the last one: a report against it is refused
	// (the client must write through the MDS), and nothing changes.
	if got := s.layoutError(fh, lsid, good.dev); got != nfs4.NFS4ERR_INVAL {
		t.Fatalf("LAYOUTERROR on the last good copy: %v, want NFS4ERR_INVAL", got)
	}
	if stale, err := st.Stale(ctx, ino); err != nil || !slices.Equal(stale, []string{badID}) {
		t.Fatalf("stale copies after the refused LAYOUTERROR: %v, %v", stale, err)
	}
	if _, rff := s.waitLayout(fh, sid, nfs4.LAYOUTIOMODE4_READ); len(rff.FflMirrors) != 1 {
		t.Fatalf("read layout with a stale copy: %d mirrors, want 1", len(rff.FflMirrors))
	}
	if err := v3Write(ctx, ns, gs, ms1[0], 1<<20, data[1<<20:]); err != nil {
		t.Fatalf("write to the good copy: %v", err)
	}
	s.layoutCommit(fh, lsid, uint64(len(data)))
	patch := []byte("through the MDS while a copy is stale")
	res, err := s.cl.Compound(putFH(fh), op(nfs4.NfsArgop4{Argop: nfs4.OP_WRITE, Opwrite: &nfs4.WRITE4args{Stateid: sid, Offset: 4096, Stable: nfs4.FILE_SYNC4, Data: patch}}))
	if status(t, res, err) != nfs4.NFS4_OK {
		t.Fatalf("WRITE through the MDS: %v", wiretest.Check(res))
	}
	copy(data[4096:], patch)
	files := dataFiles(t, gs, name)
	if !bytes.Equal(files[good.srv], data) {
		t.Fatalf("good copy: %d bytes, not the data written", len(files[good.srv]))
	}
	if !bytes.Equal(files[bad.srv], first) {
		t.Fatalf("stale copy: %d bytes, want the %d written before it went stale", len(files[bad.srv]), len(first))
	}

	// Heal.
	if n, err := st.Heal(ctx, ino); err != nil || n != 1 {
		t.Fatalf("heal: %d copies, %v; want 1", n, err)
	}
	if stale, err := st.Stale(ctx, ino); err != nil || len(stale) != 0 {
		t.Fatalf("stale copies after the heal: %v, %v", stale, err)
	}
	wantMetric(t, reg, "shoal_flexv3_copies_healed_total", nil, 1)
	files = dataFiles(t, gs, name)
	if sa, sb := sha256.Sum256(files[0]), sha256.Sum256(files[1]); sa != sb || !bytes.Equal(files[0], data) {
		t.Fatalf("after the heal: sha256 %x (%d bytes) and %x (%d bytes), equal to the data %v",
			sa, len(files[0]), sb, len(files[1]), bytes.Equal(files[0], data))
	}
	// The heal fenced the layout handed out while the copy was stale.
	if got := nfs3.Status(v3Write(ctx, ns, gs, ms1[0], 0, []byte("x"))); got != nfs3.NFS3ERR_ACCES && got != nfs3.NFS3ERR_PERM {
		t.Fatalf("write with the pre-heal layout's owner: %v, want an access error", got)
	}
	// Layouts name both mirrors again, and the client's writes with
	// them reach both.
	_, ff = s.waitLayout(fh, sid, nfs4.LAYOUTIOMODE4_RW)
	ms2 := v3Mirrors(t, s, gs, ff)
	if len(ms2) != 2 {
		t.Fatalf("write layout after the heal: %d mirrors, want 2", len(ms2))
	}
	tail := []byte("after the heal")
	for _, m := range ms2 {
		if err := v3Write(ctx, ns, gs, m, 100, tail); err != nil {
			t.Fatalf("write to server %d after the heal: %v", m.srv, err)
		}
	}
	copy(data[100:], tail)
	for i, b := range dataFiles(t, gs, name) {
		if !bytes.Equal(b, data) {
			t.Fatalf("data file on server %d after the heal and a write: %d bytes, differs", i, len(b))
		}
	}
	// Nothing left to heal.
	if n, err := st.HealPass(ctx); err != nil || n != 0 {
		t.Fatalf("heal pass with nothing stale: %d, %v", n, err)
	}
}

// TestFlexFilesNFSv3HealAuto: the ff_ioerr4 of a LAYOUTRETURN marks a
// copy stale just as LAYOUTERROR does, and the MDS's healer (started on
// the mark) heals it without being asked.
func TestFlexFilesNFSv3HealAuto(t *testing.T) {
	c, ns, gs := startV3ClusterWith(t, Config{Lease: 30 * time.Second, HealInterval: time.Hour})
	ctx := ctxT(t)
	st := c.MDS.FlexV3.Store()
	s := newFlexSession(t, c, "v3-heal-auto")
	sid, fh := s.create("g")
	lsid, ff := s.mustLayoutGet(fh, sid, nfs4.LAYOUTIOMODE4_RW)
	ms := v3Mirrors(t, s, gs, ff)
	data := make([]byte, 1<<20+5)
	rand.Read(data)
	// Only the first mirror gets the data: the client's write to the
	// second failed, and it says so when it returns the layout.
	if err := v3Write(ctx, ns, gs, ms[0], 0, data); err != nil {
		t.Fatal(err)
	}
	s.layoutCommit(fh, lsid, uint64(len(data)))
	body := xdr.Marshal(&nfs4.FfLayoutreturn4{FflrIoerrReport: []nfs4.FfIoerr4{{
		FfieOffset: 0, FfieLength: ^uint64(0), FfieStateid: lsid,
		FfieErrors: []nfs4.DeviceError4{{DeDeviceid: ms[1].dev, DeStatus: nfs4.NFS4ERR_NXIO, DeOpnum: nfs4.OP_WRITE}},
	}}})
	if got := s.layoutReturn(fh, lsid, body); got != nfs4.NFS4_OK {
		t.Fatalf("LAYOUTRETURN: %v", got)
	}
	name := dataName(t, gs)
	ino := inoOfData(t, name)
	waitFor(t, "the reported copy healed", func() bool {
		files := dataFiles(t, gs, name)
		stale, err := st.Stale(ctx, ino)
		return err == nil && len(stale) == 0 && bytes.Equal(files[ms[1].srv], data)
	})
	files := dataFiles(t, gs, name)
	if sha256.Sum256(files[0]) != sha256.Sum256(files[1]) || !bytes.Equal(files[0], data) {
		t.Fatal("data files differ after the heal")
	}
	if _, ff := s.waitLayout(fh, sid, nfs4.LAYOUTIOMODE4_RW); len(ff.FflMirrors) != 2 {
		t.Fatalf("write layout after the heal: %d mirrors, want 2", len(ff.FflMirrors))
	}
}

// TestFlexFilesNFSv3StaleRestart: a stale mark outlives the MDS. After
// a LAYOUTERROR marks a copy stale, the MDS restarts on the same
// directory; the new one knows the copy is stale, and its heal pass finds
// and heals it.
func TestFlexFilesNFSv3StaleRestart(t *testing.T) {
	dir := t.TempDir()
	c, ns, gs := startV3ClusterWith(t, Config{Dir: dir, Lease: 30 * time.Second, HealInterval: -1})
	ctx := ctxT(t)
	s := newFlexSession(t, c, "v3-restart")
	sid, fh := s.create("r")
	lsid, ff := s.mustLayoutGet(fh, sid, nfs4.LAYOUTIOMODE4_RW)
	ms := v3Mirrors(t, s, gs, ff)
	data := make([]byte, 2<<20+9)
	rand.Read(data)
	if err := v3Write(ctx, ns, gs, ms[0], 0, data); err != nil {
		t.Fatal(err)
	}
	s.layoutCommit(fh, lsid, uint64(len(data)))
	if got := s.layoutError(fh, lsid, ms[1].dev); got != nfs4.NFS4_OK {
		t.Fatalf("LAYOUTERROR: %v", got)
	}
	name := dataName(t, gs)
	ino := inoOfData(t, name)
	badID := "nfs3:" + gs[ms[1].srv].Addr() + gs[ms[1].srv].Path

	addr := c.MDS.Addr.String()
	if err := c.MDS.Close(); err != nil {
		t.Fatalf("closing the MDS: %v", err)
	}
	f := false
	m, err := StartMDS(MDSConfig{
		Listen: addr, Dir: filepath.Join(dir, "mds"),
		Exports:      []*server.Export{{Path: "/", RootSquash: &f, Layout: server.LayoutFlexFiles, FlexStripe: server.FlexStripeOff}},
		Lease:        30 * time.Second,
		HealInterval: -1,
		FlexV3:       &flexv3.Config{Dial: ns.Dial, Mirrors: 2, Servers: v3Servers(gs)},
		Logger:       slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatalf("restarting the MDS: %v", err)
	}
	c.mu.Lock()
	c.MDS = m
	c.mu.Unlock()

	st := m.FlexV3.Store()
	if stale, err := st.Stale(ctx, ino); err != nil || !slices.Equal(stale, []string{badID}) {
		t.Fatalf("stale copies after the restart: %v, %v; want [%s]", stale, err, badID)
	}
	if n, err := st.HealPass(ctx); err != nil || n != 1 {
		t.Fatalf("heal pass after the restart: %d copies, %v; want 1", n, err)
	}
	files := dataFiles(t, gs, name)
	if sha256.Sum256(files[0]) != sha256.Sum256(files[1]) || !bytes.Equal(files[ms[1].srv], data) {
		t.Fatal("data files differ after the heal")
	}
	if stale, err := st.Stale(ctx, ino); err != nil || len(stale) != 0 {
		t.Fatalf("stale copies after the heal: %v, %v", stale, err)
	}
}

// TestFlexFilesNFSv3HealUnderWrites: writes keep coming while a stale
// copy heals, through the MDS (another client) and straight to the good
// copy with a layout handed out while the copy was stale. Every write
// acknowledged must be in both data files afterwards: the heal holds
// writes through the MDS back and fences the layout's owner before it
// copies (flexv3's heal rule), so none lands on the good copy alone.
func TestFlexFilesNFSv3HealUnderWrites(t *testing.T) {
	c, ns, gs := startV3ClusterWith(t, Config{Lease: 30 * time.Second, HealInterval: -1})
	ctx := ctxT(t)
	st := c.MDS.FlexV3.Store()
	s := newFlexSession(t, c, "v3-heal-writes")
	sid, fh := s.create("w")
	lsid, ff := s.mustLayoutGet(fh, sid, nfs4.LAYOUTIOMODE4_RW)
	ms := v3Mirrors(t, s, gs, ff)
	data := make([]byte, 4<<20)
	rand.Read(data)
	for _, m := range ms {
		if err := v3Write(ctx, ns, gs, m, 0, data); err != nil {
			t.Fatal(err)
		}
	}
	s.layoutCommit(fh, lsid, uint64(len(data)))
	if got := s.layoutError(fh, lsid, ms[1].dev); got != nfs4.NFS4_OK {
		t.Fatalf("LAYOUTERROR: %v", got)
	}
	name := dataName(t, gs)
	ino := inoOfData(t, name)
	_, ff = s.waitLayout(fh, sid, nfs4.LAYOUTIOMODE4_RW)
	one := v3Mirrors(t, s, gs, ff)
	if len(one) != 1 {
		t.Fatalf("write layout with a stale copy: %d mirrors", len(one))
	}

	// Writer 1: the layout's owner, straight to the good copy, chunks
	// at even 4 KiB slots until the fence refuses it.
	// Writer 2: another client through the MDS, at odd slots.
	const slots = 200
	chunk := func(k int) []byte { return bytes.Repeat([]byte{byte(k), byte(k >> 8), 0xa5, 0x5a}, 1024) }
	type result struct{ acked []int }
	layoutDone, mdsDone := make(chan result, 1), make(chan result, 1)
	go func() {
		var r result
		defer func() { layoutDone <- r }()
		cl, err := nfs3.Dial(ctx, gs[one[0].srv].Addr(), nfs3.Options{Dial: ns.Dial, UID: one[0].uid, GID: one[0].gid})
		if err != nil {
			return
		}
		defer cl.Close()
		for k := 0; k < slots; k += 2 {
			if _, err := cl.Write(ctx, one[0].fh, uint64(k)*4096, chunk(k), nfs3.FILE_SYNC); err != nil {
				return
			}
			r.acked = append(r.acked, k)
		}
	}()
	s2 := newFlexSession(t, c, "v3-heal-writes-mds")
	sid2, fh2 := s2.create("w")
	go func() {
		var r result
		defer func() { mdsDone <- r }()
		for k := 1; k < slots; k += 2 {
			res, err := s2.cl.Compound(putFH(fh2), op(nfs4.NfsArgop4{Argop: nfs4.OP_WRITE, Opwrite: &nfs4.WRITE4args{
				Stateid: sid2, Offset: uint64(k) * 4096, Stable: nfs4.FILE_SYNC4, Data: chunk(k)}}))
			if err != nil || res.Status != nfs4.NFS4_OK {
				continue
			}
			r.acked = append(r.acked, k)
		}
	}()
	n, herr := st.Heal(ctx, ino)
	lr, mr := <-layoutDone, <-mdsDone
	if herr != nil || n != 1 {
		t.Fatalf("heal: %d copies, %v", n, herr)
	}
	t.Logf("acknowledged: %d layout writes, %d writes through the MDS", len(lr.acked), len(mr.acked))
	if len(mr.acked) != slots/2 {
		t.Fatalf("writes through the MDS: %d of %d acknowledged", len(mr.acked), slots/2)
	}
	files := dataFiles(t, gs, name)
	if sha256.Sum256(files[0]) != sha256.Sum256(files[1]) {
		t.Fatalf("data files differ after a heal under writes (%d and %d bytes)", len(files[0]), len(files[1]))
	}
	for _, k := range append(lr.acked, mr.acked...) {
		if !bytes.Equal(files[0][k*4096:(k+1)*4096], chunk(k)) {
			t.Fatalf("acknowledged write at slot %d missing after the heal", k)
		}
	}
}

// TestFlexFilesNFSv3HealDownServer: the usual case of a client's error
// report, a data server that went down. Its copy is marked stale (the
// mark needs nothing from that server), writes through the MDS go on
// with the good copy alone, a heal pass leaves the file alone while the
// server does not answer, and heals it once the server is back.
func TestFlexFilesNFSv3HealDownServer(t *testing.T) {
	c, ns, gs := startV3ClusterWith(t, Config{Lease: 30 * time.Second, HealInterval: -1})
	ctx := ctxT(t)
	st := c.MDS.FlexV3.Store()
	s := newFlexSession(t, c, "v3-heal-down")
	sid, fh := s.create("d")
	lsid, ff := s.mustLayoutGet(fh, sid, nfs4.LAYOUTIOMODE4_RW)
	ms := v3Mirrors(t, s, gs, ff)
	data := make([]byte, 1<<20+77)
	rand.Read(data)
	for _, m := range ms {
		if err := v3Write(ctx, ns, gs, m, 0, data); err != nil {
			t.Fatal(err)
		}
	}
	s.layoutCommit(fh, lsid, uint64(len(data)))
	name := dataName(t, gs)
	ino := inoOfData(t, name)
	bad := ms[1].srv
	gs[bad].Stop()
	if got := s.layoutError(fh, lsid, ms[1].dev); got != nfs4.NFS4_OK {
		t.Fatalf("LAYOUTERROR for the stopped server: %v", got)
	}
	_, ff = s.waitLayout(fh, sid, nfs4.LAYOUTIOMODE4_RW)
	if got := v3Mirrors(t, s, gs, ff); len(got) != 1 || got[0].srv != ms[0].srv {
		t.Fatalf("write layout with the server down: %+v", got)
	}
	patch := []byte("while the other server is down")
	res, err := s.cl.Compound(putFH(fh), op(nfs4.NfsArgop4{Argop: nfs4.OP_WRITE, Opwrite: &nfs4.WRITE4args{Stateid: sid, Offset: 10, Stable: nfs4.FILE_SYNC4, Data: patch}}))
	if status(t, res, err) != nfs4.NFS4_OK {
		t.Fatalf("WRITE through the MDS with a copy's server down: %v", wiretest.Check(res))
	}
	copy(data[10:], patch)
	if n, err := st.HealPass(ctx); err == nil || n != 0 {
		t.Fatalf("heal pass with the server down: %d copies, %v; want none and an error", n, err)
	}
	if stale, err := st.Stale(ctx, ino); err != nil || len(stale) != 1 {
		t.Fatalf("stale copies after a failed heal: %v, %v", stale, err)
	}
	g, err := ganeshatest.Start(ctx, ns, gs[bad].Dir, gs[bad].Port)
	if err != nil {
		t.Fatalf("restarting Ganesha: %v", err)
	}
	t.Cleanup(g.Stop)
	gs[bad] = g
	if n, err := st.HealPass(ctx); err != nil || n != 1 {
		t.Fatalf("heal pass with the server back: %d copies, %v; want 1", n, err)
	}
	files := dataFiles(t, gs, name)
	if sha256.Sum256(files[0]) != sha256.Sum256(files[1]) || !bytes.Equal(files[0], data) {
		t.Fatal("data files differ from each other or from the data after the heal")
	}
}

// TestFlexFilesNFSv3MarkUncached: a store that has not looked the file
// up (as after an MDS restart) marks a copy on a stopped data server
// stale from the metadata alone, then serves the file from the good copy;
// the good copy is then the last and is refused.
func TestFlexFilesNFSv3MarkUncached(t *testing.T) {
	c, ns, gs := startV3ClusterWith(t, Config{Lease: 30 * time.Second, HealInterval: -1})
	ctx := ctxT(t)
	s := newFlexSession(t, c, "v3-uncached")
	sid, fh := s.create("u")
	lsid, ff := s.mustLayoutGet(fh, sid, nfs4.LAYOUTIOMODE4_RW)
	ms := v3Mirrors(t, s, gs, ff)
	data := []byte("the good copy's bytes")
	for _, m := range ms {
		if err := v3Write(ctx, ns, gs, m, 0, data); err != nil {
			t.Fatal(err)
		}
	}
	s.layoutCommit(fh, lsid, uint64(len(data)))
	ino := inoOfData(t, dataName(t, gs))
	gs[ms[1].srv].Stop()

	fresh, err := flexv3.New(flexv3.Config{Dial: ns.Dial, Mirrors: 2, Servers: v3Servers(gs), Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	fresh.SetMaps(c.MDS.Server.Meta())
	var devs [2][16]byte
	for i, m := range ms {
		copy(devs[i][:], m.dev[:])
	}
	if _, marked, err := fresh.MarkStale(ctx, ino, devs[1]); err != nil || !marked {
		t.Fatalf("mark the stopped server's copy: marked %v, %v", marked, err)
	}
	f, err := fresh.Open(ino, false)
	if err != nil {
		t.Fatalf("open with a stale copy's server stopped: %v", err)
	}
	got := make([]byte, len(data))
	if n, err := f.ReadAt(got, 0); n != len(data) || !bytes.Equal(got, data) {
		t.Fatalf("read: %d bytes %q, %v", n, got[:n], err)
	}
	if _, marked, err := fresh.MarkStale(ctx, ino, devs[0]); !errors.Is(err, flexv3.ErrLastCopy) || marked {
		t.Fatalf("mark the last good copy: marked %v, %v; want ErrLastCopy", marked, err)
	}
	if _, marked, err := fresh.MarkStale(ctx, ino, devs[1]); err != nil || marked {
		t.Fatalf("mark the stale copy again: marked %v, %v; want nothing done", marked, err)
	}
}

// v3Servers is the flexv3 configuration of the test's Ganeshas.
func v3Servers(gs []*ganeshatest.Server) []flexv3.Server {
	var out []flexv3.Server
	for _, g := range gs {
		out = append(out, flexv3.Server{Addr: g.Addr(), MountAddr: g.MountAddr(), Path: g.Path, Advertise: g.Addr()})
	}
	return out
}
