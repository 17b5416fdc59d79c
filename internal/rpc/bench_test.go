package rpc

import (
	"context"
	"testing"

	"github.com/shoalfs/shoal/internal/xdr"
)

func BenchmarkCallRoundTrip(b *testing.B) {
	for _, size := range []struct {
		name string
		n    int
	}{{"4KiB", 4 << 10}, {"1MiB", 1 << 20}} {
		b.Run(size.name, func(b *testing.B) {
			addr := startServer(b, &Server{Handler: HandlerFunc(func(ctx context.Context, call *Call, res *xdr.Encoder) AcceptStat {
				d := xdr.NewDecoder(call.Args)
				res.Uint32(uint32(len(d.Opaque(0))))
				return Success
			})})
			c := dial(b, addr, nil)
			args := opaqueArg(make([]byte, size.n))
			cred := AuthSysCred(AuthSysParams{Machine: "bench", UID: 1, GID: 1})
			ctx := context.Background()
			b.SetBytes(int64(size.n))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.Call(ctx, testProg, testVers, 1, cred, args); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
