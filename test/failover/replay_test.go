package failover

import (
	"context"
	"testing"
	"time"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/wiretest"
	"github.com/shoalfs/shoal/server"
)

// TestResentRenameAfterKill: the leader commits a RENAME and dies (as by
// kill -9: the test hook server.DropReplyAfterEnv) before its reply
// leaves; the client, as the Linux kernel does, recovers with the new
// leader under the same client owner and sends the RENAME again. It is
// answered success (not NFS4ERR_NOENT: its source is gone) from the
// replay record the dead leader wrote in etcd with the change, and the
// new leader counts it. The same RENAME from another client owner gets
// the real answer.
func TestResentRenameAfterKill(t *testing.T) {
	w := NewWorld(t, shoalBin)
	w.StartEtcd(3)
	doomed := w.AddMDSEnv([]string{server.DropReplyAfterEnv + "=RENAME"})
	if l := w.WaitLeader(nil, 30*time.Second); l != doomed {
		t.Fatalf("%s leads, want %s", l.Node, doomed.Node)
	}
	w.WaitSecret(10 * time.Second)
	w.AddMDS()

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const owner = "Linux NFSv4.1 replay-test"
	c, err := wiretest.Setup(ctx, doomed.Addr, []byte(owner))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rename := func() []nfs4.NfsArgop4 {
		return []nfs4.NfsArgop4{
			{Argop: nfs4.OP_PUTROOTFH}, {Argop: nfs4.OP_SAVEFH}, {Argop: nfs4.OP_PUTROOTFH},
			{Argop: nfs4.OP_RENAME, Oprename: &nfs4.RENAME4args{Oldname: []byte("tmp44"), Newname: []byte("f44")}},
		}
	}
	res, err := c.CompoundCtx(ctx, nfs4.NfsArgop4{Argop: nfs4.OP_PUTROOTFH},
		nfs4.NfsArgop4{Argop: nfs4.OP_CREATE, Opcreate: &nfs4.CREATE4args{Objtype: nfs4.Createtype4{Type: nfs4.NF4DIR}, Objname: []byte("tmp44")}})
	if err == nil {
		err = wiretest.Check(res)
	}
	if err != nil {
		t.Fatalf("mkdir tmp44: %v", err)
	}
	// The leader carries the RENAME out and dies before answering.
	if res, err := c.CompoundCtx(ctx, rename()...); err == nil {
		t.Fatalf("the leader answered the RENAME (%v): the test hook did not work", res.Status)
	}
	if err := doomed.P.Wait(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	next := w.WaitLeader(doomed, 60*time.Second)

	// The client comes back: EXCHANGE_ID with its owner, CREATE_SESSION,
	// RECLAIM_COMPLETE (it held no state), and resends.
	c2, err := wiretest.Setup(ctx, next.Addr, []byte(owner))
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	// Another client's identical RENAME is a new request: NOENT.
	other, err := wiretest.Setup(ctx, next.Addr, []byte("another client"))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if res, err := other.CompoundCtx(ctx, rename()...); err != nil || res.Status != nfs4.NFS4ERR_NOENT {
		t.Fatalf("RENAME from another client owner: %v %v, want NOENT", statusOf(res), err)
	}
	res, err = c2.CompoundCtx(ctx, rename()...)
	if err != nil || res.Status != nfs4.NFS4_OK {
		t.Fatalf("resent RENAME after the failover: %v %v, want OK", statusOf(res), err)
	}
	if v, err := next.Metric(`shoal_mds_replays_answered_total{instance="mds",role="mds"}`); err != nil || v != 1 {
		t.Errorf("shoal_mds_replays_answered_total = %v (%v), want 1", v, err)
	}
	// The namespace is what one RENAME makes.
	res, err = c2.CompoundCtx(ctx, nfs4.NfsArgop4{Argop: nfs4.OP_PUTROOTFH},
		nfs4.NfsArgop4{Argop: nfs4.OP_LOOKUP, Oplookup: &nfs4.LOOKUP4args{Objname: []byte("f44")}})
	if err != nil || res.Status != nfs4.NFS4_OK {
		t.Errorf("lookup f44: %v %v", statusOf(res), err)
	}
	res, err = c2.CompoundCtx(ctx, nfs4.NfsArgop4{Argop: nfs4.OP_PUTROOTFH},
		nfs4.NfsArgop4{Argop: nfs4.OP_LOOKUP, Oplookup: &nfs4.LOOKUP4args{Objname: []byte("tmp44")}})
	if err != nil || res.Status != nfs4.NFS4ERR_NOENT {
		t.Errorf("lookup tmp44: %v %v, want NOENT", statusOf(res), err)
	}
}

func statusOf(res *nfs4.COMPOUND4res) any {
	if res == nil {
		return "no reply"
	}
	return res.Status
}
