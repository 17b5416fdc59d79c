package server

import (
	"context"
	"fmt"
	"time"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/rpc"
	"github.com/shoalfs/shoal/internal/xdr"
	"github.com/shoalfs/shoal/server/internal/state"
)

// seqContext is the session state of a COMPOUND that began with SEQUENCE.
type seqContext struct {
	slot      *state.Slot
	cacheThis bool
	clientID  state.ClientID
	session   *state.Session
}

// alwaysCache is the reply size up to which replies are cached even when
// the client did not ask (sa_cachethis false): cheap insurance for
// exactly-once semantics of small non-idempotent requests.
const alwaysCache = 2048

func (q *seqContext) complete(size int, reply func() []byte) {
	var b []byte
	cache := q.cacheThis || size <= alwaysCache
	if cache && size <= int(q.slot.MaxCached()) {
		b = reply()
	}
	q.slot.Complete(b, cache && b != nil)
}

// principal identifies the RPC credential for client-record comparisons.
// An AUTH_SYS principal is the user on the machine that sent the
// credential: the same uid from another machine name is another principal
// (RFC 8881 §2.4.3, §18.36.4).
func (c *compound) principal() string {
	if p := c.call.Sys; p != nil {
		return fmt.Sprintf("sys:%d@%s", p.UID, p.Machine)
	}
	return "none"
}

// sequence evaluates SEQUENCE. tag is the COMPOUND's tag and ops the
// encoded operations after SEQUENCE; they are fingerprinted for false retry
// detection (reqhash.go) and not retained. A non-nil []byte is a cached
// reply to send instead of evaluating the COMPOUND.
func (c *compound) sequence(a *nfs4.SEQUENCE4args, tag, ops []byte) (opReply, []byte) {
	// Check the request against the session's limits before the slot is
	// touched: a failed SEQUENCE must leave the slot unchanged (RFC 8881
	// §18.46.3), or the client's next request would get this error replayed.
	if sess, err := c.s.st.m.Session(state.SessionID(a.SaSessionid)); err == nil {
		fore := sess.ForeAttrs()
		if uint32(c.nops) > fore.MaxOperations {
			return fail(nfs4.NFS4ERR_TOO_MANY_OPS), nil
		}
		if int64(c.requestSize()) > int64(fore.MaxRequestSize) {
			// RFC 8881 §2.10.6.4: on SEQUENCE, nothing was executed.
			return fail(nfs4.NFS4ERR_REQ_TOO_BIG), nil
		}
		if st := sequenceOverLimit(fore, a.SaCachethis, tag); st != nfs4.NFS4_OK {
			return fail(st), nil
		}
	}
	res, err := c.s.st.m.Sequence(state.SequenceArgs{
		SessionID:     state.SessionID(a.SaSessionid),
		SequenceID:    a.SaSequenceid,
		SlotID:        a.SaSlotid,
		HighestSlotID: a.SaHighestSlotid,
		RequestHash:   requestHash(tag, c.minor, c.nops-1, ops),
		Conn:          c.call.Conn,
	})
	if err != nil {
		return failErr(err), nil
	}
	if res.Replay != nil {
		return opReply{}, res.Replay
	}
	sess, err := c.s.st.m.Session(state.SessionID(a.SaSessionid))
	if err != nil {
		res.Slot.Complete(nil, false)
		return failErr(err), nil
	}
	c.seq = &seqContext{slot: res.Slot, cacheThis: a.SaCachethis, clientID: res.ClientID, session: sess}
	// The client reuses a slot only once it has the reply of the slot's
	// previous request: that request's replay records are obsolete.
	c.s.replays.confirm(sess.ID(), a.SaSlotid)
	var flags uint32
	if res.CBPathDown {
		flags |= nfs4.SEQ4_STATUS_CB_PATH_DOWN_SESSION
	}
	if res.DelegRevoked {
		flags |= nfs4.SEQ4_STATUS_RECALLABLE_STATE_REVOKED
	}
	return ok(&nfs4.SEQUENCE4resok{
		SrSessionid:           a.SaSessionid,
		SrSequenceid:          a.SaSequenceid,
		SrSlotid:              a.SaSlotid,
		SrHighestSlotid:       res.HighestSlotID,
		SrTargetHighestSlotid: res.TargetHighestSlotID,
		SrStatusFlags:         flags,
	}), nil
}

