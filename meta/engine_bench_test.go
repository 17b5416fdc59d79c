package meta_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shoalfs/shoal/internal/leader"
	"github.com/shoalfs/shoal/meta"
	"github.com/shoalfs/shoal/meta/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

// BenchmarkEngines measures the metadata operations of a small-file
// workload (create, stat, remove of empty files in one directory) on each
// engine as the server opens it, durably: bbolt with its write-ahead log
// and group commit, etcd with one embedded member (fsync on), etcd with
// three embedded members in this process ("etcd-embedded3"), and, when
// SHOAL_BENCH_ETCD names the client endpoints of a running etcd cluster
// (host:port,...; scripts/etcd-bench.sh starts three Debian etcd
// processes), that cluster. etcd is opened as an elected metadata server
// opens it (`shoal mds` under internal/leader): fenced on a leadership
// term of its own, whose lease proof turns the engine's read cache on;
// the "-nocache" rows are the same with EtcdOptions.NoReadCache, so
// every stat asks etcd (what a cache miss costs, and what the engine did
// before it had the cache). Group commit is on in all of them.
//
// Each operation runs serially (conc-1) and from 16 goroutines at once
// (conc-16, b.RunParallel), as the NFS server does for the COMPOUNDs of
// several clients. ns/op is the time per operation over all goroutines:
// 1e9/ns is the rate in operations per second.
//
//	go test ./meta -run '^$' -bench 'Engines' -benchtime 2000x
func BenchmarkEngines(b *testing.B) {
	type engine struct {
		name string
		open func(b *testing.B) meta.Engine
	}
	// requests counts the etcd engine's KV requests (reads and commits),
	// reported per operation as req/op: the round trips an operation
	// pays, whichever members they go to.
	var requests atomic.Int64
	count := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if strings.HasPrefix(method, "/etcdserverpb.KV/") {
			requests.Add(1)
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	etcdOn := func(endpoints func(b *testing.B) []string, nocache bool) func(b *testing.B) meta.Engine {
		return func(b *testing.B) meta.Engine {
			eps := endpoints(b)
			cli, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
				DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(count)}})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { cli.Close() })
			prefix := fmt.Sprintf("/bench-%d-%d/", os.Getpid(), time.Now().UnixNano())
			term, err := leader.Campaign(context.Background(), leader.Config{Client: cli, Prefix: prefix, Info: leader.Info{Node: "bench"},
				Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = term.Resign(context.Background()) })
			e, err := meta.OpenEtcd(context.Background(), meta.EtcdOptions{
				Client: cli, Endpoints: eps, NoReadCache: nocache, Prefix: prefix,
				Fence: &meta.EtcdFence{Key: term.Key(), CreateRevision: int64(term.Number()), Valid: term.Check},
			})
			if err != nil {
				b.Fatal(err)
			}
			return e
		}
	}
	var (
		embedded     *etcdtest.Cluster
		embeddedOnce sync.Once
	)
	embeddedEndpoints := func(b *testing.B) []string {
		// One cluster for all sub-benchmarks; stopped when the first
		// benchmark using it ends, hence started on the outer b.
		embeddedOnce.Do(func() { embedded = etcdtest.Start(b, 1, etcdtest.Options{}) })
		return embedded.Endpoints
	}
	var (
		three     *etcdtest.Cluster
		threeOnce sync.Once
	)
	// Three embedded members (the same etcd as the one-member rows, each
	// with its own data directory, fsync on, raft over loopback TCP):
	// what a 3-member cluster costs against one member, without the
	// version difference of Debian's etcd processes.
	threeEndpoints := func(b *testing.B) []string {
		threeOnce.Do(func() { three = etcdtest.Start(b, 3, etcdtest.Options{}) })
		return three.Endpoints
	}
	engines := []engine{
		{"bolt", func(b *testing.B) meta.Engine {
			e, err := meta.OpenBolt(filepath.Join(b.TempDir(), "meta.db"), meta.BoltOptions{GroupCommit: true, WAL: true})
			if err != nil {
				b.Fatal(err)
			}
			return e
		}},
		{"etcd-embedded", etcdOn(embeddedEndpoints, false)},
		{"etcd-embedded-nocache", etcdOn(embeddedEndpoints, true)},
		{"etcd-embedded3", etcdOn(threeEndpoints, false)},
		{"etcd-embedded3-nocache", etcdOn(threeEndpoints, true)},
	}
	if eps := os.Getenv("SHOAL_BENCH_ETCD"); eps != "" {
		external := func(*testing.B) []string { return strings.Split(eps, ",") }
		engines = append(engines,
			engine{"etcd-external", etcdOn(external, false)},
			engine{"etcd-external-nocache", etcdOn(external, true)})
	}
	// Start the embedded cluster on the outer benchmark, so it outlives
	// the sub-benchmarks that share it.
	embeddedEndpoints(b)
	threeEndpoints(b)
	for _, eng := range engines {
		for _, conc := range []int{1, 16} {
			b.Run(fmt.Sprintf("%s/conc-%d", eng.name, conc), func(b *testing.B) {
				e := eng.open(b)
				defer e.Close()
				benchSmallFiles(b, e, conc, &requests)
			})
		}
	}
}

