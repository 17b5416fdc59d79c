package testbed

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestParseRate(t *testing.T) {
	tests := []struct {
		in   string
		want Rate
		str  string
		bad  bool
	}{
		{in: "1gbit", want: 1e9, str: "1gbit"},
		{in: "800mbit", want: 800e6, str: "800mbit"},
		{in: "2.5Gbit", want: 2.5e9, str: "2500mbit"},
		{in: "125mbps", want: 1e9, str: "1gbit"},
		{in: "1000000", want: 1e6, str: "1mbit"},
		{in: "fast", bad: true},
		{in: "-1gbit", bad: true},
		{in: "10kbit", bad: true},
		{in: "", bad: true},
	}
	for _, tt := range tests {
		got, err := ParseRate(tt.in)
		if tt.bad {
			if err == nil {
				t.Errorf("ParseRate(%q) = %v, want an error", tt.in, got)
			}
			continue
		}
		if err != nil || got != tt.want || got.String() != tt.str {
			t.Errorf("ParseRate(%q) = %v (%q), %v; want %v (%q)", tt.in, uint64(got), got, err, uint64(tt.want), tt.str)
		}
	}
}

func TestPlan(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want []string // node:namespace:ip:addr
		err  string
	}{
		{
			name: "defaults",
			cfg:  Config{DataServers: 2, Clients: 1, Dir: "/x"},
			want: []string{
				"mds:shoaltb-mds:10.77.0.1:10.77.0.1:2049",
				"ds0:shoaltb-ds0:10.77.1.1:10.77.1.1:2049",
				"ds1:shoaltb-ds1:10.77.1.2:10.77.1.2:2049",
				"c0:shoaltb-c0:10.77.2.1:",
			},
		},
		{name: "bad name", cfg: Config{Name: "Bad-Name", DataServers: 1, Clients: 1}, err: "bad testbed name"},
		{name: "no ds", cfg: Config{DataServers: 0, Clients: 1}, err: "--ds"},
		{name: "too many clients", cfg: Config{DataServers: 1, Clients: 201}, err: "--clients"},
		{name: "bad rate", cfg: Config{DataServers: 1, Clients: 1, Rate: "lots"}, err: "bad rate"},
		{name: "more copies than data servers", cfg: Config{DataServers: 1, Clients: 1, Mirrors: 2}, err: "--mirrors 2"},
		{name: "too many copies", cfg: Config{DataServers: 6, Clients: 1, Mirrors: 4}, err: "--mirrors 4"},
		{name: "negative copies", cfg: Config{DataServers: 2, Clients: 1, Mirrors: -1}, err: "--mirrors -1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := Plan(tt.cfg)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("Plan: %v, want error containing %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, n := range s.Nodes {
				got = append(got, fmt.Sprintf("%s:%s:%s:%s", n.Name, n.Namespace, n.IP, n.Addr))
			}
			if strings.Join(got, " ") != strings.Join(tt.want, " ") {
				t.Errorf("nodes = %v, want %v", got, tt.want)
			}
			if s.MDS != "10.77.0.1:2049" || s.Switch != "shoaltb-sw" || s.Rate != DefaultRate || s.Storage != StorageTmpfs || s.Copies() != 1 {
				t.Errorf("state = %+v", s)
			}
		})
	}
}

func TestPlanMirrors(t *testing.T) {
	s, err := Plan(Config{DataServers: 2, Clients: 1, Mirrors: 2, Dir: "/x"})
	if err != nil || s.Mirrors != 2 || s.Copies() != 2 {
		t.Fatalf("Plan with 2 copies: %+v, %v", s, err)
	}
	// A state file from before copies were recorded means one.
	if (&State{}).Copies() != 1 {
		t.Errorf("zero State: %d copies, want 1", (&State{}).Copies())
	}
}

// needRoot skips tests that create namespaces.
func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	for _, tool := range []string{"ip", "tc"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s", tool)
		}
	}
}

var (
	buildOnce sync.Once
	builtBin  string
	buildErr  error
)

// shoalBinary builds cmd/shoal once per test binary, or uses
// $SHOAL_TESTBED_BIN.
func shoalBinary(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("SHOAL_TESTBED_BIN"); p != "" {
		return p
	}
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "shoal-testbed-bin")
		if err != nil {
			buildErr = err
			return
		}
		builtBin = filepath.Join(dir, "shoal")
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		defer cancel()
		out, err := exec.CommandContext(ctx, "go", "build", "-o", builtBin, "github.com/shoalfs/shoal/cmd/shoal").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("%v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatalf("build shoal (set SHOAL_TESTBED_BIN to use a prebuilt one): %v", buildErr)
	}
	return builtBin
}

