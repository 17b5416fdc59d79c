package server

import (
	"testing"

	"github.com/shoalfs/shoal/internal/nfs4"
)

// TestOpenWantDelegation: with delegations off, an OPEN that states a
// delegation want gets OPEN_DELEGATE_NONE_EXT with the reason it gets none
// (RFC 8881 §18.16.3); one without a want keeps plain OPEN_DELEGATE_NONE;
// an undefined want is NFS4ERR_INVAL. deleg_test.go has the grants.
func TestOpenWantDelegation(t *testing.T) {
	ts := startServer(t, Config{NoDelegations: true})
	c := ts.client()
	rw := uint32(nfs4.OPEN4_SHARE_ACCESS_BOTH)
	must(t)(c.Compound(opPutRoot(), opOpen(c.ClientID, openArgs{name: "f", owner: "creator", access: rw,
		create: true, mode: nfs4.UNCHECKED4})))
	none := nfs4.WhyNoDelegation4(-1)
	for _, tc := range []struct {
		name   string
		access uint32
		want   nfs4.Nfsstat4
		typ    nfs4.OpenDelegationType4
		why    nfs4.WhyNoDelegation4
	}{
		{"no want", rw, nfs4.NFS4_OK, nfs4.OPEN_DELEGATE_NONE, none},
		{"no want, read", nfs4.OPEN4_SHARE_ACCESS_READ, nfs4.NFS4_OK, nfs4.OPEN_DELEGATE_NONE, none},
		{"WANT_NO_DELEG", rw | nfs4.OPEN4_SHARE_ACCESS_WANT_NO_DELEG, nfs4.NFS4_OK, nfs4.OPEN_DELEGATE_NONE_EXT, nfs4.WND4_NOT_WANTED},
		{"WANT_READ_DELEG", nfs4.OPEN4_SHARE_ACCESS_READ | nfs4.OPEN4_SHARE_ACCESS_WANT_READ_DELEG, nfs4.NFS4_OK, nfs4.OPEN_DELEGATE_NONE_EXT, nfs4.WND4_NOT_SUPP_FTYPE},
		{"WANT_ANY_DELEG", rw | nfs4.OPEN4_SHARE_ACCESS_WANT_ANY_DELEG, nfs4.NFS4_OK, nfs4.OPEN_DELEGATE_NONE_EXT, nfs4.WND4_NOT_SUPP_FTYPE},
		{"WANT_WRITE_DELEG", rw | nfs4.OPEN4_SHARE_ACCESS_WANT_WRITE_DELEG, nfs4.NFS4_OK, nfs4.OPEN_DELEGATE_NONE_EXT, nfs4.WND4_WRITE_DELEG_NOT_SUPP_FTYPE},
		{"WANT_READ_DELEG with signal", nfs4.OPEN4_SHARE_ACCESS_READ | nfs4.OPEN4_SHARE_ACCESS_WANT_READ_DELEG |
			nfs4.OPEN4_SHARE_ACCESS_WANT_SIGNAL_DELEG_WHEN_RESRC_AVAIL, nfs4.NFS4_OK, nfs4.OPEN_DELEGATE_NONE_EXT, nfs4.WND4_NOT_SUPP_FTYPE},
		{"WANT_CANCEL", rw | nfs4.OPEN4_SHARE_ACCESS_WANT_CANCEL, nfs4.NFS4_OK, nfs4.OPEN_DELEGATE_NONE_EXT, nfs4.WND4_CANCELLED},
		{"undefined want", rw | 0x0600, nfs4.NFS4ERR_INVAL, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := c.Compound(opPutRoot(), opOpen(c.ClientID, openArgs{name: "f", owner: tc.name, access: tc.access}))
			if err != nil {
				t.Fatal(err)
			}
			if res.Status != tc.want {
				t.Fatalf("OPEN: %s, want %s", summary(res), statName(tc.want))
			}
			if tc.want != nfs4.NFS4_OK {
				return
			}
			ok := find(t, res, nfs4.OP_OPEN).Opopen.Resok4
			d := ok.Delegation
			if d.DelegationType != tc.typ {
				t.Fatalf("delegation type %v, want %v", d.DelegationType, tc.typ)
			}
			if tc.typ == nfs4.OPEN_DELEGATE_NONE_EXT {
				if d.OdWhynone == nil || d.OdWhynone.OndWhy != tc.why {
					t.Errorf("why no delegation %+v, want %v", d.OdWhynone, tc.why)
				}
			}
			must(t)(c.Compound(opPutFH(fhOf(t, must(t)(c.Compound(opPutRoot(), opLookup("f"), opGetFH())))), opClose(ok.Stateid)))
		})
	}
}
