package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/shoalfs/shoal/server"
)

// Starter brings up one server under test.
type Starter interface {
	// Start starts the server (or finds it) and returns how to reach it.
	// An error wrapping ErrUnavailable means the target cannot run on this
	// machine; the report records it as skipped rather than failed.
	Start(ctx context.Context) (*Endpoint, error)
}

// ErrUnavailable marks a target that cannot run here (not installed, not
// root, ...). It is a note in the report, not a failure.
var ErrUnavailable = errors.New("target unavailable")

// Endpoint is a running server.
type Endpoint struct {
	// Addr is the server's host:port.
	Addr string
	// Root is the directory of the server's pseudo file system that the
	// benchmark works under, such as "/export".
	Root string
	// PID is the server's process id when it is a separate process, so its
	// CPU time can be read from /proc; 0 otherwise.
	PID int
	// Profile is where the server's CPU profile will be once Stop returned;
	// empty if it is not profiled.
	Profile string
	// Stop shuts the server down and releases what Start created. Nil for
	// servers the benchmark did not start.
	Stop func(ctx context.Context) error
}

var (
	_ Starter = (*ShoalProcess)(nil)
	_ Starter = (*Ganesha)(nil)
	_ Starter = Existing{}
	_ Starter = (*ShoalInProcess)(nil)
)

// stopGrace is how long a server gets to exit after SIGTERM before SIGKILL.
const stopGrace = 15 * time.Second

// startTimeout bounds how long a server may take to accept connections.
const startTimeout = 30 * time.Second

// ShoalProcess runs `Exe serve` as a child process on a free loopback port.
type ShoalProcess struct {
	// Exe is the shoal binary, normally os.Executable().
	Exe string
	// Dir is the server's data directory; its log goes next to it.
	Dir string
	// CPUProfile, if set, is passed to `shoal serve --cpuprofile`.
	CPUProfile string
	// LogLevel of the server (default "warn").
	LogLevel string
	// Args are extra flags of `shoal serve`, such as --sync=false.
	Args []string
}

// Start implements Starter.
func (s *ShoalProcess) Start(ctx context.Context) (*Endpoint, error) {
	if err := os.MkdirAll(s.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("shoal: %w", err)
	}
	level := s.LogLevel
	if level == "" {
		level = "warn"
	}
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ { // the free port may be taken between probe and bind
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		args := []string{"serve", "--listen", addr, "--dir", filepath.Join(s.Dir, "data"),
			"--no-root-squash", "--log-level", level}
		if s.CPUProfile != "" {
			args = append(args, "--cpuprofile", s.CPUProfile)
		}
		args = append(args, s.Args...)
		logPath := filepath.Join(s.Dir, "serve.log")
		logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return nil, fmt.Errorf("shoal: %w", err)
		}
		cmd := exec.Command(s.Exe, args...)
		cmd.Stdout, cmd.Stderr = logf, logf
		cmd.SysProcAttr = childProcAttr()
		if err := cmd.Start(); err != nil {
			logf.Close()
			return nil, fmt.Errorf("shoal: start %s: %w", s.Exe, err)
		}
		exited := make(chan struct{})
		go func() { cmd.Wait(); logf.Close(); close(exited) }()
		stop := func(ctx context.Context) error { return terminate(ctx, cmd.Process, exited) }
		if err := waitListening(ctx, addr, exited); err != nil {
			stop(context.WithoutCancel(ctx))
			lastErr = fmt.Errorf("shoal serve: %w (log: %s%s)", err, logPath, tail(logPath))
			if ctx.Err() != nil {
				break
			}
			continue
		}
		return &Endpoint{Addr: addr, Root: "/", PID: cmd.Process.Pid, Profile: s.CPUProfile, Stop: stop}, nil
	}
	return nil, lastErr
}

// terminate sends SIGTERM to p, waits for it to exit, and SIGKILLs it
// after stopGrace or when ctx ends.
func terminate(ctx context.Context, p *os.Process, exited <-chan struct{}) error {
	select {
	case <-exited:
		return nil
	default:
	}
	if err := p.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("signal pid %d: %w", p.Pid, err)
	}
	t := time.NewTimer(stopGrace)
	defer t.Stop()
	select {
	case <-exited:
		return nil
	case <-t.C:
	case <-ctx.Done():
	}
	p.Kill()
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		return fmt.Errorf("pid %d did not exit after SIGKILL", p.Pid)
	}
	return fmt.Errorf("pid %d did not exit on SIGTERM within %v; killed", p.Pid, stopGrace)
}

