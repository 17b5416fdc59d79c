package server

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/rpc"
	"github.com/shoalfs/shoal/internal/xdr"
	"github.com/shoalfs/shoal/server/internal/state"
)

// opReply is what an operation handler returns: the status, and the body that
// follows the status in the operation's result. For the common
// "switch (nfsstat4 status) { case NFS4_OK: X4resok; default: void; }" result
// shape the body is the resok on success and nil on error; results that carry
// data on errors too (LOCK4denied, SETATTR's attrsset) set body in both cases.
type opReply struct {
	status nfs4.Nfsstat4
	body   xdr.Marshaler
}

func ok(body xdr.Marshaler) opReply                { return opReply{status: nfs4.NFS4_OK, body: body} }
func fail(s nfs4.Nfsstat4) opReply                 { return opReply{status: s} }
func failErr(err error) opReply                    { return opReply{status: statusOf(err)} }
func status(s nfs4.Nfsstat4) opReply               { return opReply{status: s} }
func okOrErr(err error) opReply                    { return opReply{status: statusOf(err)} }
func (r opReply) withBody(b xdr.Marshaler) opReply { r.body = b; return r }

// opHandler runs one operation of a COMPOUND.
type opHandler func(c *compound, a *nfs4.NfsArgop4) opReply

// compound is the per-request evaluation context of one COMPOUND.
type compound struct {
	s     *Server
	ctx   context.Context
	call  *rpc.Call
	minor uint32
	addr  netip.Addr
	log   *slog.Logger

	// Current and saved filehandles (RFC 8881 §16.2.3.1.1).
	cfh, sfh       fhandle
	hasCFH, hasSFH bool
	// Current and saved stateids (RFC 8881 §16.2.3.1.2).
	csid, ssid       nfs4.Stateid4
	hasCSID, hasSSID bool

	seq  *seqContext // set when the COMPOUND began with SEQUENCE
	nops int         // number of operations in the request
	idx  int         // index of the operation being evaluated

	// delegHolds release the files whose delegation grants this
	// COMPOUND's operations hold back until they are done (deleg.go).
	delegHolds []func()
	// delegSince is the state manager's BreakSeq when the COMPOUND
	// began, before any of its operations looked a file up: an OPEN
	// grants no delegation of a file another client's conflicting
	// operation touched since (state.DelegArgs.Since).
	delegSince uint64
	// opened: an OPEN of this COMPOUND succeeded, so a LAYOUTGET after
	// it is the client's guess made before any I/O (layoutGet).
	opened bool
	// durable: the reply must wait until the COMPOUND's changes are
	// durable (it touched a sync export, or promised stable storage);
	// async: it touched an async export (durability.go).
	durable, async bool
}

