package rpc

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shoalfs/shoal/internal/xdr"
)

// Handler serves incoming calls. It writes the results that follow
// accept_stat into res (for PROG_MISMATCH: the low and high versions) and
// returns the accept_stat. For any status other than SUCCESS and
// PROG_MISMATCH whatever was written to res is discarded.
//
// res may splice caller-owned slices with OpaqueRef (READ data); the reply is
// written with writev after ServeRPC returns, so such slices must stay
// unchanged until then. Use Call.AfterReply to learn when they are free.
//
// Handlers run concurrently, one goroutine per call, and their replies may
// leave in any order. ctx is cancelled when the connection closes.
type Handler interface {
	ServeRPC(ctx context.Context, call *Call, res *xdr.Encoder) AcceptStat
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, call *Call, res *xdr.Encoder) AcceptStat

// ServeRPC calls f.
func (f HandlerFunc) ServeRPC(ctx context.Context, call *Call, res *xdr.Encoder) AcceptStat {
	return f(ctx, call, res)
}

var _ Handler = HandlerFunc(nil)

// Defaults for ConnConfig and Server.
const (
	DefaultMaxRecord   = 2<<20 + 64<<10
	DefaultMaxInFlight = 64
	DefaultIdleTimeout = 5 * time.Minute // Server only; Dial'd connections never idle out by default
)

// ConnConfig tunes a Conn. The zero value is usable.
type ConnConfig struct {
	// MaxRecord is the largest incoming record accepted; a peer announcing
	// a larger one has its connection closed. Default DefaultMaxRecord.
	MaxRecord int
	// MaxInFlight bounds the incoming calls served concurrently; when it
	// is reached the connection stops reading. Default DefaultMaxInFlight.
	MaxInFlight int
	// IdleTimeout closes the connection after this long without traffic,
	// unless calls are in flight in either direction or the connection is
	// pinned (see Conn.Pin). Zero or negative: never.
	IdleTimeout time.Duration
	// WriteTimeout bounds each record write; a peer that stops reading for
	// longer has its connection closed. Zero or negative: no bound.
	WriteTimeout time.Duration
	// Logger receives diagnostics. Default: discard.
	Logger *slog.Logger
}