// benchSmallFiles runs create, stat and remove sub-benchmarks on e from
// conc goroutines. Files accumulate over create's runs; stat reads them
// and remove takes them away, creating more first (untimed) if a run
// needs more than are left. The timed part's requests (counted in
// requests by the engine's client; bbolt makes none) are reported as
// req/op.
func benchSmallFiles(b *testing.B, e meta.Engine, conc int, requests *atomic.Int64) {
	ctx := context.Background()
	d, _, err := e.Create(ctx, meta.RootIno, "d", meta.CreateArgs{Type: meta.TypeDirectory, Mode: 0o755}, time.Time{})
	if err != nil {
		b.Fatal(err)
	}
	var next atomic.Int64 // names f0 .. f(next-1) have been created
	var removed atomic.Int64
	create := func() error {
		_, _, err := e.Create(ctx, d.Ino, fmt.Sprint("f", next.Add(1)-1), meta.CreateArgs{Type: meta.TypeRegular, Mode: 0o644}, time.Time{})
		return err
	}
	parallel := func(b *testing.B, op func(i int64) error) {
		before := requests.Load()
		defer func() { b.ReportMetric(float64(requests.Load()-before)/float64(b.N), "req/op") }()
		b.SetParallelism((conc + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
		if conc == 1 {
			for i := range int64(b.N) {
				if err := op(i); err != nil {
					b.Fatal(err)
				}
			}
			return
		}
		var i atomic.Int64
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := op(i.Add(1) - 1); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	b.Run("create", func(b *testing.B) {
		parallel(b, func(int64) error { return create() })
	})
	b.Run("stat", func(b *testing.B) {
		b.StopTimer()
		for next.Load() < 100 {
			if err := create(); err != nil {
				b.Fatal(err)
			}
		}
		n := next.Load()
		b.StartTimer()
		parallel(b, func(i int64) error {
			nd, err := e.Lookup(ctx, d.Ino, fmt.Sprint("f", i%n))
			if err == nil && nd.Attr.Type != meta.TypeRegular {
				err = fmt.Errorf("f%d: type %v", i%n, nd.Attr.Type)
			}
			return err
		})
	})
	b.Run("remove", func(b *testing.B) {
		b.StopTimer()
		for next.Load()-removed.Load() < int64(b.N) {
			if err := create(); err != nil {
				b.Fatal(err)
			}
		}
		base := removed.Add(int64(b.N)) - int64(b.N)
		b.StartTimer()
		parallel(b, func(i int64) error {
			_, _, err := e.Remove(ctx, d.Ino, fmt.Sprint("f", base+i), time.Time{})
			return err
		})
	})
}
