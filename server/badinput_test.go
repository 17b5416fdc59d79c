package server

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"runtime"
	"sync"
	"testing"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/rpc"
	"github.com/shoalfs/shoal/internal/wiretest"
	"github.com/shoalfs/shoal/internal/xdr"
)

// healthy runs a well-behaved client in the background while bad input is
// thrown at the server, and checks it is served throughout.
type healthy struct {
	c    *wiretest.Client
	stop chan struct{}
	done chan struct{}
	mu   sync.Mutex
	errs []string
	n    int
}

func startHealthy(t *testing.T, ts *testServer) *healthy {
	h := &healthy{c: ts.client(), stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(h.done)
		for range 20000 { // bounded; normally stopped long before
			select {
			case <-h.stop:
				return
			default:
			}
			res, err := h.c.Compound(opPutRoot(), opGetattr(nfs4.FATTR4_TYPE))
			h.mu.Lock()
			h.n++
			switch {
			case err != nil:
				h.errs = append(h.errs, err.Error())
			case res.Status != nfs4.NFS4_OK:
				h.errs = append(h.errs, summary(res))
			}
			h.mu.Unlock()
		}
	}()
	t.Cleanup(func() { h.finish(t) })
	return h
}

// check does one synchronous round trip.
func (h *healthy) check(t *testing.T) {
	t.Helper()
	must(t)(h.c.Compound(opPutRoot(), opGetFH(), opGetattr(nfs4.FATTR4_SIZE)))
}

func (h *healthy) finish(t *testing.T) {
	select {
	case <-h.stop:
		return
	default:
	}
	close(h.stop)
	<-h.done
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.errs) > 0 {
		t.Errorf("healthy client failed %d of %d calls, first: %s", len(h.errs), h.n, h.errs[0])
	}
}

func encodeArgs(tag string, minor uint32, ops ...nfs4.NfsArgop4) []byte {
	return xdr.Marshal(&nfs4.COMPOUND4args{Tag: []byte(tag), Minorversion: minor, Argarray: ops})
}

func TestBadRecords(t *testing.T) {
	ts := startServer(t, Config{})
	h := startHealthy(t, ts)
	cred := wiretest.Cred(0, 0)
	null := wiretest.Record(wiretest.CallBody(7, nfs4.NFSPROC4_NULL, cred, nil))
	tests := []struct {
		name string
		send func(r *wiretest.RawConn) error
		// closed: the server must close the connection; otherwise it
		// must still answer a NULL call on it afterwards.
		closed bool
	}{
		{"truncated record", func(r *wiretest.RawConn) error {
			b := wiretest.Record(wiretest.CallBody(1, nfs4.NFSPROC4_NULL, cred, make([]byte, 100)))
			if err := r.Raw(b[:40]); err != nil {
				return err
			}
			return r.CloseWrite()
		}, true},
		{"truncated record mark", func(r *wiretest.RawConn) error {
			if err := r.Raw([]byte{0x80, 0}); err != nil {
				return err
			}
			return r.CloseWrite()
		}, true},
		{"4 GiB record mark", func(r *wiretest.RawConn) error {
			return r.Raw([]byte{0xff, 0xff, 0xff, 0xff})
		}, true},
		{"2 GiB non-last fragment", func(r *wiretest.RawConn) error {
			return r.Raw([]byte{0x7f, 0xff, 0xff, 0xff, 1, 2, 3, 4})
		}, true},
		{"fragments adding up past the limit", func(r *wiretest.RawConn) error {
			frag := make([]byte, 4+1<<20)
			binary.BigEndian.PutUint32(frag, 1<<20)
			for range 4 {
				if err := r.Raw(frag); err != nil {
					return nil // the server may close while we write
				}
			}
			return nil
		}, true},
		{"empty record", func(r *wiretest.RawConn) error { return r.Raw(wiretest.Record(nil)) }, false},
		{"short header", func(r *wiretest.RawConn) error { return r.Raw(wiretest.Record([]byte{0, 0, 0, 9, 0, 0})) }, false},
		{"reply instead of call", func(r *wiretest.RawConn) error {
			return r.Raw(wiretest.Record([]byte{0, 0, 0, 9, 0, 0, 0, 1, 0, 0, 0, 0}))
		}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := wiretest.DialRaw(ts.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			if err := tc.send(r); err != nil {
				t.Fatalf("send: %v", err)
			}
			if tc.closed {
				if err := r.WaitClosed(); err != nil {
					t.Error(err)
				}
			} else {
				if err := r.Raw(null); err != nil {
					t.Fatal(err)
				}
				// A bad record with a readable xid may get a reply of its
				// own (GARBAGE_ARGS) first.
				for i := 0; ; i++ {
					rp, err := r.ReadReply()
					if err != nil {
						t.Fatalf("no reply to NULL after bad record: %v", err)
					}
					if rp.XID != 7 && i < 2 {
						t.Logf("reply to the bad record: %+v", rp)
						continue
					}
					if rp.XID != 7 || !rp.Accepted || rp.AcceptStat != rpc.Success {
						t.Errorf("NULL reply %+v", rp)
					}
					break
				}
			}
			h.check(t)
		})
	}
}

