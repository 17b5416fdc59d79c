// Package wiretest is a deliberately small NFSv4.1 client for driving Shoal's
// server over real TCP in tests.
//
// It does the bare minimum a session needs (EXCHANGE_ID, CREATE_SESSION with
// an optional back channel, SEQUENCE slot bookkeeping) and otherwise sends
// whatever operations a test hands it, unmodified, so tests can exercise
// error paths a well-behaved client would never reach. It keeps no file
// state, never retries and never interprets results beyond the SEQUENCE
// status it needs to advance its slot. [RawConn] goes one level lower and
// writes arbitrary record bytes, for malformed-input tests.
//
// It is test-only code: it lives under server/internal so nothing outside
// the server package's tests can depend on it.
package wiretest

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/rpc"
	"github.com/shoalfs/shoal/internal/xdr"
)

// CBProgram is the callback program number the client registers.
const CBProgram = 0x40000000

// Client is one NFSv4.1 client on one TCP connection. Compound calls on it
// share slot 0 and are serialized.
type Client struct {
	Conn *rpc.Conn
	// ImplID is the implementation id EXCHANGE_ID sends (none if empty).
	ImplID []nfs4.NfsImplId4
	// Cred is the RPC credential for every call (default AUTH_SYS uid 0).
	Cred rpc.OpaqueAuth

	ClientID  uint64
	SessionID nfs4.Sessionid4
	// CSSeq is the csa_sequence the next CREATE_SESSION uses.
	CSSeq uint32
	// Minor is the minor version of Compound and Sessionless requests
	// (default 2, so NFSv4.2 operations are available).
	Minor uint32
	// KeepLayouts makes the client accept CB_LAYOUTRECALL and then never
	// return the layout (a misbehaving client, for fencing tests); by
	// default it answers NFS4ERR_NOMATCHING_LAYOUT.
	KeepLayouts bool
	// CBGetattr, if set, answers CB_GETATTR (a holder of a write
	// delegation reporting its cached size and change); by default the
	// client does not know the operation.
	CBGetattr func(*nfs4.CBGETATTR4args) nfs4.CBGETATTR4res

	mu  sync.Mutex // serializes slot 0
	seq uint32     // last sequence ID used on slot 0

	cbMu        sync.Mutex
	cbProcs     []uint32
	cbCompounds []nfs4.CBCOMPOUND4args
	cbWake      chan struct{}
}

// Cred returns an AUTH_SYS credential for uid/gid.
func Cred(uid, gid uint32) rpc.OpaqueAuth {
	return rpc.AuthSysCred(rpc.AuthSysParams{Machine: "wiretest", UID: uid, GID: gid})
}

// Dial connects to addr. The connection serves back channel calls, which
// the client records (see Callbacks) and answers.
func Dial(ctx context.Context, addr string) (*Client, error) {
	c := &Client{Cred: Cred(0, 0), Minor: 2, cbWake: make(chan struct{}, 1)}
	conn, err := rpc.Dial(ctx, "tcp", addr, rpc.HandlerFunc(c.serveCB))
	if err != nil {
		return nil, err
	}
	c.Conn = conn
	return c, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.Conn.Close() }

