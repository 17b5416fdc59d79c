package rpc

import (
	"errors"
	"fmt"

	"github.com/shoalfs/shoal/internal/xdr"
)

// Authentication flavors understood by this package.
const (
	AuthNone = 0
	AuthSys  = 1
)

const (
	rpcVersion  = 2
	maxAuthBody = 400 // opaque_auth body<400>
	maxMachine  = 255 // authsys_parms machinename<255>
	maxGIDs     = 16  // authsys_parms gids<16>

	msgCall  = 0
	msgReply = 1

	msgAccepted = 0
	msgDenied   = 1
)

// OpaqueAuth is an opaque_auth: a flavor and an opaque body of at most 400
// bytes.
type OpaqueAuth struct {
	Flavor uint32
	Body   []byte
}

// AuthSysParams is the body of an AUTH_SYS credential.
type AuthSysParams struct {
	Stamp   uint32
	Machine string // at most 255 bytes
	UID     uint32
	GID     uint32
	GIDs    []uint32 // at most 16
}

var (
	_ xdr.Marshaler   = (*AuthSysParams)(nil)
	_ xdr.Unmarshaler = (*AuthSysParams)(nil)
)

// EncodeXDR encodes p. Callers are expected to respect the protocol bounds;
// AuthSysCred enforces them.
func (p *AuthSysParams) EncodeXDR(e *xdr.Encoder) {
	e.Uint32(p.Stamp)
	e.String(p.Machine)
	e.Uint32(p.UID)
	e.Uint32(p.GID)
	e.Uint32(uint32(len(p.GIDs)))
	for _, g := range p.GIDs {
		e.Uint32(g)
	}
}

// DecodeXDR decodes p, enforcing the protocol bounds.
func (p *AuthSysParams) DecodeXDR(d *xdr.Decoder) {
	p.Stamp = d.Uint32()
	p.Machine = d.String(maxMachine)
	p.UID = d.Uint32()
	p.GID = d.Uint32()
	n := d.ArrayLen(maxGIDs, 4)
	p.GIDs = nil
	if n > 0 {
		p.GIDs = make([]uint32, n)
		for i := range p.GIDs {
			p.GIDs[i] = d.Uint32()
		}
	}
}

// AuthSysCred returns an AUTH_SYS credential for p. As real clients do, it
// sends at most 16 supplementary groups and at most 255 bytes of machine
// name, dropping the excess.
func AuthSysCred(p AuthSysParams) OpaqueAuth {
	if len(p.GIDs) > maxGIDs {
		p.GIDs = p.GIDs[:maxGIDs]
	}
	if len(p.Machine) > maxMachine {
		p.Machine = p.Machine[:maxMachine]
	}
	return OpaqueAuth{Flavor: AuthSys, Body: xdr.Marshal(&p)}
}

// Call is an incoming call as seen by a Handler.
type Call struct {
	XID, Prog, Vers, Proc uint32
	Cred, Verf            OpaqueAuth
	Sys                   *AuthSysParams // set when Cred.Flavor == AuthSys

	// Args is the call body after the header. It aliases a buffer that
	// belongs to this call alone, so handlers may keep sub-slices of it for
	// as long as they like (for example WRITE data handed to storage),
	// unless they call ReleaseArgsAfterReply. Cred.Body and Verf.Body
	// alias the same buffer.
	Args []byte

	// Conn is the connection the call arrived on; upper layers use it to
	// find per-connection state and to send backchannel calls.
	Conn *Conn

	afterReply []func()
	// afterOne holds the first AfterReply callback, so that a handler
	// registering one (the NFS server counts every COMPOUND until its
	// reply is written) costs no allocation per call.
	afterOne    [1]func()
	releaseArgs bool
}

// ReleaseArgsAfterReply declares that nothing derived from the call's
// record — Args, Cred.Body, Verf.Body, any sub-slice of them or value
// decoded from them that aliases them (XDR opaques, WRITE data), or anything
// such a slice was handed to — is referenced once the reply has been
// written and the AfterReply callbacks have returned. The connection may
// then reuse the record's buffer for a later call, which saves allocating
// and page-faulting a fresh one for every large record.
//
// A handler must call it only when it can show this for every path the
// call took, including errors; not calling it is always safe, and the
// buffer is then left to the garbage collector. Slices spliced into the
// reply with OpaqueRef are fine, because the reply is written first. The
// declaration is ignored if the handler panics. It must be made on the
// goroutine serving the call, before the handler returns.
func (c *Call) ReleaseArgsAfterReply() { c.releaseArgs = true }

