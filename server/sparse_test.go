package server

import (
	"testing"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/wiretest"
)

// TestSparseOps runs the sparse-file steps (SEEK, READ_PLUS, DEALLOCATE,
// ALLOCATE) on a plain server; wiring's TestPNFSSparseOps runs the same
// steps on a pNFS metadata server.
func TestSparseOps(t *testing.T) {
	ts := startServer(t, Config{})
	c := ts.client()
	sid, fh := openFile(t, c, "sparse", nfs4.OPEN4_SHARE_ACCESS_BOTH, 0, "o")
	wiretest.Sparse(t, c, fh, sid)
}

// TestLayoutOpsWithoutPNFS: a server without pNFS hands out no layouts, so
// it has no use for LAYOUTSTATS and LAYOUTERROR (as for LAYOUTGET).
func TestLayoutOpsWithoutPNFS(t *testing.T) {
	ts := startServer(t, Config{})
	c := ts.client()
	sid, fh := openFile(t, c, "f", nfs4.OPEN4_SHARE_ACCESS_BOTH, 0, "o")
	for _, o := range []nfs4.NfsArgop4{
		{Argop: nfs4.OP_LAYOUTSTATS, Oplayoutstats: &nfs4.LAYOUTSTATS4args{LsaStateid: sid,
			LsaLayoutupdate: nfs4.Layoutupdate4{LouType: nfs4.LAYOUT4_NFSV4_1_FILES}}},
		{Argop: nfs4.OP_LAYOUTERROR, Oplayouterror: &nfs4.LAYOUTERROR4args{LeaStateid: sid}},
	} {
		want(t, nfs4.NFS4ERR_NOTSUPP)(c.Compound(opPutFH(fh), o))
	}
}