// compoundRequest evaluates a COMPOUND procedure.
func (s *Server) compoundRequest(ctx context.Context, call *rpc.Call, e *xdr.Encoder) rpc.AcceptStat {
	// Counted until its reply is written, so that Quiesce can wait for
	// every reply of a leader that steps down.
	s.inflight.Add(1)
	call.AfterReply(s.replied)
	if s.quiescing.Load() {
		// A leader stepping down runs nothing new and answers nothing
		// new: its connections close once the running replies are out,
		// and the client sends the request again, to the next leader.
		// (NFS4ERR_DELAY here would park the Linux client: see
		// notLeading's use below.)
		s.counters.notLeading.Add(1)
		s.confirmDropped(call.Args)
		return rpc.Drop
	}
	// A COMPOUND runs to its end even if its connection closes under it:
	// its reply goes into the session's slot, and the client's
	// retransmission on a new connection must find the whole reply there.
	// Cut short by the connection's context, an OPEN that created a file
	// was cached with NFS4ERR_DELAY for the GETATTR after it, and the
	// client, retrying the whole request, got NFS4ERR_EXIST for its own
	// create. So it runs under the server's life, which only Close ends;
	// the waits inside a COMPOUND are bounded by their own timeouts. (The
	// connection's context carries no values, and using the server's
	// costs no allocation per request.)
	connCtx := ctx
	ctx = s.cctx // s.life, marked meta.Deferred (durability.go)
	d := xdr.NewDecoder(call.Args)
	tag := d.Opaque(0)
	minor := d.Uint32()
	n := d.ArrayLen(0, 4)
	if d.Err() != nil {
		return rpc.GarbageArgs
	}
	c := &compound{s: s, ctx: ctx, call: call, minor: minor, nops: n, log: s.log, delegSince: s.st.m.BreakSeq()}
	defer c.releaseDelegHolds()
	if ap := call.Conn.RemoteAddrPort(); ap.IsValid() {
		c.addr = ap.Addr()
	}

	start := e.Mark()
	statusPos := e.Reserve()
	e.Opaque(tag)
	countPos := e.Reserve()
	if minor != 1 && minor != 2 {
		e.PutUint32At(statusPos, uint32(nfs4.NFS4ERR_MINOR_VERS_MISMATCH))
		return rpc.Success
	}

	st := nfs4.NFS4_OK
	done := 0
	// The record buffer may be recycled after the reply only if every
	// operation decoded from it is one whose handler keeps no reference to
	// its arguments (argsrelease.go). The tag is copied into the reply.
	release := true
	defer func() {
		if release {
			call.ReleaseArgsAfterReply()
		}
	}()
	// One union for all the operations: it escapes (handlers take its
	// address), and it is large (a pointer per operation), so a fresh one
	// per operation was most of a small COMPOUND's garbage. Handlers keep
	// only the operation's own arguments, which each decode allocates anew.
	var args nfs4.NfsArgop4
	lastStart, lastOp := -1, nfs4.NfsOpnum4(0)
	for c.idx = 0; c.idx < n; c.idx++ {
		peek := xdr.NewDecoder(d.Rest())
		op := nfs4.NfsOpnum4(peek.Uint32())
		if peek.Err() != nil {
			st = nfs4.NFS4ERR_BADXDR
			e.Uint32(uint32(nfs4.OP_ILLEGAL))
			e.Uint32(uint32(st))
			done++
			break
		}
		def, known := s.ops.lookup(op, minor)
		if !known {
			st = nfs4.NFS4ERR_OP_ILLEGAL
			e.Uint32(uint32(nfs4.OP_ILLEGAL))
			e.Uint32(uint32(st))
			done++
			break
		}
		var r opReply
		args = nfs4.NfsArgop4{}
		release = release && def.releaseArgs
		args.DecodeXDR(d)
		switch {
		case d.Err() != nil:
			r = fail(nfs4.NFS4ERR_BADXDR)
		case (c.idx == 0 && def.session != sequenceOp || c.idx == 1 && c.seq != nil) && s.notLeading():
			// A leader that cannot vouch for its term (etcd out of
			// reach, or paused past its lease) answers nothing from
			// what it holds: the client retries, by then at this
			// leader again or at the next one. The first operation
			// after SEQUENCE says so, not SEQUENCE: the Linux client
			// parks a slot for 15 s (NFS4_POLL_RETRY_MAX) on a
			// SEQUENCE answered NFS4ERR_DELAY, and its session
			// recovery waits for every slot, while an operation's
			// NFS4ERR_DELAY is retried after 0.1 s, doubling. SEQUENCE
			// itself touches only this server's memory.
			r = fail(nfs4.NFS4ERR_DELAY)
		case def.v40only:
			r = fail(nfs4.NFS4ERR_NOTSUPP)
		case c.idx == 0 && def.session == sequenceOp:
			var cached []byte
			// The rest of the arguments is fingerprinted now, while the
			// record buffer is certainly ours (it may be recycled after
			// the reply).
			r, cached = c.sequence(args.Opsequence, tag, d.Rest())
			if cached != nil {
				// A retransmission: answer with the reply cached in the slot.
				e.Truncate(start)
				e.Append(cached)
				return rpc.Success
			}
		case def.session == sequenceOp:
			r = fail(nfs4.NFS4ERR_SEQUENCE_POS)
		case c.idx == 0 && def.session != sessionless:
			r = fail(nfs4.NFS4ERR_OP_NOT_IN_SESSION)
		case c.seq == nil && n > 1 && def.session == sessionless:
			r = fail(nfs4.NFS4ERR_NOT_ONLY_OP)
		case def.run == nil:
			r = fail(nfs4.NFS4ERR_NOTSUPP)
		default:
			if hook := s.testHookBeforeOp.Load(); hook != nil {
				(*hook)(c, op, connCtx)
			}
			t0 := time.Now()
			r = def.run(c, &args)
			s.counters.opTime(op, time.Since(t0))
			if dropReplyAfter != 0 {
				s.testDropReply(op, r.status)
			}
		}
		opStart := e.Mark()
		lastStart, lastOp = opStart, op
		c.encodeResult(e, op, r)
		if c.seq != nil && c.idx > 0 {
			// The result must fit the session's limits; if it does
			// not, it is replaced by the error saying which (RFC 8881
			// §2.10.6.4), and the COMPOUND ends there.
			if over := c.seq.overLimit(e.Mark() - start); over != nfs4.NFS4_OK {
				e.Truncate(opStart)
				r = fail(over)
				c.encodeResult(e, op, r)
			}
		}
		s.counters.op(op, r.status)
		done++
		if op == nfs4.OP_OPEN && r.status == nfs4.NFS4_OK {
			c.opened = true
		}
		if r.status != nfs4.NFS4_OK {
			st = r.status
			if c.log.Enabled(ctx, slog.LevelDebug) {
				c.log.Debug("op failed", "op", op, "status", r.status, "index", c.idx)
			}
			break
		}
	}
	// The reply goes into the slot and out only once what it tells of
	// is durable (durability.go).
	if !c.waitDurable() && lastStart >= 0 {
		e.Truncate(lastStart)
		st = nfs4.NFS4ERR_IO
		c.encodeResult(e, lastOp, fail(st))
	}
	e.PutUint32At(statusPos, uint32(st))
	e.PutUint32At(countPos, uint32(done))
	if c.seq != nil {
		c.seq.complete(e.Mark()-start, func() []byte { return e.BytesSince(start) })
	}
	return rpc.Success
}

