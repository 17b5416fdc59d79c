package rpc

import (
	"context"
	"errors"
	"sync/atomic"

	"github.com/shoalfs/shoal/internal/xdr"
)

// ErrWaitStopped is returned (wrapped) by Pending.Wait when its stop
// channel closed before the reply came; the call is still pending.
var ErrWaitStopped = errors.New("rpc: wait stopped")

// Pending is a call that has been sent and whose reply is awaited
// (Conn.Send). It lets a caller stop waiting without giving the call up,
// and hand the rest of the wait to another goroutine only then: a caller
// that must be able to return early (its context cancelled) while the
// call still completes, as an NFSv4.1 client must to keep its session
// slot's sequence known, would otherwise run every call on a goroutine of
// its own, which adds a goroutine and a hand-off to every round trip.
//
// A Pending is used by one goroutine at a time.
type Pending struct {
	c                     *Conn
	xid, prog, vers, proc uint32
	ch                    chan reply
	done                  bool // the final result was taken, or abandoned
}

// Send sends a call like CallRelease and returns without waiting for the
// reply; Pending.Wait waits for it. Unless Send fails, the caller must
// end the call with a Wait that returns something else than
// ErrWaitStopped, or with Abandon.
func (c *Conn) Send(prog, vers, proc uint32, cred OpaqueAuth, args xdr.Marshaler) (*Pending, error) {
	e := xdr.NewEncoder(256)
	xid := c.nextXID()
	encodeCallHeader(e, xid, prog, vers, proc, cred)
	if args != nil {
		args.EncodeXDR(e)
	}
	p := &Pending{c: c, xid: xid, prog: prog, vers: vers, proc: proc}
	var arr [4][]byte // most calls are one slice: no allocation for the list
	if err := c.send(p, cred, e.AppendBuffers(arr[:0]), e.Len()); err != nil {
		return nil, err
	}
	return p, nil
}

// Wait waits for the reply until ctx ends or stop (which may be nil)
// closes. Its results are CallRelease's, and a result or an error other
// than ErrWaitStopped ends the call; if ctx ends first the call is
// abandoned (a reply that comes later is dropped). If stop closes first,
// Wait returns an error wrapping ErrWaitStopped and the call stays
// pending: the caller must Wait again (for example on another goroutine)
// or Abandon it.
func (p *Pending) Wait(ctx context.Context, stop <-chan struct{}) (res []byte, release func(), err error) {
	res, rb, err := p.wait(ctx, stop)
	if err != nil {
		if !p.done && !errors.Is(err, ErrWaitStopped) {
			p.Abandon() // ctx ended first
		}
		return nil, nil, err
	}
	return res, releaser(rb), nil
}

// Abandon gives the call up: its reply, if it comes, is dropped. Calling
// it after the call ended does nothing.
func (p *Pending) Abandon() {
	if p.done {
		return
	}
	p.done = true
	p.c.forget(p.xid)
	p.c.busy.Add(-1)
	// A reply delivered before forget took the xid out waits in the
	// buffered channel; nothing will read it, and its pooled buffer, if
	// any, goes to the garbage collector.
}

func (p *Pending) wrap(err error) error { return callErr(p.xid, p.prog, p.vers, p.proc, err) }

// wait is Wait with the reply's pooled buffer (nil if not pooled) rather
// than a release function. It does not abandon the call when ctx ends:
// the caller does.
func (p *Pending) wait(ctx context.Context, stop <-chan struct{}) (res []byte, rb *recBuf, err error) {
	if p.done {
		return nil, nil, p.wrap(errors.New("wait on an ended call"))
	}
	var r reply
	var ok bool
	select {
	case r, ok = <-p.ch:
	case <-ctx.Done():
		return nil, nil, p.wrap(ctx.Err())
	case <-stop:
		return nil, nil, p.wrap(ErrWaitStopped)
	}
	p.done = true
	p.c.busy.Add(-1)
	if !ok {
		return nil, nil, p.wrap(p.c.Err())
	}
	res, err = parseReply(r.rec)
	if err != nil {
		r.rb.release() // the errors below copy what they need
		var ae *AcceptError
		var re *RejectError
		switch {
		case errors.As(err, &ae):
			ae.Prog, ae.Vers, ae.Proc = p.prog, p.vers, p.proc
			return nil, nil, ae
		case errors.As(err, &re):
			re.Prog, re.Vers, re.Proc = p.prog, p.vers, p.proc
			return nil, nil, re
		}
		return nil, nil, p.wrap(err)
	}
	return res, r.rb, nil
}

// releaser returns the release function CallRelease hands out for a
// reply in rb (nil: not pooled).
func releaser(rb *recBuf) func() {
	if rb == nil {
		return func() {}
	}
	var released atomic.Bool
	return func() {
		// Twice in a pool would hand one buffer to two records.
		if released.CompareAndSwap(false, true) {
			rb.release()
		}
	}
}
