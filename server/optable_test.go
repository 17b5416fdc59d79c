package server

import (
	"encoding/binary"
	"testing"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/wiretest"
	"github.com/shoalfs/shoal/internal/xdr"
)

// TestOpTableComplete checks that every operation number of NFSv4.1 and
// NFSv4.2 is declared in mdsOps, supported or not, and that the
// declarations of every role's table are consistent: minor versions,
// session rules, NFSv4.0-only operations and releaseArgs marks.
func TestOpTableComplete(t *testing.T) {
	for op := nfs4.OP_ACCESS; op <= nfs4.OP_REMOVEXATTR; op++ {
		if _, ok := mdsOps[op]; !ok {
			t.Errorf("%v (%d) is not declared in mdsOps", op, uint32(op))
		}
		wantMinor := uint32(1)
		if op > nfs4.OP_RECLAIM_COMPLETE {
			wantMinor = 2
		}
		if m, ok := opMinor(op); !ok || m != wantMinor {
			t.Errorf("%v: minor %d (defined %v), want %d", op, m, ok, wantMinor)
		}
	}
	for name, table := range map[string]opTable{"mdsOps": mdsOps, "plainOps": plainOps, "dsOps": dsOps} {
		for op, d := range table {
			if _, ok := opMinor(op); !ok {
				t.Errorf("%s declares %v (%d), outside OP_ACCESS..OP_REMOVEXATTR", name, op, uint32(op))
			}
			if d.v40only && (d.run != nil || d.releaseArgs) {
				t.Errorf("%s %v: NFSv4.0-only but has a handler or releases its arguments", name, op)
			}
			if (d.session == sequenceOp) != (op == nfs4.OP_SEQUENCE) {
				t.Errorf("%s %v: session rule %d", name, op, d.session)
			}
			if d.run == nil && d.releaseArgs && op != nfs4.OP_SEQUENCE {
				t.Errorf("%s %v: unsupported, yet marked releaseArgs", name, op)
			}
			if name == "plainOps" && d.run != nil && mdsOps[op].pnfs {
				t.Errorf("plainOps serves %v, a pNFS operation", op)
			}
			if name == "dsOps" && d.pnfs {
				t.Errorf("dsOps: %v marked pnfs", op)
			}
		}
	}
	for op, d := range mdsOps {
		if d.pnfs && d.run == nil {
			t.Errorf("mdsOps %v: pNFS operation without a handler", op)
		}
		if p := plainOps[op]; !d.pnfs && (p.run == nil) != (d.run == nil) {
			t.Errorf("plainOps %v differs from mdsOps but is no pNFS operation", op)
		}
	}
	if _, ok := mdsOps.lookup(nfs4.OP_ILLEGAL, 2); ok {
		t.Error("OP_ILLEGAL is declared: it must be answered as an illegal operation")
	}
	if _, ok := mdsOps.lookup(nfs4.OP_ALLOCATE, 1); ok {
		t.Error("an NFSv4.2 operation is defined in minor version 1")
	}
}

// TestOpTableOnTheWire sends each operation number with no arguments as
// the second operation of a COMPOUND and checks the dispatcher's verdict:
// unknown numbers (and NFSv4.2 ones in 4.1) are OP_ILLEGAL, declared but
// unimplemented ones NFS4ERR_NOTSUPP, SEQUENCE NFS4ERR_SEQUENCE_POS, and
// implemented ones reach their handler (anything else, typically BADXDR
// for the missing arguments or NOFILEHANDLE).
func TestOpTableOnTheWire(t *testing.T) {
	ts := startServer(t, Config{})
	c := ts.client()
	ctx := testCtx(t)
	for _, minor := range []uint32{1, 2} {
		c.Minor = minor
		for op := nfs4.NfsOpnum4(0); op <= nfs4.OP_REMOVEXATTR+1; op++ {
			// SEQUENCE, then the bare operation number.
			args := encodeCompound(t, minor, c, op)
			raw, err := c.CallRaw(ctx, args)
			if err != nil {
				t.Fatalf("%v: %v", op, err)
			}
			c.AdvanceSlot()
			resop, st := lastResult(t, raw)
			d, declared := ts.srv.ops.lookup(op, minor)
			switch {
			case !declared:
				if resop != nfs4.OP_ILLEGAL || st != nfs4.NFS4ERR_OP_ILLEGAL {
					t.Errorf("minor %d op %d: %v %v, want OP_ILLEGAL", minor, uint32(op), resop, st)
				}
			case op == nfs4.OP_SEQUENCE:
				// No arguments: BADXDR is checked before the position.
				if st != nfs4.NFS4ERR_BADXDR && st != nfs4.NFS4ERR_SEQUENCE_POS {
					t.Errorf("minor %d SEQUENCE second: %v", minor, st)
				}
			case d.v40only || d.run == nil:
				// An operation without arguments decodes; one with
				// arguments is BADXDR before NOTSUPP.
				if st != nfs4.NFS4ERR_NOTSUPP && st != nfs4.NFS4ERR_BADXDR {
					t.Errorf("minor %d %v: %v, want NOTSUPP", minor, op, st)
				}
			default:
				if resop != op || st == nfs4.NFS4ERR_NOTSUPP || st == nfs4.NFS4ERR_OP_ILLEGAL {
					t.Errorf("minor %d %v: %v %v, want its handler's answer", minor, op, resop, st)
				}
			}
		}
	}
}

// encodeCompound encodes COMPOUND arguments of SEQUENCE (c's slot 0, next
// sequence ID) followed by the bare operation number op, without arguments.
func encodeCompound(t *testing.T, minor uint32, c *wiretest.Client, op nfs4.NfsOpnum4) []byte {
	t.Helper()
	b := xdr.Marshal(&nfs4.COMPOUND4args{Minorversion: minor,
		Argarray: []nfs4.NfsArgop4{wiretest.Seq(c.SessionID, 0, c.SlotSeq()+1, false)}})
	// tag<> (empty: 4 bytes), minorversion, then the array count.
	binary.BigEndian.PutUint32(b[8:12], 2)
	return binary.BigEndian.AppendUint32(b, uint32(op))
}

// lastResult returns the operation number and status of the last result
// of a raw COMPOUND reply.
func lastResult(t *testing.T, raw []byte) (nfs4.NfsOpnum4, nfs4.Nfsstat4) {
	t.Helper()
	d := xdr.NewDecoder(raw)
	d.Uint32()  // status
	d.Opaque(0) // tag
	n := d.Uint32()
	if n != 2 {
		t.Fatalf("%d results, want 2 (SEQUENCE failed?)", n)
	}
	if op, st := d.Uint32(), d.Uint32(); op != uint32(nfs4.OP_SEQUENCE) || st != 0 {
		t.Fatalf("first result %d %d", op, st)
	}
	var sr nfs4.SEQUENCE4resok
	sr.DecodeXDR(d)
	op, st := nfs4.NfsOpnum4(d.Uint32()), nfs4.Nfsstat4(d.Uint32())
	if d.Err() != nil {
		t.Fatalf("decoding reply: %v", d.Err())
	}
	return op, st
}
