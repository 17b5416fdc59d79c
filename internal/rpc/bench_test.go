package rpc

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/shoalfs/shoal/internal/xdr"
)

// BenchmarkCallRoundTrip measures one call at a time on one connection. The
// "release" variants have the handler declare ReleaseArgsAfterReply, so
// large records reuse pooled buffers instead of fresh allocations.
func BenchmarkCallRoundTrip(b *testing.B) {
	for _, tc := range []struct {
		name    string
		n       int
		release bool
	}{
		{"4KiB", 4 << 10, false},
		{"1MiB", 1 << 20, false},
		{"1MiB-release", 1 << 20, true},
	} {
		b.Run(tc.name, func(b *testing.B) {
			addr := startServer(b, &Server{Handler: HandlerFunc(func(ctx context.Context, call *Call, res *xdr.Encoder) AcceptStat {
				d := xdr.NewDecoder(call.Args)
				res.Uint32(uint32(len(d.Opaque(0))))
				if tc.release {
					call.ReleaseArgsAfterReply()
				}
				return Success
			})})
			c := dial(b, addr, nil)
			args := opaqueArg(make([]byte, tc.n))
			cred := AuthSysCred(AuthSysParams{Machine: "bench", UID: 1, GID: 1})
			ctx := context.Background()
			b.SetBytes(int64(tc.n))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.Call(ctx, testProg, testVers, 1, cred, args); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkReplyRoundTrip is the READ direction: a small call answered with
// 1 MiB of results, which the caller copies out, as a READ into a caller's
// buffer does. "release" uses CallRelease and releases after the copy.
func BenchmarkReplyRoundTrip(b *testing.B) {
	for _, release := range []bool{false, true} {
		name := "1MiB"
		if release {
			name += "-release"
		}
		b.Run(name, func(b *testing.B) {
			data := make([]byte, 1<<20)
			addr := startServer(b, &Server{Handler: HandlerFunc(func(ctx context.Context, call *Call, res *xdr.Encoder) AcceptStat {
				res.OpaqueRef(data)
				call.ReleaseArgsAfterReply()
				return Success
			})})
			c := dial(b, addr, nil)
			dst := make([]byte, len(data))
			ctx := context.Background()
			b.SetBytes(int64(len(data)))
			b.ReportAllocs()
			for b.Loop() {
				var res []byte
				free := func() {}
				var err error
				if release {
					res, free, err = c.CallRelease(ctx, testProg, testVers, 1, OpaqueAuth{}, uint32Arg(len(data)))
				} else {
					res, err = c.Call(ctx, testProg, testVers, 1, OpaqueAuth{}, uint32Arg(len(data)))
				}
				if err != nil {
					b.Fatal(err)
				}
				copy(dst, xdr.NewDecoder(res).Opaque(0))
				free()
			}
		})
	}
}

// BenchmarkCallParallel is many calls in flight on one connection, as a
// client with several streams of operations over one session sends them:
// b.RunParallel's goroutines (4 per P) each make small calls one after the other. cpu-µs/op is the process's CPU
// time (client and server) per call.
func BenchmarkCallParallel(b *testing.B) {
	addr := startServer(b, &Server{Handler: HandlerFunc(func(ctx context.Context, call *Call, res *xdr.Encoder) AcceptStat {
		res.Uint32(1)
		call.ReleaseArgsAfterReply()
		return Success
	})})
	c := dial(b, addr, nil)
	ctx := context.Background()
	b.ReportAllocs()
	b.SetParallelism(4)
	cpu0 := processCPU(b)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := c.Call(ctx, testProg, testVers, 1, OpaqueAuth{}, uint32Arg(7)); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64((processCPU(b)-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
}

// processCPU is the CPU time (user and system) this process used so far.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