func (cfg ConnConfig) withDefaults() ConnConfig {
	if cfg.MaxRecord <= 0 {
		cfg.MaxRecord = DefaultMaxRecord
	}
	if cfg.MaxRecord > maxFragment {
		cfg.MaxRecord = maxFragment
	}
	if cfg.MaxInFlight <= 0 {
		cfg.MaxInFlight = DefaultMaxInFlight
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return cfg
}

// ConnState is a connection lifecycle event reported to Server.ConnState.
type ConnState int

// Connection states.
const (
	StateNew    ConnState = iota // accepted, before the first read
	StateClosed                  // closed, all its handlers have returned
)

func (s ConnState) String() string {
	switch s {
	case StateNew:
		return "new"
	case StateClosed:
		return "closed"
	}
	return fmt.Sprintf("ConnState(%d)", int(s))
}

// Conn is one full-duplex RPC connection. It serves incoming CALLs with its
// Handler and matches incoming REPLYs to calls made with Conn.Call, so the
// same type is the server side of a client connection, the client side, and
// both ends of the NFSv4.1 backchannel.
type Conn struct {
	nc    net.Conn
	raddr netip.AddrPort // the peer's address, parsed once; zero if not IP
	h     Handler
	cfg   ConnConfig
	log   *slog.Logger

	ctx    context.Context // parent of handler contexts, cancelled on close
	cancel context.CancelFunc

	wmu sync.Mutex // serializes record writes
	// wbase and wbufs, under wmu: the buffers of the record being
	// written (write).
	wbase, wbufs net.Buffers

	mu      sync.Mutex
	pending map[uint32]chan reply // outgoing calls awaiting a reply; nil once closed
	values  map[any]any
	err     error // why the connection closed; wraps ErrConnClosed

	xid        atomic.Uint32
	busy       atomic.Int64 // handlers running + outgoing calls pending
	pins       atomic.Int64
	lastActive atomic.Int64 // unix nanoseconds
	idle       *time.Timer

	sem      chan struct{} // MaxInFlight slots
	handlers sync.WaitGroup
	// work hands a call to a handler goroutine that finished its last
	// one and waits for another (worker); unbuffered, so a call goes only
	// to a goroutine ready for it. idleWorkers counts those waiting.
	work        chan callWork
	idleWorkers atomic.Int32
	done        chan struct{} // closed on close
	finished    chan struct{} // closed when the reader and all handlers have returned
	onFinish    func()
}

// Option configures Dial.
type Option func(*ConnConfig)

// WithConfig replaces the whole configuration.
func WithConfig(cfg ConnConfig) Option { return func(c *ConnConfig) { *c = cfg } }

// WithLogger sets the logger.
func WithLogger(l *slog.Logger) Option { return func(c *ConnConfig) { c.Logger = l } }

// Dial connects to addr. h (which may be nil) serves calls the peer sends
// back on this connection, such as NFSv4.1 callbacks.
func Dial(ctx context.Context, network, addr string, h Handler, opts ...Option) (*Conn, error) {
	var cfg ConnConfig
	for _, o := range opts {
		o(&cfg)
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, network, addr)
	if err != nil {
		// net.Dial errors already name the network and address.
		return nil, fmt.Errorf("rpc: %w", err)
	}
	return NewConn(nc, h, cfg), nil
}

// NewConn starts serving nc. h may be nil, in which case incoming calls are
// answered PROG_UNAVAIL. The Conn owns nc from now on.
func NewConn(nc net.Conn, h Handler, cfg ConnConfig) *Conn {
	c := newConn(nc, h, cfg)
	c.start()
	return c
}

func newConn(nc net.Conn, h Handler, cfg ConnConfig) *Conn {
	cfg = cfg.withDefaults()
	c := &Conn{
		nc:       nc,
		h:        h,
		cfg:      cfg,
		log:      cfg.Logger.With("remote", nc.RemoteAddr().String()),
		pending:  make(map[uint32]chan reply),
		sem:      make(chan struct{}, cfg.MaxInFlight),
		work:     make(chan callWork),
		done:     make(chan struct{}),
		finished: make(chan struct{}),
	}
	// The same parse the server would otherwise make per request (its
	// exports allow clients by address).
	c.raddr, _ = netip.ParseAddrPort(nc.RemoteAddr().String())
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.xid.Store(rand.Uint32())
	c.touch()
	if cfg.IdleTimeout > 0 {
		// Created here, armed by start: checkIdle and closeWith read c.idle.
		c.idle = time.AfterFunc(time.Duration(1<<62), c.checkIdle)
		c.idle.Stop()
	}
	return c
}

func (c *Conn) start() {
	if c.idle != nil {
		c.idle.Reset(c.cfg.IdleTimeout)
	}
	go c.readLoop()
}

// RemoteAddr returns the peer's address.
func (c *Conn) RemoteAddr() net.Addr { return c.nc.RemoteAddr() }

// RemoteAddrPort returns the peer's IP address and port, parsed from
// RemoteAddr once per connection; the zero AddrPort if it is not an IP
// address.
func (c *Conn) RemoteAddrPort() netip.AddrPort { return c.raddr }

// LocalAddr returns the local address.
func (c *Conn) LocalAddr() net.Addr { return c.nc.LocalAddr() }

// Done is closed when the connection closes.
func (c *Conn) Done() <-chan struct{} { return c.done }

// Err returns nil while the connection is open and afterwards the reason it
// closed, which always wraps ErrConnClosed.
func (c *Conn) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Close closes the connection. Pending outgoing calls fail with
// ErrConnClosed and handler contexts are cancelled; Close does not wait for
// handlers (a handler may close its own connection).
func (c *Conn) Close() error {
	c.closeWith(nil)
	return nil
}

// SetValue stores val under key for the connection's lifetime. Upper layers
// use it to attach state, such as the NFSv4.1 session a backchannel belongs
// to. key should be a comparable value of an unexported type.
func (c *Conn) SetValue(key, val any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.values == nil {
		c.values = make(map[any]any)
	}
	c.values[key] = val
}

// Value returns the value stored under key, or nil.
func (c *Conn) Value(key any) any {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.values[key]
}

// Pin keeps the connection from being closed for idleness until the
// returned function is called (once; further calls do nothing). The server
// pins a connection while it is bound as a session's backchannel.
func (c *Conn) Pin() (unpin func()) {
	c.pins.Add(1)
	var once sync.Once
	return func() {
		once.Do(func() {
			c.touch()
			c.pins.Add(-1)
		})
	}
}

func (c *Conn) touch() { c.lastActive.Store(time.Now().UnixNano()) }

func (c *Conn) checkIdle() {
	select {
	case <-c.done:
		return
	default:
	}
	wait := c.cfg.IdleTimeout
	if c.busy.Load() == 0 && c.pins.Load() == 0 {
		since := time.Since(time.Unix(0, c.lastActive.Load()))
		if since >= wait {
			c.log.Debug("rpc: closing idle connection", "idle", since)
			c.closeWith(ErrIdleTimeout)
			return
		}
		wait -= since
	}
	c.idle.Reset(wait)
}

// closeWith closes the connection once, recording cause (nil for a local
// Close).
func (c *Conn) closeWith(cause error) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	if cause == nil {
		c.err = ErrConnClosed
	} else {
		c.err = fmt.Errorf("%w: %w", ErrConnClosed, cause)
	}
	pending := c.pending
	c.pending = nil
	c.mu.Unlock()

	if c.idle != nil {
		c.idle.Stop()
	}
	// Mark the connection done before cancelling handlers, so a handler
	// that returns because of the cancellation finds it closed and does
	// not write a reply.
	close(c.done)
	_ = c.nc.Close()
	c.cancel()
	for _, ch := range pending {
		close(ch) // a closed channel tells the waiter to look at c.err
	}
}