// AfterReply registers f to run once the reply to c has been written or has
// failed to be written. Handlers use it to recycle buffers they spliced into
// the reply with OpaqueRef. Callbacks run in registration order on the
// goroutine that served the call.
func (c *Call) AfterReply(f func()) {
	if c.afterReply == nil {
		c.afterReply = c.afterOne[:0]
	}
	c.afterReply = append(c.afterReply, f)
}

func (c *Call) runAfterReply() {
	for _, f := range c.afterReply {
		f()
	}
}

// AcceptStat is the accept_stat of an accepted reply.
type AcceptStat uint32

// Accepted reply statuses.
const (
	Success      AcceptStat = 0
	ProgUnavail  AcceptStat = 1
	ProgMismatch AcceptStat = 2
	ProcUnavail  AcceptStat = 3
	GarbageArgs  AcceptStat = 4
	SystemErr    AcceptStat = 5

	// Drop is not on the wire: a Handler returns it to send no reply
	// at all (and leaves res alone). The call was not carried out,
	// and the client is expected to send it again on a new connection,
	// as when a server dies: a server handing over to another does this
	// until it closes its connections.
	Drop AcceptStat = ^AcceptStat(0)
)

func (s AcceptStat) String() string {
	switch s {
	case Success:
		return "SUCCESS"
	case ProgUnavail:
		return "PROG_UNAVAIL"
	case ProgMismatch:
		return "PROG_MISMATCH"
	case ProcUnavail:
		return "PROC_UNAVAIL"
	case GarbageArgs:
		return "GARBAGE_ARGS"
	case SystemErr:
		return "SYSTEM_ERR"
	}
	return fmt.Sprintf("accept_stat(%d)", uint32(s))
}

// RejectStat is the reject_stat of a denied reply.
type RejectStat uint32

// Denied reply statuses.
const (
	RPCMismatch RejectStat = 0
	AuthError   RejectStat = 1
)

func (s RejectStat) String() string {
	switch s {
	case RPCMismatch:
		return "RPC_MISMATCH"
	case AuthError:
		return "AUTH_ERROR"
	}
	return fmt.Sprintf("reject_stat(%d)", uint32(s))
}

// AuthStat is the auth_stat of an AUTH_ERROR reply.
type AuthStat uint32

// Authentication failure reasons.
const (
	AuthOK           AuthStat = 0
	AuthBadCred      AuthStat = 1
	AuthRejectedCred AuthStat = 2
	AuthBadVerf      AuthStat = 3
	AuthRejectedVerf AuthStat = 4
	AuthTooWeak      AuthStat = 5
	AuthInvalidResp  AuthStat = 6
	AuthFailed       AuthStat = 7
)

func (s AuthStat) String() string {
	names := [...]string{"AUTH_OK", "AUTH_BADCRED", "AUTH_REJECTEDCRED", "AUTH_BADVERF",
		"AUTH_REJECTEDVERF", "AUTH_TOOWEAK", "AUTH_INVALIDRESP", "AUTH_FAILED"}
	if int(s) < len(names) {
		return names[s]
	}
	return fmt.Sprintf("auth_stat(%d)", uint32(s))
}

// Errors returned by Conn.Call and friends.
var (
	// ErrConnClosed is wrapped by every error caused by the connection
	// closing, whatever the reason (peer, idle timeout, Close).
	ErrConnClosed = errors.New("rpc: connection closed")
	// ErrBadReply is wrapped when a reply cannot be parsed.
	ErrBadReply = errors.New("rpc: malformed reply")
	// ErrIdleTimeout is wrapped by Conn.Err after an idle close.
	ErrIdleTimeout = errors.New("rpc: idle timeout")
	// ErrServerClosed is returned by Server.Serve after Server.Close.
	ErrServerClosed = errors.New("rpc: server closed")
)

