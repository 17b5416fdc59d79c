package client

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/server"
)

// TestLostReplyThenNewRequest: the server runs a request, but its reply
// never reaches the client, which frees the slot without moving its
// sequence id (a call made without reconnecting, for example). The next,
// different request on that slot reuses the sequence id, and the server
// answers NFS4ERR_SEQ_FALSE_RETRY. The client must move the slot on and
// resend, not fail, and not take the lost request's cached reply as its
// own.
func TestLostReplyThenNewRequest(t *testing.T) {
	c, ctx := dialTestServer(t)

	for _, tc := range []struct {
		name      string
		cachethis bool // whether the lost request's reply was cached
	}{
		{"cached reply", true},
		{"uncached reply", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn, sess, err := c.current()
			if err != nil {
				t.Fatal(err)
			}
			lost := "lost-" + map[bool]string{true: "cached", false: "uncached"}[tc.cachethis]
			slot, seq, highest, err := sess.slots.acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			args := &nfs4.COMPOUND4args{Minorversion: c.minor.Load(), Argarray: []nfs4.NfsArgop4{
				{Argop: nfs4.OP_SEQUENCE, Opsequence: &nfs4.SEQUENCE4args{SaSessionid: sess.id, SaSequenceid: seq,
					SaSlotid: uint32(slot), SaHighestSlotid: uint32(highest), SaCachethis: tc.cachethis}},
				{Argop: nfs4.OP_PUTROOTFH},
				{Argop: nfs4.OP_CREATE, Opcreate: &nfs4.CREATE4args{Objtype: nfs4.Createtype4{Type: nfs4.NF4DIR},
					Objname: nfs4.Component4(lost), Createattrs: nfs4.Fattr4{}}},
			}}
			if _, err := conn.Call(ctx, nfs4.NFS4_PROGRAM, nfs4.NFS_V4, nfs4.NFSPROC4_COMPOUND, c.cred, args); err != nil {
				t.Fatal(err)
			}
			sess.slots.release(slot, false, -1) // as if the reply had been lost

			before := c.Stats().Retries
			name := "after-" + lost
			if err := c.Mkdir(ctx, "/"+name, 0o755); err != nil {
				var se *StatusError
				if errors.As(err, &se) && se.status() == nfs4.NFS4ERR_EXIST {
					t.Fatalf("Mkdir %s got the lost CREATE's reply or ran twice: %v", name, err)
				}
				t.Fatalf("Mkdir %s after a lost reply on its slot: %v", name, err)
			}
			for _, p := range []string{"/" + lost, "/" + name} {
				if a, err := c.Stat(ctx, p); err != nil || a.Type != TypeDir {
					t.Errorf("Stat %s = %+v, %v; want a directory", p, a, err)
				}
			}
			if c.Stats().Retries == before {
				t.Error("no retry counted: the slot's sequence id was not reused, so nothing was tested")
			}
		})
	}
}

// dialTestServer starts a Shoal server on loopback and dials it; both are
// closed when the test ends. ctx bounds the test's calls.
func dialTestServer(t *testing.T) (*Client, context.Context) {
	t.Helper()
	noSquash := false
	srv, err := server.New(server.Config{Dir: t.TempDir(), Logger: slog.New(slog.DiscardHandler),
		Exports: []*server.Export{{Path: "/", RootSquash: &noSquash}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	c, err := Dial(ctx, ln.Addr().String(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, ctx
}
