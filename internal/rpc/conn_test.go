package rpc

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shoalfs/shoal/internal/xdr"
)

func TestRecordFragments(t *testing.T) {
	checkLeaks(t)
	addr := startServer(t, &Server{Handler: echoHandler})
	args := bytes.Repeat([]byte("0123456789abcdef"), 1024) // 16 KiB
	tests := []struct {
		name  string
		sizes []int
	}{
		{"single", nil},
		{"two", []int{10}},
		{"header split", []int{3, 5, 7}},
		{"empty fragments", []int{0, 0, 40, 0}},
		{"many", []int{1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000}},
	}
	rc := dialRaw(t, addr)
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rec := rawCall(uint32(i+1), 2, testProg, testVers, 1, OpaqueAuth{}, OpaqueAuth{}, args)
			rc.send(fragment(rec, tc.sizes...))
			res, err := rc.reply()
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(res, args) {
				t.Fatalf("echo mismatch: got %d bytes", len(res))
			}
		})
	}
}

func TestRecordReader(t *testing.T) {
	rec := []byte("hello, record")
	tests := []struct {
		name    string
		stream  []byte
		max     int
		want    [][]byte
		wantErr error
	}{
		{"clean eof", nil, 100, nil, nil},
		{"one", fragment(rec), 100, [][]byte{rec}, nil},
		{"fragments", fragment(rec, 1, 2, 3), 100, [][]byte{rec}, nil},
		{"two records", append(fragment(rec), fragment(rec, 4)...), 100, [][]byte{rec, rec}, nil},
		{"at limit", fragment(rec, 5), len(rec), [][]byte{rec}, nil},
		{"over limit", fragment(rec, 5), len(rec) - 1, nil, ErrRecordTooLarge},
		{"4 GiB", []byte{0xff, 0xff, 0xff, 0xff}, 1 << 20, nil, ErrRecordTooLarge},
		{"2 GiB", []byte{0x7f, 0xff, 0xff, 0xff}, 1 << 20, nil, ErrRecordTooLarge},
		{"truncated body", fragment(rec)[:8], 100, nil, errUnexpected},
		{"truncated mark", fragment(rec)[:2], 100, nil, errUnexpected},
		{"eof after fragment", fragment(rec, 4)[:8], 100, nil, errUnexpected},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rr := recordReader{r: bytes.NewReader(tc.stream), max: tc.max}
			var got [][]byte
			var err error
			for range 10 {
				var r []byte
				if r, _, err = rr.next(); err != nil {
					break
				}
				got = append(got, r)
			}
			if tc.wantErr == nil {
				if err.Error() != "EOF" {
					t.Fatalf("err = %v, want EOF", err)
				}
			} else if !errors.Is(err, tc.wantErr) {
				t.Fatalf("err = %v, want %v", err, tc.wantErr)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("got %d records, want %d", len(got), len(tc.want))
			}
			for i := range got {
				if !bytes.Equal(got[i], tc.want[i]) {
					t.Fatalf("record %d = %q", i, got[i])
				}
			}
		})
	}
}

var errUnexpected = io.ErrUnexpectedEOF

