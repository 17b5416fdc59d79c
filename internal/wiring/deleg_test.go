package wiring

import (
	"testing"
	"time"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/wiretest"
	"github.com/shoalfs/shoal/internal/xdr"
)

// TestDelegDataServer: the Linux files-layout client sends I/O to the data
// servers under its delegation stateid when it holds one, so a data
// server accepts a live delegation stateid of the right mode (asking the
// MDS, Server.CheckDataIO), and refuses it once returned.
func TestDelegDataServer(t *testing.T) {
	c := startCluster(t, 1, 30*time.Second)
	ctx := ctxT(t)
	cl, err := wiretest.Setup(ctx, c.MDS.Addr.String(), []byte("deleg-client"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ds, err := wiretest.Setup(ctx, c.DS[0].Addr.String(), []byte("deleg-client"))
	if err != nil {
		t.Fatal(err)
	}
	defer ds.Close()

	// open creates name with access and returns its delegation stateid
	// and the data server filehandle of its layout, asked for under the
	// delegation stateid.
	open := func(name string, access uint32, iomode nfs4.Layoutiomode4) (nfs4.Stateid4, []byte, []byte) {
		t.Helper()
		// The MDS grants no delegation in an OPEN that creates the
		// file unless the client asks for one.
		if access&nfs4.OPEN4_SHARE_ACCESS_WRITE != 0 {
			access |= nfs4.OPEN4_SHARE_ACCESS_WANT_WRITE_DELEG
		} else {
			access |= nfs4.OPEN4_SHARE_ACCESS_WANT_READ_DELEG
		}
		res, err := cl.Compound(
			op(nfs4.NfsArgop4{Argop: nfs4.OP_PUTROOTFH}),
			op(nfs4.NfsArgop4{Argop: nfs4.OP_OPEN, Opopen: &nfs4.OPEN4args{
				ShareAccess: access,
				Owner:       nfs4.OpenOwner4{Clientid: cl.ClientID, Owner: []byte("o")},
				Openhow: nfs4.Openflag4{Opentype: nfs4.OPEN4_CREATE, How: &nfs4.Createhow4{
					Mode: nfs4.UNCHECKED4, Createattrs: &nfs4.Fattr4{}}},
				Claim: nfs4.OpenClaim4{Claim: nfs4.CLAIM_NULL, File: ptr(nfs4.Component4(name))},
			}}),
			op(nfs4.NfsArgop4{Argop: nfs4.OP_GETFH}))
		if status(t, res, err) != nfs4.NFS4_OK {
			t.Fatalf("OPEN %s: %v", name, wiretest.Check(res))
		}
		d := res.Resarray[2].Opopen.Resok4.Delegation
		var sid nfs4.Stateid4
		switch d.DelegationType {
		case nfs4.OPEN_DELEGATE_READ:
			sid = d.Read.Stateid
		case nfs4.OPEN_DELEGATE_WRITE:
			sid = d.Write.Stateid
		default:
			t.Fatalf("OPEN %s: no delegation: %+v", name, d)
		}
		fh := res.Resarray[3].Opgetfh.Resok4.Object
		res, err = cl.Compound(putFH(fh), layoutGet(sid, iomode))
		if status(t, res, err) != nfs4.NFS4_OK {
			t.Fatalf("LAYOUTGET under the delegation of %s: %v", name, wiretest.Check(res))
		}
		var fl nfs4.Nfsv41FileLayout4
		if err := xdr.Unmarshal(res.Resarray[2].Oplayoutget.LogrResok4.LogrLayout[0].LoContent.LocBody, &fl); err != nil {
			t.Fatal(err)
		}
		return sid, fh, fl.NflFhList[0]
	}
	io := func(dataFH []byte, sid nfs4.Stateid4, write bool) nfs4.Nfsstat4 {
		t.Helper()
		a := nfs4.NfsArgop4{Argop: nfs4.OP_READ, Opread: &nfs4.READ4args{Stateid: sid, Count: 10}}
		if write {
			a = nfs4.NfsArgop4{Argop: nfs4.OP_WRITE, Opwrite: &nfs4.WRITE4args{Stateid: sid, Stable: nfs4.FILE_SYNC4, Data: []byte("deleg")}}
		}
		res, err := ds.Compound(putFH(dataFH), op(a))
		return status(t, res, err)
	}

	wsid, wfh, wdata := open("w", nfs4.OPEN4_SHARE_ACCESS_BOTH, nfs4.LAYOUTIOMODE4_RW)
	rsid, _, rdata := open("r", nfs4.OPEN4_SHARE_ACCESS_READ, nfs4.LAYOUTIOMODE4_READ)
	for _, tc := range []struct {
		name   string
		dataFH []byte
		sid    nfs4.Stateid4
		write  bool
		want   nfs4.Nfsstat4
	}{
		{"write under a write delegation", wdata, wsid, true, nfs4.NFS4_OK},
		{"read under a write delegation", wdata, wsid, false, nfs4.NFS4_OK},
		{"read under a read delegation", rdata, rsid, false, nfs4.NFS4_OK},
		{"write under a read delegation", rdata, rsid, true, nfs4.NFS4ERR_OPENMODE},
		{"delegation of another file", rdata, wsid, false, nfs4.NFS4ERR_BAD_STATEID},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if st := io(tc.dataFH, tc.sid, tc.write); st != tc.want {
				t.Fatalf("DS I/O: %v, want %v", st, tc.want)
			}
		})
	}

	// Returned: the data server refuses it once its cached verdict
	// (cluster.Agent, a few seconds) is gone.
	res, err := cl.Compound(putFH(wfh), op(nfs4.NfsArgop4{Argop: nfs4.OP_DELEGRETURN, Opdelegreturn: &nfs4.DELEGRETURN4args{DelegStateid: wsid}}))
	if status(t, res, err) != nfs4.NFS4_OK {
		t.Fatalf("DELEGRETURN: %v", wiretest.Check(res))
	}
	deadline := time.Now().Add(20 * time.Second)
	for io(wdata, wsid, true) != nfs4.NFS4ERR_BAD_STATEID {
		if time.Now().After(deadline) {
			t.Fatal("data server still accepts a returned delegation stateid")
		}
		time.Sleep(100 * time.Millisecond)
	}
}