func (c *compound) exchangeID(a *nfs4.EXCHANGEID4args) opReply {
	const known = nfs4.EXCHGID4_FLAG_SUPP_MOVED_REFER | nfs4.EXCHGID4_FLAG_SUPP_MOVED_MIGR |
		nfs4.EXCHGID4_FLAG_BIND_PRINC_STATEID | nfs4.EXCHGID4_FLAG_USE_NON_PNFS |
		nfs4.EXCHGID4_FLAG_USE_PNFS_MDS | nfs4.EXCHGID4_FLAG_USE_PNFS_DS |
		nfs4.EXCHGID4_FLAG_UPD_CONFIRMED_REC_A | nfs4.EXCHGID4_FLAG_SUPP_FENCE_OPS
	if a.EiaFlags&^uint32(known) != 0 {
		return fail(nfs4.NFS4ERR_INVAL)
	}
	res, err := c.s.st.m.ExchangeID(c.ctx, state.ExchangeIDArgs{
		OwnerID:   a.EiaClientowner.CoOwnerid,
		Verifier:  a.EiaClientowner.CoVerifier,
		Principal: c.principal(),
		Update:    a.EiaFlags&nfs4.EXCHGID4_FLAG_UPD_CONFIRMED_REC_A != 0,
	})
	if err != nil {
		return failErr(err)
	}
	c.s.pnfs.noteImpl(res.ClientID, a.EiaClientImplId)
	flags := c.s.exchangeFlags
	if res.Confirmed {
		flags |= nfs4.EXCHGID4_FLAG_CONFIRMED_R
	}
	return ok(&nfs4.EXCHANGEID4resok{
		EirClientid:     uint64(res.ClientID),
		EirSequenceid:   res.SequenceID,
		EirFlags:        flags,
		EirStateProtect: nfs4.StateProtect4R{SprHow: nfs4.SP4_NONE},
		EirServerOwner:  nfs4.ServerOwner4{SoMajorId: c.s.owner},
		EirServerScope:  c.s.scope,
		EirServerImplId: []nfs4.NfsImplId4{{
			NiiDomain: []byte("shoal.dev"),
			NiiName:   []byte("shoal"),
		}},
	})
}

func channelFrom(a *nfs4.ChannelAttrs4) state.ChannelAttrs {
	return state.ChannelAttrs{
		HeaderPadSize:         a.CaHeaderpadsize,
		MaxRequestSize:        a.CaMaxrequestsize,
		MaxResponseSize:       a.CaMaxresponsesize,
		MaxResponseSizeCached: a.CaMaxresponsesizeCached,
		MaxOperations:         a.CaMaxoperations,
		MaxRequests:           a.CaMaxrequests,
	}
}

func channelTo(a state.ChannelAttrs) nfs4.ChannelAttrs4 {
	return nfs4.ChannelAttrs4{
		CaHeaderpadsize:         0,
		CaMaxrequestsize:        a.MaxRequestSize,
		CaMaxresponsesize:       a.MaxResponseSize,
		CaMaxresponsesizeCached: a.MaxResponseSizeCached,
		CaMaxoperations:         a.MaxOperations,
		CaMaxrequests:           a.MaxRequests,
	}
}

// cbCredFrom picks the credential for callbacks from the client's list:
// AUTH_SYS if offered, else AUTH_NONE.
func cbCredFrom(parms []nfs4.CallbackSecParms4) (rpc.OpaqueAuth, bool) {
	none := false
	for _, p := range parms {
		switch p.CbSecflavor {
		case nfs4.AUTH_SYS:
			if p.CbspSysCred != nil {
				return rpc.AuthSysCred(rpc.AuthSysParams{
					Stamp: p.CbspSysCred.Stamp, Machine: p.CbspSysCred.Machinename,
					UID: p.CbspSysCred.Uid, GID: p.CbspSysCred.Gid, GIDs: p.CbspSysCred.Gids,
				}), true
			}
		case nfs4.AUTH_NONE:
			none = true
		}
	}
	return rpc.OpaqueAuth{Flavor: rpc.AuthNone}, none
}

