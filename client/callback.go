package client

import (
	"context"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/rpc"
	"github.com/shoalfs/shoal/internal/xdr"
)

// serveCallback serves the backchannel: CB_NULL and CB_COMPOUND with
// CB_SEQUENCE, CB_RECALL, CB_GETATTR (deleg.go) and CB_LAYOUTRECALL.
// Every operation is answered at once and whatever takes round trips
// (DELEGRETURN, LAYOUTRETURN) runs in the background: those round trips
// may wait for the very server that waits for this answer.
func (c *Client) serveCallback(ctx context.Context, call *rpc.Call, res *xdr.Encoder) rpc.AcceptStat {
	if call.Prog != nfs4.NFS4_CALLBACK {
		return rpc.ProgUnavail
	}
	switch call.Proc {
	case nfs4.CB_NULL:
		return rpc.Success
	case nfs4.CB_COMPOUND:
	default:
		return rpc.ProcUnavail
	}
	var args nfs4.CBCOMPOUND4args
	if err := xdr.Unmarshal(call.Args, &args); err != nil {
		return rpc.GarbageArgs
	}
	out := nfs4.CBCOMPOUND4res{Tag: args.Tag}
	for i, op := range args.Argarray {
		r := nfs4.NfsCbResop4{Resop: op.Argop}
		var st nfs4.Nfsstat4
		switch op.Argop {
		case nfs4.OP_CB_SEQUENCE:
			a := op.Opcbsequence
			if i != 0 || a == nil {
				st = nfs4.NFS4ERR_SEQUENCE_POS
				r.Opcbsequence = &nfs4.CBSEQUENCE4res{CsrStatus: st}
				break
			}
			r.Opcbsequence = &nfs4.CBSEQUENCE4res{CsrResok4: &nfs4.CBSEQUENCE4resok{
				CsrSessionid: a.CsaSessionid, CsrSequenceid: a.CsaSequenceid, CsrSlotid: a.CsaSlotid,
			}}
		case nfs4.OP_CB_RECALL:
			st = nfs4.NFS4ERR_BADXDR
			if a := op.Opcbrecall; a != nil {
				st = c.cbRecall(a)
			}
			r.Opcbrecall = &nfs4.CBRECALL4res{Status: st}
		case nfs4.OP_CB_GETATTR:
			// The Client holds no write delegations (deleg.go): no
			// file's attributes differ from the server's on its account.
			st = nfs4.NFS4ERR_BADHANDLE
			r.Opcbgetattr = &nfs4.CBGETATTR4res{Status: st}
		case nfs4.OP_CB_LAYOUTRECALL:
			st = nfs4.NFS4ERR_NOMATCHING_LAYOUT
			if a := op.Opcblayoutrecall; a == nil {
				st = nfs4.NFS4ERR_BADXDR
			} else if c.pnfs != nil {
				st = c.pnfs.recall(a)
			}
			r.Opcblayoutrecall = &nfs4.CBLAYOUTRECALL4res{ClorrStatus: st}
		default:
			st = nfs4.NFS4ERR_NOTSUPP
			r = nfs4.NfsCbResop4{Resop: nfs4.OP_CB_ILLEGAL, Opcbillegal: &nfs4.CBILLEGAL4res{Status: st}}
		}
		out.Resarray = append(out.Resarray, r)
		out.Status = st
		if st != nfs4.NFS4_OK {
			break
		}
	}
	out.EncodeXDR(res)
	return rpc.Success
}

// serveNoCallbacks serves the backchannel of a data server's session,
// which carries no state that could be recalled: CB_NULL only.
func serveNoCallbacks(_ context.Context, call *rpc.Call, _ *xdr.Encoder) rpc.AcceptStat {
	switch {
	case call.Prog != nfs4.NFS4_CALLBACK:
		return rpc.ProgUnavail
	case call.Proc == nfs4.CB_NULL:
		return rpc.Success
	}
	return rpc.ProcUnavail
}