func (c *Conn) readLoop() {
	defer func() {
		c.handlers.Wait()
		close(c.finished)
		if c.onFinish != nil {
			c.onFinish()
		}
	}()
	rr := recordReader{r: bufio.NewReaderSize(c.nc, 64<<10), max: c.cfg.MaxRecord}
	for {
		rec, rb, err := rr.next()
		if err != nil {
			switch {
			case errors.Is(err, io.EOF):
				c.closeWith(fmt.Errorf("peer closed: %w", err))
			case errors.Is(err, net.ErrClosed):
				c.closeWith(nil)
			default:
				c.log.Debug("rpc: read failed", "err", err)
				c.closeWith(fmt.Errorf("read: %w", err))
			}
			return
		}
		c.touch()
		if len(rec) >= 8 && binary.BigEndian.Uint32(rec[4:]) == msgReply {
			c.deliver(rec, rb)
			continue
		}
		// Everything else is treated as a call; parseCall decides how
		// to answer it. Waiting for a slot here is what bounds memory:
		// the socket is not read while MaxInFlight calls are running.
		select {
		case c.sem <- struct{}{}:
		case <-c.done:
			rb.release() // no handler will see it
			return
		}
		c.busy.Add(1)
		c.handlers.Add(1)
		select {
		case c.work <- callWork{rec, rb}:
		default:
			go c.worker(rec, rb)
		}
	}
}

// callWork is a call record and its pooled buffer, handed to a worker.
type callWork struct {
	rec []byte
	rb  *recBuf
}

// maxIdleWorkers bounds the handler goroutines a connection keeps waiting
// for calls; more run while more calls are in flight (up to MaxInFlight).
const maxIdleWorkers = 8

// worker serves rec, then the calls readLoop hands it while it waits,
// until the connection closes or enough others wait. A handler goroutine
// that lives on keeps the stack its calls grew: a fresh goroutine per
// call starts at the smallest stack and copies it two or three times as
// a COMPOUND descends into the metadata engine, which cost about a tenth
// of the MDS's CPU per small-file operation (server.BenchmarkSmallFileOps).
// An idle worker's stack is shrunk by the garbage collector like any
// goroutine's, so a connection's idle workers cost little memory.
func (c *Conn) worker(rec []byte, rb *recBuf) {
	for {
		c.serve(rec, rb)
		if c.idleWorkers.Add(1) > maxIdleWorkers {
			c.idleWorkers.Add(-1)
			return
		}
		select {
		case w := <-c.work:
			c.idleWorkers.Add(-1)
			rec, rb = w.rec, w.rb
		case <-c.done:
			c.idleWorkers.Add(-1)
			return
		}
	}
}

// reply is an incoming reply record and, if it is pooled, its buffer.
type reply struct {
	rec []byte
	rb  *recBuf
}

func (c *Conn) deliver(rec []byte, rb *recBuf) {
	xid := binary.BigEndian.Uint32(rec)
	c.mu.Lock()
	ch := c.pending[xid]
	delete(c.pending, xid)
	c.mu.Unlock()
	if ch == nil {
		c.log.Debug("rpc: reply for unknown xid", "xid", xid)
		rb.release() // nobody saw it
		return
	}
	ch <- reply{rec, rb} // buffered
}

