package wiring

import (
	"bytes"
	"context"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/wiretest"
	"github.com/shoalfs/shoal/internal/xdr"
	"github.com/shoalfs/shoal/server"
)

// TestDataServerWhileMDSAway: while the MDS is away (restarting, failing
// over), a data server keeps serving I/O under a stateid the MDS accepted
// within its lease, and sends I/O it cannot vouch for (a stateid it never
// saw, a file whose stripe map it does not have) to the MDS
// (NFS4ERR_PNFS_NO_LAYOUT), never NFS4ERR_DELAY, which the Linux client
// answers with a 15 s pause. Once the data server has registered with the
// new MDS, that MDS decides: the old boot's stateids are stale.
func TestDataServerWhileMDSAway(t *testing.T) {
	const lease = 60 * time.Second
	dir := t.TempDir()
	ctx := ctxT(t)
	c := startClusterIn(t, dir, 1, lease)
	const owner = "away-client"
	cl, err := wiretest.Setup(ctx, c.MDS.Addr.String(), []byte(owner))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()

	// Two files open for writing, each with a layout.
	type file struct {
		sid nfs4.Stateid4
		fh  []byte // at the MDS
		dfh []byte // data filehandle at the data server
	}
	openWithLayout := func(name string) file {
		t.Helper()
		res, err := cl.Compound(
			op(nfs4.NfsArgop4{Argop: nfs4.OP_PUTROOTFH}),
			openOp(cl.ClientID, nfs4.OPEN4_SHARE_ACCESS_BOTH, nfs4.OpenClaim4{Claim: nfs4.CLAIM_NULL, File: ptr(nfs4.Component4(name))}, true),
			op(nfs4.NfsArgop4{Argop: nfs4.OP_GETFH}),
		)
		if status(t, res, err) != nfs4.NFS4_OK {
			t.Fatalf("OPEN %s: %v", name, wiretest.Check(res))
		}
		sid := res.Resarray[2].Opopen.Resok4.Stateid
		fh := bytes.Clone(res.Resarray[3].Opgetfh.Resok4.Object)
		res, err = cl.Compound(putFH(fh), layoutGet(sid, nfs4.LAYOUTIOMODE4_RW))
		if status(t, res, err) != nfs4.NFS4_OK {
			t.Fatalf("LAYOUTGET %s: %v", name, wiretest.Check(res))
		}
		var fl nfs4.Nfsv41FileLayout4
		if err := xdr.Unmarshal(res.Resarray[2].Oplayoutget.LogrResok4.LogrLayout[0].LoContent.LocBody, &fl); err != nil {
			t.Fatal(err)
		}
		return file{sid: sid, fh: fh, dfh: bytes.Clone(fl.NflFhList[0])}
	}
	checked, unchecked := openWithLayout("checked"), openWithLayout("unchecked")
	if bytes.Equal(checked.dfh, unchecked.dfh) {
		t.Fatal("two files, one data filehandle")
	}
	// A second open of the checked file, by another open owner: the MDS
	// granted its stateid, the data server has the file's object and
	// stripe map but never saw that stateid.
	res, err := cl.Compound(putFH(checked.fh), op(nfs4.NfsArgop4{Argop: nfs4.OP_OPEN, Opopen: &nfs4.OPEN4args{
		ShareAccess: nfs4.OPEN4_SHARE_ACCESS_BOTH,
		Owner:       nfs4.OpenOwner4{Clientid: cl.ClientID, Owner: []byte("o2")},
		Claim:       nfs4.OpenClaim4{Claim: nfs4.CLAIM_FH}}}))
	if status(t, res, err) != nfs4.NFS4_OK {
		t.Fatalf("second OPEN: %v", wiretest.Check(res))
	}
	secondOpen := file{sid: res.Resarray[2].Opopen.Resok4.Stateid, fh: checked.fh, dfh: checked.dfh}

	ds, err := wiretest.Setup(ctx, c.DS[0].Addr.String(), []byte(owner))
	if err != nil {
		t.Fatal(err)
	}
	defer ds.Close()
	write := func(f file) nfs4.Nfsstat4 {
		t.Helper()
		res, err := ds.Compound(putFH(f.dfh), op(nfs4.NfsArgop4{Argop: nfs4.OP_WRITE, Opwrite: &nfs4.WRITE4args{
			Stateid: f.sid, Stable: nfs4.FILE_SYNC4, Data: []byte("data")}}))
		return status(t, res, err)
	}
	if st := write(checked); st != nfs4.NFS4_OK {
		t.Fatalf("WRITE at the data server with the MDS up: %v", st)
	}

	addr := c.MDS.Addr.String()
	if err := c.MDS.Close(); err != nil {
		t.Fatalf("closing the MDS: %v", err)
	}
	for _, tt := range []struct {
		name string
		f    file
		want nfs4.Nfsstat4
	}{
		{"stateid accepted before", checked, nfs4.NFS4_OK},
		{"stateid never checked, file known", secondOpen, nfs4.NFS4ERR_PNFS_NO_LAYOUT},
		{"stateid never checked, file unknown", unchecked, nfs4.NFS4ERR_PNFS_NO_LAYOUT},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if st := write(tt.f); st != tt.want {
				t.Errorf("WRITE at the data server with the MDS away: %v, want %v", st, tt.want)
			}
		})
	}

	// A new MDS, a new boot: the data server registers with it and asks
	// it again.
	f := false
	m, err := StartMDS(MDSConfig{
		Listen: addr, Dir: filepath.Join(dir, "mds"),
		Exports: []*server.Export{{Path: "/", RootSquash: &f}},
		Lease:   lease,
		Logger:  slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatalf("restarting the MDS on %s: %v", addr, err)
	}
	c.mu.Lock()
	c.MDS = m
	c.mu.Unlock()
	wctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := m.Registry.WaitFor(wctx, 1); err != nil {
		t.Fatalf("data server re-registering: %v", err)
	}
	// The data server counts as registered once it has the reply; the
	// registry, once it has sent it.
	waitFor(t, "the data server to register again", func() bool { return c.DS[0].Agent.Stats().Registrations >= 2 })
	if st := write(checked); st != nfs4.NFS4ERR_STALE_STATEID {
		t.Errorf("WRITE under the previous boot's stateid: %v, want NFS4ERR_STALE_STATEID", st)
	}
}
