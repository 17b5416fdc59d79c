package server

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"testing"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/rpc"
	"github.com/shoalfs/shoal/internal/serverhook"
	"github.com/shoalfs/shoal/internal/xdr"
)

// TestSetPrograms checks the one way to serve another ONC RPC program on a
// server's listener: internal/serverhook.SetPrograms on a Config (MDS) or a
// DataServerConfig (DS). Over loopback TCP, a call to the attached program
// reaches its handler, a call to a program nobody attached gets
// PROG_UNAVAIL, and the NFS program still answers.
func TestSetPrograms(t *testing.T) {
	const prog, other = 0x20005ea1, 0x20005ea2
	const answer = 0x5ea15ea1
	progs := map[uint32]rpc.Handler{prog: rpc.HandlerFunc(
		func(_ context.Context, _ *rpc.Call, res *xdr.Encoder) rpc.AcceptStat {
			res.Uint32(answer)
			return rpc.Success
		})}
	for _, tc := range []struct {
		name  string
		start func(t *testing.T) (*Server, error)
	}{
		{"mds", func(t *testing.T) (*Server, error) {
			cfg := Config{Dir: t.TempDir(), Exports: defaultExports()}
			serverhook.SetPrograms(&cfg, progs)
			return New(cfg)
		}},
		{"ds", func(t *testing.T) (*Server, error) {
			key := make([]byte, 32)
			cfg := DataServerConfig{
				Dir:          t.TempDir(),
				Secret:       func() []byte { return key },
				CheckStateid: func(context.Context, uint64, [16]byte, bool) error { return nil },
				FileSize:     func(context.Context, uint64) (uint64, error) { return 0, nil },
			}
			serverhook.SetPrograms(&cfg, progs)
			return NewDataServer(cfg)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, err := tc.start(t)
			if err != nil {
				t.Fatal(err)
			}
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				srv.Close()
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- srv.Serve(ln) }()
			t.Cleanup(func() {
				if err := srv.Close(); err != nil {
					t.Errorf("server Close: %v", err)
				}
				<-done
			})
			ctx := testCtx(t)
			conn, err := rpc.Dial(ctx, "tcp", ln.Addr().String(), nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { conn.Close() })
			none := rpc.OpaqueAuth{Flavor: rpc.AuthNone}

			res, err := conn.Call(ctx, prog, 1, 0, none, nil)
			if err != nil || len(res) != 4 || binary.BigEndian.Uint32(res) != answer {
				t.Errorf("call to the attached program: %x, %v; want %#x", res, err, answer)
			}
			_, err = conn.Call(ctx, other, 1, 0, none, nil)
			var ae *rpc.AcceptError
			if !errors.As(err, &ae) || ae.Stat != rpc.ProgUnavail {
				t.Errorf("call to a program not attached: %v, want PROG_UNAVAIL", err)
			}
			if _, err := conn.Call(ctx, nfs4.NFS4_PROGRAM, nfs4.NFS_V4, nfs4.NFSPROC4_NULL, none, nil); err != nil {
				t.Errorf("NFS NULL beside the attached program: %v", err)
			}
		})
	}
}

// TestSetProgramsWrongType checks that SetPrograms refuses a value that is
// not a pointer to one of the two configurations, rather than dropping the
// programs without a word.
func TestSetProgramsWrongType(t *testing.T) {
	for _, cfg := range []any{Config{}, DataServerConfig{}, &PNFSConfig{}, nil} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("SetPrograms(%T) did not panic", cfg)
				}
			}()
			serverhook.SetPrograms(cfg, nil)
		}()
	}
}
