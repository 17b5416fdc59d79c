package kernel

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// server is an NFSv4.1+ server under test, serving one directory on one
// loopback port. Start must also work after Kill, on the same directory and
// port: that is the server-crash step of the workload.
type server interface {
	// Start starts the server and returns once its port accepts TCP.
	Start(ctx context.Context) error
	// Kill crashes the server with SIGKILL and waits until it is gone.
	Kill() error
	// Stop shuts the server down cleanly; it is a no-op if not running.
	Stop() error
	// ExportPath is the path the client mounts, e.g. "/export".
	ExportPath() string
	// Describe names the server and where its logs are, for failures.
	Describe() string
}

var (
	_ server = (*ganeshaServer)(nil)
	_ server = (*processServer)(nil)
	_ server = (*pnfsServer)(nil)
)

// startTimeout bounds how long a server may take to open its port.
const startTimeout = 30 * time.Second

// ganeshaServer runs NFS-Ganesha through scripts/ganesha.sh, which owns the
// configuration and the pid file (the process is not our child: it is
// started with setsid so that it behaves like a daemon).
type ganeshaServer struct {
	script string // path of scripts/ganesha.sh
	dir    string // instance dir: ganesha.conf, ganesha.log, export/, recov/
	port   int
}

func (g *ganeshaServer) run(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "bash", append([]string{g.script}, args...)...)
	// Ganesha's graceless mode answers lock reclaims after a restart with
	// NFS4ERR_NO_GRACE, so the client silently loses its locks and the
	// crash/live step fails. A short grace period keeps reclaim working;
	// Ganesha lifts it early once all known clients sent RECLAIM_COMPLETE,
	// and at once on a fresh start with no clients to wait for.
	cmd.Env = os.Environ()
	if os.Getenv("GANESHA_GRACE") == "" {
		cmd.Env = append(cmd.Env, "GANESHA_GRACE=15")
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("ganesha.sh %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

func (g *ganeshaServer) Start(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, startTimeout+10*time.Second)
	defer cancel()
	_, err := g.run(ctx, "start", g.dir, strconv.Itoa(g.port))
	return err
}

func (g *ganeshaServer) Kill() error {
	_, err := g.run(context.Background(), "kill", g.dir)
	return err
}

func (g *ganeshaServer) Stop() error {
	_, err := g.run(context.Background(), "stop", g.dir)
	return err
}

func (g *ganeshaServer) ExportPath() string { return "/export" }

func (g *ganeshaServer) Describe() string {
	return fmt.Sprintf("nfs-ganesha on 127.0.0.1:%d (log %s)", g.port, filepath.Join(g.dir, "ganesha.log"))
}

// processServer runs a server command as a child process: `shoal serve`,
// or any command given by SHOAL_KERNEL_SERVER_CMD. Kill sends SIGKILL to
// the process it started, by pid.
type processServer struct {
	name   string
	argv   []string
	dir    string // passed to the command; the log goes next to it
	port   int
	export string
	// ready, if set, is the prefix of the output line the server prints
	// once it is fully in service; Start waits for it instead of only for
	// the port (`shoal up` opens the MDS port before its data servers have
	// registered).
	ready string

	readyLine string // the last ready line seen
	cmd       *exec.Cmd
	exited    chan struct{} // closed when cmd has been waited for
	log       *os.File
}

func (p *processServer) Start(ctx context.Context) error {
	if p.cmd != nil {
		return errors.New(p.name + ": already running")
	}
	logPath := p.dir + ".log"
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("%s: open log: %w", p.name, err)
	}
	fmt.Fprintf(f, "=== %s: %s\n", time.Now().UTC().Format(time.RFC3339), strings.Join(p.argv, " "))
	cmd := exec.Command(p.argv[0], p.argv[1:]...)
	var tap *lineTap
	if p.ready != "" {
		tap = &lineTap{w: f, prefix: p.ready, found: make(chan string, 1)}
		cmd.Stdout, cmd.Stderr = tap, tap
	} else {
		cmd.Stdout, cmd.Stderr = f, f
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("%s: start: %w", p.name, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	p.cmd, p.exited, p.log = cmd, exited, f
	if tap != nil {
		line, err := waitLine(ctx, tap.found, exited)
		if err != nil {
			_ = p.Kill()
			return fmt.Errorf("%s: %w (log %s)", p.name, err, logPath)
		}
		p.readyLine = line
	}
	if err := waitPort(ctx, p.port, exited); err != nil {
		_ = p.Kill()
		return fmt.Errorf("%s: %w (log %s)", p.name, err, logPath)
	}
	return nil
}

// waitLine waits for the ready line, the process's exit or the start
// timeout.
func waitLine(ctx context.Context, found <-chan string, exited <-chan struct{}) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	select {
	case l := <-found:
		return l, nil
	case <-exited:
		return "", errors.New("exited before printing its ready line")
	case <-ctx.Done():
		return "", fmt.Errorf("no ready line: %w", ctx.Err())
	}
}

// lineTap copies a child's output to its log and reports the first line
// that starts with prefix. exec.Cmd calls Write from one goroutine.
type lineTap struct {
	w      io.Writer
	prefix string
	found  chan string // buffered, receives one line
	buf    []byte
	done   bool
}

func (l *lineTap) Write(p []byte) (int, error) {
	n, err := l.w.Write(p)
	if l.done {
		return n, err
	}
	l.buf = append(l.buf, p...)
	for {
		i := bytes.IndexByte(l.buf, '\n')
		if i < 0 {
			break
		}
		line := string(l.buf[:i])
		l.buf = l.buf[i+1:]
		if strings.HasPrefix(line, l.prefix) {
			l.found <- line
			l.done, l.buf = true, nil
			break
		}
	}
	return n, err
}

func (p *processServer) Kill() error { return p.signal(syscall.SIGKILL, 0) }

func (p *processServer) Stop() error { return p.signal(syscall.SIGTERM, 10*time.Second) }

// signal sends sig to the server and waits for it to exit, escalating to
// SIGKILL after grace.
func (p *processServer) signal(sig syscall.Signal, grace time.Duration) error {
	if p.cmd == nil {
		return nil
	}
	defer func() {
		p.log.Close()
		p.cmd, p.exited, p.log = nil, nil, nil
	}()
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.exited:
		return nil
	case <-time.After(grace):
	}
	_ = p.cmd.Process.Kill()
	select {
	case <-p.exited:
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("%s: pid %d did not exit after SIGKILL", p.name, p.cmd.Process.Pid)
	}
}

func (p *processServer) ExportPath() string { return p.export }

func (p *processServer) Describe() string {
	return fmt.Sprintf("%s on 127.0.0.1:%d (log %s.log)", p.name, p.port, p.dir)
}

// waitPort polls until 127.0.0.1:port accepts a TCP connection, the
// process exits (exited closes) or ctx/startTimeout expires.
func waitPort(ctx context.Context, port int, exited <-chan struct{}) error {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		select {
		case <-exited:
			return errors.New("exited before opening " + addr)
		case <-ctx.Done():
			return fmt.Errorf("%s not accepting connections: %w", addr, ctx.Err())
		case <-tick.C:
		}
	}
}

// freePort asks the kernel for an unused loopback port. The port is
// released before the server binds it; on this machine that race is
// harmless, and a bind failure shows up as a start error.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// expandArgs substitutes {port} and {dir} in a command template.
func expandArgs(tmpl string, port int, dir string) []string {
	r := strings.NewReplacer("{port}", strconv.Itoa(port), "{dir}", dir)
	return strings.Fields(r.Replace(tmpl))
}