// serve answers one call record. rb, if not nil, is the pooled buffer
// holding rec; it goes back to its pool after the reply is written if
// nothing can reference it any more (see Call.ReleaseArgsAfterReply).
func (c *Conn) serve(rec []byte, rb *recBuf) {
	defer func() {
		c.touch()
		c.busy.Add(-1)
		<-c.sem
		c.handlers.Done()
	}()
	e := xdr.NewEncoder(512)
	call, err := parseCall(rec)
	if err != nil {
		var ce *callError
		if !errors.As(err, &ce) || ce.Fault == faultDrop {
			c.log.Debug("rpc: dropping record", "err", err)
			rb.release()
			return
		}
		c.log.Debug("rpc: rejecting call", "err", err)
		encodeFault(e, ce) // copies nothing from rec but the xid
		_ = c.writeRecord(e)
		rb.release() // no handler saw the record
		return
	}
	call.Conn = c
	statAt := encodeAccepted(e, call.XID, Success)
	stat, clean := c.invoke(call, e)
	if stat == Drop {
		if c.afterReply(call) && clean && call.releaseArgs {
			rb.release()
		}
		return
	}
	switch stat {
	case Success, ProgMismatch:
		e.PutUint32At(statAt, uint32(stat))
	default:
		e.Reset()
		encodeAccepted(e, call.XID, stat)
	}
	if e.Len()-4 > maxFragment {
		c.log.Error("rpc: reply too large", "prog", call.Prog, "proc", call.Proc, "size", e.Len())
		e.Reset()
		encodeAccepted(e, call.XID, SystemErr)
	}
	_ = c.writeRecord(e) // a failed write closes the connection
	// The reply may splice slices of the record (OpaqueRef); it has been
	// written (or abandoned) now, and writev does not keep them.
	if c.afterReply(call) && clean && call.releaseArgs {
		rb.release()
	}
}

// afterReply runs the call's AfterReply callbacks, which are handler code
// and so get the same panic protection. It reports whether they ran without
// panicking.
func (c *Conn) afterReply(call *Call) (clean bool) {
	defer func() {
		if r := recover(); r != nil {
			c.log.Error("rpc: AfterReply callback panic", "prog", call.Prog, "proc", call.Proc,
				"panic", r, "stack", string(debug.Stack()))
			clean = false
		}
	}()
	call.runAfterReply()
	return true
}

// invoke runs the handler, turning a panic into SYSTEM_ERR: one bad request
// must not take the server down. clean is false if the handler panicked,
// in which case its ReleaseArgsAfterReply declaration is not trusted.
func (c *Conn) invoke(call *Call, e *xdr.Encoder) (stat AcceptStat, clean bool) {
	if c.h == nil {
		return ProgUnavail, true
	}
	defer func() {
		if r := recover(); r != nil {
			c.log.Error("rpc: handler panic", "prog", call.Prog, "vers", call.Vers, "proc", call.Proc,
				"panic", r, "stack", string(debug.Stack()))
			stat, clean = SystemErr, false
		}
	}()
	stat = c.h.ServeRPC(c.ctx, call, e)
	if stat > SystemErr && stat != Drop {
		c.log.Error("rpc: handler returned invalid accept_stat", "stat", uint32(stat), "prog", call.Prog, "proc", call.Proc)
		stat = SystemErr
	}
	return stat, true
}

// writeRecord patches the record mark at the start of e and writes e as one
// record.
func (c *Conn) writeRecord(e *xdr.Encoder) error {
	var arr [4][]byte // most replies are one slice: no allocation for the list
	bufs := e.AppendBuffers(arr[:0])
	putRecordMark(bufs[0], e.Len()-4)
	return c.write(bufs)
}

// write sends bufs with a single writev. A failed or partial write leaves
// the stream unusable, so it closes the connection.
func (c *Conn) write(bufs net.Buffers) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	select {
	case <-c.done:
		return c.Err()
	default:
	}
	if c.cfg.WriteTimeout > 0 {
		_ = c.nc.SetWriteDeadline(time.Now().Add(c.cfg.WriteTimeout))
	}
	// WriteTo consumes the slice it is called on, through a pointer that
	// escapes: written from c's own fields, a record costs no allocation
	// of a slice header. The references are cleared after, so that the
	// connection keeps no record's buffers alive.
	c.wbase = append(c.wbase[:0], bufs...)
	c.wbufs = c.wbase
	_, err := c.wbufs.WriteTo(c.nc)
	clear(c.wbase)
	if err != nil {
		c.closeWith(fmt.Errorf("write: %w", err))
		return c.Err()
	}
	c.touch()
	return nil
}

// Call sends a call with an AUTH_NONE verifier and waits for the reply. On
// SUCCESS it returns the results, which alias a buffer owned by this call
// alone. Otherwise the error is an *AcceptError, a *RejectError, or wraps
// ErrConnClosed, ErrBadReply or the context's error. args may be nil for a
// void argument; it may splice data with OpaqueRef, which is written without
// copying.
func (c *Conn) Call(ctx context.Context, prog, vers, proc uint32, cred OpaqueAuth, args xdr.Marshaler) ([]byte, error) {
	e := xdr.NewEncoder(256)
	xid := c.nextXID()
	encodeCallHeader(e, xid, prog, vers, proc, cred)
	if args != nil {
		args.EncodeXDR(e)
	}
	var arr [4][]byte
	res, _, err := c.roundTrip(ctx, xid, prog, vers, proc, cred, e.AppendBuffers(arr[:0]), e.Len())
	return res, err // a pooled reply buffer is left to the garbage collector
}