// serveCB answers callbacks: CB_NULL, and CB_COMPOUND with an empty OK
// result.
func (c *Client) serveCB(_ context.Context, call *rpc.Call, res *xdr.Encoder) rpc.AcceptStat {
	if call.Prog != CBProgram {
		return rpc.ProgUnavail
	}
	c.cbMu.Lock()
	c.cbProcs = append(c.cbProcs, call.Proc)
	c.cbMu.Unlock()
	select {
	case c.cbWake <- struct{}{}:
	default:
	}
	switch call.Proc {
	case nfs4.CB_NULL:
		return rpc.Success
	case nfs4.CB_COMPOUND:
		var args nfs4.CBCOMPOUND4args
		if err := xdr.Unmarshal(call.Args, &args); err != nil {
			return rpc.GarbageArgs
		}
		c.cbMu.Lock()
		c.cbCompounds = append(c.cbCompounds, args)
		c.cbMu.Unlock()
		// Answer every operation with NFS4_OK; CB_SEQUENCE echoes its
		// arguments as RFC 8881 §20.9 requires.
		r := nfs4.CBCOMPOUND4res{Status: nfs4.NFS4_OK, Tag: args.Tag}
		for _, op := range args.Argarray {
			res := nfs4.NfsCbResop4{Resop: op.Argop}
			switch op.Argop {
			case nfs4.OP_CB_SEQUENCE:
				a := op.Opcbsequence
				res.Opcbsequence = &nfs4.CBSEQUENCE4res{CsrStatus: nfs4.NFS4_OK, CsrResok4: &nfs4.CBSEQUENCE4resok{
					CsrSessionid: a.CsaSessionid, CsrSequenceid: a.CsaSequenceid, CsrSlotid: a.CsaSlotid,
					CsrHighestSlotid: a.CsaHighestSlotid, CsrTargetHighestSlotid: a.CsaHighestSlotid,
				}}
			case nfs4.OP_CB_RECALL:
				res.Opcbrecall = &nfs4.CBRECALL4res{Status: nfs4.NFS4_OK}
			case nfs4.OP_CB_GETATTR:
				if c.CBGetattr == nil {
					r.Status = nfs4.NFS4ERR_NOTSUPP
					res = nfs4.NfsCbResop4{Resop: nfs4.OP_CB_ILLEGAL, Opcbillegal: &nfs4.CBILLEGAL4res{Status: nfs4.NFS4ERR_OP_ILLEGAL}}
					break
				}
				gr := c.CBGetattr(op.Opcbgetattr)
				res.Opcbgetattr = &gr
			case nfs4.OP_CB_OFFLOAD:
				res.Opcboffload = &nfs4.CBOFFLOAD4res{CorStatus: nfs4.NFS4_OK}
			case nfs4.OP_CB_LAYOUTRECALL:
				st := nfs4.NFS4ERR_NOMATCHING_LAYOUT
				if c.KeepLayouts {
					st = nfs4.NFS4_OK // "will return", but never does
				}
				res.Opcblayoutrecall = &nfs4.CBLAYOUTRECALL4res{ClorrStatus: st}
			default:
				r.Status = nfs4.NFS4ERR_NOTSUPP
				res = nfs4.NfsCbResop4{Resop: nfs4.OP_CB_ILLEGAL, Opcbillegal: &nfs4.CBILLEGAL4res{Status: nfs4.NFS4ERR_OP_ILLEGAL}}
			}
			r.Resarray = append(r.Resarray, res)
			if r.Status != nfs4.NFS4_OK {
				break
			}
		}
		r.EncodeXDR(res)
		return rpc.Success
	}
	return rpc.ProcUnavail
}

// CBCompounds returns the CB_COMPOUND requests received so far.
func (c *Client) CBCompounds() []nfs4.CBCOMPOUND4args {
	c.cbMu.Lock()
	defer c.cbMu.Unlock()
	return append([]nfs4.CBCOMPOUND4args(nil), c.cbCompounds...)
}

// Callbacks returns the procedure numbers of the callbacks received so far.
func (c *Client) Callbacks() []uint32 {
	c.cbMu.Lock()
	defer c.cbMu.Unlock()
	return append([]uint32(nil), c.cbProcs...)
}

