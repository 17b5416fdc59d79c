package scripted

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/rpc"
	"github.com/shoalfs/shoal/internal/xdr"
)

// Server answers: the NULL procedure, and COMPOUND.

// Model constants the client learns from GETATTR and CREATE_SESSION.
const (
	leaseSeconds = 300 // long enough that no lease renewal runs during a test
	stripeUnit   = 64 << 10
)

// result is one operation's result: a full NfsResop4, or for failures
// just the operation and its status (which is how almost every failed
// result is encoded).
type result struct {
	res    *nfs4.NfsResop4
	op     nfs4.NfsOpnum4
	status nfs4.Nfsstat4
	note   string // for the trace
}

type compoundRes struct {
	status nfs4.Nfsstat4
	tag    []byte
	rs     []result
}

var _ xdr.Marshaler = (*compoundRes)(nil)

func (c *compoundRes) EncodeXDR(e *xdr.Encoder) {
	e.Int32(int32(c.status))
	e.Opaque(c.tag)
	e.Uint32(uint32(len(c.rs)))
	for _, r := range c.rs {
		if r.res != nil {
			r.res.EncodeXDR(e)
			continue
		}
		e.Uint32(uint32(r.op))
		e.Int32(int32(r.status))
		switch r.op {
		case nfs4.OP_SETATTR:
			e.Uint32(0) // attrsset: empty bitmap
		case nfs4.OP_LAYOUTGET:
			if r.status == nfs4.NFS4ERR_LAYOUTUNAVAILABLE {
				e.Bool(false)
			}
		}
	}
}

func fail(op nfs4.NfsOpnum4, st nfs4.Nfsstat4) result { return result{op: op, status: st} }

func (s *Server) serve(_ context.Context, call *rpc.Call, res *xdr.Encoder) rpc.AcceptStat {
	if call.Prog != nfs4.NFS4_PROGRAM {
		return rpc.ProgUnavail
	}
	switch call.Proc {
	case nfs4.NFSPROC4_NULL:
		return rpc.Success
	case nfs4.NFSPROC4_COMPOUND:
	default:
		return rpc.ProcUnavail
	}
	var args nfs4.COMPOUND4args
	if err := xdr.Unmarshal(call.Args, &args); err != nil {
		return rpc.GarbageArgs
	}
	s.mu.Lock()
	out, line, hold := s.compoundLocked(call.Conn, &args)
	if a := call.Sys; a != nil && (a.UID != 0 || a.GID != 0) {
		line += fmt.Sprintf(" [as %d:%d]", a.UID, a.GID) // root, the tests' client, goes unsaid
	}
	if hold == 0 {
		s.logLocked(line)
		s.mu.Unlock()
		res.Append(out)
		return rpc.Success
	}
	// Held: processed now, logged and answered when the script releases
	// it, so that a trace shows it where its reply goes out.
	h := &heldReply{op: hold, release: make(chan struct{})}
	s.held = append(s.held, h)
	s.notifyLocked()
	s.mu.Unlock()
	<-h.release // Release or Close
	s.mu.Lock()
	s.logLocked(line + " (held)")
	s.mu.Unlock()
	res.Append(out)
	return rpc.Success
}