// CallRelease is Call for a caller that knows when it is done with the
// results. On success release is not nil; calling it declares that nothing
// references res or anything decoded from it any more, and lets the
// connection reuse the reply's buffer (see "Buffer reuse" in the package
// documentation). Calling it is optional, further calls do nothing, and on
// error there is nothing to release.
func (c *Conn) CallRelease(ctx context.Context, prog, vers, proc uint32, cred OpaqueAuth, args xdr.Marshaler) (res []byte, release func(), err error) {
	e := xdr.NewEncoder(256)
	xid := c.nextXID()
	encodeCallHeader(e, xid, prog, vers, proc, cred)
	if args != nil {
		args.EncodeXDR(e)
	}
	var arr [4][]byte
	res, rb, err := c.roundTrip(ctx, xid, prog, vers, proc, cred, e.AppendBuffers(arr[:0]), e.Len())
	if err != nil {
		return nil, nil, err
	}
	return res, releaser(rb), nil
}

// CallBuffers is Call with arguments already encoded as XDR in args, which
// are written after the header without copying and are not modified.
func (c *Conn) CallBuffers(ctx context.Context, prog, vers, proc uint32, cred OpaqueAuth, args net.Buffers) ([]byte, error) {
	e := xdr.NewEncoder(128)
	xid := c.nextXID()
	encodeCallHeader(e, xid, prog, vers, proc, cred)
	n := e.Len()
	bufs := make(net.Buffers, 0, 1+len(args))
	bufs = append(bufs, e.Bytes())
	for _, b := range args {
		n += len(b)
		bufs = append(bufs, b)
	}
	res, _, err := c.roundTrip(ctx, xid, prog, vers, proc, cred, bufs, n)
	return res, err
}

func (c *Conn) nextXID() uint32 { return c.xid.Add(1) }

// roundTrip sends a call and waits for its reply. On success rb, if not
// nil, is the pooled buffer res lives in; the caller may release it once
// nothing references res.
func (c *Conn) roundTrip(ctx context.Context, xid, prog, vers, proc uint32, cred OpaqueAuth, bufs net.Buffers, n int) (res []byte, rb *recBuf, err error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, callErr(xid, prog, vers, proc, err)
	}
	p := &Pending{c: c, xid: xid, prog: prog, vers: vers, proc: proc}
	if err := c.send(p, cred, bufs, n); err != nil {
		return nil, nil, err
	}
	res, rb, err = p.wait(ctx, nil)
	if err != nil && !p.done {
		p.Abandon() // ctx ended first
	}
	return res, rb, err
}

// callErr wraps err with what identifies the call.
func callErr(xid, prog, vers, proc uint32, err error) error {
	return fmt.Errorf("rpc: call %d/%d/%d xid %#x: %w", prog, vers, proc, xid, err)
}

// send registers p's reply channel and writes the call. It counts p as
// busy until p's final result is taken or p is abandoned.
func (c *Conn) send(p *Pending, cred OpaqueAuth, bufs net.Buffers, n int) error {
	if len(cred.Body) > maxAuthBody {
		return p.wrap(fmt.Errorf("credential body of %d bytes exceeds %d", len(cred.Body), maxAuthBody))
	}
	if n-4 > maxFragment {
		return p.wrap(fmt.Errorf("call of %d bytes too large for one record", n))
	}
	putRecordMark(bufs[0], n-4)

	p.ch = make(chan reply, 1)
	c.mu.Lock()
	if c.pending == nil {
		err := c.err
		c.mu.Unlock()
		return p.wrap(err)
	}
	if _, dup := c.pending[p.xid]; dup {
		// 2^32 calls outstanding is impossible in practice, but a
		// collision must never cross replies.
		c.mu.Unlock()
		return p.wrap(errors.New("xid in use"))
	}
	c.pending[p.xid] = p.ch
	c.mu.Unlock()
	c.busy.Add(1)
	if err := c.write(bufs); err != nil {
		c.forget(p.xid)
		c.busy.Add(-1)
		return p.wrap(err)
	}
	return nil
}

func (c *Conn) forget(xid uint32) {
	c.mu.Lock()
	delete(c.pending, xid)
	c.mu.Unlock()
}
