package wiring

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shoalfs/shoal/client"
	"github.com/shoalfs/shoal/meta/etcdtest"
	"github.com/shoalfs/shoal/server"
)

// freeAddr returns a loopback address with a port nobody listens on now.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// haNode is one `shoal mds` as RunMDS runs it.
type haNode struct {
	name, addr string
	leads      chan *MDS
	done       chan error
	cancel     context.CancelFunc
}

func startHANode(t *testing.T, etcdURL, name string) *haNode {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	n := &haNode{name: name, addr: freeAddr(t), leads: make(chan *MDS, 4), done: make(chan error, 1), cancel: cancel}
	go func() {
		n.done <- RunMDS(ctx, MDSConfig{
			Listen: n.addr, Dir: filepath.Join(t.TempDir(), name), MetaURL: etcdURL, Node: name,
			LeaderLease: 2 * time.Second, Lease: 5 * time.Second, Exports: []*server.Export{{Path: "/", RootSquash: new(bool)}},
		}, func(m *MDS) { n.leads <- m })
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-n.done:
		case <-time.After(30 * time.Second):
			t.Errorf("%s did not stop", name)
		}
	})
	return n
}

// refuses reports whether nothing listens on addr.
func refuses(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err == nil {
		c.Close()
		return false
	}
	return errors.Is(err, syscall.ECONNREFUSED)
}

func putFile(t *testing.T, addr, path, data string) {
	t.Helper()
	ctx := context.Background()
	c, err := client.Dial(ctx, addr, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	f, err := c.Open(ctx, path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write([]byte(data)); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

func getFile(t *testing.T, addr, path string) string {
	t.Helper()
	ctx := context.Background()
	c, err := client.Dial(ctx, addr, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	f, err := c.Open(ctx, path, os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b, err := io.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestStandbysDoNotServe: of three metadata servers on one etcd prefix,
// one leads and the other two stand by without listening, so no client
// or data server can change anything through them. A planned step-down
// hands over to a standby, which serves the same namespace, and the old
// leader stands by in its turn.
func TestStandbysDoNotServe(t *testing.T) {
	etcd := etcdtest.Start(t, 1, etcdtest.Options{NoFsync: true})
	url := "etcd://" + strings.Join(etcd.Endpoints, ",") + "/hatest"

	a := startHANode(t, url, "a")
	var ma *MDS
	select {
	case ma = <-a.leads:
	case err := <-a.done:
		t.Fatalf("a stopped: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("a never led")
	}
	b, c := startHANode(t, url, "b"), startHANode(t, url, "c")
	// Wait until both stand in line (the status lists them).
	deadline := time.Now().Add(20 * time.Second)
	for {
		st, err := ma.elec.HAStatus(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if len(st.Nodes) == 3 {
			if !st.Nodes[0].Leader || st.Nodes[0].Node != "a" || st.Nodes[1].Leader || st.Nodes[2].Leader {
				t.Fatalf("election = %+v, want a leading and two standbys", st.Nodes)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("election = %+v, want 3 nodes", st.Nodes)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, n := range []*haNode{b, c} {
		select {
		case <-n.leads:
			t.Fatalf("%s leads beside a", n.name)
		default:
		}
		if !refuses(n.addr) {
			t.Fatalf("standby %s accepts connections on %s", n.name, n.addr)
		}
	}
	putFile(t, a.addr, "/before", "written through a")

	start := time.Now()
	if err := ma.StepDown(); err != nil {
		t.Fatal(err)
	}
	var next *MDS
	var nn *haNode
	select {
	case next = <-b.leads:
		nn = b
	case next = <-c.leads:
		nn = c
	case <-time.After(20 * time.Second):
		t.Fatal("no standby took over within 20 s of a step-down")
	}
	t.Logf("step-down: %s leads %v later, term %d -> %d", nn.name, time.Since(start).Round(time.Millisecond), ma.Term(), next.Term())
	if next.Term() <= ma.Term() {
		t.Fatalf("term %d after %d", next.Term(), ma.Term())
	}
	<-ma.Done()
	if !refuses(a.addr) {
		t.Fatal("the old leader still listens after stepping down")
	}
	if got := getFile(t, nn.addr, "/before"); got != "written through a" {
		t.Fatalf("after the step-down the file reads %q", got)
	}
	putFile(t, nn.addr, "/after", "written through "+nn.name)
	for _, n := range []*haNode{a, b, c} {
		if n != nn && !refuses(n.addr) {
			t.Fatalf("%s serves beside the new leader %s", n.name, nn.name)
		}
	}
}