func (c *compound) createSession(a *nfs4.CREATESESSION4args) opReply {
	cred, okCred := cbCredFrom(a.CsaSecParms)
	if !okCred && len(a.CsaSecParms) > 0 {
		return fail(nfs4.NFS4ERR_ENCR_ALG_UNSUPP)
	}
	if st := checkChannels(a, cred); st != nfs4.NFS4_OK {
		return fail(st)
	}
	res, err := c.s.st.m.CreateSession(c.ctx, state.CreateSessionArgs{
		ClientID:     state.ClientID(a.CsaClientid),
		Sequence:     a.CsaSequence,
		Principal:    c.principal(),
		Fore:         foreChannel(&a.CsaForeChanAttrs),
		Back:         channelFrom(&a.CsaBackChanAttrs),
		CBProgram:    a.CsaCbProgram,
		ConnBackChan: a.CsaFlags&nfs4.CREATE_SESSION4_FLAG_CONN_BACK_CHAN != 0,
		Conn:         c.call.Conn,
	})
	if err != nil {
		return failErr(err)
	}
	st, sid, minor := c.s.st, res.SessionID, c.minor
	// The pin follows the Manager's binding, so a replay of this
	// CREATE_SESSION on another connection pins nothing.
	st.sessionChanged(sid, c.call.Conn, func() {
		st.cbCred[sid] = cred
		st.cbMinor[sid] = minor
	})
	var flags uint32
	if res.ConnBackChan {
		flags |= nfs4.CREATE_SESSION4_FLAG_CONN_BACK_CHAN
		c.call.AfterReply(func() { go c.s.probeBackchannel(sid) })
	}
	return ok(&nfs4.CREATESESSION4resok{
		CsrSessionid:     res.SessionID,
		CsrSequence:      res.Sequence,
		CsrFlags:         flags,
		CsrForeChanAttrs: channelTo(res.Fore),
		CsrBackChanAttrs: channelTo(res.Back),
	})
}

func (c *compound) destroySession(a *nfs4.DESTROYSESSION4args) opReply {
	id := state.SessionID(a.DsaSessionid)
	if err := c.s.st.m.DestroySession(id); err != nil {
		return failErr(err)
	}
	c.s.st.sessionsGone(id)
	return ok(nil)
}

func (c *compound) bindConn(a *nfs4.BINDCONNTOSESSION4args) opReply {
	var dir state.ChannelDir
	switch a.BctsaDir {
	case nfs4.CDFC4_FORE:
		dir = state.ChannelFore
	case nfs4.CDFC4_BACK:
		dir = state.ChannelBack
	case nfs4.CDFC4_FORE_OR_BOTH, nfs4.CDFC4_BACK_OR_BOTH:
		dir = state.ChannelBoth
	default:
		return fail(nfs4.NFS4ERR_INVAL)
	}
	id := state.SessionID(a.BctsaSessid)
	got, err := c.s.st.m.BindConnToSession(id, c.call.Conn, dir)
	if err != nil {
		return failErr(err)
	}
	// Pins a connection newly bound to the back channel, and unpins one
	// rebound to the fore channel only.
	c.s.st.sessionChanged(id, c.call.Conn, nil)
	return ok(&nfs4.BINDCONNTOSESSION4resok{
		BctsrSessid: a.BctsaSessid,
		BctsrDir:    nfs4.ChannelDirFromServer4(got),
	})
}

func (c *compound) reclaimComplete(a *nfs4.RECLAIMCOMPLETE4args) opReply {
	id, st := c.clientID()
	if st != nfs4.NFS4_OK {
		return fail(st)
	}
	return okOrErr(c.s.st.m.ReclaimComplete(id, a.RcaOneFs))
}

func (c *compound) destroyClientID(a *nfs4.DESTROYCLIENTID4args) opReply {
	return okOrErr(c.s.st.m.DestroyClientID(c.ctx, state.ClientID(a.DcaClientid)))
}

func (c *compound) backchannelCtl(a *nfs4.BACKCHANNELCTL4args) opReply {
	if c.seq == nil {
		return fail(nfs4.NFS4ERR_OP_NOT_IN_SESSION)
	}
	cred, okCred := cbCredFrom(a.BcaSecParms)
	if !okCred && len(a.BcaSecParms) > 0 {
		return fail(nfs4.NFS4ERR_ENCR_ALG_UNSUPP)
	}
	c.seq.session.SetCBProgram(a.BcaCbProgram)
	st, id := c.s.st, c.seq.session.ID()
	st.sessionChanged(id, nil, func() { st.cbCred[id] = cred })
	return ok(nil)
}

// probeBackchannel sends CB_NULL on a new session's back channel, as the
// Linux client expects before it considers the back channel up.
func (s *Server) probeBackchannel(id state.SessionID) {
	sess, err := s.st.m.Session(id)
	if err != nil {
		return
	}
	conn, _ := sess.BackChannel().(*rpc.Conn)
	if conn == nil {
		return
	}
	ctx, cancel := context.WithTimeout(s.st.ctx, 10*time.Second)
	defer cancel()
	s.st.mu.Lock()
	cred := s.st.cbCred[id]
	s.st.mu.Unlock()
	if _, err := conn.Call(ctx, sess.CBProgram(), nfs4.NFS_CB, nfs4.CB_NULL, cred, noArgs{}); err != nil {
		s.log.Debug("CB_NULL failed", "session", id.String(), "err", err)
		// No delegations for a client that cannot be called back.
		sess.SetCallbackFailed(true)
	}
}

type noArgs struct{}

func (noArgs) EncodeXDR(*xdr.Encoder) {}