// notLeading reports whether the server must not act now (Config.Leading).
func (s *Server) notLeading() bool {
	if s.cfg.Leading == nil {
		return false
	}
	if err := s.cfg.Leading(); err != nil {
		s.counters.notLeading.Add(1)
		return true
	}
	return false
}

// opHook is a test's function run before each operation's handler, with
// the context of the connection the COMPOUND arrived on
// (Server.testHookBeforeOp).
type opHook func(c *compound, op nfs4.NfsOpnum4, connCtx context.Context)

// encodeResult encodes the result of operation op.
func (c *compound) encodeResult(e *xdr.Encoder, op nfs4.NfsOpnum4, r opReply) {
	if r.body == nil && op == nfs4.OP_SETATTR {
		// SETATTR4res carries attrsset whatever the status, also when
		// the dispatcher fails the operation before its handler runs.
		r.body = bitmapVal(nil)
	}
	e.Uint32(uint32(op))
	e.Uint32(uint32(r.status))
	if r.body != nil {
		r.body.EncodeXDR(e)
	}
}

// setFH sets the current filehandle. A new current filehandle invalidates
// the current stateid (RFC 8881 §16.2.3.1.2); operations that produce both
// (OPEN) set the stateid afterwards.
func (c *compound) setFH(h fhandle) {
	c.cfh, c.hasCFH = h, true
	c.hasCSID = false
	if h.kind == fhObject && c.s.ns != nil {
		// Also for operations that use the handle without loading its
		// object (load marks it too).
		if e := c.s.ns.byID[h.export]; e != nil {
			c.touched(e)
		}
	}
}

// initLife starts the server's life (the context only Close ends) and
// the counting of COMPOUNDs in flight; every role's constructor calls it.
func (s *Server) initLife() {
	s.life, s.endLife = context.WithCancel(context.Background())
	s.replied = func() { s.inflight.Add(-1) }
}

// confirmDropped retires the replay records that a COMPOUND dropped while
// quiescing proves obsolete: if it opens with a SEQUENCE that is the next
// request on its slot, the client had the reply of the slot's previous
// one. Quiesce deletes what is retired before the hand-over, so the next
// leader does not answer a new request from such a record.
func (s *Server) confirmDropped(args []byte) {
	if s.replays == nil {
		return
	}
	d := xdr.NewDecoder(args)
	d.Opaque(nfs4.NFS4_OPAQUE_LIMIT) // tag
	d.Uint32()                       // minorversion
	if d.ArrayLen(0, 4) < 1 || d.Uint32() != uint32(nfs4.OP_SEQUENCE) {
		return
	}
	var a nfs4.SEQUENCE4args
	a.DecodeXDR(d)
	if d.Err() != nil {
		return
	}
	id := state.SessionID(a.SaSessionid)
	if s.st.m.NextOnSlot(id, a.SaSlotid, a.SaSequenceid) {
		s.replays.confirm(id, a.SaSlotid)
	}
}

// Quiesce prepares a planned hand-over (a leader stepping down): every
// COMPOUND from now on is dropped unanswered and not run (the client
// sends it again once the connection closes), and Quiesce returns once
// the replies of those already running have been written, or when ctx
// ends. A client then never resends to the next leader a request this one
// carried out: without the reply cache of this server, the next one would
// run it again (a RENAME would fail with NOENT, a REMOVE too).
func (s *Server) Quiesce(ctx context.Context) error {
	s.quiescing.Store(true)
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for s.inflight.Load() > 0 {
		select {
		case <-ctx.Done():
			return fmt.Errorf("server: %d COMPOUNDs still running: %w", s.inflight.Load(), ctx.Err())
		case <-t.C:
		}
	}
	// The replay records whose replies provably arrived go now, not
	// with a flush this server will not live to run: a record the next
	// leader finds may answer a new request identical to the old one
	// (the residual hazard in replay.go).
	if _, err := s.replays.deleteRetired(ctx); err != nil {
		return fmt.Errorf("server: delete retired replay records: %w", err)
	}
	return nil
}
