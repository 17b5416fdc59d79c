package meta_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/shoalfs/shoal/meta/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// BenchmarkEtcdTxn measures the floor under the etcd engine's serial
// creates and removes: one etcd Txn of a create's shape, sent straight to
// the cluster's leader with the plain etcd client, one after the other,
// with no engine around it. Each of the engine's serial creates and
// removes is exactly one such Txn (BenchmarkEngines reports 1 req/op), so
// where the engine's rate is close to this one, what is left of the gap
// between an embedded member and a cluster of processes is etcd's own
// commit latency, which no change to the engine can remove.
//
// The Txn is what a create of the engine commits: If(the generation key
// has the revision the last commit gave it, the fence key has its create
// revision, the new entry does not exist) Then(put seven keys of the
// sizes a create writes: two inodes of 118 bytes, the entry, two
// counters, an index key and the generation) Else(get the generation).
//
// The clusters are BenchmarkEngines': one embedded member
// ("etcd-embedded"), three embedded members ("etcd-embedded3"), and the
// cluster at SHOAL_BENCH_ETCD ("etcd-external"). scripts/etcd-bench.sh
// runs it next to BenchmarkEngines and prints its rate as the txn/s
// column.
//
//	go test ./meta -run '^$' -bench 'EtcdTxn' -benchtime 2000x
func BenchmarkEtcdTxn(b *testing.B) {
	// The embedded clusters are started on the outer b, once: a
	// sub-benchmark's function runs more than once (b.N = 1 first).
	type cluster struct{ name, leader string }
	clusters := []cluster{
		{"etcd-embedded", leaderEndpoint(b, etcdtest.Start(b, 1, etcdtest.Options{}).Endpoints)},
		{"etcd-embedded3", leaderEndpoint(b, etcdtest.Start(b, 3, etcdtest.Options{}).Endpoints)},
	}
	if eps := os.Getenv("SHOAL_BENCH_ETCD"); eps != "" {
		clusters = append(clusters, cluster{"etcd-external", leaderEndpoint(b, strings.Split(eps, ","))})
	}
	for _, c := range clusters {
		b.Run(c.name+"/conc-1/txn", func(b *testing.B) { benchTxnFloor(b, c.leader) })
	}
}

// leaderEndpoint returns the endpoint of eps whose member leads, as the
// engine's pin finds it (kv_etcd_pin.go).
func leaderEndpoint(b testing.TB, eps []string) string {
	cli, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		b.Fatal(err)
	}
	defer cli.Close()
	for range 50 {
		for _, ep := range eps {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			st, err := cli.Status(ctx, ep)
			cancel()
			if err == nil && st.Header.MemberId == st.Leader {
				return ep
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	b.Fatalf("no member of %v leads", eps)
	return ""
}

// benchTxnFloor commits b.N create-shaped Txns to ep, one at a time.
func benchTxnFloor(b *testing.B, ep string) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{ep}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		b.Fatal(err)
	}
	defer cli.Close()
	ctx := context.Background()
	prefix := fmt.Sprintf("/bench-txn-%d-%d/", os.Getpid(), time.Now().UnixNano())
	gen, fence := prefix+"gen", prefix+"fence"
	fr, err := cli.Put(ctx, fence, "term")
	if err != nil {
		b.Fatal(err)
	}
	gr, err := cli.Put(ctx, gen, "0000000000000000")
	if err != nil {
		b.Fatal(err)
	}
	fenceRev, genRev := fr.Header.Revision, gr.Header.Revision
	inode := strings.Repeat("i", 118)
	b.ResetTimer()
	for i := range b.N {
		entry := fmt.Sprintf("%sd/e/1/f%d", prefix, i)
		resp, err := cli.Txn(ctx).If(
			clientv3.Compare(clientv3.ModRevision(gen), "=", genRev),
			clientv3.Compare(clientv3.CreateRevision(fence), "=", fenceRev),
			clientv3.Compare(clientv3.CreateRevision(entry), "=", 0),
		).Then(
			clientv3.OpPut(entry, fmt.Sprintf("%016x", i+2)),
			clientv3.OpPut(fmt.Sprintf("%sd/A%016x", prefix, i+2), inode),
			clientv3.OpPut(prefix+"d/A1", inode),
			clientv3.OpPut(prefix+"d/Kf", fmt.Sprintf("%08x", i)),
			clientv3.OpPut(prefix+"d/Ki", fmt.Sprintf("%08x", i+3)),
			clientv3.OpPut(fmt.Sprintf("%sd/S1/%016x", prefix, i+2), "1"),
			clientv3.OpPut(gen, fmt.Sprintf("%016x", i)),
		).Else(clientv3.OpGet(gen)).Commit()
		if err != nil {
			b.Fatal(err)
		}
		if !resp.Succeeded {
			b.Fatalf("txn %d: a condition failed", i)
		}
		genRev = resp.Header.Revision
	}
}