func TestMain(m *testing.M) {
	code := m.Run()
	if builtBin != "" {
		os.RemoveAll(filepath.Dir(builtBin))
	}
	os.Exit(code)
}

// cancelOn is a slog handler that cancels a context when a given message
// is logged, to interrupt Up at a chosen step.
type cancelOn struct {
	slog.Handler
	msg    string
	cancel context.CancelFunc
}

func (h cancelOn) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == h.msg {
		h.cancel()
	}
	return h.Handler.Handle(ctx, r)
}

// testName is a testbed name unlikely to collide with a user's testbed or
// a concurrent test run.
func testName(tag string) string {
	return fmt.Sprintf("t%s%d", tag, os.Getpid()%1000000)
}

// assertGone fails if any namespace or process of s remains.
func assertGone(t *testing.T, s *State) {
	t.Helper()
	for _, ns := range s.Namespaces() {
		if namespaceExists(ns) {
			t.Errorf("namespace %s still exists", ns)
		}
	}
	for _, n := range s.Nodes {
		if n.PID != 0 && alive(n.PID) {
			t.Errorf("%s (pid %d) still running", n.Name, n.PID)
		}
	}
	// Also any process working in the testbed directory, recorded or not.
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		pid, err := strconv.Atoi(filepath.Base(p))
		if err != nil || !alive(pid) {
			continue
		}
		for _, a := range cmdline(pid) {
			if strings.HasPrefix(a, s.Dir+"/") {
				t.Errorf("pid %d still running in the testbed directory: %q", pid, cmdline(pid))
				break
			}
		}
	}
	if _, err := os.Stat(filepath.Join(s.Dir, StateFile)); err == nil {
		t.Errorf("state file still there")
	}
}