// compoundLocked runs one COMPOUND and returns its encoded result, its
// trace line, and the operation whose rule asks for the reply to be held
// (0: none).
func (s *Server) compoundLocked(conn *rpc.Conn, args *nfs4.COMPOUND4args) ([]byte, string, nfs4.NfsOpnum4) {
	var req []string
	for i := range args.Argarray {
		req = append(req, s.renderArg(&args.Argarray[i]))
	}
	out := &compoundRes{tag: args.Tag}
	var hold nfs4.NfsOpnum4
	st := compoundState{conn: conn}
	var replay []byte
	for i := range args.Argarray {
		op := &args.Argarray[i]
		cur := ""
		if st.cur != nil {
			cur = st.cur.name
		}
		r := s.takeRule(op.Argop, cur)
		if r != nil && r.Hold {
			hold = op.Argop
		}
		var res result
		switch {
		case op.Argop == nfs4.OP_SEQUENCE && i != 0:
			res = fail(op.Argop, nfs4.NFS4ERR_SEQUENCE_POS)
		case r != nil && r.Status != nfs4.NFS4_OK:
			res = fail(op.Argop, r.Status)
			res.note = "(scripted)"
		default:
			res, replay = s.opLocked(&st, i, op, r)
		}
		if replay != nil {
			return replay, strings.Join(req, " | ") + " -> replay", hold
		}
		out.rs = append(out.rs, res)
		if res.res != nil {
			res.status = statusOf(res.res)
		}
		if res.status != nfs4.NFS4_OK {
			out.status = res.status
			break
		}
	}
	var notes []string
	for _, r := range out.rs {
		if r.note != "" {
			notes = append(notes, r.note)
		}
	}
	line := strings.Join(req, " | ") + " -> " + statusText(out.status)
	if len(notes) > 0 {
		line += " " + strings.Join(notes, " ")
	}
	enc := xdr.Marshal(out)
	if st.slot != nil {
		st.slot.reply = enc
	}
	return enc, line, hold
}

func statusText(st nfs4.Nfsstat4) string {
	if st == nfs4.NFS4_OK {
		return "OK"
	}
	return st.String()
}

// compoundState is the state of one COMPOUND in progress.
type compoundState struct {
	conn *rpc.Conn
	sess *session
	slot *slotState
	cur  *file
	cl   *client
}

// statusOf extracts the status of a full result (the first field of
// every result type that the server builds in full).
func statusOf(r *nfs4.NfsResop4) nfs4.Nfsstat4 {
	b := xdr.Marshal(r)
	if len(b) < 8 {
		return nfs4.NFS4ERR_SERVERFAULT
	}
	return nfs4.Nfsstat4(int32(binary.BigEndian.Uint32(b[4:8])))
}