func TestCallRoundTrip(t *testing.T) {
	checkLeaks(t)
	addr := startServer(t, &Server{Handler: HandlerFunc(func(ctx context.Context, call *Call, res *xdr.Encoder) AcceptStat {
		switch call.Proc {
		case 0:
			return Success
		case 1:
			d := xdr.NewDecoder(call.Args)
			b := d.Opaque(0)
			if d.Err() != nil {
				return GarbageArgs
			}
			res.OpaqueRef(b) // splice the request buffer straight back out
			return Success
		case 2:
			res.Uint32(1)
			res.Uint32(3)
			return ProgMismatch
		case 3:
			res.Uint32(0xdead) // must be discarded
			return ProcUnavail
		case 4:
			panic("handler bug")
		case 5:
			return AcceptStat(99)
		}
		return ProcUnavail
	})})
	c := dial(t, addr, nil)
	ctx := testCtx(t)
	big := bytes.Repeat([]byte{0xa5}, 100_000)
	tests := []struct {
		name    string
		proc    uint32
		args    xdr.Marshaler
		want    []byte
		wantErr error
	}{
		{"null", 0, nil, []byte{}, nil},
		{"echo small", 1, opaqueArg("hi"), xdr.Marshal(opaqueArg("hi")), nil},
		{"echo big", 1, opaqueArg(big), xdr.Marshal(opaqueArg(big)), nil},
		{"garbage", 1, uint32Arg(1000), nil, &AcceptError{Stat: GarbageArgs}},
		{"prog mismatch", 2, nil, nil, &AcceptError{Stat: ProgMismatch, Low: 1, High: 3}},
		{"proc unavail", 3, nil, nil, &AcceptError{Stat: ProcUnavail}},
		{"panic", 4, nil, nil, &AcceptError{Stat: SystemErr}},
		{"invalid stat", 5, nil, nil, &AcceptError{Stat: SystemErr}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := c.Call(ctx, testProg, testVers, tc.proc, OpaqueAuth{}, tc.args)
			if tc.wantErr != nil {
				var ae *AcceptError
				if !errors.As(err, &ae) {
					t.Fatalf("err = %v, want %v", err, tc.wantErr)
				}
				want := tc.wantErr.(*AcceptError)
				if ae.Stat != want.Stat || ae.Low != want.Low || ae.High != want.High || ae.Proc != tc.proc || ae.Prog != testProg {
					t.Fatalf("err = %+v, want %+v", ae, want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, tc.want) {
				t.Fatalf("got %d bytes, want %d", len(got), len(tc.want))
			}
		})
	}

	// CallBuffers sends pre-encoded arguments without modifying them.
	hdr := binary.BigEndian.AppendUint32(nil, uint32(len(big)))
	bufs := [][]byte{hdr, big}
	got, err := c.CallBuffers(ctx, testProg, testVers, 1, OpaqueAuth{}, bufs)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, xdr.Marshal(opaqueArg(big))) || len(bufs[0]) != 4 || len(bufs[1]) != len(big) {
		t.Fatal("CallBuffers: bad echo or arguments modified")
	}
}

