package server

import (
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/wiretest"
	"github.com/shoalfs/shoal/server/internal/state"
)

// startIdleServer is startServer with connections closed after idle
// without traffic; the timeout is set before the server accepts any
// connection.
func startIdleServer(t *testing.T, cfg Config, idle time.Duration) *testServer {
	t.Helper()
	cfg.Dir = t.TempDir()
	if cfg.Exports == nil {
		cfg.Exports = defaultExports()
	}
	ts := &testServer{t: t, cfg: cfg}
	cfg.Logger = slog.New(panicWatch{panics: &ts.panics, mu: &ts.mu, msgs: &ts.msgs})
	ts.cfg.Logger = cfg.Logger
	srv, err := New(cfg)
	if err != nil {
		t.Fatalf("server.New: %v", err)
	}
	srv.rpc.IdleTimeout = idle
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		srv.Close()
		t.Fatalf("listen: %v", err)
	}
	ts.srv, ts.addr, ts.done = srv, ln.Addr().String(), make(chan error, 1)
	go func() { ts.done <- srv.Serve(ln) }()
	t.Cleanup(func() {
		ts.stop()
		if n := ts.panics.Load(); n > 0 {
			t.Errorf("server logged %d handler panics: %q", n, ts.msgs)
		}
	})
	return ts
}