func TestBadCompounds(t *testing.T) {
	ts := startServer(t, Config{})
	h := startHealthy(t, ts)
	c := ts.client()
	ctx := testCtx(t)
	illegal := func(op nfs4.NfsOpnum4) nfs4.NfsArgop4 { return nfs4.NfsArgop4{Argop: op} }

	t.Run("unknown ops", func(t *testing.T) {
		for _, op := range []nfs4.NfsOpnum4{9999, 76, 0, 2, -1} {
			res := want(t, nfs4.NFS4ERR_OP_ILLEGAL)(c.Compound(opPutRoot(), illegal(op), opGetFH()))
			last := res.Resarray[len(res.Resarray)-1]
			if len(res.Resarray) != 3 || last.Resop != nfs4.OP_ILLEGAL || last.Opillegal == nil || last.Opillegal.Status != nfs4.NFS4ERR_OP_ILLEGAL {
				t.Errorf("op %d: %s", op, summary(res))
			}
		}
		// An operation of 4.2 in a 4.1 COMPOUND is illegal there.
		c.Minor = 1
		res := want(t, nfs4.NFS4ERR_OP_ILLEGAL)(c.Compound(opPutRoot(), nfs4.NfsArgop4{Argop: nfs4.OP_SEEK, Opseek: &nfs4.SEEK4args{}}))
		c.Minor = 2
		if res.Resarray[len(res.Resarray)-1].Resop != nfs4.OP_ILLEGAL {
			t.Errorf("SEEK in 4.1: %s", summary(res))
		}
		// Unknown op as the first op without a session.
		res, err := c.Sessionless(ctx, illegal(9999))
		want(t, nfs4.NFS4ERR_OP_ILLEGAL)(res, err)
		h.check(t)
	})

	t.Run("too many ops", func(t *testing.T) {
		ops := make([]nfs4.NfsArgop4, 10000)
		for i := range ops {
			ops[i] = opPutRoot()
		}
		res, err := c.Sessionless(ctx, ops...)
		res = want(t, nfs4.NFS4ERR_OP_NOT_IN_SESSION)(res, err)
		if len(res.Resarray) != 1 {
			t.Errorf("%d results", len(res.Resarray))
		}
		res = want(t, nfs4.NFS4ERR_TOO_MANY_OPS)(c.Compound(ops[1:]...))
		if len(res.Resarray) != 1 {
			t.Errorf("%d results", len(res.Resarray))
		}
		// A failed SEQUENCE must leave the slot alone (RFC 8881 §18.46.3),
		// so the next request reuses the sequence ID and must be executed,
		// not answered from the slot's cache.
		must(t)(c.Compound(opPutRoot(), opGetFH()))
		h.check(t)
	})

	t.Run("4.0-only ops", func(t *testing.T) {
		for _, op := range []nfs4.NfsOpnum4{nfs4.OP_SETCLIENTID, nfs4.OP_SETCLIENTID_CONFIRM, nfs4.OP_RENEW,
			nfs4.OP_OPEN_CONFIRM, nfs4.OP_RELEASE_LOCKOWNER} {
			res := want(t, nfs4.NFS4ERR_NOTSUPP)(c.Compound(nfs4.NfsArgop4{Argop: op}))
			if res.Resarray[1].Resop != op {
				t.Errorf("%v: result op %v", op, res.Resarray[1].Resop)
			}
			res, err := c.Sessionless(ctx, nfs4.NfsArgop4{Argop: op})
			want(t, nfs4.NFS4ERR_NOTSUPP)(res, err)
		}
		h.check(t)
	})

	t.Run("garbage args", func(t *testing.T) {
		// Raw requests use slots of their own so the client's slot 0
		// bookkeeping stays right.
		good := encodeArgs("", 2, wiretest.Seq(c.SessionID, 3, 1, false), opPutRoot(), opLookup("x"))
		seqOnly := encodeArgs("", 2, wiretest.Seq(c.SessionID, 4, 1, false))
		binary.BigEndian.PutUint32(seqOnly[8:], 2)
		tests := []struct {
			name     string
			args     []byte
			garbage  bool          // RPC GARBAGE_ARGS
			wantStat nfs4.Nfsstat4 // otherwise this COMPOUND status
		}{
			{"empty", nil, true, 0},
			{"three bytes", []byte{1, 2, 3}, true, 0},
			{"huge tag", []byte{0x7f, 0xff, 0xff, 0xff}, true, 0},
			{"count beyond data", binary.BigEndian.AppendUint32([]byte{0, 0, 0, 0, 0, 0, 0, 2}, 1000), true, 0},
			{"op args cut short", good[:len(good)-4], false, nfs4.NFS4ERR_BADXDR},
			{"opnum cut short", append(seqOnly, 0, 0), false, nfs4.NFS4ERR_BADXDR},
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				raw, err := c.CallRaw(ctx, tc.args)
				if tc.garbage {
					var ae *rpc.AcceptError
					if !errors.As(err, &ae) || ae.Stat != rpc.GarbageArgs {
						t.Errorf("got %v, want GARBAGE_ARGS", err)
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				var res nfs4.COMPOUND4res
				if err := xdr.Unmarshal(raw, &res); err != nil {
					t.Fatalf("decode reply: %v", err)
				}
				if res.Status != tc.wantStat {
					t.Errorf("got %s, want %s", summary(&res), statName(tc.wantStat))
				}
			})
		}
		h.check(t)
	})

	t.Run("result shapes of dispatcher failures", func(t *testing.T) {
		// SETATTR4res has attrsset even on error; replies must decode
		// when the dispatcher rejects SETATTR before its handler runs.
		res, err := c.Sessionless(ctx, opSetattr(anonStateid, fattr(aMode(0o600))))
		want(t, nfs4.NFS4ERR_OP_NOT_IN_SESSION)(res, err)
		args := encodeArgs("", 2, wiretest.Seq(c.SessionID, 6, 1, false), opPutRoot(), opSetattr(anonStateid, fattr(aMode(0o600))))
		raw, err := c.CallRaw(ctx, args[:len(args)-4])
		if err != nil {
			t.Fatal(err)
		}
		var r nfs4.COMPOUND4res
		if err := xdr.Unmarshal(raw, &r); err != nil {
			t.Fatalf("undecodable reply to truncated SETATTR: %v", err)
		}
		if r.Status != nfs4.NFS4ERR_BADXDR {
			t.Errorf("truncated SETATTR: %s", summary(&r))
		}
		h.check(t)
	})

	t.Run("bad stateids", func(t *testing.T) {
		sid, fh := openFile(t, c, "f", nfs4.OPEN4_SHARE_ACCESS_BOTH, 0, "o")
		random := nfs4.Stateid4{Seqid: 1, Other: [12]byte{4: 1, 5: 9, 8: 1, 9: 2, 10: 3, 11: 4}}
		copy(random.Other[:4], sid.Other[:4]) // this boot's epoch, unknown state
		ahead := sid
		ahead.Seqid += 5
		otherEpoch := sid
		otherEpoch.Other[3]-- // an earlier boot: epochs only grow
		for _, tc := range []struct {
			name string
			sid  nfs4.Stateid4
			want nfs4.Nfsstat4
		}{
			{"unknown", random, nfs4.NFS4ERR_BAD_STATEID},
			{"seqid too high", ahead, nfs4.NFS4ERR_BAD_STATEID},
			{"other boot", otherEpoch, nfs4.NFS4ERR_STALE_STATEID},
			{"invalid special", nfs4.Stateid4{Seqid: 0xffffffff}, nfs4.NFS4ERR_BAD_STATEID},
		} {
			t.Run(tc.name, func(t *testing.T) {
				want(t, tc.want)(c.Compound(opPutFH(fh), opRead(tc.sid, 0, 10)))
				want(t, tc.want)(c.Compound(opPutFH(fh), opWrite(tc.sid, 0, nfs4.UNSTABLE4, []byte("x"))))
			})
		}
		// Another client's stateid is not valid for this client.
		c2 := ts.client()
		want(t, nfs4.NFS4ERR_BAD_STATEID)(c2.Compound(opPutFH(fh), opRead(sid, 0, 10)))
		h.check(t)
	})

	t.Run("bad filehandles", func(t *testing.T) {
		res := must(t)(c.Compound(opPutRoot(), opOpen(c.ClientID, openArgs{name: "gone", access: nfs4.OPEN4_SHARE_ACCESS_BOTH, create: true}), opGetFH()))
		fh := fhOf(t, res)
		must(t)(c.Compound(opPutFH(fh), opClose(openSid(t, res)), opPutRoot(), opRemove("gone")))
		want(t, nfs4.NFS4ERR_STALE)(c.Compound(opPutFH(fh), opGetattr(nfs4.FATTR4_SIZE)))
		for i := range fh {
			forged := bytesClone(fh)
			forged[i] ^= 0x01
			want(t, nfs4.NFS4ERR_BADHANDLE)(c.Compound(opPutFH(forged), opGetattr(nfs4.FATTR4_SIZE)))
		}
		for _, b := range [][]byte{nil, {1}, append(bytesClone(fh), 0), make([]byte, nfs4.NFS4_FHSIZE)} {
			want(t, nfs4.NFS4ERR_BADHANDLE)(c.Compound(opPutFH(b), opGetattr(nfs4.FATTR4_SIZE)))
		}
		// Handles longer than NFS4_FHSIZE do not even decode.
		want(t, nfs4.NFS4ERR_BADXDR)(c.Compound(opPutFH(make([]byte, nfs4.NFS4_FHSIZE+1))))
		want(t, nfs4.NFS4ERR_NOFILEHANDLE)(c.Compound(opGetattr(nfs4.FATTR4_SIZE)))
		want(t, nfs4.NFS4ERR_RESTOREFH)(c.Compound(opRestFH()))
		h.check(t)
	})
}

