package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/shoalfs/shoal/internal/wiring"
	"github.com/shoalfs/shoal/server"
)

var (
	_ MirroredStarter = (*ClusterProcess)(nil)
	_ MirroredStarter = (*ClusterSplit)(nil)
	_ MirroredStarter = (*ClusterInProcess)(nil)
)

// ClusterReady is the content of `shoal up --ready-file`: written (by
// rename, so never seen half-written) once every data server is in
// service.
type ClusterReady struct {
	MDS         string   `json:"mds"`
	DataServers []string `json:"data_servers"`
	PID         int      `json:"pid"`
}

// ClusterProcess runs `Exe up` as a child process: the metadata server
// and every data server in one process, on kernel-chosen loopback ports,
// apart from the clients so its CPU time is its own and can be profiled.
type ClusterProcess struct {
	// Exe is the shoal binary, normally os.Executable().
	Exe string
	// Dir holds one subdirectory per cluster started, with its data and
	// log.
	Dir string
	// ProfileDir, if set, receives a CPU profile of each cluster
	// (`shoal up --cpuprofile`), named after its data-server count.
	ProfileDir string
	// LogLevel of the cluster (default "warn").
	LogLevel string
	// StripeUnit, if not zero, is passed to --stripe-unit.
	StripeUnit uint64
}

// StartCluster implements ClusterStarter.
func (p *ClusterProcess) StartCluster(ctx context.Context, n int) (*ClusterEndpoint, error) {
	return p.StartMirrored(ctx, n, 1)
}

