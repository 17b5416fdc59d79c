package server

import (
	"bytes"
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/wiretest"
)

// TestCompoundOutlivesItsConnection closes the connection in the middle of
// a COMPOUND that creates a file (after OPEN, before GETATTR), then
// retransmits the same request on a new connection, as a client does. The
// server must have run the COMPOUND to its end and cached the whole reply:
// a reply cut short (NFS4ERR_DELAY for the GETATTR, from the connection's
// cancelled context) made the client retry the create with a new sequence
// id, and its own create then failed with NFS4ERR_EXIST.
func TestCompoundOutlivesItsConnection(t *testing.T) {
	ts := startServer(t, Config{})
	c := ts.client()
	ctx := testCtx(t)

	var armed atomic.Bool
	closed := make(chan error, 1)
	hook := opHook(func(cp *compound, op nfs4.NfsOpnum4, connCtx context.Context) {
		if op != nfs4.OP_GETATTR || !armed.CompareAndSwap(true, false) {
			return
		}
		cp.call.Conn.Close()
		select {
		case <-connCtx.Done():
			closed <- nil
		case <-time.After(10 * time.Second):
			closed <- context.DeadlineExceeded
		}
	})
	ts.srv.testHookBeforeOp.Store(&hook)

	// The slot's next sequence id: one plain request moves it on.
	_, _, seq, err := c.CompoundRaw(ctx, opPutRoot())
	if err != nil {
		t.Fatal(err)
	}
	seq++
	args := &nfs4.COMPOUND4args{Minorversion: c.Minor, Argarray: opsOf(
		wiretest.Seq(c.SessionID, 0, seq, true),
		opPutRoot(),
		opOpen(c.ClientID, openArgs{name: "made-once", access: nfs4.OPEN4_SHARE_ACCESS_BOTH, create: true, mode: nfs4.GUARDED4}),
		opGetFH(),
		opGetattr(nfs4.FATTR4_SIZE, nfs4.FATTR4_CHANGE),
	)}
	armed.Store(true)
	if _, _, err := c.Send(ctx, args); err == nil {
		t.Fatal("the request was answered on a connection closed under it")
	}
	if err := <-closed; err != nil {
		t.Fatalf("the connection's context did not end: %v", err)
	}

	c2, err := wiretest.Dial(ctx, ts.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	c2.Cred, c2.SessionID, c2.ClientID, c2.Minor = c.Cred, c.SessionID, c.ClientID, c.Minor
	var res *nfs4.COMPOUND4res
	var raw []byte
	// While the first run finishes, the slot answers NFS4ERR_DELAY.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		res, raw, err = c2.Send(ctx, args)
		if err != nil {
			t.Fatal(err)
		}
		if res.Status != nfs4.NFS4ERR_DELAY || len(res.Resarray) != 1 || time.Now().After(deadline) {
			break
		}
	}
	if res.Status != nfs4.NFS4_OK || len(res.Resarray) != len(args.Argarray) {
		t.Fatalf("retransmission answered %s, want every operation OK", summary(res))
	}
	again, raw2, err := c2.Send(ctx, args)
	if err != nil || !bytes.Equal(raw, raw2) {
		t.Fatalf("second retransmission not the cached reply: %v %s", err, summary(again))
	}
}