func (s *Server) opLocked(st *compoundState, i int, op *nfs4.NfsArgop4, r *Rule) (result, []byte) {
	if i == 0 {
		switch op.Argop {
		case nfs4.OP_SEQUENCE, nfs4.OP_EXCHANGE_ID, nfs4.OP_CREATE_SESSION, nfs4.OP_DESTROY_SESSION,
			nfs4.OP_BIND_CONN_TO_SESSION, nfs4.OP_DESTROY_CLIENTID:
		default:
			return fail(op.Argop, nfs4.NFS4ERR_OP_NOT_IN_SESSION), nil
		}
	}
	switch op.Argop {
	case nfs4.OP_EXCHANGE_ID:
		return s.exchangeID(op.OpexchangeId), nil
	case nfs4.OP_CREATE_SESSION:
		return s.createSession(st, op.OpcreateSession), nil
	case nfs4.OP_SEQUENCE:
		return s.sequence(st, op.Opsequence, r)
	case nfs4.OP_DESTROY_SESSION:
		if s.sessions[op.OpdestroySession.DsaSessionid] == nil {
			return fail(op.Argop, nfs4.NFS4ERR_BADSESSION), nil
		}
		delete(s.sessions, op.OpdestroySession.DsaSessionid)
		return fail(op.Argop, nfs4.NFS4_OK), nil
	case nfs4.OP_DESTROY_CLIENTID:
		return fail(op.Argop, nfs4.NFS4_OK), nil
	case nfs4.OP_BIND_CONN_TO_SESSION:
		a := op.OpbindConnToSession
		se := s.sessions[a.BctsaSessid]
		if se == nil {
			return fail(op.Argop, nfs4.NFS4ERR_BADSESSION), nil
		}
		dir := nfs4.CDFS4_FORE
		if a.BctsaDir == nfs4.CDFC4_BACK || a.BctsaDir == nfs4.CDFC4_BACK_OR_BOTH || a.BctsaDir == nfs4.CDFC4_FORE_OR_BOTH {
			dir = nfs4.CDFS4_BOTH
			s.backConn, s.backSess = st.conn, se
		}
		return result{res: &nfs4.NfsResop4{Resop: op.Argop, OpbindConnToSession: &nfs4.BINDCONNTOSESSION4res{
			BctsrResok4: &nfs4.BINDCONNTOSESSION4resok{BctsrSessid: se.id, BctsrDir: dir}}}}, nil
	}
	if st.sess == nil {
		return fail(op.Argop, nfs4.NFS4ERR_OP_NOT_IN_SESSION), nil
	}
	switch op.Argop {
	case nfs4.OP_RECLAIM_COMPLETE:
		if st.cl.reclaimed {
			return fail(op.Argop, nfs4.NFS4ERR_COMPLETE_ALREADY), nil
		}
		st.cl.reclaimed = true
		s.grace = false
		return fail(op.Argop, nfs4.NFS4_OK), nil
	case nfs4.OP_PUTROOTFH:
		st.cur = s.files[""]
		return fail(op.Argop, nfs4.NFS4_OK), nil
	case nfs4.OP_PUTFH:
		f := s.dataFile(op.Opputfh.Object)
		if f == nil {
			return fail(op.Argop, nfs4.NFS4ERR_STALE), nil
		}
		st.cur = f
		return fail(op.Argop, nfs4.NFS4_OK), nil
	case nfs4.OP_LOOKUP:
		if st.cur == nil {
			return fail(op.Argop, nfs4.NFS4ERR_NOFILEHANDLE), nil
		}
		f := s.files[string(op.Oplookup.Objname)]
		if !st.cur.dir || f == nil || f.name == "" {
			return fail(op.Argop, nfs4.NFS4ERR_NOENT), nil
		}
		st.cur = f
		return fail(op.Argop, nfs4.NFS4_OK), nil
	case nfs4.OP_GETFH:
		if st.cur == nil {
			return fail(op.Argop, nfs4.NFS4ERR_NOFILEHANDLE), nil
		}
		return result{res: &nfs4.NfsResop4{Resop: op.Argop, Opgetfh: &nfs4.GETFH4res{
			Resok4: &nfs4.GETFH4resok{Object: st.cur.fh}}}}, nil
	case nfs4.OP_GETATTR:
		if st.cur == nil {
			return fail(op.Argop, nfs4.NFS4ERR_NOFILEHANDLE), nil
		}
		return result{res: &nfs4.NfsResop4{Resop: op.Argop, Opgetattr: &nfs4.GETATTR4res{
			Resok4: &nfs4.GETATTR4resok{ObjAttributes: attrs(st.cur, op.Opgetattr.AttrRequest, len(s.flexDS) > 0)}}}}, nil
	case nfs4.OP_OPEN:
		return s.open(st, op.Opopen, r), nil
	case nfs4.OP_CLOSE:
		return s.closeOp(st, op.Opclose), nil
	case nfs4.OP_LAYOUTGET:
		return s.layoutGet(st, op.Oplayoutget, r), nil
	case nfs4.OP_GETDEVICEINFO:
		if op.Opgetdeviceinfo.GdiaLayoutType == nfs4.LAYOUT4_FLEX_FILES {
			return s.flexDevice(op.Opgetdeviceinfo), nil
		}
		return s.deviceInfo(op.Opgetdeviceinfo), nil
	case nfs4.OP_WRITE:
		return s.write(st, op.Opwrite), nil
	case nfs4.OP_READ:
		return s.read(st, op.Opread), nil
	case nfs4.OP_COMMIT:
		if st.cur == nil {
			return fail(op.Argop, nfs4.NFS4ERR_NOFILEHANDLE), nil
		}
		return result{res: &nfs4.NfsResop4{Resop: op.Argop, Opcommit: &nfs4.COMMIT4res{
			Resok4: &nfs4.COMMIT4resok{Writeverf: scriptedVerf}}}}, nil
	case nfs4.OP_LAYOUTCOMMIT:
		return s.layoutCommit(st, op.Oplayoutcommit), nil
	case nfs4.OP_LAYOUTERROR:
		return s.layoutError(st, op.Oplayouterror), nil
	case nfs4.OP_LAYOUTRETURN:
		return s.layoutReturn(st, op.Oplayoutreturn), nil
	case nfs4.OP_LOCK:
		return s.lock(st, op.Oplock), nil
	case nfs4.OP_LOCKU:
		for _, sid := range st.cur.locks {
			if sid.Other == op.Oplocku.LockStateid.Other {
				sid.Seqid++
				return result{res: &nfs4.NfsResop4{Resop: op.Argop, Oplocku: &nfs4.LOCKU4res{LockStateid: sid}}, note: s.sidName(*sid)}, nil
			}
		}
		return fail(op.Argop, nfs4.NFS4ERR_BAD_STATEID), nil
	case nfs4.OP_TEST_STATEID:
		codes := make([]nfs4.Nfsstat4, len(op.OptestStateid.TsStateids))
		for i, sid := range op.OptestStateid.TsStateids {
			if _, ok := s.names[sid.Other]; !ok {
				codes[i] = nfs4.NFS4ERR_BAD_STATEID
			}
			if r != nil && i < len(r.Codes) {
				codes[i] = r.Codes[i]
			}
		}
		var ns []string
		for _, c := range codes {
			ns = append(ns, statusText(c))
		}
		return result{res: &nfs4.NfsResop4{Resop: op.Argop, OptestStateid: &nfs4.TESTSTATEID4res{
			TsrResok4: &nfs4.TESTSTATEID4resok{TsrStatusCodes: codes}}}, note: "[" + strings.Join(ns, ",") + "]"}, nil
	case nfs4.OP_FREE_STATEID, nfs4.OP_DELEGRETURN:
		return fail(op.Argop, nfs4.NFS4_OK), nil
	}
	return fail(op.Argop, nfs4.NFS4ERR_NOTSUPP), nil
}

