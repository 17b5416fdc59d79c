package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/shoalfs/shoal/internal/testbed"
)

// TestbedCluster runs the benchmarks on an emulated cluster (package
// testbed): every server and every client in a network namespace of its
// own behind a rate-limited link, so that striping over N data servers
// can show N links' worth of bandwidth, as on real hosts. It is both the
// ClusterStarter and the ClientLauncher: client i runs `shoal bench
// client` inside client namespace i mod M, so each client has its own
// link, as in the papers.
//
// With State set it uses that running testbed, which must have the data
// server count (and number of copies) asked for, and leaves it up. With Up
// set it brings a fresh testbed up for every cluster started
// (Up.DataServers and, from StartMirrored, Up.Mirrors are overridden) and
// tears it down when the cluster stops.
type TestbedCluster struct {
	// Exe is the shoal binary the clients run.
	Exe   string
	State *testbed.State
	Up    *testbed.Config
	// Logger for testbed bring-up and teardown (default: discard).
	Logger *slog.Logger

	mu  sync.Mutex
	cur *testbed.State
}

var (
	_ MirroredStarter = (*TestbedCluster)(nil)
	_ ClientLauncher  = (*TestbedCluster)(nil)
	_ ClusterStarter  = (*GaneshaTestbed)(nil)
)

func (t *TestbedCluster) logger() *slog.Logger {
	if t.Logger != nil {
		return t.Logger
	}
	return slog.New(slog.DiscardHandler)
}

// StartCluster implements ClusterStarter: a running testbed as it is, or
// a new one with Up.Mirrors copies.
func (t *TestbedCluster) StartCluster(ctx context.Context, n int) (*ClusterEndpoint, error) {
	return t.start(ctx, n, 0)
}

// StartMirrored implements MirroredStarter: a running testbed must keep
// mirrors copies (`shoal testbed up --mirrors`).
func (t *TestbedCluster) StartMirrored(ctx context.Context, n, mirrors int) (*ClusterEndpoint, error) {
	return t.start(ctx, n, mirrors)
}

// start starts (or checks) a testbed of n data servers; mirrors 0 takes
// the running testbed's or Up's number of copies.
func (t *TestbedCluster) start(ctx context.Context, n, mirrors int) (*ClusterEndpoint, error) {
	var st *testbed.State
	stop := func(context.Context) error { return nil }
	switch {
	case t.State != nil:
		if got := len(t.State.ByRole(testbed.RoleDS)); got != n {
			return nil, fmt.Errorf("testbed %s has %d data servers, not %d (bring one up with --ds %d, or use --testbed-up)", t.State.Name, got, n, n)
		}
		if got := t.State.Copies(); mirrors != 0 && got != mirrors {
			return nil, fmt.Errorf("testbed %s keeps %d copies, not %d (bring one up with --mirrors %d, or use --testbed-up)", t.State.Name, got, mirrors, mirrors)
		}
		st = t.State
	case t.Up != nil:
		cfg := *t.Up
		cfg.DataServers = n
		if mirrors != 0 {
			cfg.Mirrors = mirrors
		}
		if cfg.Logger == nil {
			cfg.Logger = t.logger()
		}
		var err error
		if st, err = testbed.Up(ctx, cfg); err != nil {
			return nil, fmt.Errorf("testbed up --ds %d --mirrors %d: %w", n, max(cfg.Mirrors, 1), err)
		}
		stop = func(ctx context.Context) error {
			return testbed.Down(ctx, st.Name, st.Dir, t.logger())
		}
	default:
		return nil, errors.New("testbed cluster: neither a running testbed nor a configuration to bring one up")
	}
	t.mu.Lock()
	t.cur = st
	t.mu.Unlock()
	return &ClusterEndpoint{Addr: st.MDS, Root: "/", Procs: testbedProcs(st), Stop: stop, Namespace: clientNamespace(st)}, nil
}

// clientNamespace is the namespace the harness's own client dials from.
func clientNamespace(st *testbed.State) string {
	if c := st.ByRole(testbed.RoleClient); len(c) > 0 {
		return c[0].Namespace
	}
	return ""
}

// testbedProcs are the testbed's server processes by role.
func testbedProcs(st *testbed.State) []ServerProc {
	var procs []ServerProc
	for _, n := range st.Nodes {
		switch {
		case n.PID <= 0:
		case n.Role == testbed.RoleMDS:
			procs = append(procs, ServerProc{Role: RoleMDS, PID: n.PID})
		case n.Role == testbed.RoleDS:
			procs = append(procs, ServerProc{Role: RoleDS, PID: n.PID})
		}
	}
	return procs
}