// TestBackchannelIdleClose: a connection bound to a session's back
// channel is kept open however long it is idle, while it is one; once the
// session ends (DESTROY_SESSION, lease expiry, the client's reboot) or the
// connection is rebound to the fore channel only, the server closes it
// like any idle connection.
func TestBackchannelIdleClose(t *testing.T) {
	const idle = 500 * time.Millisecond
	// stayOpen is how long a pinned connection must survive without
	// traffic: many idle timeouts, so an unpinned one would be closed.
	const stayOpen = 8 * idle
	// closeWait bounds the wait for the server to close a connection that
	// is no longer pinned (lease expiry included); generous for -race on a
	// loaded machine.
	const closeWait = 60 * time.Second

	destroySession := func(t *testing.T, ts *testServer, fore *wiretest.Client) {
		// On a fresh connection: the fore one may have been closed for
		// idleness meanwhile, which the session survives.
		c := ts.dial()
		must(t)(c.Sessionless(testCtx(t), nfs4.NfsArgop4{Argop: nfs4.OP_DESTROY_SESSION,
			OpdestroySession: &nfs4.DESTROYSESSION4args{DsaSessionid: fore.SessionID}}))
	}
	cases := []struct {
		name string
		// lease is the server's lease time; 0 means the default, which
		// does not run out during the test.
		lease time.Duration
		// sameConn creates the session with CONN_BACK_CHAN on the fore
		// connection and then binds that connection to the back channel
		// again, so it is pinned twice for the session; otherwise a second
		// connection is bound with BIND_CONN_TO_SESSION(CDFC4_BACK).
		sameConn bool
		// end, if set, ends the back channel binding (back is the bound
		// connection).
		end func(t *testing.T, ts *testServer, fore, back *wiretest.Client)
		// closed: back must get closed (by the server once idle, unless end
		// closes it); otherwise back must stay open.
		closed bool
		// ends: the session ends, so the server must forget its callback
		// parameters.
		ends bool
	}{
		{name: "session lives"},
		{name: "session lives, bound twice", sameConn: true},
		{
			name:   "destroy session",
			end:    func(t *testing.T, ts *testServer, fore, _ *wiretest.Client) { destroySession(t, ts, fore) },
			closed: true,
			ends:   true,
		},
		{
			name:     "destroy session, bound twice",
			sameConn: true,
			end:      func(t *testing.T, ts *testServer, fore, _ *wiretest.Client) { destroySession(t, ts, fore) },
			closed:   true,
			ends:     true,
		},
		{name: "lease expires", lease: 2 * time.Second, closed: true, ends: true},
		{name: "lease expires, bound twice", lease: 2 * time.Second, sameConn: true, closed: true, ends: true},
		{
			// A new incarnation of the client confirms its client ID: the
			// old record and its session are purged.
			name: "client reboots",
			end: func(t *testing.T, ts *testServer, fore, _ *wiretest.Client) {
				c := ts.dial()
				ctx := testCtx(t)
				if _, err := c.ExchangeID(ctx, []byte(t.Name()), nfs4.Verifier4{2}); err != nil {
					t.Fatal(err)
				}
				if _, err := c.CreateSession(ctx, false); err != nil {
					t.Fatal(err)
				}
				want(t, nfs4.NFS4ERR_BADSESSION)(c.Sessionless(ctx, nfs4.NfsArgop4{Argop: nfs4.OP_DESTROY_SESSION,
					OpdestroySession: &nfs4.DESTROYSESSION4args{DsaSessionid: fore.SessionID}}))
			},
			closed: true,
			ends:   true,
		},
		{
			name: "rebound to fore channel",
			end: func(t *testing.T, _ *testServer, fore, back *wiretest.Client) {
				res := must(t)(back.Sessionless(testCtx(t), bindConnOp(fore.SessionID, nfs4.CDFC4_FORE)))
				if d := res.Resarray[0].OpbindConnToSession.BctsrResok4.BctsrDir; d != nfs4.CDFS4_FORE {
					t.Fatalf("rebound direction %v, want fore", d)
				}
			},
			closed: true,
		},
		{
			// The session outlives its back channel connection, and must not
			// keep it (the server forgets its pin).
			name:   "back connection closed by the client",
			end:    func(_ *testing.T, _ *testServer, _, back *wiretest.Client) { back.Close() },
			closed: true,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ts := startIdleServer(t, Config{Lease: tc.lease}, idle)
			ctx := testCtx(t)
			fore := ts.dial()
			if _, err := fore.ExchangeID(ctx, []byte(t.Name()), nfs4.Verifier4{1}); err != nil {
				t.Fatal(err)
			}
			if _, err := fore.CreateSession(ctx, tc.sameConn); err != nil {
				t.Fatal(err)
			}
			back := fore
			if !tc.sameConn {
				back = ts.dial()
			}
			res := must(t)(back.Sessionless(ctx, bindConnOp(fore.SessionID, nfs4.CDFC4_BACK)))
			if d := res.Resarray[0].OpbindConnToSession.BctsrResok4.BctsrDir; d != nfs4.CDFS4_BACK {
				t.Fatalf("bound direction %v, want back", d)
			}
			if tc.end != nil {
				tc.end(t, ts, fore, back)
			}
			if !tc.closed {
				select {
				case <-back.Conn.Done():
					t.Fatalf("back channel connection of a live session closed: %v", back.Conn.Err())
				case <-time.After(stayOpen):
				}
				st := ts.srv.st
				st.mu.Lock()
				_, okCred := st.cbCred[state.SessionID(fore.SessionID)]
				pins := len(st.pins[state.SessionID(fore.SessionID)])
				st.mu.Unlock()
				if !okCred || pins != 1 {
					t.Errorf("live session: callback credential kept %v, pinned connections %d; want true, 1", okCred, pins)
				}
				return
			}
			select {
			case <-back.Conn.Done():
			case <-time.After(closeWait):
				t.Fatalf("connection no longer bound to a back channel still open after %v", closeWait)
			}
			// What the server keeps for the session: callback parameters
			// while it lives, and no pin on a closed connection (the server
			// notices a close asynchronously: poll, bounded).
			sid := state.SessionID(fore.SessionID)
			st := ts.srv.st
			var cb bool
			var pins int
			if !pollUntil(400, 25*time.Millisecond, func() bool {
				st.mu.Lock()
				defer st.mu.Unlock()
				_, okCred := st.cbCred[sid]
				_, okMinor := st.cbMinor[sid]
				cb, pins = okCred || okMinor, len(st.pins[sid])
				return cb == !tc.ends && pins == 0
			}) {
				t.Errorf("server keeps callback parameters: %v (want %v), pinned connections: %d (want 0)", cb, !tc.ends, pins)
			}
		})
	}
}

func bindConnOp(sid nfs4.Sessionid4, dir nfs4.ChannelDirFromClient4) nfs4.NfsArgop4 {
	return nfs4.NfsArgop4{Argop: nfs4.OP_BIND_CONN_TO_SESSION,
		OpbindConnToSession: &nfs4.BINDCONNTOSESSION4args{BctsaSessid: sid, BctsaDir: dir}}
}