func (s *Server) exchangeID(a *nfs4.EXCHANGEID4args) result {
	flags := uint32(nfs4.EXCHGID4_FLAG_USE_PNFS_MDS)
	owner := string(a.EiaClientowner.CoOwnerid)
	c := s.clients[s.owners[owner]]
	if c != nil && c.confirmed && c.verifier == a.EiaClientowner.CoVerifier {
		flags |= nfs4.EXCHGID4_FLAG_CONFIRMED_R
	} else {
		s.nextClient++
		c = &client{id: uint64(s.epoch)<<32 | uint64(s.nextClient), name: fmt.Sprintf("c%d", s.nextClient),
			verifier: a.EiaClientowner.CoVerifier, csSeq: 1}
		s.clients[c.id] = c
		s.owners[owner] = c.id
	}
	return result{res: &nfs4.NfsResop4{Resop: nfs4.OP_EXCHANGE_ID, OpexchangeId: &nfs4.EXCHANGEID4res{
		EirResok4: &nfs4.EXCHANGEID4resok{
			EirClientid: nfs4.Clientid4(c.id), EirSequenceid: nfs4.Sequenceid4(c.csSeq), EirFlags: nfs4.Uint32T(flags),
			EirStateProtect: nfs4.StateProtect4R{SprHow: nfs4.SP4_NONE},
			EirServerOwner:  nfs4.ServerOwner4{SoMajorId: []byte("scripted")},
			EirServerScope:  []byte("scripted"),
		}}}, note: c.name + map[bool]string{true: " confirmed", false: ""}[flags&nfs4.EXCHGID4_FLAG_CONFIRMED_R != 0]}
}

func (s *Server) createSession(st *compoundState, a *nfs4.CREATESESSION4args) result {
	c := s.clients[uint64(a.CsaClientid)]
	if c == nil {
		return fail(nfs4.OP_CREATE_SESSION, nfs4.NFS4ERR_STALE_CLIENTID)
	}
	if uint32(a.CsaSequence) != c.csSeq {
		return fail(nfs4.OP_CREATE_SESSION, nfs4.NFS4ERR_SEQ_MISORDERED)
	}
	c.csSeq++
	c.confirmed = true
	s.nextSess++
	se := &session{name: fmt.Sprintf("s%d", s.nextSess), cl: c, slots: make([]slotState, s.slots), cbProg: uint32(a.CsaCbProgram)}
	se.id[0] = 's'
	binary.BigEndian.PutUint32(se.id[4:8], uint32(s.nextSess))
	binary.BigEndian.PutUint32(se.id[8:12], uint32(s.epoch))
	s.sessions[se.id] = se
	if a.CsaFlags&nfs4.CREATE_SESSION4_FLAG_CONN_BACK_CHAN != 0 {
		s.backConn, s.backSess = st.conn, se
	}
	fore := a.CsaForeChanAttrs
	fore.CaMaxrequests = min(fore.CaMaxrequests, uint32(s.slots))
	return result{res: &nfs4.NfsResop4{Resop: nfs4.OP_CREATE_SESSION, OpcreateSession: &nfs4.CREATESESSION4res{
		CsrResok4: &nfs4.CREATESESSION4resok{
			CsrSessionid: se.id, CsrSequence: a.CsaSequence, CsrFlags: a.CsaFlags & nfs4.CREATE_SESSION4_FLAG_CONN_BACK_CHAN,
			CsrForeChanAttrs: fore, CsrBackChanAttrs: a.CsaBackChanAttrs,
		}}}, note: se.name}
}

