package wiring

import (
	"encoding/binary"
	"testing"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/wiretest"
	"github.com/shoalfs/shoal/server"
)

// TestFlexFilesOpenLayoutInline checks the LAYOUTGET inside the OPEN that
// creates a file on a flexfiles export with inline data on (the default):
// a client that says it is Linux is declined (NFS4ERR_LAYOUTUNAVAILABLE)
// and its file stays at the MDS, small enough to be kept inline; any other
// client (pynfs, FFLS1) gets the layout, and the file is placed on the
// data servers at once.
func TestFlexFilesOpenLayoutInline(t *testing.T) {
	c := startFlexClusterInline(t, 3, 2, server.FlexStripeAuto, 0)
	for _, tc := range []struct {
		name   string
		impl   []nfs4.NfsImplId4
		want   nfs4.Nfsstat4
		placed bool
	}{
		{"linux", []nfs4.NfsImplId4{{NiiDomain: []byte("kernel.org"), NiiName: []byte("Linux 6.1.0-27-amd64 #1 SMP PREEMPT_DYNAMIC x86_64")}},
			nfs4.NFS4ERR_LAYOUTUNAVAILABLE, false},
		{"pynfs", nil, nfs4.NFS4_OK, true},
		{"shoal", []nfs4.NfsImplId4{{NiiDomain: []byte("shoal.dev"), NiiName: []byte("shoal client")}}, nfs4.NFS4_OK, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cl := setupAs(t, c.MDS.Addr.String(), "open-layout-"+tc.name, tc.impl)
			name := "open-layout-" + tc.name
			res, err := cl.Compound(op(nfs4.NfsArgop4{Argop: nfs4.OP_PUTROOTFH}), flexOpenOp(cl, name),
				op(nfs4.NfsArgop4{Argop: nfs4.OP_GETFH}),
				op(nfs4.NfsArgop4{Argop: nfs4.OP_GETATTR, Opgetattr: &nfs4.GETATTR4args{AttrRequest: nfs4.Bitmap4{1 << nfs4.FATTR4_FILEID}}}),
				flexLayoutGet(currentStateid, nfs4.LAYOUTIOMODE4_RW, 0, ^uint64(0), 4096))
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Resarray) != 6 {
				t.Fatalf("OPEN+LAYOUTGET: %d results, status %v", len(res.Resarray), res.Status)
			}
			if got := res.Status; got != tc.want {
				t.Fatalf("LAYOUTGET in the creating OPEN: %v, want %v", got, tc.want)
			}
			ino := binary.BigEndian.Uint64(res.Resarray[4].Opgetattr.Resok4.ObjAttributes.AttrVals)
			fh, open := res.Resarray[3].Opgetfh.Resok4.Object, res.Resarray[2].Opopen.Resok4.Stateid
			if st := stateOf(t, c, ino); st.placed != tc.placed {
				t.Fatalf("after OPEN+LAYOUTGET the file is placed: %v, want %v", st.placed, tc.placed)
			}
			// A small write through the MDS: inline unless placed.
			data := []byte("small file " + tc.name)
			res, err = cl.Compound(putFH(fh), op(nfs4.NfsArgop4{Argop: nfs4.OP_WRITE, Opwrite: &nfs4.WRITE4args{
				Stateid: open, Offset: 0, Stable: nfs4.FILE_SYNC4, Data: data}}))
			if status(t, res, err) != nfs4.NFS4_OK {
				t.Fatalf("WRITE: %v", wiretest.Check(res))
			}
			st := stateOf(t, c, ino)
			if inline := st.inline != nil; inline == tc.placed || st.placed != tc.placed {
				t.Fatalf("after a small write: inline %q, placed %v; want placed %v", st.inline, st.placed, tc.placed)
			}
		})
	}
}

// setupAs is wiretest.Setup for a client that names itself impl in
// EXCHANGE_ID.
func setupAs(t *testing.T, addr, owner string, impl []nfs4.NfsImplId4) *wiretest.Client {
	t.Helper()
	ctx := ctxT(t)
	cl, err := wiretest.Dial(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	cl.ImplID = impl
	if _, err := cl.ExchangeID(ctx, []byte(owner), nfs4.Verifier4{1}); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.CreateSession(ctx, true); err != nil {
		t.Fatal(err)
	}
	if err := cl.ReclaimComplete(ctx); err != nil {
		t.Fatal(err)
	}
	return cl
}