// StartMirrored implements MirroredStarter (`shoal up --mirrors`).
func (p *ClusterProcess) StartMirrored(ctx context.Context, n, mirrors int) (*ClusterEndpoint, error) {
	dir := filepath.Join(p.Dir, fmt.Sprintf("cluster-ds%d-%d", n, time.Now().UnixNano()))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("shoal up: %w", err)
	}
	level := p.LogLevel
	if level == "" {
		level = "warn"
	}
	ready := filepath.Join(dir, "ready.json")
	args := []string{"up", "--dir", filepath.Join(dir, "data"), "--ds", fmt.Sprint(n),
		"--listen", "127.0.0.1:0", "--ready-file", ready, "--log-level", level}
	if p.StripeUnit != 0 {
		args = append(args, "--stripe-unit", fmt.Sprint(p.StripeUnit))
	}
	if mirrors > 1 {
		args = append(args, "--mirrors", fmt.Sprint(mirrors))
	}
	profile := ""
	if p.ProfileDir != "" {
		profile = filepath.Join(p.ProfileDir, fmt.Sprintf("shoal-up-ds%d.cpu.pprof", n))
		args = append(args, "--cpuprofile", profile)
	}
	logPath := filepath.Join(dir, "up.log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("shoal up: %w", err)
	}
	cmd := exec.Command(p.Exe, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = childProcAttr()
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("shoal up: start %s: %w", p.Exe, err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); logf.Close(); close(exited) }()
	stop := func(ctx context.Context) error { return terminate(ctx, cmd.Process, exited) }
	info, err := waitReadyFile(ctx, ready, exited)
	if err != nil {
		stop(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("shoal up --ds %d: %w (log: %s%s)", n, err, logPath, tail(logPath))
	}
	if len(info.DataServers) != n {
		stop(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("shoal up --ds %d: ready with %d data servers", n, len(info.DataServers))
	}
	ep := &ClusterEndpoint{Addr: info.MDS, Root: "/", Procs: []ServerProc{{Role: RoleAll, PID: cmd.Process.Pid}}, Stop: stop}
	if profile != "" {
		ep.Profiles = []string{profile}
	}
	return ep, nil
}

// waitReadyFile polls for path until it holds a ClusterReady, the process
// exits, ctx ends or startTimeout passes.
func waitReadyFile(ctx context.Context, path string, exited <-chan struct{}) (ClusterReady, error) {
	deadline := time.Now().Add(startTimeout)
	for time.Now().Before(deadline) {
		if b, err := os.ReadFile(path); err == nil {
			var info ClusterReady
			if err := json.Unmarshal(b, &info); err != nil {
				return info, fmt.Errorf("bad ready file %s: %w", path, err)
			}
			if info.MDS == "" {
				return info, fmt.Errorf("ready file %s names no MDS", path)
			}
			return info, nil
		}
		select {
		case <-exited:
			return ClusterReady{}, errors.New("exited during startup")
		case <-ctx.Done():
			return ClusterReady{}, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return ClusterReady{}, fmt.Errorf("not ready within %v", startTimeout)
}

// ClusterInProcess runs the cluster inside the calling process. Its CPU
// time is not separable from the clients'; tests use it because it needs
// no binary.
type ClusterInProcess struct {
	Dir    string
	Logger *slog.Logger // default: discard
}

// StartCluster implements ClusterStarter.
func (p *ClusterInProcess) StartCluster(ctx context.Context, n int) (*ClusterEndpoint, error) {
	return p.StartMirrored(ctx, n, 1)
}

// StartMirrored implements MirroredStarter.
func (p *ClusterInProcess) StartMirrored(ctx context.Context, n, mirrors int) (*ClusterEndpoint, error) {
	log := p.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	dir := filepath.Join(p.Dir, fmt.Sprintf("cluster-ds%d-%d", n, time.Now().UnixNano()))
	f := false
	c, err := wiring.Start(ctx, wiring.Config{
		Dir: dir, DataServers: n, Listen: "127.0.0.1:0", Mirrors: mirrors,
		Exports: []*server.Export{{Path: "/", RootSquash: &f}}, Logger: log,
	})
	if err != nil {
		return nil, err
	}
	stop := func(context.Context) error { return c.Close() }
	return &ClusterEndpoint{Addr: c.MDS.Addr.String(), Root: "/", Stop: stop}, nil
}

// ClusterSplit runs the metadata server (`Exe mds`) and each data server
// (`Exe ds`) as processes of their own, so the report can tell the MDS's
// CPU time from the data servers': with pNFS off the MDS carries every
// byte, with pNFS on it should be nearly idle.
type ClusterSplit struct {
	// Exe is the shoal binary, normally os.Executable().
	Exe string
	// Dir holds one subdirectory per cluster started.
	Dir string
	// StripeUnit, if not zero, is passed to `mds --stripe-unit`.
	StripeUnit uint64
}

// StartCluster implements ClusterStarter.
func (p *ClusterSplit) StartCluster(ctx context.Context, n int) (*ClusterEndpoint, error) {
	return p.StartMirrored(ctx, n, 1)
}

// StartMirrored implements MirroredStarter (`shoal mds --mirrors`; each
// data server's peer address is its loopback listen address).
func (p *ClusterSplit) StartMirrored(ctx context.Context, n, mirrors int) (ep *ClusterEndpoint, err error) {
	dir := filepath.Join(p.Dir, fmt.Sprintf("split-ds%d-%d", n, time.Now().UnixNano()))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var procs []*serverChild
	stop := func(ctx context.Context) error {
		// Data servers first (in parallel), then the metadata server.
		errs := make(chan error, len(procs))
		for _, c := range procs[min(1, len(procs)):] {
			go func() { errs <- c.stop(ctx) }()
		}
		var all []error
		for range procs[min(1, len(procs)):] {
			all = append(all, <-errs)
		}
		if len(procs) > 0 {
			all = append(all, procs[0].stop(ctx))
		}
		return errors.Join(all...)
	}
	defer func() {
		if err != nil {
			stop(context.WithoutCancel(ctx))
		}
	}()
	// Both roles log "... ready" with their address at info level once
	// they serve; that line is how the harness learns the kernel-chosen
	// ports.
	args := []string{"mds", "--listen", "127.0.0.1:0", "--dir", filepath.Join(dir, "mds"),
		"--no-root-squash", "--log-level", "info"}
	if p.StripeUnit != 0 {
		args = append(args, "--stripe-unit", fmt.Sprint(p.StripeUnit))
	}
	if mirrors > 1 {
		args = append(args, "--mirrors", fmt.Sprint(mirrors))
	}
	mds, err := startServerChild(p.Exe, args, filepath.Join(dir, "mds.log"))
	if err != nil {
		return nil, err
	}
	procs = append(procs, mds)
	mdsAddr, err := mds.waitLog(ctx, "shoal mds ready", "listen")
	if err != nil {
		return nil, fmt.Errorf("shoal mds: %w", err)
	}
	for i := 0; i < n; i++ {
		d, err := startServerChild(p.Exe, []string{"ds", "--mds", mdsAddr, "--listen", "127.0.0.1:0",
			"--join-secret-file", filepath.Join(dir, "mds", "join-secret"),
			"--dir", filepath.Join(dir, fmt.Sprintf("ds%d", i)), "--log-level", "info"},
			filepath.Join(dir, fmt.Sprintf("ds%d.log", i)))
		if err != nil {
			return nil, err
		}
		procs = append(procs, d)
	}
	// StartDS returns once the MDS has the data server in service, and
	// only then does `shoal ds` log that it is ready.
	for i, d := range procs[1:] {
		if _, err := d.waitLog(ctx, "shoal ds ready", "listen"); err != nil {
			return nil, fmt.Errorf("shoal ds %d: %w", i, err)
		}
	}
	ep = &ClusterEndpoint{Addr: mdsAddr, Root: "/", Stop: stop}
	ep.Procs = append(ep.Procs, ServerProc{Role: RoleMDS, PID: mds.cmd.Process.Pid})
	for _, d := range procs[1:] {
		ep.Procs = append(ep.Procs, ServerProc{Role: RoleDS, PID: d.cmd.Process.Pid})
	}
	return ep, nil
}

// serverChild is one server process with its log file.
type serverChild struct {
	cmd    *exec.Cmd
	log    string
	exited chan struct{}
}

func startServerChild(exe string, args []string, logPath string) (*serverChild, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = childProcAttr()
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s %s: %w", exe, args[0], err)
	}
	c := &serverChild{cmd: cmd, log: logPath, exited: make(chan struct{})}
	go func() { cmd.Wait(); logf.Close(); close(c.exited) }()
	return c, nil
}

func (c *serverChild) stop(ctx context.Context) error {
	return terminate(ctx, c.cmd.Process, c.exited)
}

// waitLog polls the child's log for a line containing msg and returns the
// value of key=VALUE on it, bounded by startTimeout, ctx and the child's
// exit.
func (c *serverChild) waitLog(ctx context.Context, msg, key string) (string, error) {
	deadline := time.Now().Add(startTimeout)
	for time.Now().Before(deadline) {
		for _, line := range strings.Split(readFile(c.log), "\n") {
			if !strings.Contains(line, msg) {
				continue
			}
			for _, f := range strings.Fields(line) {
				if v, ok := strings.CutPrefix(f, key+"="); ok {
					return strings.Trim(v, `"`), nil
				}
			}
			return "", fmt.Errorf("ready line without %s=: %q", key, line)
		}
		select {
		case <-c.exited:
			return "", fmt.Errorf("exited during startup (log: %s%s)", c.log, tail(c.log))
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return "", fmt.Errorf("not ready within %v (log: %s%s)", startTimeout, c.log, tail(c.log))
}