// sequence checks the slot (RFC 8881 §2.10.6.1): the next seqid is new,
// the same seqid is a replay answered from the slot's reply, anything
// else NFS4ERR_SEQ_MISORDERED.
func (s *Server) sequence(st *compoundState, a *nfs4.SEQUENCE4args, r *Rule) (result, []byte) {
	se := s.sessions[a.SaSessionid]
	if se == nil {
		return fail(nfs4.OP_SEQUENCE, nfs4.NFS4ERR_BADSESSION), nil
	}
	if int(a.SaSlotid) >= len(se.slots) {
		return fail(nfs4.OP_SEQUENCE, nfs4.NFS4ERR_BADSLOT), nil
	}
	sl := &se.slots[a.SaSlotid]
	switch uint32(a.SaSequenceid) {
	case sl.seq + 1:
	case sl.seq:
		if sl.reply != nil {
			return result{}, sl.reply
		}
		return fail(nfs4.OP_SEQUENCE, nfs4.NFS4ERR_RETRY_UNCACHED_REP), nil
	default:
		return fail(nfs4.OP_SEQUENCE, nfs4.NFS4ERR_SEQ_MISORDERED), nil
	}
	sl.seq++
	sl.reply = nil
	st.sess, st.slot, st.cl = se, sl, se.cl
	var flags uint32
	res := result{}
	if r != nil && r.Flags != 0 {
		flags = r.Flags
		res.note = "(scripted flags)"
	}
	res.res = &nfs4.NfsResop4{Resop: nfs4.OP_SEQUENCE, Opsequence: &nfs4.SEQUENCE4res{SrResok4: &nfs4.SEQUENCE4resok{
		SrSessionid: se.id, SrSequenceid: a.SaSequenceid, SrSlotid: a.SaSlotid,
		SrHighestSlotid: nfs4.Slotid4(len(se.slots) - 1), SrTargetHighestSlotid: nfs4.Slotid4(len(se.slots) - 1), SrStatusFlags: nfs4.Uint32T(flags),
	}}}
	return res, nil
}

func (s *Server) open(st *compoundState, a *nfs4.OPEN4args, r *Rule) result {
	if st.cur == nil {
		return fail(nfs4.OP_OPEN, nfs4.NFS4ERR_NOFILEHANDLE)
	}
	var f *file
	switch a.Claim.Claim {
	case nfs4.CLAIM_NULL:
		if a.Claim.File == nil {
			return fail(nfs4.OP_OPEN, nfs4.NFS4ERR_BADXDR)
		}
		if s.grace {
			return fail(nfs4.OP_OPEN, nfs4.NFS4ERR_GRACE)
		}
		f = s.files[string(*a.Claim.File)]
		if f == nil || f.name == "" {
			return fail(nfs4.OP_OPEN, nfs4.NFS4ERR_NOENT)
		}
	case nfs4.CLAIM_FH:
		if s.grace {
			return fail(nfs4.OP_OPEN, nfs4.NFS4ERR_GRACE)
		}
		f = st.cur
	case nfs4.CLAIM_PREVIOUS:
		if !s.grace || st.cl.reclaimed {
			return fail(nfs4.OP_OPEN, nfs4.NFS4ERR_NO_GRACE)
		}
		f = st.cur
	default:
		return fail(nfs4.OP_OPEN, nfs4.NFS4ERR_NOTSUPP)
	}
	if f.dir {
		return fail(nfs4.OP_OPEN, nfs4.NFS4ERR_ISDIR)
	}
	if f.opens == nil {
		f.opens = map[string]*nfs4.Stateid4{}
	}
	owner := string(a.Owner.Owner)
	sid := f.opens[owner]
	if sid == nil {
		sid = s.newStateid('o')
		f.opens[owner] = sid
	} else {
		sid.Seqid++
	}
	st.cur = f
	ok := &nfs4.OPEN4resok{Stateid: *sid, Delegation: nfs4.OpenDelegation4{DelegationType: nfs4.OPEN_DELEGATE_NONE}}
	note := s.sidName(*sid)
	if r != nil && r.Deleg {
		d := s.newStateid('d')
		ok.Delegation = nfs4.OpenDelegation4{DelegationType: nfs4.OPEN_DELEGATE_READ, Read: &nfs4.OpenReadDelegation4{Stateid: *d}}
		note += " " + s.sidName(*d)
	}
	return result{res: &nfs4.NfsResop4{Resop: nfs4.OP_OPEN, Opopen: &nfs4.OPEN4res{Resok4: ok}}, note: note}
}