// Ganesha runs NFS-Ganesha through scripts/ganesha.sh.
type Ganesha struct {
	// Script is the path of scripts/ganesha.sh.
	Script string
	// Dir holds the instance's configuration, log and export.
	Dir string
}

// Start implements Starter.
func (g *Ganesha) Start(ctx context.Context) (*Endpoint, error) {
	if _, err := exec.LookPath("ganesha.nfsd"); err != nil {
		return nil, fmt.Errorf("%w: ganesha.nfsd is not installed (apt-get install nfs-ganesha nfs-ganesha-vfs)", ErrUnavailable)
	}
	if g.Script == "" {
		return nil, fmt.Errorf("%w: scripts/ganesha.sh not found (run from the repository or pass --ganesha-script)", ErrUnavailable)
	}
	if _, err := os.Stat(g.Script); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("%w: NFS-Ganesha needs root", ErrUnavailable)
	}
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		out, err := exec.CommandContext(ctx, g.Script, "start", g.Dir, strconv.Itoa(port)).CombinedOutput()
		if err != nil {
			g.stop(context.WithoutCancel(ctx))
			lastErr = fmt.Errorf("ganesha.sh start: %w: %s", err, strings.TrimSpace(string(out)))
			if ctx.Err() != nil {
				break
			}
			continue
		}
		pid, _ := strconv.Atoi(strings.TrimSpace(readFile(filepath.Join(g.Dir, "ganesha.pid"))))
		return &Endpoint{
			Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
			Root: "/export",
			PID:  pid,
			Stop: g.stop,
		}, nil
	}
	return nil, lastErr
}

func (g *Ganesha) stop(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, g.Script, "stop", g.Dir).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ganesha.sh stop: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Existing is a server the benchmark did not start.
type Existing struct {
	Addr string
	Root string // default "/"
	// PID, if the server runs on this machine, lets the report include
	// its CPU time.
	PID int
}

// Start implements Starter: it only checks that the address accepts TCP.
func (e Existing) Start(ctx context.Context) (*Endpoint, error) {
	d := net.Dialer{Timeout: 10 * time.Second}
	c, err := d.DialContext(ctx, "tcp", e.Addr)
	if err != nil {
		return nil, err
	}
	c.Close()
	root := e.Root
	if root == "" {
		root = "/"
	}
	return &Endpoint{Addr: e.Addr, Root: root, PID: e.PID}, nil
}

// ShoalInProcess runs a Shoal server inside the calling process, on a free
// loopback port. Its CPU time is not separable from the client's.
type ShoalInProcess struct {
	Dir    string
	Logger *slog.Logger // default: discard
}

// Start implements Starter.
func (s *ShoalInProcess) Start(ctx context.Context) (*Endpoint, error) {
	log := s.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	f := false
	srv, err := server.New(server.Config{
		Dir:     s.Dir,
		Exports: []*server.Export{{Path: "/", RootSquash: &f}},
		Logger:  log,
	})
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		srv.Close()
		return nil, err
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	stop := func(context.Context) error {
		err := srv.Close()
		<-done
		return err
	}
	return &Endpoint{Addr: ln.Addr().String(), Root: "/", Stop: stop}, nil
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// waitListening polls addr until it accepts TCP, the process exits, ctx
// ends or startTimeout passes.
func waitListening(ctx context.Context, addr string, exited <-chan struct{}) error {
	deadline := time.Now().Add(startTimeout)
	for i := 0; time.Now().Before(deadline); i++ {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		select {
		case <-exited:
			return errors.New("exited during startup")
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return fmt.Errorf("did not accept connections on %s within %v", addr, startTimeout)
}

func readFile(path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}

// tail returns the last lines of a log file for an error message.
func tail(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	b, _ := io.ReadAll(io.LimitReader(f, 1<<20))
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > 5 {
		lines = lines[len(lines)-5:]
	}
	if len(lines) == 0 || lines[0] == "" {
		return ""
	}
	return ":\n" + strings.Join(lines, "\n")
}

// FindScript looks for rel (such as "scripts/ganesha.sh") in the working
// directory and its parents, then next to the executable and its parents,
// so `shoal bench` works from anywhere inside a checkout.
func FindScript(rel string) string {
	var starts []string
	if wd, err := os.Getwd(); err == nil {
		starts = append(starts, wd)
	}
	if exe, err := os.Executable(); err == nil {
		starts = append(starts, filepath.Dir(exe))
	}
	for _, dir := range starts {
		for i := 0; i < 8; i++ {
			p := filepath.Join(dir, rel)
			if st, err := os.Stat(p); err == nil && !st.IsDir() {
				return p
			}
			parent := filepath.Dir(dir)
			if parent == dir {
				break
			}
			dir = parent
		}
	}
	return ""
}