// WaitCallback waits until a callback with procedure proc has arrived.
func (c *Client) WaitCallback(ctx context.Context, proc uint32) error {
	for {
		for _, p := range c.Callbacks() {
			if p == proc {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wiretest: no callback %d: %w", proc, ctx.Err())
		case <-c.cbWake:
		}
	}
}

// Null calls the NULL procedure.
func (c *Client) Null(ctx context.Context) error {
	_, err := c.Conn.Call(ctx, nfs4.NFS4_PROGRAM, nfs4.NFS_V4, nfs4.NFSPROC4_NULL, c.Cred, nil)
	return err
}

// rawArgs marshals pre-encoded arguments.
type rawArgs []byte

func (r rawArgs) EncodeXDR(e *xdr.Encoder) { e.Append(r) }

// CallRaw sends pre-encoded COMPOUND arguments and returns the raw result
// bytes (after accept_stat).
func (c *Client) CallRaw(ctx context.Context, args []byte) ([]byte, error) {
	return c.Conn.Call(ctx, nfs4.NFS4_PROGRAM, nfs4.NFS_V4, nfs4.NFSPROC4_COMPOUND, c.Cred, rawArgs(args))
}

// Send sends a COMPOUND as is (no SEQUENCE is added) and decodes the
// result. It also returns the raw result bytes.
func (c *Client) Send(ctx context.Context, args *nfs4.COMPOUND4args) (*nfs4.COMPOUND4res, []byte, error) {
	raw, err := c.CallRaw(ctx, xdr.Marshal(args))
	if err != nil {
		return nil, nil, err
	}
	res := new(nfs4.COMPOUND4res)
	if err := xdr.Unmarshal(raw, res); err != nil {
		return nil, raw, fmt.Errorf("wiretest: decode COMPOUND result: %w", err)
	}
	return res, raw, nil
}

// Sessionless sends ops as a minor version 1 COMPOUND without SEQUENCE.
func (c *Client) Sessionless(ctx context.Context, ops ...nfs4.NfsArgop4) (*nfs4.COMPOUND4res, error) {
	res, _, err := c.Send(ctx, &nfs4.COMPOUND4args{Minorversion: c.Minor, Argarray: ops})
	return res, err
}

// ExchangeID runs EXCHANGE_ID for owner/verifier and records the client ID.
func (c *Client) ExchangeID(ctx context.Context, owner []byte, verf nfs4.Verifier4) (*nfs4.EXCHANGEID4resok, error) {
	res, err := c.Sessionless(ctx, nfs4.NfsArgop4{Argop: nfs4.OP_EXCHANGE_ID, OpexchangeId: &nfs4.EXCHANGEID4args{
		EiaClientowner:  nfs4.ClientOwner4{CoVerifier: verf, CoOwnerid: owner},
		EiaFlags:        0,
		EiaStateProtect: nfs4.StateProtect4A{SpaHow: nfs4.SP4_NONE},
		EiaClientImplId: c.ImplID,
	}})
	if err != nil {
		return nil, err
	}
	if err := Check(res); err != nil {
		return nil, err
	}
	ok := res.Resarray[0].OpexchangeId.EirResok4
	c.ClientID = ok.EirClientid
	c.CSSeq = ok.EirSequenceid
	return ok, nil
}

// CreateSession creates a session for the recorded client ID, with this
// connection as back channel when back is set.
func (c *Client) CreateSession(ctx context.Context, back bool) (*nfs4.CREATESESSION4resok, error) {
	var flags uint32
	if back {
		flags = nfs4.CREATE_SESSION4_FLAG_CONN_BACK_CHAN
	}
	// Room for 1 MiB of READ or WRITE data plus the rest of the request
	// or reply: the server enforces these (NFS4ERR_REQ_TOO_BIG,
	// NFS4ERR_REP_TOO_BIG).
	attrs := nfs4.ChannelAttrs4{
		CaMaxrequestsize: 1<<20 + 64<<10, CaMaxresponsesize: 1<<20 + 64<<10,
		CaMaxresponsesizeCached: 64 << 10, CaMaxoperations: 16, CaMaxrequests: 8,
	}
	backAttrs := nfs4.ChannelAttrs4{
		CaMaxrequestsize: 16 << 10, CaMaxresponsesize: 16 << 10,
		CaMaxoperations: 4, CaMaxrequests: 1,
	}
	res, err := c.Sessionless(ctx, nfs4.NfsArgop4{Argop: nfs4.OP_CREATE_SESSION, OpcreateSession: &nfs4.CREATESESSION4args{
		CsaClientid:      c.ClientID,
		CsaSequence:      c.CSSeq,
		CsaFlags:         flags,
		CsaForeChanAttrs: attrs,
		CsaBackChanAttrs: backAttrs,
		CsaCbProgram:     CBProgram,
		CsaSecParms:      []nfs4.CallbackSecParms4{{CbSecflavor: nfs4.AUTH_NONE}},
	}})
	if err != nil {
		return nil, err
	}
	if err := Check(res); err != nil {
		return nil, err
	}
	ok := res.Resarray[0].OpcreateSession.CsrResok4
	c.SessionID = ok.CsrSessionid
	c.CSSeq++
	c.mu.Lock()
	c.seq = 0
	c.mu.Unlock()
	return ok, nil
}

// Setup dials addr and establishes a client ID and a session with a back
// channel, then sends RECLAIM_COMPLETE as a client does once it has nothing
// (more) to reclaim: the server refuses new opens and locks before it (RFC
// 8881 §18.51.3).
func Setup(ctx context.Context, addr string, owner []byte) (*Client, error) {
	c, err := SetupReclaiming(ctx, addr, owner)
	if err != nil {
		return nil, err
	}
	if err := c.ReclaimComplete(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// SetupReclaiming is Setup without RECLAIM_COMPLETE: a client coming back
// after a server restart, which reclaims its state first.
func SetupReclaiming(ctx context.Context, addr string, owner []byte) (*Client, error) {
	c, err := Dial(ctx, addr)
	if err != nil {
		return nil, err
	}
	if _, err := c.ExchangeID(ctx, owner, nfs4.Verifier4{1}); err != nil {
		c.Close()
		return nil, err
	}
	if _, err := c.CreateSession(ctx, true); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// ReclaimComplete sends a global RECLAIM_COMPLETE (rca_one_fs false) on the
// session.
func (c *Client) ReclaimComplete(ctx context.Context) error {
	res, err := c.CompoundCtx(ctx, nfs4.NfsArgop4{Argop: nfs4.OP_RECLAIM_COMPLETE,
		OpreclaimComplete: &nfs4.RECLAIMCOMPLETE4args{RcaOneFs: false}})
	if err != nil {
		return err
	}
	return Check(res)
}

// Seq returns a SEQUENCE operation.
func Seq(sid nfs4.Sessionid4, slot, seqid uint32, cacheThis bool) nfs4.NfsArgop4 {
	return nfs4.NfsArgop4{Argop: nfs4.OP_SEQUENCE, Opsequence: &nfs4.SEQUENCE4args{
		SaSessionid: sid, SaSequenceid: seqid, SaSlotid: slot, SaHighestSlotid: slot, SaCachethis: cacheThis,
	}}
}

// Compound sends SEQUENCE (slot 0, next sequence ID) followed by ops. The
// slot's sequence ID advances when SEQUENCE succeeds. The returned result
// includes the SEQUENCE result at index 0.
func (c *Client) Compound(ops ...nfs4.NfsArgop4) (*nfs4.COMPOUND4res, error) {
	return c.CompoundCtx(context.Background(), ops...)
}

// CompoundCtx is Compound with a context.
func (c *Client) CompoundCtx(ctx context.Context, ops ...nfs4.NfsArgop4) (*nfs4.COMPOUND4res, error) {
	res, _, err := c.compound(ctx, false, ops)
	return res, err
}

// CompoundRaw is Compound with sa_cachethis set, also returning the raw
// result bytes, and the sequence ID used (for retransmission tests).
func (c *Client) CompoundRaw(ctx context.Context, ops ...nfs4.NfsArgop4) (*nfs4.COMPOUND4res, []byte, uint32, error) {
	c.mu.Lock()
	seq := c.seq + 1
	c.mu.Unlock()
	res, raw, err := c.compound(ctx, true, ops)
	return res, raw, seq, err
}

func (c *Client) compound(ctx context.Context, cacheThis bool, ops []nfs4.NfsArgop4) (*nfs4.COMPOUND4res, []byte, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	seq := c.seq + 1
	all := append([]nfs4.NfsArgop4{Seq(c.SessionID, 0, seq, cacheThis)}, ops...)
	res, raw, err := c.Send(ctx, &nfs4.COMPOUND4args{Minorversion: c.Minor, Argarray: all})
	if err != nil {
		return nil, raw, err
	}
	if len(res.Resarray) > 0 && res.Resarray[0].Resop == nfs4.OP_SEQUENCE &&
		res.Resarray[0].Opsequence != nil && res.Resarray[0].Opsequence.SrStatus == nfs4.NFS4_OK {
		c.seq = seq
	}
	return res, raw, nil
}

// SlotSeq returns the last sequence ID used on slot 0.
func (c *Client) SlotSeq() uint32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.seq
}

// AdvanceSlot records that a request sent outside Compound (with Send or
// CallRaw, using sequence ID SlotSeq()+1 on slot 0) passed SEQUENCE.
func (c *Client) AdvanceSlot() {
	c.mu.Lock()
	c.seq++
	c.mu.Unlock()
}

// ErrStatus is returned by Check for a failed COMPOUND.
type ErrStatus struct {
	Status nfs4.Nfsstat4
	Op     nfs4.NfsOpnum4 // the failing operation
	Index  int
}

func (e *ErrStatus) Error() string {
	return fmt.Sprintf("wiretest: op %d (%v) failed: %v", e.Index, e.Op, e.Status)
}

// Check returns an *ErrStatus unless the COMPOUND succeeded.
func Check(res *nfs4.COMPOUND4res) error {
	if res.Status == nfs4.NFS4_OK {
		return nil
	}
	e := &ErrStatus{Status: res.Status}
	if n := len(res.Resarray); n > 0 {
		e.Index = n - 1
		e.Op = res.Resarray[n-1].Resop
	}
	return e
}

// StatusOf returns the status carried by an error from Check, NFS4_OK for
// nil, and -1 for other errors.
func StatusOf(err error) nfs4.Nfsstat4 {
	if err == nil {
		return nfs4.NFS4_OK
	}
	var e *ErrStatus
	if errors.As(err, &e) {
		return e.Status
	}
	return -1
}