func (s *Server) closeOp(st *compoundState, a *nfs4.CLOSE4args) result {
	f := st.cur
	if f == nil {
		return fail(nfs4.OP_CLOSE, nfs4.NFS4ERR_NOFILEHANDLE)
	}
	for owner, sid := range f.opens {
		if sid.Other != a.OpenStateid.Other {
			continue
		}
		if a.OpenStateid.Seqid != 0 && a.OpenStateid.Seqid != sid.Seqid {
			return fail(nfs4.OP_CLOSE, nfs4.NFS4ERR_OLD_STATEID)
		}
		delete(f.opens, owner)
		sid.Seqid++
		return result{res: &nfs4.NfsResop4{Resop: nfs4.OP_CLOSE, Opclose: &nfs4.CLOSE4res{OpenStateid: sid}}}
	}
	return fail(nfs4.OP_CLOSE, nfs4.NFS4ERR_BAD_STATEID)
}

// layoutGet follows RFC 8881 §12.5.3: the first LAYOUTGET of a file names
// an open (or lock, or delegation) stateid and creates the layout state
// with seqid 1; later ones name the layout stateid, which must not be
// older than the current one, and every grant moves the seqid on.
func (s *Server) layoutGet(st *compoundState, a *nfs4.LAYOUTGET4args, r *Rule) result {
	f := st.cur
	if f == nil {
		return fail(nfs4.OP_LAYOUTGET, nfs4.NFS4ERR_NOFILEHANDLE)
	}
	sid := a.LogaStateid
	switch {
	case f.layout != nil && sid.Other == f.layout.Other:
		switch {
		case seqNewer(sid.Seqid, f.layout.Seqid):
			return fail(nfs4.OP_LAYOUTGET, nfs4.NFS4ERR_BAD_STATEID)
		case seqNewer(f.layout.Seqid, sid.Seqid):
			return fail(nfs4.OP_LAYOUTGET, nfs4.NFS4ERR_OLD_STATEID)
		}
		f.layout.Seqid++
	case s.isOpenOf(f, sid) || strings.HasPrefix(s.names[sid.Other], "deleg"):
		if f.layout == nil {
			f.layout = s.newStateid('l')
		} else {
			f.layout.Seqid++
		}
	default:
		return fail(nfs4.OP_LAYOUTGET, nfs4.NFS4ERR_BAD_STATEID)
	}
	note := ""
	if r != nil && r.Seqid != 0 {
		f.layout.Seqid = nfs4.Uint32T(r.Seqid)
		note = "(scripted seqid) "
	}
	typ := nfs4.LAYOUT4_NFSV4_1_FILES
	body := xdr.Marshal(&nfs4.Nfsv41FileLayout4{NflDeviceid: nfs4.Deviceid4{1}, NflUtil: stripeUnit, NflFhList: []nfs4.NfsFh4{f.fh}})
	if len(s.flexDS) > 0 {
		if a.LogaLayoutType != nfs4.LAYOUT4_FLEX_FILES {
			return fail(nfs4.OP_LAYOUTGET, nfs4.NFS4ERR_UNKNOWN_LAYOUTTYPE)
		}
		typ, body = nfs4.LAYOUT4_FLEX_FILES, s.flexLayoutBody(f, *f.layout)
		note += "flexfiles "
	}
	return result{res: &nfs4.NfsResop4{Resop: nfs4.OP_LAYOUTGET, Oplayoutget: &nfs4.LAYOUTGET4res{LogrResok4: &nfs4.LAYOUTGET4resok{
		LogrReturnOnClose: true, LogrStateid: *f.layout,
		LogrLayout: []nfs4.Layout4{{LoOffset: 0, LoLength: nfs4.NFS4_UINT64_MAX, LoIomode: a.LogaIomode,
			LoContent: nfs4.LayoutContent4{LocType: typ, LocBody: body}}},
	}}}, note: note + s.sidName(*f.layout)}
}

