package rpc

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/shoalfs/shoal/internal/xdr"
)

const testProg, testVers = 400123, 1

// checkLeaks fails the test if goroutines started during it are still
// running shortly after it ends. Register it first so it runs last.
func checkLeaks(t testing.TB) {
	before := runtime.NumGoroutine()
	t.Cleanup(func() {
		deadline := time.Now().Add(5 * time.Second)
		for i := 0; ; i++ {
			n := runtime.NumGoroutine()
			if n <= before {
				return
			}
			if time.Now().After(deadline) {
				buf := make([]byte, 1<<20)
				buf = buf[:runtime.Stack(buf, true)]
				t.Errorf("goroutine leak: %d before, %d after\n%s", before, n, buf)
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
}

// startServer serves s on a loopback listener until the test ends.
func startServer(t testing.TB, s *Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve(ln) }()
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		if err := <-served; !errors.Is(err, ErrServerClosed) {
			t.Errorf("Serve returned %v, want ErrServerClosed", err)
		}
	})
	return ln.Addr().String()
}

func dial(t testing.TB, addr string, h Handler, opts ...Option) *Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := Dial(ctx, "tcp", addr, h, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// opaqueArg marshals as opaque<>, spliced without copying.
type opaqueArg []byte

func (a opaqueArg) EncodeXDR(e *xdr.Encoder) { e.OpaqueRef(a) }

type uint32Arg uint32

func (a uint32Arg) EncodeXDR(e *xdr.Encoder) { e.Uint32(uint32(a)) }

// echoHandler answers every call with its arguments, verbatim.
var echoHandler = HandlerFunc(func(ctx context.Context, call *Call, res *xdr.Encoder) AcceptStat {
	res.Append(call.Args)
	return Success
})

// rawCall builds a CALL message (no record mark).
func rawCall(xid, rpcvers, prog, vers, proc uint32, cred, verf OpaqueAuth, args []byte) []byte {
	e := xdr.NewEncoder(64)
	e.Uint32(xid)
	e.Uint32(msgCall)
	e.Uint32(rpcvers)
	e.Uint32(prog)
	e.Uint32(vers)
	e.Uint32(proc)
	e.Uint32(cred.Flavor)
	e.Opaque(cred.Body)
	e.Uint32(verf.Flavor)
	e.Opaque(verf.Body)
	e.Append(args)
	return e.Bytes()
}

// fragment splits rec into record-marked fragments of the given sizes (the
// last fragment takes the remainder).
func fragment(rec []byte, sizes ...int) []byte {
	var out []byte
	for _, n := range sizes {
		n = min(n, len(rec))
		out = binary.BigEndian.AppendUint32(out, uint32(n))
		out = append(out, rec[:n]...)
		rec = rec[n:]
	}
	out = binary.BigEndian.AppendUint32(out, lastFragment|uint32(len(rec)))
	return append(out, rec...)
}

// rawConn is a client speaking bytes directly.
type rawConn struct {
	t  testing.TB
	nc net.Conn
	rr recordReader
}

func dialRaw(t testing.TB, addr string) *rawConn {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	nc.SetDeadline(time.Now().Add(10 * time.Second))
	return &rawConn{t: t, nc: nc, rr: recordReader{r: bufio.NewReader(nc), max: 1 << 24}}
}

func (r *rawConn) send(b []byte) {
	r.t.Helper()
	if _, err := r.nc.Write(b); err != nil {
		r.t.Fatal(err)
	}
}

func (r *rawConn) reply() ([]byte, error) {
	r.t.Helper()
	rec, _, err := r.rr.next()
	if err != nil {
		r.t.Fatalf("reading reply: %v", err)
	}
	return parseReply(rec)
}

// waitClosed reads until the peer closes the connection.
func (r *rawConn) waitClosed() {
	r.t.Helper()
	buf := make([]byte, 4096)
	for i := 0; i < 1000; i++ {
		if _, err := r.nc.Read(buf); err != nil {
			if isTimeout(err) {
				r.t.Fatal("connection not closed by server")
			}
			return
		}
	}
	r.t.Fatal("connection kept sending data")
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout() || strings.Contains(err.Error(), "timeout")
}

// waitFor polls cond, bounded in time.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}