// AcceptError reports a reply that was accepted with a status other than
// SUCCESS.
type AcceptError struct {
	XID, Prog, Vers, Proc uint32
	Stat                  AcceptStat
	Low, High             uint32 // supported versions, for PROG_MISMATCH
}

func (e *AcceptError) Error() string {
	s := fmt.Sprintf("rpc: call %d/%d/%d xid %#x: %v", e.Prog, e.Vers, e.Proc, e.XID, e.Stat)
	if e.Stat == ProgMismatch {
		s += fmt.Sprintf(" (supported %d-%d)", e.Low, e.High)
	}
	return s
}

// RejectError reports a denied reply.
type RejectError struct {
	XID, Prog, Vers, Proc uint32
	Stat                  RejectStat
	Low, High             uint32   // supported RPC versions, for RPC_MISMATCH
	Auth                  AuthStat // for AUTH_ERROR
}

func (e *RejectError) Error() string {
	s := fmt.Sprintf("rpc: call %d/%d/%d xid %#x denied: %v", e.Prog, e.Vers, e.Proc, e.XID, e.Stat)
	switch e.Stat {
	case RPCMismatch:
		s += fmt.Sprintf(" (supported %d-%d)", e.Low, e.High)
	case AuthError:
		s += " " + e.Auth.String()
	}
	return s
}

// callFault says how to answer a call record that cannot be served.
type callFault int

const (
	faultDrop        callFault = iota // no usable xid: drop silently
	faultGarbage                      // accepted, GARBAGE_ARGS
	faultRPCMismatch                  // denied, RPC_MISMATCH 2..2
	faultAuth                         // denied, AUTH_ERROR
)

// callError is returned by parseCall.
type callError struct {
	XID   uint32
	Fault callFault
	Auth  AuthStat
	Err   error
}

func (e *callError) Error() string {
	return fmt.Sprintf("rpc: bad call xid %#x: %v", e.XID, e.Err)
}

func (e *callError) Unwrap() error { return e.Err }

// readAuth decodes an opaque_auth. tooLong reports a body over 400 bytes; in
// that case the body is not consumed.
func readAuth(d *xdr.Decoder) (a OpaqueAuth, tooLong bool) {
	a.Flavor = d.Uint32()
	n := d.Uint32()
	if d.Err() != nil {
		return a, false
	}
	if n > maxAuthBody {
		return a, true
	}
	a.Body = d.FixedOpaque(int(n))
	return a, false
}

// parseCall parses a record that should hold a CALL message. On failure the
// error is a *callError telling the caller how to answer.
func parseCall(rec []byte) (*Call, error) {
	d := xdr.NewDecoder(rec)
	c := &Call{XID: d.Uint32()}
	if d.Err() != nil {
		return nil, &callError{Fault: faultDrop, Err: errors.New("record too short for an xid")}
	}
	fail := func(f callFault, as AuthStat, format string, args ...any) (*Call, error) {
		return nil, &callError{XID: c.XID, Fault: f, Auth: as, Err: fmt.Errorf(format, args...)}
	}
	mtype := d.Uint32()
	vers := d.Uint32()
	if d.Err() != nil {
		return fail(faultGarbage, 0, "truncated header: %w", d.Err())
	}
	if mtype != msgCall {
		return fail(faultGarbage, 0, "message type %d is not CALL", mtype)
	}
	if vers != rpcVersion {
		return fail(faultRPCMismatch, 0, "rpc version %d", vers)
	}
	c.Prog, c.Vers, c.Proc = d.Uint32(), d.Uint32(), d.Uint32()
	var long bool
	if c.Cred, long = readAuth(d); long {
		return fail(faultAuth, AuthBadCred, "credential body over %d bytes", maxAuthBody)
	}
	if c.Verf, long = readAuth(d); long {
		return fail(faultAuth, AuthBadVerf, "verifier body over %d bytes", maxAuthBody)
	}
	if d.Err() != nil {
		return fail(faultGarbage, 0, "truncated header: %w", d.Err())
	}
	switch c.Cred.Flavor {
	case AuthNone:
	case AuthSys:
		p := new(AuthSysParams)
		if err := xdr.Unmarshal(c.Cred.Body, p); err != nil {
			return fail(faultAuth, AuthBadCred, "AUTH_SYS credential: %w", err)
		}
		c.Sys = p
	default:
		return fail(faultAuth, AuthBadCred, "unsupported credential flavor %d", c.Cred.Flavor)
	}
	if c.Verf.Flavor != AuthNone {
		return fail(faultAuth, AuthBadVerf, "unsupported verifier flavor %d", c.Verf.Flavor)
	}
	c.Args = d.Rest()
	return c, nil
}

