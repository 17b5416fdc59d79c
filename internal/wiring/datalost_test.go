package wiring

import (
	"bytes"
	"fmt"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/shoalfs/shoal/internal/cluster"
	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/wiretest"
)

// TestDataServerRestartChangesVerifier writes UNSTABLE through the metadata
// server (no layout: the MDS forwards to the data servers), restarts every
// data server, and commits. A restarted data server may have lost what it
// had not committed, so the COMMIT must succeed with a write verifier other
// than the WRITEs', which makes the client resend them (RFC 8881 §18.3.3).
// Writes and commits after that share one verifier again.
func TestDataServerRestartChangesVerifier(t *testing.T) {
	const lease = 30 * time.Second
	dir := t.TempDir()
	ctx := ctxT(t)
	c := startClusterIn(t, dir, 2, lease)
	cl, sid, fh := openThroughMDS(t, c, "datalost")
	// Two MiB: with the 1 MiB stripe unit both data servers hold some.
	data := bytes.Repeat([]byte("shoal-dl"), (2<<20)/8)
	write := func(what string) [8]byte {
		t.Helper()
		var verf [8]byte
		for off := 0; off < len(data); off += 1 << 20 {
			res, err := cl.Compound(putFH(fh), op(nfs4.NfsArgop4{Argop: nfs4.OP_WRITE, Opwrite: &nfs4.WRITE4args{
				Stateid: sid, Offset: uint64(off), Stable: nfs4.UNSTABLE4, Data: data[off : off+1<<20]}}))
			if status(t, res, err) != nfs4.NFS4_OK {
				t.Fatalf("%s: WRITE at %d: %v", what, off, wiretest.Check(res))
			}
			w := res.Resarray[2].Opwrite.Resok4
			if off > 0 && w.Writeverf != verf {
				t.Fatalf("%s: WRITE verifiers differ within one run: %x, %x", what, verf, w.Writeverf)
			}
			verf = w.Writeverf
		}
		return verf
	}
	commit := func(what string) [8]byte {
		t.Helper()
		res, err := cl.Compound(putFH(fh), op(nfs4.NfsArgop4{Argop: nfs4.OP_COMMIT, Opcommit: &nfs4.COMMIT4args{}}))
		if status(t, res, err) != nfs4.NFS4_OK {
			t.Fatalf("%s: COMMIT: %v", what, wiretest.Check(res))
		}
		return res.Resarray[2].Opcommit.Resok4.Writeverf
	}

	if w, c := write("before"), commit("before"); w != c {
		t.Fatalf("no restart: WRITE verifier %x, COMMIT verifier %x", w, c)
	}
	before := write("unstable")
	secret, err := cluster.ReadJoinSecret(c.MDS.JoinSecretFile)
	if err != nil {
		t.Fatal(err)
	}
	for i := range c.DS {
		if err := c.DS[i].Close(); err != nil {
			t.Fatalf("closing data server %d: %v", i, err)
		}
		d, err := StartDS(ctx, DSConfig{Listen: "127.0.0.1:0", Dir: filepath.Join(dir, fmt.Sprintf("ds%d", i)),
			MDS: []string{c.MDS.Addr.String()}, JoinSecret: secret, Lease: lease, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatalf("restarting data server %d: %v", i, err)
		}
		c.DS[i] = d
	}
	if err := c.MDS.Registry.WaitFor(ctx, len(c.DS)); err != nil {
		t.Fatal(err)
	}
	after := commit("after the restart")
	if after == before {
		t.Fatalf("COMMIT after the data servers restarted kept the verifier %x: the client would not resend its UNSTABLE writes", after)
	}
	// The client resends under the new verifier, and it holds.
	if w := write("resent"); w != after {
		t.Fatalf("resent WRITEs got verifier %x, the COMMIT said %x", w, after)
	}
	if c := commit("resent"); c != after {
		t.Fatalf("second COMMIT verifier %x, want %x", c, after)
	}
	got := make([]byte, 0, len(data))
	for off := 0; off < len(data); off += 1 << 20 {
		res, err := cl.Compound(putFH(fh), op(nfs4.NfsArgop4{Argop: nfs4.OP_READ, Opread: &nfs4.READ4args{
			Stateid: sid, Offset: uint64(off), Count: 1 << 20}}))
		if status(t, res, err) != nfs4.NFS4_OK {
			t.Fatalf("READ at %d: %v", off, wiretest.Check(res))
		}
		got = append(got, res.Resarray[2].Opread.Resok4.Data...)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("data read back differs from what was written")
	}
}

// TestDataServerDownIsDelay: with a data server down, I/O the metadata
// server forwards to it is answered NFS4ERR_DELAY, which clients retry
// (the data server may be restarting), never NFS4ERR_SERVERFAULT, which
// the Linux client turns into EIO at once.
func TestDataServerDownIsDelay(t *testing.T) {
	c := startClusterIn(t, t.TempDir(), 2, 30*time.Second)
	cl, sid, fh := openThroughMDS(t, c, "ds-down")
	// One stripe unit on each data server: one of the two WRITEs needs the
	// closed one.
	data := bytes.Repeat([]byte{7}, 1<<20)
	write := func() (got []nfs4.Nfsstat4) {
		for off := uint64(0); off < 2<<20; off += 1 << 20 {
			res, err := cl.Compound(putFH(fh), op(nfs4.NfsArgop4{Argop: nfs4.OP_WRITE, Opwrite: &nfs4.WRITE4args{
				Stateid: sid, Offset: off, Stable: nfs4.FILE_SYNC4, Data: data}}))
			got = append(got, status(t, res, err))
		}
		return got
	}
	// The first write places the file over both data servers; a file
	// first written with one of them down would be placed on the other
	// only.
	if got := write(); got[0] != nfs4.NFS4_OK || got[1] != nfs4.NFS4_OK {
		t.Fatalf("WRITEs with every data server up: %v", got)
	}
	if err := c.DS[0].Close(); err != nil {
		t.Fatal(err)
	}
	got := write()
	delays := 0
	for _, st := range got {
		switch st {
		case nfs4.NFS4_OK:
		case nfs4.NFS4ERR_DELAY:
			delays++
		default:
			t.Errorf("WRITE with a data server down: %v, want NFS4_OK or NFS4ERR_DELAY", st)
		}
	}
	if delays == 0 {
		t.Errorf("no WRITE touched the closed data server (statuses %v): nothing was tested", got)
	}
}

// openThroughMDS sets up a client named owner on c's metadata server and
// creates and opens file "f" for reading and writing; it takes no layout.
// The client is closed when the test ends.
func openThroughMDS(t *testing.T, c *Cluster, owner string) (*wiretest.Client, nfs4.Stateid4, []byte) {
	t.Helper()
	cl, err := wiretest.Setup(ctxT(t), c.MDS.Addr.String(), []byte(owner))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	res, err := cl.Compound(
		op(nfs4.NfsArgop4{Argop: nfs4.OP_PUTROOTFH}),
		openOp(cl.ClientID, nfs4.OPEN4_SHARE_ACCESS_BOTH, nfs4.OpenClaim4{Claim: nfs4.CLAIM_NULL, File: ptr(nfs4.Component4("f"))}, true),
		op(nfs4.NfsArgop4{Argop: nfs4.OP_GETFH}),
	)
	if status(t, res, err) != nfs4.NFS4_OK {
		t.Fatalf("OPEN: %v", wiretest.Check(res))
	}
	return cl, res.Resarray[2].Opopen.Resok4.Stateid, bytes.Clone(res.Resarray[3].Opgetfh.Resok4.Object)
}