// inProcess calls the server's RPC handler directly with COMPOUND args,
// as the fuzz target does. The call's connection is one end of a pipe.
func inProcess(t testing.TB, srv *Server, conn *rpc.Conn, args []byte) ([]byte, rpc.AcceptStat) {
	e := xdr.NewEncoder(512)
	call := &rpc.Call{XID: 1, Prog: nfs4.NFS4_PROGRAM, Vers: nfs4.NFS_V4, Proc: nfs4.NFSPROC4_COMPOUND,
		Cred: wiretest.Cred(0, 0), Sys: &rpc.AuthSysParams{Machine: "fuzz"}, Args: args, Conn: conn}
	st := srv.serveRPC(context.Background(), call, e)
	return e.Bytes(), st
}

func pipeConn(t testing.TB) *rpc.Conn {
	a, b := net.Pipe()
	conn := rpc.NewConn(a, nil, rpc.ConnConfig{})
	t.Cleanup(func() {
		conn.Close()
		b.Close()
	})
	return conn
}

func TestHugeCompoundAllocation(t *testing.T) {
	ts := startServer(t, Config{})
	c := ts.client()
	conn := pipeConn(t)
	ops := make([]nfs4.NfsArgop4, 10001)
	for i := range ops {
		ops[i] = opGetattr(nfs4.FATTR4_SIZE)
	}
	for _, tc := range []struct {
		name string
		ops  []nfs4.NfsArgop4
	}{
		{"without SEQUENCE", ops[1:]},
		{"after SEQUENCE", append([]nfs4.NfsArgop4{wiretest.Seq(c.SessionID, 5, 1, false)}, ops[1:]...)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := encodeArgs("", 2, tc.ops...)
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			out, st := inProcess(t, ts.srv, conn, args)
			runtime.ReadMemStats(&after)
			if st != rpc.Success {
				t.Fatalf("accept stat %v", st)
			}
			var res nfs4.COMPOUND4res
			if err := xdr.Unmarshal(out, &res); err != nil {
				t.Fatal(err)
			}
			if len(res.Resarray) != 1 {
				t.Errorf("%s: %d results", summary(&res), len(res.Resarray))
			}
			// The request is ~120 KB; evaluating one operation of it must
			// not cost more than a few times that.
			if n := after.TotalAlloc - before.TotalAlloc; n > 4<<20 {
				t.Errorf("allocated %d bytes for a %d-byte request", n, len(args))
			}
		})
	}
}
