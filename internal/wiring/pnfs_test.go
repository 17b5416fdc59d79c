package wiring

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/statuspage"
	"github.com/shoalfs/shoal/internal/wiretest"
	"github.com/shoalfs/shoal/internal/xdr"
	"github.com/shoalfs/shoal/meta"
	"github.com/shoalfs/shoal/server"
)

func startCluster(t *testing.T, n int, lease time.Duration) *Cluster {
	t.Helper()
	return startClusterIn(t, t.TempDir(), n, lease)
}

// startClusterIn is startCluster keeping its state in dir, for tests that
// restart a role on the same directory.
func startClusterIn(t *testing.T, dir string, n int, lease time.Duration) *Cluster {
	t.Helper()
	f := false
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := Start(ctx, Config{
		Dir: dir, DataServers: n, Listen: "127.0.0.1:0",
		Exports: []*server.Export{{Path: "/", RootSquash: &f}},
		Lease:   lease,
		Logger:  slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func op(o nfs4.NfsArgop4) nfs4.NfsArgop4 { return o }

var currentStateid = nfs4.Stateid4{Seqid: 1}

func layoutGet(sid nfs4.Stateid4, mode nfs4.Layoutiomode4) nfs4.NfsArgop4 {
	return nfs4.NfsArgop4{Argop: nfs4.OP_LAYOUTGET, Oplayoutget: &nfs4.LAYOUTGET4args{
		LogaLayoutType: nfs4.LAYOUT4_NFSV4_1_FILES, LogaIomode: mode,
		LogaLength: ^uint64(0), LogaStateid: sid, LogaMaxcount: 1 << 16,
	}}
}

func putFH(fh []byte) nfs4.NfsArgop4 {
	return nfs4.NfsArgop4{Argop: nfs4.OP_PUTFH, Opputfh: &nfs4.PUTFH4args{Object: fh}}
}

func status(t *testing.T, res *nfs4.COMPOUND4res, err error) nfs4.Nfsstat4 {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	return res.Status
}

// TestPNFSProtocol checks the metadata server's files layouts end to end at
// the wire level against a real 3-DS cluster: LAYOUTGET contents and the
// (k + ino) mod n rotation, GETDEVICEINFO addresses, I/O at a data server
// under MDS-granted stateids, LAYOUTCOMMIT, layout stateid seqids,
// CB_LAYOUTRECALL on truncate with RECALLCONFLICT and LAYOUTTRYLATER, and
// fencing of a client that never returns a recalled layout.
func TestPNFSProtocol(t *testing.T) {
	const lease = 2 * time.Second
	c := startCluster(t, 3, lease)
	ctx := ctxT(t)
	mds := c.MDS.Addr.String()
	cl, err := wiretest.Setup(ctx, mds, []byte("pnfs-client"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	cl.KeepLayouts = true

	// OPEN (create) + GETFH + LAYOUTGET in one compound, as the Linux
	// client does: the OPEN succeeds, the layout of a file whose data is
	// at the MDS (here: none yet) is declined, and the client's small I/O
	// goes through the MDS (mdsthreshold). A LAYOUTGET of its own, as
	// I/O past the threshold sends, is granted.
	res, err := cl.Compound(
		op(nfs4.NfsArgop4{Argop: nfs4.OP_PUTROOTFH}),
		op(nfs4.NfsArgop4{Argop: nfs4.OP_OPEN, Opopen: &nfs4.OPEN4args{
			// No delegation: another client opens the file below to
			// see LAYOUTTRYLATER, which a write delegation would hold
			// back with DELAY (delegations are deleg_test.go's).
			ShareAccess: nfs4.OPEN4_SHARE_ACCESS_BOTH | nfs4.OPEN4_SHARE_ACCESS_WANT_NO_DELEG,
			Owner:       nfs4.OpenOwner4{Clientid: cl.ClientID, Owner: []byte("o1")},
			Openhow: nfs4.Openflag4{Opentype: nfs4.OPEN4_CREATE, How: &nfs4.Createhow4{
				Mode: nfs4.UNCHECKED4, Createattrs: &nfs4.Fattr4{}}},
			Claim: nfs4.OpenClaim4{Claim: nfs4.CLAIM_NULL, File: ptr(nfs4.Component4("f"))},
		}}),
		op(nfs4.NfsArgop4{Argop: nfs4.OP_GETFH}),
		layoutGet(currentStateid, nfs4.LAYOUTIOMODE4_RW),
	)
	if st := status(t, res, err); st != nfs4.NFS4ERR_LAYOUTUNAVAILABLE || len(res.Resarray) != 5 {
		t.Fatalf("OPEN+LAYOUTGET of a new file: %v, want the OPEN done and the layout declined", wiretest.Check(res))
	}
	openSid := res.Resarray[2].Opopen.Resok4.Stateid
	fh := res.Resarray[3].Opgetfh.Resok4.Object
	res, err = cl.Compound(putFH(fh), layoutGet(openSid, nfs4.LAYOUTIOMODE4_RW))
	if status(t, res, err) != nfs4.NFS4_OK {
		t.Fatalf("LAYOUTGET: %v", wiretest.Check(res))
	}
	lg := res.Resarray[2].Oplayoutget.LogrResok4
	if len(lg.LogrLayout) != 1 || lg.LogrLayout[0].LoContent.LocType != nfs4.LAYOUT4_NFSV4_1_FILES {
		t.Fatalf("layout: %+v", lg.LogrLayout)
	}
	var fl nfs4.Nfsv41FileLayout4
	if err := xdr.Unmarshal(lg.LogrLayout[0].LoContent.LocBody, &fl); err != nil {
		t.Fatal(err)
	}
	if fl.NflUtil != DefaultStripeUnit || len(fl.NflFhList) != 1 {
		t.Fatalf("nfl_util %#x, %d filehandles", fl.NflUtil, len(fl.NflFhList))
	}
	want, err := c.MDS.Striped.Layout(ctx, inoOf(t, c, "f"))
	if err != nil {
		t.Fatal(err)
	}
	first := int(want.First)
	if fl.NflFirstStripeIndex != want.First || want.Count != 3 || fl.NflDeviceid != want.Device {
		t.Fatalf("layout first %d device %x, want %+v", fl.NflFirstStripeIndex, fl.NflDeviceid, want)
	}
	layoutSid := lg.LogrStateid
	if layoutSid.Seqid != 1 {
		t.Fatalf("first layout stateid seqid %d", layoutSid.Seqid)
	}

	// GETDEVICEINFO lists every data server by stripe index.
	res, err = cl.Compound(op(nfs4.NfsArgop4{Argop: nfs4.OP_GETDEVICEINFO, Opgetdeviceinfo: &nfs4.GETDEVICEINFO4args{
		GdiaDeviceId: fl.NflDeviceid, GdiaLayoutType: nfs4.LAYOUT4_NFSV4_1_FILES, GdiaMaxcount: 1 << 16}}))
	if status(t, res, err) != nfs4.NFS4_OK {
		t.Fatalf("GETDEVICEINFO: %v", res.Status)
	}
	var da nfs4.Nfsv41FileLayoutDsAddr4
	if err := xdr.Unmarshal(res.Resarray[1].Opgetdeviceinfo.GdirResok4.GdirDeviceAddr.DaAddrBody, &da); err != nil {
		t.Fatal(err)
	}
	if len(da.NfldaStripeIndices) != 3 || len(da.NfldaMultipathDsList) != 3 {
		t.Fatalf("device: %+v", da)
	}
	dsAddr := func(i int) string {
		na := da.NfldaMultipathDsList[da.NfldaStripeIndices[i]][0]
		return fromUaddr(t, na.NaRAddr)
	}
	for i, d := range c.DS {
		if got := dsAddr(i); got != d.Addr.String() { // the map lists data servers in join order
			t.Errorf("DS %d advertised as %s, listens on %s", i, got, d.Addr)
		}
	}

	// WRITE stripe unit 0 at its data server, under the open stateid.
	ds, err := wiretest.Setup(ctx, dsAddr(first), []byte("pnfs-client"))
	if err != nil {
		t.Fatal(err)
	}
	defer ds.Close()
	data := []byte(strings.Repeat("x", 4096))
	write := func(sid nfs4.Stateid4) nfs4.Nfsstat4 {
		res, err := ds.Compound(putFH(fl.NflFhList[0]), op(nfs4.NfsArgop4{Argop: nfs4.OP_WRITE, Opwrite: &nfs4.WRITE4args{
			Stateid: sid, Offset: 0, Stable: nfs4.UNSTABLE4, Data: data}}))
		return status(t, res, err)
	}
	if st := write(openSid); st != nfs4.NFS4_OK {
		t.Fatalf("DS WRITE: %v", st)
	}
	bogus := openSid
	bogus.Other[11] ^= 0x55
	if st := write(bogus); st != nfs4.NFS4ERR_BAD_STATEID {
		t.Fatalf("DS WRITE with a stateid the MDS never granted: %v", st)
	}
	if res, err := ds.Compound(putFH(fh), op(nfs4.NfsArgop4{Argop: nfs4.OP_COMMIT, Opcommit: &nfs4.COMMIT4args{}})); status(t, res, err) != nfs4.NFS4ERR_BADHANDLE {
		t.Fatalf("DS accepts an MDS filehandle: %v", res.Status)
	}

	// LAYOUTCOMMIT publishes the size.
	res, err = cl.Compound(putFH(fh), op(nfs4.NfsArgop4{Argop: nfs4.OP_LAYOUTCOMMIT, Oplayoutcommit: &nfs4.LAYOUTCOMMIT4args{
		LocaLength: 4096, LocaStateid: layoutSid,
		LocaLastWriteOffset: nfs4.Newoffset4{NoNewoffset: true, NoOffset: ptr(uint64(4095))},
		LocaLayoutupdate:    nfs4.Layoutupdate4{LouType: nfs4.LAYOUT4_NFSV4_1_FILES},
	}}))
	if status(t, res, err) != nfs4.NFS4_OK {
		t.Fatalf("LAYOUTCOMMIT: %v", wiretest.Check(res))
	}
	if ns := res.Resarray[2].Oplayoutcommit.LocrResok4.LocrNewsize; !ns.NsSizechanged || *ns.NsSize != 4096 {
		t.Fatalf("LAYOUTCOMMIT new size %+v", ns)
	}

	// Layout stateid seqids: the current one works, and so does an older
	// one, as LAYOUTGETs sent in parallel carry (RFC 8881 §12.5.3); one
	// the server has not issued does not.
	res, err = cl.Compound(putFH(fh), layoutGet(layoutSid, nfs4.LAYOUTIOMODE4_RW))
	if status(t, res, err) != nfs4.NFS4_OK {
		t.Fatalf("LAYOUTGET with layout stateid: %v", res.Status)
	}
	layoutSid2 := res.Resarray[2].Oplayoutget.LogrResok4.LogrStateid
	if layoutSid2.Seqid != 2 || layoutSid2.Other != layoutSid.Other {
		t.Fatalf("second layout stateid %+v", layoutSid2)
	}
	res, err = cl.Compound(putFH(fh), layoutGet(layoutSid, nfs4.LAYOUTIOMODE4_RW))
	if status(t, res, err) != nfs4.NFS4_OK {
		t.Fatalf("LAYOUTGET with an older layout seqid: %v", res.Status)
	}
	if sid := res.Resarray[2].Oplayoutget.LogrResok4.LogrStateid; sid.Seqid != 3 || sid.Other != layoutSid.Other {
		t.Fatalf("third layout stateid %+v", sid)
	}
	future := layoutSid2
	future.Seqid = 4
	if res, err := cl.Compound(putFH(fh), layoutGet(future, nfs4.LAYOUTIOMODE4_RW)); status(t, res, err) != nfs4.NFS4ERR_BAD_STATEID {
		t.Fatalf("LAYOUTGET with a layout seqid not issued yet: %v", res.Status)
	}

	// Truncate: CB_LAYOUTRECALL goes out, SETATTR is delayed, LAYOUTGET
	// gets RECALLCONFLICT (same client) or LAYOUTTRYLATER (another).
	truncate := func() nfs4.Nfsstat4 {
		sz := make([]byte, 8)
		res, err := cl.Compound(putFH(fh), op(nfs4.NfsArgop4{Argop: nfs4.OP_SETATTR, Opsetattr: &nfs4.SETATTR4args{
			Stateid: openSid, ObjAttributes: nfs4.Fattr4{Attrmask: nfs4.Bitmap4{1 << nfs4.FATTR4_SIZE}, AttrVals: sz}}}))
		return status(t, res, err)
	}
	if st := truncate(); st != nfs4.NFS4ERR_DELAY {
		t.Fatalf("truncate with a layout out: %v, want DELAY while recalling", st)
	}
	waitFor(t, "CB_LAYOUTRECALL", func() bool { return hasLayoutRecall(cl, fh) })
	if res, err := cl.Compound(putFH(fh), layoutGet(layoutSid2, nfs4.LAYOUTIOMODE4_RW)); status(t, res, err) != nfs4.NFS4ERR_RECALLCONFLICT {
		t.Fatalf("LAYOUTGET by the recalled client: %v", res.Status)
	}
	other, err := wiretest.Setup(ctx, mds, []byte("pnfs-other"))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	res, err = other.Compound(putFH(fh), op(nfs4.NfsArgop4{Argop: nfs4.OP_OPEN, Opopen: &nfs4.OPEN4args{
		ShareAccess: nfs4.OPEN4_SHARE_ACCESS_READ,
		Owner:       nfs4.OpenOwner4{Clientid: other.ClientID, Owner: []byte("o2")},
		Claim:       nfs4.OpenClaim4{Claim: nfs4.CLAIM_FH}}}), layoutGet(currentStateid, nfs4.LAYOUTIOMODE4_READ))
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != nfs4.NFS4ERR_LAYOUTTRYLATER {
		t.Fatalf("LAYOUTGET by another client during the recall: %v", wiretest.Check(res))
	}

	// The client never returns the layout: after a lease it is revoked,
	// the truncate goes through, and the data servers fence the client.
	waitFor(t, "truncate after revocation", func() bool {
		ds.Compound() // keep the data-server session's lease alive
		return truncate() == nfs4.NFS4_OK
	})
	if st := write(openSid); st != nfs4.NFS4ERR_PNFS_NO_LAYOUT {
		t.Fatalf("DS WRITE by a fenced client: %v, want PNFS_NO_LAYOUT", st)
	}
	if f := c.MDS.Server.Stats().Fences; f != 1 {
		t.Fatalf("fences = %d", f)
	}
	// A new layout unfences it.
	res, err = cl.Compound(putFH(fh), layoutGet(openSid, nfs4.LAYOUTIOMODE4_RW))
	if status(t, res, err) != nfs4.NFS4_OK {
		t.Fatalf("LAYOUTGET after revocation: %v", res.Status)
	}
	waitFor(t, "unfenced DS WRITE", func() bool { return write(openSid) == nfs4.NFS4_OK })
	checkStatusClient(t, c, cl.ClientID, "pnfs-client")
}

func ptr[T any](v T) *T { return &v }

// waitFor polls cond for up to 20 s; this bounds a test, it asserts no timing.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func hasLayoutRecall(c *wiretest.Client, fh []byte) bool {
	for _, cb := range c.CBCompounds() {
		for _, a := range cb.Argarray {
			if r := a.Opcblayoutrecall; r != nil && r.CloraRecall.LorLayout != nil && string(r.CloraRecall.LorLayout.LorFh) == string(fh) {
				return true
			}
		}
	}
	return false
}

func inoOf(t *testing.T, c *Cluster, name string) uint64 {
	t.Helper()
	nd, err := c.MDS.Server.Meta().Lookup(context.Background(), 1, name)
	if err != nil {
		t.Fatal(err)
	}
	return uint64(nd.Ino)
}

// fromUaddr converts "h1.h2.h3.h4.p1.p2" to host:port.
func fromUaddr(t *testing.T, u string) string {
	t.Helper()
	parts := strings.Split(u, ".")
	if len(parts) != 6 {
		t.Fatalf("bad uaddr %q", u)
	}
	hi, _ := strconv.Atoi(parts[4])
	lo, _ := strconv.Atoi(parts[5])
	return net.JoinHostPort(strings.Join(parts[:4], "."), strconv.Itoa(hi<<8|lo))
}

var _ = errors.New

// TestReadThroughMDSAfterDataServerDies checks the shared-storage fallback:
// after a data server process is gone entirely, reads through the MDS still
// return the right bytes of its stripe units.
func TestReadThroughMDSAfterDataServerDies(t *testing.T) {
	c := startCluster(t, 3, 30*time.Second)
	// Stripe maps are kept for regular files of the namespace only.
	nd, _, err := c.MDS.Server.Meta().Create(ctxT(t), meta.RootIno, "dies",
		meta.CreateArgs{Type: meta.TypeRegular, Mode: 0o644}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	ino := uint64(nd.Ino)
	data := make([]byte, 5<<20+123)
	for i := range data {
		data[i] = byte(i*7 + i>>12)
	}
	f, err := c.MDS.Striped.Open(ino, true)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := c.DS[1].Close(); err != nil {
		t.Fatal(err)
	}
	c.DS[1] = nil
	got := make([]byte, len(data))
	n, err := f.ReadAt(got, 0)
	if n != len(data) || (err != nil && !errors.Is(err, io.EOF)) {
		t.Fatalf("ReadAt = %d, %v", n, err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("data read through the MDS differs after a data server died")
	}
}

// checkStatusClient checks what the status page shows of the client of
// TestPNFSProtocol: the client, and its recall, fence and unfence.
func checkStatusClient(t *testing.T, c *Cluster, id uint64, owner string) {
	t.Helper()
	cid := clientID(id)
	s := snapshotUntil(t, c, "the client's events", func(s *statuspage.Snapshot) bool {
		return hasEvent(s, "unfence", cid, "")
	})
	for _, want := range []struct{ kind, detail string }{
		{"layout recall", "inode "}, {"fence", "did not return"}, {"unfence", "new layout"},
	} {
		if !hasEvent(s, want.kind, cid, want.detail) {
			t.Errorf("no %s event of client %s: %+v", want.kind, cid, s.Events)
		}
	}
	i := slices.IndexFunc(s.Clients, func(cl statuspage.Client) bool { return cl.ID == cid })
	if i < 0 {
		t.Fatalf("client %s not among %+v", cid, s.Clients)
	}
	if cl := s.Clients[i]; cl.Owner != owner || !cl.Confirmed || len(cl.Sessions) != 1 || len(cl.Addrs) != 1 || cl.Layouts != 1 || cl.Fenced ||
		!cl.LeaseExpires.After(s.Time) {
		t.Errorf("client %+v", cl)
	}
}

// TestRemoveWaitsForRecall: removing the last link of a closed file whose
// layout a client still holds recalls the layout and waits a little for
// it, instead of answering NFS4ERR_DELAY at once: Linux keeps layouts
// after close, answers the recall within a round trip, but retries a
// delayed REMOVE only after 100 ms or more, so an `rm -r` of files it had
// read took 100 ms per file. A holder that keeps its layout still gets
// the remover NFS4ERR_DELAY.
func TestRemoveWaitsForRecall(t *testing.T) {
	c := startCluster(t, 2, 2*time.Second)
	ctx := ctxT(t)
	for _, tc := range []struct {
		name string
		keep bool // the holder answers the recall but never returns
		want nfs4.Nfsstat4
	}{
		{"holder-gives-back", false, nfs4.NFS4_OK},
		{"holder-keeps", true, nfs4.NFS4ERR_DELAY},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cl, err := wiretest.Setup(ctx, c.MDS.Addr.String(), []byte("rm-"+tc.name))
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			cl.KeepLayouts = tc.keep
			res, err := cl.Compound(
				op(nfs4.NfsArgop4{Argop: nfs4.OP_PUTROOTFH}),
				openOp(cl.ClientID, nfs4.OPEN4_SHARE_ACCESS_BOTH|nfs4.OPEN4_SHARE_ACCESS_WANT_NO_DELEG,
					nfs4.OpenClaim4{Claim: nfs4.CLAIM_NULL, File: ptr(nfs4.Component4(tc.name))}, true),
				op(nfs4.NfsArgop4{Argop: nfs4.OP_GETFH}),
			)
			if status(t, res, err) != nfs4.NFS4_OK {
				t.Fatalf("OPEN: %v", wiretest.Check(res))
			}
			sid := res.Resarray[2].Opopen.Resok4.Stateid
			fh := res.Resarray[3].Opgetfh.Resok4.Object
			res, err = cl.Compound(putFH(fh), layoutGet(sid, nfs4.LAYOUTIOMODE4_RW))
			if status(t, res, err) != nfs4.NFS4_OK {
				t.Fatalf("LAYOUTGET: %v", wiretest.Check(res))
			}
			res, err = cl.Compound(putFH(fh), op(nfs4.NfsArgop4{Argop: nfs4.OP_CLOSE, Opclose: &nfs4.CLOSE4args{OpenStateid: sid}}))
			if status(t, res, err) != nfs4.NFS4_OK {
				t.Fatalf("CLOSE: %v", wiretest.Check(res))
			}
			res, err = cl.Compound(op(nfs4.NfsArgop4{Argop: nfs4.OP_PUTROOTFH}),
				op(nfs4.NfsArgop4{Argop: nfs4.OP_REMOVE, Opremove: &nfs4.REMOVE4args{Target: nfs4.Component4(tc.name)}}))
			if st := status(t, res, err); st != tc.want {
				t.Fatalf("first REMOVE: %v, want %v", st, tc.want)
			}
			if !hasLayoutRecall(cl, fh) {
				t.Fatal("no CB_LAYOUTRECALL before the file was freed")
			}
		})
	}
}