// lock grants every lock asked for (no conflicts: one client): a new lock
// owner's under an open stateid of the file, a known one's under its lock
// stateid. Reclaims are taken in the grace period only, other locks
// outside it only.
func (s *Server) lock(st *compoundState, a *nfs4.LOCK4args) result {
	f := st.cur
	if f == nil {
		return fail(nfs4.OP_LOCK, nfs4.NFS4ERR_NOFILEHANDLE)
	}
	switch {
	case a.Reclaim && (!s.grace || st.cl.reclaimed):
		return fail(nfs4.OP_LOCK, nfs4.NFS4ERR_NO_GRACE)
	case !a.Reclaim && s.grace:
		return fail(nfs4.OP_LOCK, nfs4.NFS4ERR_GRACE)
	}
	var sid *nfs4.Stateid4
	switch l := a.Locker; {
	case l.NewLockOwner && l.OpenOwner != nil:
		if !s.isOpenOf(f, l.OpenOwner.OpenStateid) {
			return fail(nfs4.OP_LOCK, nfs4.NFS4ERR_BAD_STATEID)
		}
		owner := string(l.OpenOwner.LockOwner.Owner)
		if f.locks == nil {
			f.locks = map[string]*nfs4.Stateid4{}
		}
		if sid = f.locks[owner]; sid == nil {
			sid = s.newStateid('k')
			f.locks[owner] = sid
		} else {
			sid.Seqid++
		}
	case !l.NewLockOwner && l.LockOwner != nil:
		for _, k := range f.locks {
			if k.Other == l.LockOwner.LockStateid.Other {
				sid = k
			}
		}
		if sid == nil {
			return fail(nfs4.OP_LOCK, nfs4.NFS4ERR_BAD_STATEID)
		}
		sid.Seqid++
	default:
		return fail(nfs4.OP_LOCK, nfs4.NFS4ERR_BADXDR)
	}
	return result{res: &nfs4.NfsResop4{Resop: nfs4.OP_LOCK, Oplock: &nfs4.LOCK4res{Resok4: &nfs4.LOCK4resok{LockStateid: *sid}}},
		note: s.sidName(*sid)}
}

func (s *Server) isOpenOf(f *file, sid nfs4.Stateid4) bool {
	for _, o := range f.opens {
		if o.Other == sid.Other {
			return true
		}
	}
	return false
}

func (s *Server) deviceInfo(a *nfs4.GETDEVICEINFO4args) result {
	if a.GdiaDeviceId != (nfs4.Deviceid4{1}) {
		return fail(nfs4.OP_GETDEVICEINFO, nfs4.NFS4ERR_NOENT)
	}
	// The device is the server itself; the tests never do I/O to it.
	host, port, _ := strings.Cut(s.Addr(), ":")
	p, _ := strconv.Atoi(port)
	uaddr := fmt.Sprintf("%s.%d.%d", host, p>>8, p&0xff)
	body := xdr.Marshal(&nfs4.Nfsv41FileLayoutDsAddr4{NfldaStripeIndices: []nfs4.Uint32T{0},
		NfldaMultipathDsList: []nfs4.MultipathList4{{{NaRNetid: "tcp", NaRAddr: uaddr}}}})
	return result{res: &nfs4.NfsResop4{Resop: nfs4.OP_GETDEVICEINFO, Opgetdeviceinfo: &nfs4.GETDEVICEINFO4res{
		GdirResok4: &nfs4.GETDEVICEINFO4resok{GdirDeviceAddr: nfs4.DeviceAddr4{DaLayoutType: nfs4.LAYOUT4_NFSV4_1_FILES, DaAddrBody: body}}}}}
}