func TestConcurrentOutOfOrder(t *testing.T) {
	checkLeaks(t)
	const n = 100
	addr := startServer(t, &Server{Handler: HandlerFunc(func(ctx context.Context, call *Call, res *xdr.Encoder) AcceptStat {
		id := binary.BigEndian.Uint32(call.Args)
		time.Sleep(time.Duration(n-id) * 50 * time.Microsecond) // later ids finish first
		res.Uint32(id * 7)
		return Success
	})})
	c := dial(t, addr, nil)
	ctx := testCtx(t)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range uint32(n) {
		wg.Go(func() {
			res, err := c.Call(ctx, testProg, testVers, 1, OpaqueAuth{}, uint32Arg(i))
			switch {
			case err != nil:
				errs <- err
			case len(res) != 4 || binary.BigEndian.Uint32(res) != i*7:
				errs <- fmt.Errorf("call %d: got %x", i, res)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestBackchannel(t *testing.T) {
	checkLeaks(t)
	const cbProg = 0x40000000
	var states sync.Map
	srv := &Server{
		Handler: HandlerFunc(func(ctx context.Context, call *Call, res *xdr.Encoder) AcceptStat {
			unpin := call.Conn.Pin()
			defer unpin()
			call.Conn.SetValue("session", "s1")
			// Call back into the client on the connection the call
			// arrived on, while this call is still being served.
			cb, err := call.Conn.Call(ctx, cbProg, 1, 1, OpaqueAuth{}, opaqueArg("recall"))
			if err != nil {
				return SystemErr
			}
			res.Append(cb)
			res.String(call.Conn.Value("session").(string))
			return Success
		}),
		ConnState: func(c *Conn, s ConnState) { states.Store(s, true) },
	}
	addr := startServer(t, srv)
	var served atomic.Int32
	c := dial(t, addr, HandlerFunc(func(ctx context.Context, call *Call, res *xdr.Encoder) AcceptStat {
		if call.Prog != cbProg {
			return ProgUnavail
		}
		served.Add(1)
		d := xdr.NewDecoder(call.Args)
		res.String("client saw " + d.String(0))
		return Success
	}))
	res, err := c.Call(testCtx(t), testProg, testVers, 1, OpaqueAuth{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	d := xdr.NewDecoder(res)
	if got, sess := d.String(0), d.String(0); d.Err() != nil || got != "client saw recall" || sess != "s1" {
		t.Fatalf("got %q %q %v", got, sess, d.Err())
	}
	if served.Load() != 1 {
		t.Fatalf("client handler served %d callbacks", served.Load())
	}
	if _, ok := states.Load(StateNew); !ok {
		t.Fatal("ConnState(StateNew) not reported")
	}
	c.Close()
	waitFor(t, "StateClosed", func() bool { _, ok := states.Load(StateClosed); return ok })
}

func TestNilHandlerProgUnavail(t *testing.T) {
	checkLeaks(t)
	// The server's handler calls back into a client that has none.
	addr := startServer(t, &Server{Handler: HandlerFunc(func(ctx context.Context, call *Call, res *xdr.Encoder) AcceptStat {
		_, err := call.Conn.Call(ctx, 1, 1, 1, OpaqueAuth{}, nil)
		var ae *AcceptError
		if errors.As(err, &ae) && ae.Stat == ProgUnavail {
			return Success
		}
		return SystemErr
	})})
	c := dial(t, addr, nil)
	if _, err := c.Call(testCtx(t), testProg, testVers, 1, OpaqueAuth{}, nil); err != nil {
		t.Fatal(err)
	}
}

func TestAuthSys(t *testing.T) {
	checkLeaks(t)
	got := make(chan *Call, 1)
	addr := startServer(t, &Server{Handler: HandlerFunc(func(ctx context.Context, call *Call, res *xdr.Encoder) AcceptStat {
		got <- call
		return Success
	})})
	c := dial(t, addr, nil)
	gids := make([]uint32, 20)
	for i := range gids {
		gids[i] = uint32(100 + i)
	}
	p := AuthSysParams{Stamp: 42, Machine: "client.example", UID: 1000, GID: 1001, GIDs: gids}
	if _, err := c.Call(testCtx(t), testProg, testVers, 1, AuthSysCred(p), nil); err != nil {
		t.Fatal(err)
	}
	call := <-got
	s := call.Sys
	if call.Cred.Flavor != AuthSys || s == nil || s.Stamp != 42 || s.Machine != "client.example" ||
		s.UID != 1000 || s.GID != 1001 || len(s.GIDs) != 16 || s.GIDs[15] != 115 {
		t.Fatalf("bad AUTH_SYS: %+v", s)
	}
	if call.Conn == nil || call.Prog != testProg || call.Vers != testVers || call.Proc != 1 {
		t.Fatalf("bad call: %+v", call)
	}
}

// TestBadCalls sends malformed calls over raw TCP and checks each answer;
// the handler must never see them.
func TestBadCalls(t *testing.T) {
	checkLeaks(t)
	var handled atomic.Int32
	addr := startServer(t, &Server{Handler: HandlerFunc(func(ctx context.Context, call *Call, res *xdr.Encoder) AcceptStat {
		handled.Add(1)
		return Success
	})})
	sysBody := AuthSysCred(AuthSysParams{Machine: "m", GIDs: []uint32{1}}).Body
	none := OpaqueAuth{}
	tests := []struct {
		name string
		rec  []byte
		want error
	}{
		{"rpc version 3", rawCall(1, 3, testProg, 1, 0, none, none, nil), &RejectError{Stat: RPCMismatch, Low: 2, High: 2}},
		{"rpcsec_gss", rawCall(2, 2, testProg, 1, 0, OpaqueAuth{Flavor: 6, Body: []byte{1, 2, 3, 4}}, none, nil), &RejectError{Stat: AuthError, Auth: AuthBadCred}},
		{"cred 401 bytes", rawCall(3, 2, testProg, 1, 0, OpaqueAuth{Flavor: AuthSys, Body: make([]byte, 401)}, none, nil), &RejectError{Stat: AuthError, Auth: AuthBadCred}},
		{"verf 401 bytes", rawCall(4, 2, testProg, 1, 0, none, OpaqueAuth{Body: make([]byte, 401)}, nil), &RejectError{Stat: AuthError, Auth: AuthBadVerf}},
		{"truncated auth_sys", rawCall(5, 2, testProg, 1, 0, OpaqueAuth{Flavor: AuthSys, Body: sysBody[:len(sysBody)-4]}, none, nil), &RejectError{Stat: AuthError, Auth: AuthBadCred}},
		{"auth_sys trailing", rawCall(6, 2, testProg, 1, 0, OpaqueAuth{Flavor: AuthSys, Body: append(sysBody, 0, 0, 0, 0)}, none, nil), &RejectError{Stat: AuthError, Auth: AuthBadCred}},
		{"auth_sys 17 gids", rawCall(7, 2, testProg, 1, 0, OpaqueAuth{Flavor: AuthSys, Body: authSysRaw(17)}, none, nil), &RejectError{Stat: AuthError, Auth: AuthBadCred}},
		{"sys verifier", rawCall(8, 2, testProg, 1, 0, none, OpaqueAuth{Flavor: AuthSys}, nil), &RejectError{Stat: AuthError, Auth: AuthBadVerf}},
		{"truncated header", rawCall(9, 2, testProg, 1, 0, none, none, nil)[:20], &AcceptError{Stat: GarbageArgs}},
		{"only xid and type", []byte{0, 0, 0, 10, 0, 0, 0, 0}, &AcceptError{Stat: GarbageArgs}},
		{"bad message type", []byte{0, 0, 0, 11, 0, 0, 0, 7, 0, 0, 0, 2}, &AcceptError{Stat: GarbageArgs}},
	}
	rc := dialRaw(t, addr)
	// Records too short for an xid are dropped without an answer.
	rc.send(fragment([]byte{1, 2}))
	rc.send(fragment(nil))
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rc.send(fragment(tc.rec))
			_, err := rc.reply()
			switch want := tc.want.(type) {
			case *RejectError:
				var re *RejectError
				if !errors.As(err, &re) || re.Stat != want.Stat || re.Low != want.Low || re.High != want.High || re.Auth != want.Auth {
					t.Fatalf("err = %v, want %v", err, want)
				}
				if re.XID != binary.BigEndian.Uint32(tc.rec) {
					t.Fatalf("reply xid %#x", re.XID)
				}
			case *AcceptError:
				var ae *AcceptError
				if !errors.As(err, &ae) || ae.Stat != want.Stat {
					t.Fatalf("err = %v, want %v", err, want)
				}
			}
		})
	}
	if n := handled.Load(); n != 0 {
		t.Fatalf("handler saw %d malformed calls", n)
	}
}

func authSysRaw(ngids int) []byte {
	e := xdr.NewEncoder(64)
	e.Uint32(0)
	e.String("m")
	e.Uint32(0)
	e.Uint32(0)
	e.Uint32(uint32(ngids))
	for range ngids {
		e.Uint32(1)
	}
	return e.Bytes()
}

func TestHugeRecordMark(t *testing.T) {
	checkLeaks(t)
	closed := make(chan struct{}, 4)
	addr := startServer(t, &Server{
		Handler: echoHandler,
		ConnState: func(c *Conn, s ConnState) {
			if s == StateClosed {
				closed <- struct{}{}
			}
		},
	})
	for _, mark := range [][]byte{{0xff, 0xff, 0xff, 0xff}, {0x7f, 0xff, 0xff, 0xff}, {0x80, 0x30, 0, 0}} {
		rc := dialRaw(t, addr)
		rc.send(mark)
		rc.waitClosed()
		<-closed
	}
	// The server keeps serving other clients.
	c := dial(t, addr, nil)
	if _, err := c.Call(testCtx(t), testProg, testVers, 1, OpaqueAuth{}, uint32Arg(5)); err != nil {
		t.Fatal(err)
	}
}

func TestTruncatedRecord(t *testing.T) {
	checkLeaks(t)
	var handled atomic.Int32
	closed := make(chan struct{}, 1)
	addr := startServer(t, &Server{
		Handler: HandlerFunc(func(ctx context.Context, call *Call, res *xdr.Encoder) AcceptStat {
			handled.Add(1)
			return Success
		}),
		ConnState: func(c *Conn, s ConnState) {
			if s == StateClosed {
				if !errors.Is(c.Err(), ErrConnClosed) {
					t.Errorf("Err() = %v", c.Err())
				}
				closed <- struct{}{}
			}
		},
	})
	rc := dialRaw(t, addr)
	rec := fragment(rawCall(1, 2, testProg, 1, 0, OpaqueAuth{}, OpaqueAuth{}, make([]byte, 100)))
	rc.send(rec[:len(rec)-10])
	rc.nc.(interface{ CloseWrite() error }).CloseWrite()
	rc.waitClosed()
	<-closed
	if n := handled.Load(); n != 0 {
		t.Fatalf("handler called %d times for a truncated record", n)
	}
}

func TestMaxInFlight(t *testing.T) {
	checkLeaks(t)
	const limit, calls = 3, 12
	var cur, peak atomic.Int32
	release := make(chan struct{})
	addr := startServer(t, &Server{
		MaxInFlight: limit,
		Handler: HandlerFunc(func(ctx context.Context, call *Call, res *xdr.Encoder) AcceptStat {
			n := cur.Add(1)
			defer cur.Add(-1)
			for {
				p := peak.Load()
				if n <= p || peak.CompareAndSwap(p, n) {
					break
				}
			}
			<-release
			return Success
		}),
	})
	c := dial(t, addr, nil)
	ctx := testCtx(t)
	var wg sync.WaitGroup
	var failed atomic.Int32
	for range calls {
		wg.Go(func() {
			if _, err := c.Call(ctx, testProg, testVers, 1, OpaqueAuth{}, nil); err != nil {
				failed.Add(1)
			}
		})
	}
	waitFor(t, "handlers to fill the slots", func() bool { return cur.Load() == limit })
	close(release)
	wg.Wait()
	if failed.Load() != 0 || peak.Load() != limit {
		t.Fatalf("failed %d, peak %d (limit %d)", failed.Load(), peak.Load(), limit)
	}
}

func TestIdleTimeout(t *testing.T) {
	checkLeaks(t)
	addr := startServer(t, &Server{Handler: echoHandler, IdleTimeout: 20 * time.Millisecond})
	c := dial(t, addr, nil)
	if _, err := c.Call(testCtx(t), testProg, testVers, 1, OpaqueAuth{}, nil); err != nil {
		t.Fatal(err)
	}
	select {
	case <-c.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("idle connection not closed")
	}
	if _, err := c.Call(testCtx(t), testProg, testVers, 1, OpaqueAuth{}, nil); !errors.Is(err, ErrConnClosed) {
		t.Fatalf("call on closed conn: %v", err)
	}

	// The client side can idle out too.
	c2 := dial(t, addr, nil, WithConfig(ConnConfig{IdleTimeout: time.Millisecond}))
	<-c2.Done()
	if err := c2.Err(); !errors.Is(err, ErrIdleTimeout) {
		t.Fatalf("Err() = %v, want idle timeout", err)
	}
}

func TestCloseWithCallsInFlight(t *testing.T) {
	checkLeaks(t)
	var started atomic.Int32
	var returned atomic.Int32
	srv := &Server{Handler: HandlerFunc(func(ctx context.Context, call *Call, res *xdr.Encoder) AcceptStat {
		started.Add(1)
		defer returned.Add(1)
		<-ctx.Done()
		return SystemErr
	})}
	addr := startServer(t, srv)
	c := dial(t, addr, nil)
	ctx := testCtx(t)
	const n = 5
	errs := make(chan error, n)
	for range n {
		go func() {
			_, err := c.Call(ctx, testProg, testVers, 1, OpaqueAuth{}, nil)
			errs <- err
		}()
	}
	waitFor(t, "handlers to start", func() bool { return started.Load() == n })
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	if returned.Load() != n {
		t.Fatalf("Close returned with %d of %d handlers running", n-returned.Load(), n)
	}
	for range n {
		if err := <-errs; !errors.Is(err, ErrConnClosed) {
			t.Fatalf("pending call: %v, want ErrConnClosed", err)
		}
	}
}

func TestCallContextCancel(t *testing.T) {
	checkLeaks(t)
	block := make(chan struct{})
	addr := startServer(t, &Server{Handler: HandlerFunc(func(ctx context.Context, call *Call, res *xdr.Encoder) AcceptStat {
		if call.Proc == 1 {
			select {
			case <-block:
			case <-ctx.Done():
			}
		}
		return Success
	})})
	c := dial(t, addr, nil)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := c.Call(ctx, testProg, testVers, 1, OpaqueAuth{}, nil)
		errc <- err
	}()
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v", err)
	}
	close(block)
	// The late reply is dropped and the connection stays usable.
	if _, err := c.Call(testCtx(t), testProg, testVers, 0, OpaqueAuth{}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Call(testCtx(t), testProg, testVers, 0, OpaqueAuth{Flavor: AuthSys, Body: make([]byte, 401)}, nil); err == nil {
		t.Fatal("oversized credential accepted")
	}
}

func TestAfterReply(t *testing.T) {
	checkLeaks(t)
	done := make(chan struct{})
	addr := startServer(t, &Server{Handler: HandlerFunc(func(ctx context.Context, call *Call, res *xdr.Encoder) AcceptStat {
		call.AfterReply(func() { close(done) })
		res.OpaqueRef(make([]byte, 4096))
		return Success
	})})
	c := dial(t, addr, nil)
	if _, err := c.Call(testCtx(t), testProg, testVers, 0, OpaqueAuth{}, nil); err != nil {
		t.Fatal(err)
	}
	<-done
}

// TestIdlePinned drives the idle check directly, so the result does not
// depend on timing.
func TestIdlePinned(t *testing.T) {
	checkLeaks(t)
	addr := startServer(t, &Server{Handler: echoHandler})
	c := dial(t, addr, nil, WithConfig(ConnConfig{IdleTimeout: time.Hour}))
	unpin := c.Pin()
	long := time.Now().Add(-2 * time.Hour).UnixNano()
	c.lastActive.Store(long)
	c.checkIdle()
	if c.Err() != nil {
		t.Fatalf("pinned connection closed: %v", c.Err())
	}
	c.busy.Add(1) // as if a call were in flight
	unpin()
	unpin() // idempotent
	c.lastActive.Store(long)
	c.checkIdle()
	if c.Err() != nil {
		t.Fatalf("busy connection closed: %v", c.Err())
	}
	c.busy.Add(-1)
	c.checkIdle()
	if !errors.Is(c.Err(), ErrIdleTimeout) {
		t.Fatalf("Err() = %v, want idle timeout", c.Err())
	}
}

// TestDrop: a handler returning Drop sends nothing (the caller waits until
// its context ends), its AfterReply callbacks still run, and the
// connection goes on serving.
func TestDrop(t *testing.T) {
	checkLeaks(t)
	after := make(chan struct{}, 1)
	addr := startServer(t, &Server{Handler: HandlerFunc(func(ctx context.Context, call *Call, res *xdr.Encoder) AcceptStat {
		if call.Proc == 1 {
			call.AfterReply(func() { after <- struct{}{} })
			res.Uint32(7) // ignored: nothing is sent
			return Drop
		}
		return Success
	})})
	c := dial(t, addr, nil)
	ctx, cancel := context.WithTimeout(testCtx(t), 300*time.Millisecond)
	defer cancel()
	if _, err := c.Call(ctx, testProg, testVers, 1, OpaqueAuth{}, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("dropped call: err = %v, want no reply (deadline exceeded)", err)
	}
	select {
	case <-after:
	case <-testCtx(t).Done():
		t.Fatal("AfterReply of a dropped call never ran")
	}
	if _, err := c.Call(testCtx(t), testProg, testVers, 0, OpaqueAuth{}, nil); err != nil {
		t.Fatalf("call after a dropped one: %v", err)
	}
}