func TestTestbed(t *testing.T) {
	needRoot(t)
	bin := shoalBinary(t)
	dir := t.TempDir()
	name := testName("b")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// Two copies of every stripe unit: the data servers forward to each
	// other over their testbed addresses.
	s, err := Up(ctx, Config{Name: name, DataServers: 2, Clients: 1, Mirrors: 2, Rate: "1gbit", Dir: dir, Binary: bin, Ready: time.Minute})
	if err != nil {
		t.Fatalf("Up: %v", err)
	}
	downed := false
	t.Cleanup(func() {
		if !downed {
			_ = Down(context.Background(), name, dir, nil)
		}
	})
	if loaded, err := Load(dir); err != nil || !loaded.Ready || len(loaded.Nodes) != 4 || loaded.Copies() != 2 {
		t.Fatalf("Load: %+v, %v", loaded, err)
	}
	c0, _ := s.Node("c0")
	if mounted, err := isMountPoint(s.DataMount); s.Storage != StorageTmpfs || !mounted {
		t.Fatalf("data storage %q at %q: mounted %v, %v; want the default tmpfs", s.Storage, s.DataMount, mounted, err)
	}

	t.Run("reachability", func(t *testing.T) {
		for _, n := range s.Nodes {
			if n.Addr == "" {
				continue
			}
			if err := probe(ctx, c0.Namespace, n.Addr); err != nil {
				t.Errorf("c0 cannot reach %s at %s: %v", n.Name, n.Addr, err)
			}
		}
		// Peer addresses, for replicated writes.
		ds0, _ := s.Node("ds0")
		ds1, _ := s.Node("ds1")
		for _, p := range [][2]Node{{ds0, ds1}, {ds1, ds0}} {
			if err := probe(ctx, p[0].Namespace, p[1].Addr); err != nil {
				t.Errorf("%s cannot reach its peer %s at %s: %v", p[0].Name, p[1].Name, p[1].Addr, err)
			}
		}
		for _, n := range s.ByRole(RoleDS) {
			if !slices.Contains(n.Cmdline, "--peer-advertise") {
				t.Errorf("%s runs without --peer-advertise: %q", n.Name, n.Cmdline)
			}
		}
		if mds, _ := s.Node("mds"); !strings.Contains(strings.Join(mds.Cmdline, " "), "--mirrors 2") {
			t.Errorf("mds runs without --mirrors 2: %q", mds.Cmdline)
		}
	})

	t.Run("isolation", func(t *testing.T) {
		for _, ns := range s.Namespaces() {
			out, err := run(ctx, "ip", "-n", ns, "route", "show", "default")
			if err != nil || strings.TrimSpace(out) != "" {
				t.Errorf("%s: default route %q, %v", ns, out, err)
			}
		}
		// A service on the host's loopback is invisible from a client.
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		dctx, dcancel := context.WithTimeout(ctx, 3*time.Second)
		defer dcancel()
		if c, err := DialIn(dctx, c0.Namespace, ln.Addr().String()); err == nil {
			c.Close()
			t.Errorf("c0 reached the host's %s", ln.Addr())
		}
	})

	t.Run("files", func(t *testing.T) {
		shoal := func(args ...string) string {
			t.Helper()
			c, err := s.Command(ctx, "c0", append([]string{bin}, args...)...)
			if err != nil {
				t.Fatal(err)
			}
			out, err := c.CombinedOutput()
			if err != nil {
				t.Fatalf("shoal %s in c0: %v\n%s", strings.Join(args, " "), err, out)
			}
			return string(out)
		}
		root := "nfs://" + s.MDS + "/"
		shoal("ls", root)
		// Three stripe units, so both data servers hold data.
		data := make([]byte, 3<<20+123)
		rand.Read(data)
		src, dst := filepath.Join(t.TempDir(), "src"), filepath.Join(t.TempDir(), "dst")
		if err := os.WriteFile(src, data, 0o644); err != nil {
			t.Fatal(err)
		}
		shoal("put", src, root+"blob")
		if out := shoal("ls", root); !strings.Contains(out, "blob") {
			t.Errorf("ls after put: %q", out)
		}
		shoal("get", root+"blob", dst)
		got, err := os.ReadFile(dst)
		if err != nil || !bytes.Equal(got, data) {
			t.Errorf("get returned %d bytes (err %v), want the %d put", len(got), err, len(data))
		}
		// The stripes landed on the tmpfs, in both data servers' directories.
		var onTmpfs int64
		filepath.WalkDir(s.DataMount, func(_ string, d fs.DirEntry, err error) error {
			if err == nil && d.Type().IsRegular() {
				if fi, err := d.Info(); err == nil {
					onTmpfs += fi.Size()
				}
			}
			return nil
		})
		// Two copies of every unit.
		if onTmpfs < 2*int64(len(data)) {
			t.Errorf("data tmpfs holds %d bytes of files, want at least twice the %d put (2 copies)", onTmpfs, len(data))
		}
	})

	t.Run("measure", func(t *testing.T) {
		res, err := Measure(ctx, s, []Flow{{"ds0", "c0"}, {"c0", "mds"}}, 500*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range res {
			if r.Bytes == 0 {
				t.Errorf("%s->%s moved no data", r.From, r.To)
			}
		}
	})

	downed = true
	if err := Down(ctx, name, dir, nil); err != nil {
		t.Fatalf("Down: %v", err)
	}
	assertGone(t, s)
	if mounted, err := isMountPoint(s.DataMount); mounted || err != nil {
		t.Errorf("data tmpfs %s still mounted after Down (%v)", s.DataMount, err)
	}
	if err := Down(ctx, name, dir, nil); err != nil {
		t.Errorf("second Down: %v", err)
	}
}

// TestUpCleansUp checks that a failed or interrupted Up leaves nothing.
func TestUpCleansUp(t *testing.T) {
	needRoot(t)
	falseBin, err := exec.LookPath("false")
	if err != nil {
		t.Skip("no false(1)")
	}
	tests := []struct {
		name     string
		bin      func(t *testing.T) string
		cancelOn string // log message that interrupts Up
		want     string
	}{
		{name: "server dies", bin: func(*testing.T) string { return falseBin }, want: "exited during startup"},
		{name: "interrupted before anything", bin: shoalBinary, cancelOn: "now", want: "interrupted"},
		{name: "interrupted with a server running", bin: shoalBinary, cancelOn: "testbed: started", want: "interrupted"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bin := tt.bin(t)
			dir := t.TempDir()
			name := testName(fmt.Sprintf("f%d", i))
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			log := slog.New(cancelOn{Handler: slog.NewTextHandler(os.Stderr, nil), msg: tt.cancelOn, cancel: cancel})
			if tt.cancelOn == "now" {
				cancel()
			}
			s, _ := Plan(Config{Name: name, DataServers: 1, Clients: 1, Dir: dir})
			st, err := Up(ctx, Config{Name: name, DataServers: 1, Clients: 1, Dir: dir, Binary: bin, Ready: 20 * time.Second, Logger: log})
			if st != nil {
				_ = Down(context.Background(), name, dir, nil)
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Up: %v, want an error containing %q", err, tt.want)
			}
			assertGone(t, s)
		})
	}
}
