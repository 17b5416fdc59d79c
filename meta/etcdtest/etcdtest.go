// Package etcdtest runs real etcd clusters inside a test process (with
// go.etcd.io/etcd/server/v3/embed) on loopback, for tests of the etcd
// metadata engine and of servers that use it.
package etcdtest

import (
	"fmt"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Options tunes Start.
type Options struct {
	// NoFsync turns off etcd's fsyncs (a real etcd otherwise: raft,
	// quorum commits, bbolt). For suites where durability on power loss
	// is not what is tested and a fsync per commit would only be slow.
	NoFsync bool
}

// Cluster is a running etcd cluster of one or more members.
type Cluster struct {
	t       testing.TB
	Members []*embed.Etcd
	// Endpoints are the members' client addresses (host:port), in member
	// order.
	Endpoints []string
	stopped   []bool
}

// Start starts an etcd cluster of n members on 127.0.0.1, with data in
// t.TempDir(), and stops it when the test ends. Ports are picked by
// listening on port 0 and releasing the port, so another process could
// take one in between; Start then retries with fresh ports.
func Start(t testing.TB, n int, opts Options) *Cluster {
	t.Helper()
	var err error
	for try := 0; try < 3; try++ {
		var c *Cluster
		if c, err = start(t, n, opts); err == nil {
			t.Cleanup(c.stopAll)
			return c
		}
	}
	t.Fatalf("etcdtest: start %d members: %v", n, err)
	return nil
}

func freePorts(n int) ([]int, error) {
	ports := make([]int, n)
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	for i := range ports {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		lns = append(lns, ln)
		ports[i] = ln.Addr().(*net.TCPAddr).Port
	}
	return ports, nil
}

func start(t testing.TB, n int, opts Options) (*Cluster, error) {
	ports, err := freePorts(2 * n)
	if err != nil {
		return nil, err
	}
	token := fmt.Sprintf("etcdtest-%d", ports[0])
	var initial []string
	peer := func(i int) url.URL { return url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", ports[2*i+1])} }
	client := func(i int) url.URL { return url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", ports[2*i])} }
	for i := range n {
		u := peer(i)
		initial = append(initial, fmt.Sprintf("m%d=%s", i, u.String()))
	}
	c := &Cluster{t: t, stopped: make([]bool, n)}
	for i := range n {
		cfg := embed.NewConfig()
		cfg.Name = fmt.Sprintf("m%d", i)
		cfg.Dir = t.TempDir()
		cfg.ListenPeerUrls = []url.URL{peer(i)}
		cfg.AdvertisePeerUrls = []url.URL{peer(i)}
		cfg.ListenClientUrls = []url.URL{client(i)}
		cfg.AdvertiseClientUrls = []url.URL{client(i)}
		cfg.InitialCluster = strings.Join(initial, ",")
		cfg.InitialClusterToken = token
		cfg.ClusterState = embed.ClusterStateFlagNew
		cfg.LogLevel = "error"
		cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
		cfg.UnsafeNoFsync = opts.NoFsync
		e, err := embed.StartEtcd(cfg)
		if err != nil {
			c.stopAll()
			return nil, fmt.Errorf("member %d: %w", i, err)
		}
		c.Members = append(c.Members, e)
		c.Endpoints = append(c.Endpoints, client(i).Host)
	}
	timeout := time.After(60 * time.Second)
	for i, e := range c.Members {
		select {
		case <-e.Server.ReadyNotify():
		case err := <-e.Err():
			c.stopAll()
			return nil, fmt.Errorf("member %d: %w", i, err)
		case <-timeout:
			c.stopAll()
			return nil, fmt.Errorf("member %d not ready after 60s", i)
		}
	}
	return c, nil
}

// Leader returns the index of the member that is leader, or -1 if the
// running members do not agree on one.
func (c *Cluster) Leader() int {
	lead := -1
	for i, e := range c.Members {
		if c.stopped[i] {
			continue
		}
		id := e.Server.Leader()
		for j, m := range c.Members {
			if m.Server.MemberID() == id && !c.stopped[j] {
				if lead != -1 && lead != j {
					return -1
				}
				lead = j
			}
		}
	}
	return lead
}

// Stop stops member i (closing its listeners and data directory).
func (c *Cluster) Stop(i int) {
	if c.stopped[i] {
		return
	}
	c.stopped[i] = true
	c.Members[i].Close()
}

// Running returns the client endpoints of the members still running.
func (c *Cluster) Running() []string {
	var eps []string
	for i, ep := range c.Endpoints {
		if !c.stopped[i] {
			eps = append(eps, ep)
		}
	}
	return eps
}

func (c *Cluster) stopAll() {
	for i := range c.Members {
		c.Stop(i)
	}
}