// layoutReturn takes back the whole layout of the current file: the
// stateid must be the layout stateid, not older than the current one
// (RFC 8881 §12.5.3: NFS4ERR_OLD_STATEID).
func (s *Server) layoutReturn(st *compoundState, a *nfs4.LAYOUTRETURN4args) result {
	f := st.cur
	lr := a.LoraLayoutreturn.LrLayout
	if f == nil || lr == nil {
		return fail(nfs4.OP_LAYOUTRETURN, nfs4.NFS4ERR_INVAL)
	}
	if f.layout == nil {
		return fail(nfs4.OP_LAYOUTRETURN, nfs4.NFS4ERR_NOMATCHING_LAYOUT)
	}
	switch sid := lr.LrfStateid; {
	case sid.Other != f.layout.Other, seqNewer(sid.Seqid, f.layout.Seqid):
		return fail(nfs4.OP_LAYOUTRETURN, nfs4.NFS4ERR_BAD_STATEID)
	case seqNewer(f.layout.Seqid, sid.Seqid):
		return fail(nfs4.OP_LAYOUTRETURN, nfs4.NFS4ERR_OLD_STATEID)
	}
	f.layout = nil
	return result{res: &nfs4.NfsResop4{Resop: nfs4.OP_LAYOUTRETURN, Oplayoutreturn: &nfs4.LAYOUTRETURN4res{
		LorrStateid: &nfs4.LayoutreturnStateid{LrsPresent: false}}}}
}

func seqNewer(a, b nfs4.Uint32T) bool { return int32(uint32(a)-uint32(b)) > 0 }

// attrs encodes the attributes of f that req asks for and the server
// knows, in bit order (the order of fattr4).
func attrs(f *file, req nfs4.Bitmap4, flex bool) nfs4.Fattr4 {
	e := xdr.NewEncoder(128)
	var mask nfs4.Bitmap4
	set := func(n int) {
		for len(mask) <= n/32 {
			mask = append(mask, 0)
		}
		mask[n/32] |= 1 << (n % 32)
	}
	for n := 0; n < 32*len(req); n++ {
		if req[n/32]&(1<<(n%32)) == 0 {
			continue
		}
		switch n {
		case nfs4.FATTR4_TYPE:
			t := nfs4.NF4REG
			if f.dir {
				t = nfs4.NF4DIR
			}
			e.Uint32(uint32(t))
		case nfs4.FATTR4_CHANGE:
			e.Uint64(1)
		case nfs4.FATTR4_SIZE:
			e.Uint64(f.size)
		case nfs4.FATTR4_LEASE_TIME:
			e.Uint32(leaseSeconds)
		case nfs4.FATTR4_FILEID:
			e.Uint64(f.fileid)
		case nfs4.FATTR4_MAXREAD, nfs4.FATTR4_MAXWRITE:
			e.Uint64(1 << 20)
		case nfs4.FATTR4_MODE:
			e.Uint32(0o644)
		case nfs4.FATTR4_NUMLINKS:
			e.Uint32(1)
		case nfs4.FATTR4_OWNER, nfs4.FATTR4_OWNER_GROUP:
			e.String("0")
		case nfs4.FATTR4_FS_LAYOUT_TYPES:
			e.Uint32(1)
			if flex {
				e.Uint32(uint32(nfs4.LAYOUT4_FLEX_FILES))
			} else {
				e.Uint32(uint32(nfs4.LAYOUT4_NFSV4_1_FILES))
			}
		case nfs4.FATTR4_LAYOUT_BLKSIZE:
			e.Uint32(stripeUnit)
		default:
			continue
		}
		set(n)
	}
	return nfs4.Fattr4{Attrmask: mask, AttrVals: bytes.Clone(e.Bytes())}
}
