package rpc

import (
	"context"
	"errors"
	"testing"

	"github.com/shoalfs/shoal/internal/xdr"
)

// TestPending covers Send and Pending.Wait: a reply taken at once; a wait
// stopped before the reply, then resumed (the reply is not lost); a wait
// whose context ends (the call is abandoned, its late reply dropped and the
// connection still usable); an abandoned call; and a connection closed
// under a pending call.
func TestPending(t *testing.T) {
	checkLeaks(t)
	release := make(chan struct{}, 16)
	addr := startServer(t, &Server{Handler: HandlerFunc(func(ctx context.Context, call *Call, res *xdr.Encoder) AcceptStat {
		d := xdr.NewDecoder(call.Args)
		v := d.Uint32()
		if call.Proc == 1 { // waits for the test to let it answer
			select {
			case <-release:
			case <-ctx.Done():
				return SystemErr
			}
		}
		res.Uint32(v + 1)
		return Success
	})})
	answer := func(t *testing.T, res []byte, want uint32) {
		t.Helper()
		d := xdr.NewDecoder(res)
		if got := d.Uint32(); d.Err() != nil || got != want {
			t.Fatalf("result %d (%v), want %d", got, d.Err(), want)
		}
	}
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, c *Conn)
	}{
		{"reply at once", func(t *testing.T, c *Conn) {
			p, err := c.Send(testProg, testVers, 0, OpaqueAuth{}, uint32Arg(41))
			if err != nil {
				t.Fatal(err)
			}
			res, free, err := p.Wait(testCtx(t), make(chan struct{}))
			if err != nil {
				t.Fatal(err)
			}
			answer(t, res, 42)
			free()
			if _, _, err := p.Wait(testCtx(t), nil); err == nil {
				t.Fatal("second Wait of an ended call succeeded")
			}
		}},
		{"stopped then resumed", func(t *testing.T, c *Conn) {
			p, err := c.Send(testProg, testVers, 1, OpaqueAuth{}, uint32Arg(6))
			if err != nil {
				t.Fatal(err)
			}
			stop := make(chan struct{})
			close(stop)
			if _, _, err := p.Wait(testCtx(t), stop); !errors.Is(err, ErrWaitStopped) {
				t.Fatalf("Wait with stop closed: %v, want ErrWaitStopped", err)
			}
			release <- struct{}{}
			res, free, err := p.Wait(testCtx(t), nil)
			if err != nil {
				t.Fatal(err)
			}
			answer(t, res, 7)
			free()
		}},
		{"context ends", func(t *testing.T, c *Conn) {
			p, err := c.Send(testProg, testVers, 1, OpaqueAuth{}, uint32Arg(1))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			if _, _, err := p.Wait(ctx, nil); !errors.Is(err, context.Canceled) {
				t.Fatalf("Wait: %v, want context.Canceled", err)
			}
			release <- struct{}{} // the late reply is dropped
			res, err := c.Call(testCtx(t), testProg, testVers, 0, OpaqueAuth{}, uint32Arg(9))
			if err != nil {
				t.Fatal(err)
			}
			answer(t, res, 10)
			waitFor(t, "no call pending", func() bool { return c.busy.Load() == 0 })
		}},
		{"abandoned", func(t *testing.T, c *Conn) {
			p, err := c.Send(testProg, testVers, 1, OpaqueAuth{}, uint32Arg(1))
			if err != nil {
				t.Fatal(err)
			}
			p.Abandon()
			p.Abandon() // a second time does nothing
			if c.busy.Load() != 0 {
				t.Fatalf("busy %d after Abandon, want 0", c.busy.Load())
			}
			release <- struct{}{}
			res, err := c.Call(testCtx(t), testProg, testVers, 0, OpaqueAuth{}, uint32Arg(2))
			if err != nil {
				t.Fatal(err)
			}
			answer(t, res, 3)
		}},
		{"connection closed", func(t *testing.T, c *Conn) {
			p, err := c.Send(testProg, testVers, 1, OpaqueAuth{}, uint32Arg(1))
			if err != nil {
				t.Fatal(err)
			}
			c.Close()
			if _, _, err := p.Wait(testCtx(t), nil); !errors.Is(err, ErrConnClosed) {
				t.Fatalf("Wait: %v, want ErrConnClosed", err)
			}
			if _, err := c.Send(testProg, testVers, 0, OpaqueAuth{}, nil); !errors.Is(err, ErrConnClosed) {
				t.Fatalf("Send on a closed connection: %v, want ErrConnClosed", err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, dial(t, addr, nil)) })
	}
}
