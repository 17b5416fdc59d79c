package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netns"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"

	"github.com/shoalfs/shoal/internal/vip"
	"github.com/shoalfs/shoal/meta/etcdtest"
)

// docBlock returns the fenced block that follows marker in
// docs/service-address.md.
func docBlock(t *testing.T, marker string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "service-address.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(b), marker)
	if !ok {
		t.Fatalf("docs/service-address.md has no %q", marker)
	}
	_, after, ok = strings.Cut(after, "```")
	if ok {
		_, after, ok = strings.Cut(after, "\n") // the fence's language
	}
	block, _, closed := strings.Cut(after, "```")
	if !ok || !closed {
		t.Fatalf("no fenced block after %q", marker)
	}
	return block
}

// TestVIPConfigExample loads the documented /etc/shoal/vip.yaml into the
// real shoal vip command: every key must be one it takes.
func TestVIPConfigExample(t *testing.T) {
	t.Cleanup(func() { _ = setLogLevel("info") })
	path := filepath.Join(t.TempDir(), "vip.yaml")
	if err := os.WriteFile(path, []byte(docBlock(t, "<!-- vip-test: file vip.yaml -->")), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd, _, err := newRootCmd().Find([]string{"vip"})
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.ParseFlags(nil); err != nil {
		t.Fatal(err)
	}
	if _, err := loadConfig[struct{}](cmd, path); err != nil {
		t.Fatal(err)
	}
	for flag, want := range map[string]string{"address": "192.0.2.100/24", "interface": "eth0", "node": "mds1", "lease": "5s"} {
		if got := cmd.Flags().Lookup(flag).Value.String(); got != want {
			t.Errorf("--%s = %q from the example, want %q", flag, got, want)
		}
	}
}

// TestVIPFlagErrors: mistakes on the command line fail before shoal vip
// touches etcd or the network, and say what is wrong.
func TestVIPFlagErrors(t *testing.T) {
	const meta = "etcd://127.0.0.1:1/shoal" // never dialled: every case fails first
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no meta", []string{"--address", "10.9.0.100/24", "--interface", "eth0"}, "--meta is required"},
		{"bolt meta", []string{"--meta", "bolt", "--address", "10.9.0.100/24", "--interface", "eth0"}, "scheme must be etcd://"},
		{"no address", []string{"--meta", meta, "--interface", "eth0"}, "--address and --interface are required"},
		{"no interface", []string{"--meta", meta, "--address", "10.9.0.100/24"}, "--address and --interface are required"},
		{"no prefix length", []string{"--meta", meta, "--address", "10.9.0.100", "--interface", "eth0"}, "with its prefix length"},
		{"IPv6", []string{"--meta", meta, "--address", "fd00::100/64", "--interface", "eth0"}, "want an IPv4 address"},
		{"bad key", []string{"--config", writeFile(t, "vip.yaml", "adress: 10.9.0.100/24\n")}, "unknown key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := run(t, append([]string{"vip"}, tc.args...)...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("shoal vip %s: error %v, want one containing %q", strings.Join(tc.args, " "), err, tc.want)
			}
		})
	}
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestKeepalivedCheck runs the documented keepalived check script against
// a real etcd election: it succeeds on the leader's host only.
func TestKeepalivedCheck(t *testing.T) {
	for _, tool := range []string{"etcdctl", "jq", "sh"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s", tool)
		}
	}
	etcd := etcdtest.Start(t, 1, etcdtest.Options{NoFsync: true})
	cli, err := clientv3.New(clientv3.Config{Endpoints: etcd.Endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	// Two candidates: A leads, B waits behind it.
	for _, node := range []string{"A", "B"} {
		sess, err := concurrency.NewSession(cli)
		if err != nil {
			t.Fatal(err)
		}
		defer sess.Close()
		el := concurrency.NewElection(sess, strings.TrimSuffix(vip.ElectionPrefix("/shoal"), "/"))
		val, _ := json.Marshal(vip.Leader{Node: node, Addr: "192.0.2.1:2049", Term: 1})
		if node == "A" {
			if err := el.Campaign(ctx, string(val)); err != nil {
				t.Fatal(err)
			}
			continue
		}
		go el.Campaign(ctx, string(val)) // blocks behind A until the session closes
	}
	// B's key exists once its campaign has written it.
	for range 500 {
		resp, err := cli.Get(ctx, vip.ElectionPrefix("/shoal"), clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		if resp.Count == 2 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	script := strings.ReplaceAll(docBlock(t, "<!-- vip-test: keepalived-check -->"),
		"192.0.2.1:2379,192.0.2.2:2379,192.0.2.3:2379", etcd.Endpoints[0])
	for _, tc := range []struct {
		host   string
		leader bool
	}{{"A", true}, {"B", false}} {
		s := strings.ReplaceAll(script, "$(hostname)", tc.host)
		out, err := exec.CommandContext(ctx, "sh", "-c", s).CombinedOutput()
		if got := err == nil; got != tc.leader {
			t.Errorf("check script on %s: exit error %v (output %q), want success %v", tc.host, err, out, tc.leader)
		}
	}
}

// TestMain lets a test run the shoal binary that this test binary also
// is: with SHOAL_TEST_MAIN=1 it runs main with its arguments instead of
// the tests, so that a test can start `shoal vip` as a real process (in
// a network namespace, with `ip netns exec`) without building it.
func TestMain(m *testing.M) {
	if os.Getenv("SHOAL_TEST_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// proc is a process the test started, with its output.
type proc struct {
	name string
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startIn starts argv in network namespace ns; the process is killed
// (by its PID) when the test ends if it still runs.
func startIn(t *testing.T, name, ns string, env []string, argv ...string) *proc {
	t.Helper()
	p := &proc{name: name, out: &syncBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command("ip", append([]string{"netns", "exec", ns}, argv...)...)
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() { p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.signal(t, syscall.SIGKILL)
		if t.Failed() {
			t.Logf("output of %s:\n%s", name, p.out)
		}
	})
	return p
}

// signal sends sig to the process (ip netns exec has exec'd it, so the
// PID is the command's) and, for SIGKILL, waits for it to end.
func (p *proc) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	select {
	case <-p.done:
		return
	default:
	}
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Logf("signal %s: %v", p.name, err)
	}
	if sig == syscall.SIGKILL {
		p.wait(t)
	}
}

// wait waits for the process to end, at most 30s, and returns its exit
// code.
func (p *proc) wait(t *testing.T) int {
	t.Helper()
	select {
	case <-p.done:
		return p.cmd.ProcessState.ExitCode()
	case <-time.After(30 * time.Second):
		t.Fatalf("%s did not exit within 30s", p.name)
		return -1
	}
}

// waitOutput waits until the process has printed want count times.
func (p *proc) waitOutput(t *testing.T, want string, count int) {
	t.Helper()
	for range 1500 { // 15s at most
		if strings.Count(p.out.String(), want) >= count {
			return
		}
		select {
		case <-p.done:
			t.Fatalf("%s exited before printing %q (%d times):\n%s", p.name, want, count, p.out)
		case <-time.After(10 * time.Millisecond):
		}
	}
	t.Fatalf("%s did not print %q (%d times):\n%s", p.name, want, count, p.out)
}

// TestVIPProcess runs `shoal vip` as real processes, one per network
// namespace standing for an MDS host, against Debian's etcd in a third
// namespace, with etcdctl elect standing for the MDSes: the address
// follows the leader, a supervisor killed with SIGKILL and restarted
// removes the address it left behind and takes it back, and SIGTERM
// removes it.
func TestVIPProcess(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root, to create network namespaces")
	}
	for _, tool := range []string{"ip", "etcd", "etcdctl"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s", tool)
		}
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	base := fmt.Sprintf("shoalvipproc-%d", os.Getpid())
	nsA, nsB, nsE := base+"-a", base+"-b", base+"-e"
	ipc := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	for i, ns := range []string{nsA, nsB, nsE} {
		if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
			if i == 0 {
				t.Skipf("cannot create a network namespace: %v: %s", err, out)
			}
			t.Fatalf("ip netns add %s: %v: %s", ns, err, out)
		}
		t.Cleanup(func() {
			if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
				t.Errorf("ip netns del %s: %v: %s", ns, err, out)
			}
		})
	}
	// E holds etcd and the bridge that connects A and B to it.
	ipc("-n", nsE, "link", "set", "lo", "up")
	ipc("-n", nsE, "link", "add", "br0", "type", "bridge")
	ipc("-n", nsE, "addr", "add", "10.9.0.3/24", "dev", "br0")
	ipc("-n", nsE, "link", "set", "br0", "up")
	hosts := map[string]*vip.Netlink{}
	for i, ns := range []string{nsA, nsB} {
		peer := fmt.Sprintf("p%d", i)
		ipc("link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", peer, "netns", nsE)
		ipc("-n", nsE, "link", "set", peer, "master", "br0", "up")
		ipc("-n", ns, "addr", "add", fmt.Sprintf("10.9.0.%d/24", i+1), "dev", "eth0")
		ipc("-n", ns, "link", "set", "eth0", "up")
		h, err := netns.GetFromName(ns)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { h.Close() })
		nl, err := vip.NewNetlink(h, "eth0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nl.Close)
		hosts[ns] = nl
	}
	holds := func(ns string) bool {
		t.Helper()
		ok, err := hosts[ns].HasAddr(netip.MustParsePrefix("10.9.0.100/24"))
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	await := func(what string, cond func() bool) {
		t.Helper()
		for range 1500 { // 15s at most
			if cond() {
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Fatalf("timed out waiting until %s", what)
	}

	const ep = "10.9.0.3:2379"
	startIn(t, "etcd", nsE, nil, "etcd", "--name", "e", "--data-dir", t.TempDir(),
		"--listen-client-urls", "http://"+ep, "--advertise-client-urls", "http://"+ep,
		"--listen-peer-urls", "http://127.0.0.1:2380", "--initial-advertise-peer-urls", "http://127.0.0.1:2380",
		"--initial-cluster", "e=http://127.0.0.1:2380", "--unsafe-no-fsync", "--logger", "zap", "--log-level", "error")
	await("etcd is healthy", func() bool {
		return exec.Command("ip", "netns", "exec", nsE, "etcdctl", "--endpoints", ep, "endpoint", "health").Run() == nil
	})
	elect := func(node string) *proc {
		val := fmt.Sprintf(`{"node":%q,"addr":"10.9.0.100:2049","term":1}`, node)
		return startIn(t, "etcdctl elect "+node, nsE, nil, "etcdctl", "--endpoints", ep, "elect", "/shoal/election", val)
	}
	supervise := func(ns, node string) *proc {
		return startIn(t, "shoal vip "+node, ns, []string{"SHOAL_TEST_MAIN=1"}, self, "vip",
			"--meta", "etcd://"+ep+"/shoal", "--node", node, "--address", "10.9.0.100/24", "--interface", "eth0", "--lease", "2s")
	}

	leaderA := elect("A")
	leaderA.waitOutput(t, `"node":"A"`, 1) // elect prints the key and value once elected
	a := supervise(nsA, "A")
	await("A holds the address", func() bool { return holds(nsA) })

	// Killed, the supervisor leaves the address behind; restarted, it
	// removes it and waits for the killed run's claim to expire before
	// claiming again.
	a.signal(t, syscall.SIGKILL)
	if !holds(nsA) {
		t.Fatal("the address went with the killed supervisor; the test cannot tell a restart's cleanup")
	}
	a = supervise(nsA, "A")
	a.waitOutput(t, "reason=stale", 1)
	a.waitOutput(t, "vip: address claimed", 1)
	if !strings.Contains(a.out.String(), "waiting for the holder") {
		t.Errorf("the restarted supervisor claimed without waiting for the killed run's claim:\n%s", a.out)
	}
	if !holds(nsA) {
		t.Fatal("A does not hold the address after claiming it")
	}

	// The leader moves to B.
	b := supervise(nsB, "B")
	leaderB := elect("B")
	leaderA.signal(t, syscall.SIGINT) // etcdctl elect resigns on SIGINT
	moved := false
	for range 3000 { // 30s at most
		a1, bHolds, a2 := holds(nsA), holds(nsB), holds(nsA)
		if a1 && bHolds && a2 {
			t.Fatal("A and B both hold the address")
		}
		if bHolds && !a2 {
			moved = true
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !moved {
		t.Fatal("the address did not move to B")
	}
	leaderB.waitOutput(t, `"node":"B"`, 1)
	a.waitOutput(t, "reason=not_leader", 1)

	// SIGTERM: B removes the address and exits cleanly.
	b.signal(t, syscall.SIGTERM)
	if code := b.wait(t); code != 0 {
		t.Errorf("shoal vip exited with %d after SIGTERM:\n%s", code, b.out)
	}
	if holds(nsB) {
		t.Error("B still holds the address after its supervisor stopped")
	}
}