// current is the testbed clients run in.
func (t *TestbedCluster) current() (*testbed.State, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.cur != nil {
		return t.cur, nil
	}
	if t.State != nil {
		return t.State, nil
	}
	return nil, errors.New("testbed cluster: no testbed is up")
}

// Launch implements ClientLauncher: a ProcessLauncher whose command runs
// in the client's namespace.
func (t *TestbedCluster) Launch(ctx context.Context, spec ClientSpec) (*ClientHandle, error) {
	st, err := t.current()
	if err != nil {
		return nil, err
	}
	clients := st.ByRole(testbed.RoleClient)
	if len(clients) == 0 {
		return nil, fmt.Errorf("testbed %s has no client namespaces", st.Name)
	}
	node := clients[spec.Index%len(clients)].Name
	logs := filepath.Join(st.Dir, "logs")
	p := &ProcessLauncher{Exe: t.Exe, LogDir: logs, Command: func(ctx context.Context, _ ClientSpec, argv []string) (*exec.Cmd, error) {
		return st.Command(ctx, node, argv...)
	}}
	return p.Launch(ctx, spec)
}

// LinkBitsPerSec is the testbed's per-link rate, 0 if unknown.
func (t *TestbedCluster) LinkBitsPerSec() float64 {
	switch {
	case t.State != nil:
		return float64(t.State.RateBits)
	case t.Up != nil:
		r, err := testbed.ParseRate(t.Up.Rate)
		if err == nil {
			return float64(r)
		}
	}
	return 0
}

// GaneshaTestbed runs NFS-Ganesha (scripts/ganesha.sh) inside the MDS
// namespace of a testbed, on Port, as the single-server NFSv4.1 baseline:
// its clients cross the same links as Shoal's, and all its traffic the
// MDS node's one link. Ganesha binds the wildcard address inside a
// namespace, which there means only the MDS's address.
type GaneshaTestbed struct {
	Script string
	// Dir holds the instance's configuration, log and export.
	Dir string
	// Testbed supplies the namespace (its current testbed).
	Testbed *TestbedCluster
	// Port defaults to 2050, next to Shoal's MDS on 2049.
	Port int
}

// StartCluster implements ClusterStarter; the data-server count is
// ignored (Ganesha is one server).
func (g *GaneshaTestbed) StartCluster(ctx context.Context, _ int) (*ClusterEndpoint, error) {
	if _, err := exec.LookPath("ganesha.nfsd"); err != nil {
		return nil, fmt.Errorf("%w: ganesha.nfsd is not installed", ErrUnavailable)
	}
	if g.Script == "" {
		return nil, fmt.Errorf("%w: scripts/ganesha.sh not found", ErrUnavailable)
	}
	st, err := g.Testbed.current()
	if err != nil {
		return nil, err
	}
	mds, ok := st.Node("mds")
	if !ok {
		return nil, fmt.Errorf("testbed %s has no mds node", st.Name)
	}
	port := g.Port
	if port == 0 {
		port = 2050
	}
	run := func(ctx context.Context, args ...string) error {
		cmd, err := st.Command(ctx, "mds", append([]string{g.Script}, args...)...)
		if err != nil {
			return err
		}
		cmd.Env = append(cmd.Env, "GANESHA_BIND="+mds.IP)
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("ganesha.sh %s: %w: %s", args[0], err, strings.TrimSpace(string(out)))
		}
		return nil
	}
	if err := os.MkdirAll(g.Dir, 0o755); err != nil {
		return nil, err
	}
	stop := func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		return run(ctx, "stop", g.Dir)
	}
	if err := run(ctx, "start", g.Dir, strconv.Itoa(port)); err != nil {
		stop(context.WithoutCancel(ctx))
		return nil, err
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(readFile(filepath.Join(g.Dir, "ganesha.pid"))))
	ep := &ClusterEndpoint{Addr: fmt.Sprintf("%s:%d", mds.IP, port), Root: "/export", Stop: stop, Namespace: clientNamespace(st)}
	if pid > 0 {
		ep.Procs = []ServerProc{{Role: RoleGanesha, PID: pid}}
	}
	return ep, nil
}

// RoleGanesha is the server role of the NFS-Ganesha baseline.
const RoleGanesha = "ganesha"