// encodeCallHeader writes a record mark placeholder and a CALL header with
// an AUTH_NONE verifier.
func encodeCallHeader(e *xdr.Encoder, xid, prog, vers, proc uint32, cred OpaqueAuth) {
	e.Reserve() // record mark, patched once the length is known
	e.Uint32(xid)
	e.Uint32(msgCall)
	e.Uint32(rpcVersion)
	e.Uint32(prog)
	e.Uint32(vers)
	e.Uint32(proc)
	e.Uint32(cred.Flavor)
	e.Opaque(cred.Body)
	e.Uint32(AuthNone)
	e.Uint32(0)
}

// encodeAccepted writes a record mark placeholder and the header of an
// accepted reply, returning the position of accept_stat.
func encodeAccepted(e *xdr.Encoder, xid uint32, stat AcceptStat) int {
	e.Reserve()
	e.Uint32(xid)
	e.Uint32(msgReply)
	e.Uint32(msgAccepted)
	e.Uint32(AuthNone)
	e.Uint32(0)
	p := e.Reserve()
	e.PutUint32At(p, uint32(stat))
	return p
}

// encodeFault writes the complete reply record for a call that failed to
// parse.
func encodeFault(e *xdr.Encoder, ce *callError) {
	switch ce.Fault {
	case faultGarbage:
		encodeAccepted(e, ce.XID, GarbageArgs)
	case faultRPCMismatch, faultAuth:
		e.Reserve()
		e.Uint32(ce.XID)
		e.Uint32(msgReply)
		e.Uint32(msgDenied)
		if ce.Fault == faultRPCMismatch {
			e.Uint32(uint32(RPCMismatch))
			e.Uint32(rpcVersion)
			e.Uint32(rpcVersion)
		} else {
			e.Uint32(uint32(AuthError))
			e.Uint32(uint32(ce.Auth))
		}
	}
}

// parseReply parses a REPLY record. It returns the results that follow a
// SUCCESS accept_stat, or an *AcceptError, *RejectError or ErrBadReply
// (without call context; the caller fills that in).
func parseReply(rec []byte) ([]byte, error) {
	d := xdr.NewDecoder(rec)
	xid := d.Uint32()
	mtype := d.Uint32()
	stat := d.Uint32()
	if d.Err() != nil || mtype != msgReply {
		return nil, fmt.Errorf("%w: header", ErrBadReply)
	}
	switch stat {
	case msgAccepted:
		if _, long := readAuth(d); long {
			return nil, fmt.Errorf("%w: verifier too long", ErrBadReply)
		}
		as := AcceptStat(d.Uint32())
		var lo, hi uint32
		if as == ProgMismatch {
			lo, hi = d.Uint32(), d.Uint32()
		}
		if d.Err() != nil {
			return nil, fmt.Errorf("%w: accepted reply: %w", ErrBadReply, d.Err())
		}
		if as == Success {
			return d.Rest(), nil
		}
		return nil, &AcceptError{XID: xid, Stat: as, Low: lo, High: hi}
	case msgDenied:
		re := &RejectError{XID: xid, Stat: RejectStat(d.Uint32())}
		switch re.Stat {
		case RPCMismatch:
			re.Low, re.High = d.Uint32(), d.Uint32()
		case AuthError:
			re.Auth = AuthStat(d.Uint32())
		default:
			return nil, fmt.Errorf("%w: reject_stat %d", ErrBadReply, re.Stat)
		}
		if d.Err() != nil {
			return nil, fmt.Errorf("%w: denied reply: %w", ErrBadReply, d.Err())
		}
		return nil, re
	}
	return nil, fmt.Errorf("%w: reply_stat %d", ErrBadReply, stat)
}
