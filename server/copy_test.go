package server

import (
	"bytes"
	"testing"
	"time"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/wiretest"
)

// TestCopy runs the server-side copy steps (COPY, CLONE, OFFLOAD_STATUS,
// OFFLOAD_CANCEL) on a plain server; wiring's TestPNFSCopy runs the same
// steps on a pNFS metadata server.
func TestCopy(t *testing.T) {
	ts := startServer(t, Config{})
	c := ts.client()
	wiretest.Copy(t, c, func(name string) (nfs4.Stateid4, []byte) {
		return openFile(t, c, name, nfs4.OPEN4_SHARE_ACCESS_BOTH, 0, "o-"+name)
	})
	// The bytes were copied by the store, not by READ and WRITE.
	st := ts.srv.Stats()
	if st.Ops["COPY"] == 0 || st.Ops["CLONE"] == 0 {
		t.Errorf("ops %v: no COPY or CLONE counted", st.Ops)
	}
}

// TestCopyAsync: a COPY the client asks to be asynchronous, when it is
// long enough (here: any), is answered at once with a copy stateid; the
// copy runs in the background and ends with CB_OFFLOAD on the COPY's
// session; OFFLOAD_STATUS reports progress and outcome to the client that
// started it (and to no other), OFFLOAD_CANCEL stops a copy that has not
// ended and sends no CB_OFFLOAD for it.
func TestCopyAsync(t *testing.T) {
	const mib = 1 << 20
	ts := startServer(t, Config{})
	ts.srv.copies.min = 1
	ts.srv.copies.init()
	c := ts.client()
	other := ts.client()
	srcSid, src := openFile(t, c, "src", nfs4.OPEN4_SHARE_ACCESS_BOTH, 0, "o1")
	dstSid, dst := openFile(t, c, "dst", nfs4.OPEN4_SHARE_ACCESS_BOTH, 0, "o2")
	data := bytes.Repeat([]byte("async copy "), 3*mib/11)
	for off := 0; off < len(data); off += mib {
		must(t)(c.Compound(opPutFH(src), opWrite(srcSid, uint64(off), nfs4.FILE_SYNC4, data[off:min(off+mib, len(data))])))
	}
	n := uint64(len(data))
	copyOp := func(dstOff uint64, sync bool) []nfs4.NfsArgop4 {
		return []nfs4.NfsArgop4{opPutFH(src), {Argop: nfs4.OP_SAVEFH}, opPutFH(dst), {Argop: nfs4.OP_COPY, Opcopy: &nfs4.COPY4args{
			CaSrcStateid: srcSid, CaDstStateid: dstSid, CaDstOffset: dstOff, CaConsecutive: true, CaSynchronous: sync}}}
	}
	status := func(cl *wiretest.Client, sid nfs4.Stateid4) (*nfs4.COMPOUND4res, error) {
		return cl.Compound(opPutFH(dst), nfs4.NfsArgop4{Argop: nfs4.OP_OFFLOAD_STATUS,
			OpoffloadStatus: &nfs4.OFFLOADSTATUS4args{OsaStateid: sid}})
	}
	cancel := func(sid nfs4.Stateid4) (*nfs4.COMPOUND4res, error) {
		return c.Compound(opPutFH(dst), nfs4.NfsArgop4{Argop: nfs4.OP_OFFLOAD_CANCEL,
			OpoffloadCancel: &nfs4.OFFLOADCANCEL4args{OcaStateid: sid}})
	}
	start := func(dstOff uint64) nfs4.Stateid4 {
		t.Helper()
		res := must(t)(c.Compound(copyOp(dstOff, false)...))
		ok := res.Resarray[4].Opcopy.CrResok4
		if len(ok.CrResponse.WrCallbackId) != 1 || ok.CrRequirements.CrSynchronous {
			t.Fatalf("asynchronous COPY answered %+v, want a copy stateid", ok)
		}
		return ok.CrResponse.WrCallbackId[0]
	}
	offloads := func(sid nfs4.Stateid4) []*nfs4.CBOFFLOAD4args {
		var out []*nfs4.CBOFFLOAD4args
		for _, cb := range c.CBCompounds() {
			for _, op := range cb.Argarray {
				if op.Argop == nfs4.OP_CB_OFFLOAD && op.Opcboffload.CoaStateid == sid {
					out = append(out, op.Opcboffload)
				}
			}
		}
		return out
	}

	t.Run("completes with CB_OFFLOAD", func(t *testing.T) {
		sid := start(0)
		ctx := testCtx(t)
		for len(offloads(sid)) == 0 {
			if err := c.WaitCallback(ctx, nfs4.CB_COMPOUND); err != nil {
				t.Fatal(err)
			}
			if len(offloads(sid)) == 0 {
				time.Sleep(10 * time.Millisecond)
			}
		}
		cb := offloads(sid)[0]
		if !bytes.Equal(cb.CoaFh, dst) || cb.CoaOffloadInfo.CoaStatus != nfs4.NFS4_OK ||
			cb.CoaOffloadInfo.CoaResok4 == nil || cb.CoaOffloadInfo.CoaResok4.WrCount != n {
			t.Errorf("CB_OFFLOAD %+v, want %d bytes copied into the destination", cb, n)
		}
		res := must(t)(status(c, sid))
		if r := res.Resarray[2].OpoffloadStatus.OsrResok4; r.OsrCount != n || len(r.OsrComplete) != 1 || r.OsrComplete[0] != nfs4.NFS4_OK {
			t.Errorf("OFFLOAD_STATUS %+v, want %d bytes, complete", r, n)
		}
		want(t, nfs4.NFS4ERR_BAD_STATEID)(status(other, sid))
		want(t, nfs4.NFS4ERR_COMPLETE_ALREADY)(cancel(sid))
		got, err := wiretest.ReadFile(c, dst, dstSid)
		if err != nil || !bytes.Equal(got, data) {
			t.Errorf("destination: %d bytes (%v), want the source's %d", len(got), err, len(data))
		}
	})

	t.Run("cancelled before it runs", func(t *testing.T) {
		// Occupy every worker, so the copy waits.
		for range asyncCopyWorkers {
			ts.srv.copies.sem <- struct{}{}
		}
		sid := start(8 * mib)
		res := must(t)(status(c, sid))
		if r := res.Resarray[2].OpoffloadStatus.OsrResok4; r.OsrCount != 0 || len(r.OsrComplete) != 0 {
			t.Errorf("OFFLOAD_STATUS of a waiting copy: %+v", r)
		}
		must(t)(cancel(sid))
		for range asyncCopyWorkers {
			<-ts.srv.copies.sem
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			res := must(t)(status(c, sid))
			r := res.Resarray[2].OpoffloadStatus.OsrResok4
			if len(r.OsrComplete) == 1 {
				if r.OsrComplete[0] == nfs4.NFS4_OK || r.OsrCount != 0 {
					t.Errorf("cancelled copy: %+v", r)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the cancelled copy never ended")
			}
			time.Sleep(10 * time.Millisecond)
		}
		time.Sleep(100 * time.Millisecond)
		if cbs := offloads(sid); len(cbs) != 0 {
			t.Errorf("CB_OFFLOAD for a cancelled copy: %+v", cbs)
		}
	})

	t.Run("synchronous when asked", func(t *testing.T) {
		res := must(t)(c.Compound(copyOp(0, true)...))
		if ok := res.Resarray[4].Opcopy.CrResok4; len(ok.CrResponse.WrCallbackId) != 0 || !ok.CrRequirements.CrSynchronous || ok.CrResponse.WrCount != n {
			t.Errorf("synchronous COPY answered %+v", ok)
		}
	})
}
