package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

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
