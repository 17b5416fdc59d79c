package kernel

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netns"
)

// The shoal-failover kind's network: network namespaces the test creates
// and deletes, joined by a bridge.
//
//	lan:  bridge br0, the VM's tap0, and one veth end per host namespace
//	a:    eth0 10.201.0.1/24   shoal mds (0.0.0.0:2049), shoal vip
//	b:    eth0 10.201.0.2/24   shoal mds (0.0.0.0:2049), shoal vip
//	svc:  eth0 10.201.0.10/24  3 etcd members (ports 2379/2479/2579)
//	           10.201.0.11-13  3 shoal ds (port 2049 each)
//
// The service address 10.201.0.100/24 sits on eth0 of a or b, wherever
// the leading MDS is (shoal vip). The guest is 10.201.0.15. Nothing is
// attached to the machine's own namespace: the test reaches the servers'
// metrics by opening its sockets inside svc (nsNet.dial).

const (
	foSubnet  = "10.201.0."
	foVIP     = foSubnet + "100"
	foGuest   = foSubnet + "15"
	foEtcdIP  = foSubnet + "10"
	foMDSPort = 2049
)

var foMDSIP = map[string]string{"a": foSubnet + "1", "b": foSubnet + "2"}

func foDSIP(i int) string { return foSubnet + strconv.Itoa(11+i) }

// nsNet is the set of namespaces of one test.
type nsNet struct {
	prefix string // unique per test run: namespace names are machine-wide
	svc    netns.NsHandle
}

// ns is the machine-wide name of namespace role (lan, a, b, svc).
func (n *nsNet) ns(role string) string { return n.prefix + "-" + role }

func runCmd(args ...string) error {
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// newNSNet creates the namespaces, the bridge, the veths, the tap and
// the addresses; t.Cleanup deletes the namespaces (and with them every
// device and address in them).
func newNSNet(t *testing.T) *nsNet {
	t.Helper()
	b := make([]byte, 3)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	n := &nsNet{prefix: "shkf" + hex.EncodeToString(b), svc: -1}
	for _, role := range []string{"lan", "a", "b", "svc"} {
		if err := runCmd("ip", "netns", "add", n.ns(role)); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := runCmd("ip", "netns", "del", n.ns(role)); err != nil {
				t.Errorf("cleanup: %v", err)
			}
		})
	}
	lan := n.ns("lan")
	steps := [][]string{
		{"ip", "-n", lan, "link", "add", "br0", "type", "bridge"},
		{"ip", "-n", lan, "link", "set", "br0", "up"},
		{"ip", "-n", lan, "tuntap", "add", "dev", "tap0", "mode", "tap"},
		{"ip", "-n", lan, "link", "set", "tap0", "master", "br0", "up"},
	}
	hostAddrs := map[string][]string{
		"a": {foMDSIP["a"]}, "b": {foMDSIP["b"]},
		"svc": {foEtcdIP, foDSIP(0), foDSIP(1), foDSIP(2)},
	}
	for _, role := range []string{"a", "b", "svc"} {
		h := n.ns(role)
		peer := "v" + role
		steps = append(steps,
			[]string{"ip", "link", "add", "eth0", "netns", h, "type", "veth", "peer", "name", peer, "netns", lan},
			[]string{"ip", "-n", lan, "link", "set", peer, "master", "br0", "up"},
			[]string{"ip", "-n", h, "link", "set", "lo", "up"},
			[]string{"ip", "-n", h, "link", "set", "eth0", "up"})
		for _, a := range hostAddrs[role] {
			steps = append(steps, []string{"ip", "-n", h, "addr", "add", a + "/24", "dev", "eth0"})
		}
	}
	for _, s := range steps {
		if err := runCmd(s...); err != nil {
			t.Fatal(err)
		}
	}
	h, err := netns.GetFromName(n.ns("svc"))
	if err != nil {
		t.Fatalf("open namespace %s: %v", n.ns("svc"), err)
	}
	n.svc = h
	t.Cleanup(func() { h.Close() })
	return n
}

// dial opens a TCP connection from inside the svc namespace. The socket
// is created on this goroutine's thread while the thread is in svc and
// keeps that namespace after the thread switches back; a thread that
// cannot switch back stays locked and dies with the goroutine.
func (n *nsNet) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	type result struct {
		c   net.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			ch <- result{nil, fmt.Errorf("current namespace: %w", err)}
			return
		}
		defer orig.Close()
		if err := netns.Set(n.svc); err != nil {
			runtime.UnlockOSThread()
			ch <- result{nil, fmt.Errorf("enter namespace: %w", err)}
			return
		}
		var d net.Dialer
		c, err := d.DialContext(ctx, network, addr)
		if serr := netns.Set(orig); serr == nil {
			runtime.UnlockOSThread()
		}
		ch <- result{c, err}
	}()
	r := <-ch
	return r.c, r.err
}

// httpClient is an HTTP client whose connections start in svc.
func (n *nsNet) httpClient() *http.Client {
	return &http.Client{
		Timeout:   3 * time.Second,
		Transport: &http.Transport{DialContext: n.dial, DisableKeepAlives: true},
	}
}

// metric is the value of one sample (name with labels, as exposed) on
// http://addr/metrics.
func (n *nsNet) metric(addr, series string) (float64, error) {
	b, err := n.get("http://" + addr + "/metrics")
	if err != nil {
		return 0, err
	}
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`)
	m := re.FindSubmatch(b)
	if m == nil {
		return 0, fmt.Errorf("%s: no %s", addr, series)
	}
	return strconv.ParseFloat(string(m[1]), 64)
}

func (n *nsNet) get(url string) ([]byte, error) {
	resp, err := n.httpClient().Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return io.ReadAll(resp.Body)
}

// listens reports whether addr accepts a TCP connection, seen from svc.
func (n *nsNet) listens(addr string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	c, err := n.dial(ctx, "tcp", addr)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// nsProc is a process the test started in a namespace (`ip netns exec`
// execs the command, so the PID is the server's own).
type nsProc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

func (p *nsProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (p *nsProc) signal(sig syscall.Signal) {
	if !p.exited() {
		_ = p.cmd.Process.Signal(sig)
	}
}

func (p *nsProc) wait(d time.Duration) error {
	select {
	case <-p.done:
		return nil
	case <-time.After(d):
		return fmt.Errorf("%s (pid %d) still running after %v", p.name, p.cmd.Process.Pid, d)
	}
}

// startIn starts argv in namespace ns, logging to dir/name.log; the test's
// cleanup continues and kills it by PID.
func startIn(t *testing.T, ns, dir, name string, argv ...string) *nsProc {
	t.Helper()
	p, err := startInErr(t, ns, dir, name, argv...)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// startInErr is startIn for goroutines other than the test's: it returns
// the error instead of failing the test.
func startInErr(t *testing.T, ns, dir, name string, argv ...string) (*nsProc, error) {
	logPath := filepath.Join(dir, name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(f, "=== %s: ip netns exec %s %s\n", time.Now().UTC().Format(time.RFC3339Nano), ns, strings.Join(argv, " "))
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns}, argv...)...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &nsProc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.signal(syscall.SIGCONT)
		p.signal(syscall.SIGKILL)
		if err := p.wait(15 * time.Second); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	return p, nil
}

// waitFor polls cond every 50 ms until it holds or d has passed.
func waitFor(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
}

var errNoLeader = errors.New("no MDS leads")
