// Package ganeshatest runs NFS-Ganesha (Debian's nfs-ganesha with the VFS
// backend) as a real NFSv3 server for tests: the loosely coupled data
// servers of Shoal's flexible files layout.
//
// Ganesha cannot serve NFSv3 without registering it with a portmapper: it
// exits at start ("Cannot register NFS V3 on TCP") when no rpcbind
// answers, and it has no setting to skip the registration. A host-wide
// rpcbind is not something a test may start, so every server runs inside
// a network namespace the test creates ([NewNetns]), next to an rpcbind of
// its own that runs with a private /run (its unix socket would otherwise
// take the host's path). Ganesha finds no /run/rpcbind.sock there and
// registers over TCP with the namespace's 127.0.0.1:111. Inside a
// namespace Ganesha binds the wildcard address whatever Bind_addr says
// (and Bind_addr = 127.0.0.1 is refused there), which is harmless because
// nothing else is in it. MOUNT is served on the NFS port (MNT_Port = the
// NFS port), so one host:port names a data server.
//
// The test reaches the servers with [Netns.Dial], which opens the socket
// from inside the namespace. Processes are started by PID and killed by
// PID at Close.
package ganeshatest

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/shoalfs/shoal/internal/testbed"
)

// Available reports why Ganesha cannot run here ("" when it can): it
// needs root, ganesha.nfsd, rpcbind and ip.
func Available() string {
	if os.Geteuid() != 0 {
		return "needs root (network namespaces)"
	}
	for _, b := range []string{"ganesha.nfsd", "rpcbind", "ip", "unshare"} {
		if _, err := exec.LookPath(b); err != nil {
			return b + " not installed"
		}
	}
	if _, err := os.Stat("/usr/lib/x86_64-linux-gnu/ganesha/libfsalvfs.so"); err != nil {
		if m, _ := filepath.Glob("/usr/lib/*/ganesha/libfsalvfs.so"); len(m) == 0 {
			return "nfs-ganesha-vfs not installed"
		}
	}
	return ""
}

// Netns is a network namespace with loopback up and an rpcbind of its own.
type Netns struct {
	Name    string
	owned   bool
	rpcbind *proc
}

// proc is a process the package started; one goroutine waits for it and
// closes done.
type proc struct {
	cmd  *exec.Cmd
	done chan struct{}
}

func startProc(c *exec.Cmd) (*proc, error) {
	if err := c.Start(); err != nil {
		return nil, err
	}
	p := &proc{cmd: c, done: make(chan struct{})}
	go func() {
		c.Wait()
		close(p.done)
	}()
	return p, nil
}

// NewNetns creates namespace name (which must not exist), brings up its
// loopback and starts its rpcbind.
func NewNetns(ctx context.Context, name string) (*Netns, error) {
	if out, err := exec.CommandContext(ctx, "ip", "netns", "add", name).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("ganeshatest: ip netns add %s: %v: %s", name, err, out)
	}
	n := &Netns{Name: name, owned: true}
	if out, err := exec.CommandContext(ctx, "ip", "-n", name, "link", "set", "lo", "up").CombinedOutput(); err != nil {
		n.Close()
		return nil, fmt.Errorf("ganeshatest: lo up in %s: %v: %s", name, err, out)
	}
	if err := n.StartRpcbind(ctx); err != nil {
		n.Close()
		return nil, err
	}
	return n, nil
}

// UseNetns wraps an existing namespace (one a test harness created for
// other reasons) and starts an rpcbind in it; Close stops the rpcbind but
// leaves the namespace.
func UseNetns(ctx context.Context, name string) (*Netns, error) {
	n := &Netns{Name: name}
	if err := n.StartRpcbind(ctx); err != nil {
		return nil, err
	}
	return n, nil
}

// StartRpcbind starts rpcbind in the namespace with a private /run and
// waits until it accepts connections on 127.0.0.1:111.
func (n *Netns) StartRpcbind(ctx context.Context) error {
	// ip netns exec and unshare exec their command, and sh execs
	// rpcbind: the PID started is rpcbind's.
	c := exec.Command("ip", "netns", "exec", n.Name, "unshare", "--mount", "--propagation", "private",
		"sh", "-c", "mount -t tmpfs shoal-rpcbind /run && exec rpcbind -f")
	var errb lockedBuffer
	c.Stderr = &errb
	p, err := startProc(c)
	if err != nil {
		return fmt.Errorf("ganeshatest: start rpcbind: %w", err)
	}
	n.rpcbind = p
	if err := n.waitListening(ctx, "127.0.0.1:111", p); err != nil {
		return fmt.Errorf("ganeshatest: rpcbind: %w: %s", err, errb.String())
	}
	return nil
}

// Dial opens a TCP connection to addr from inside the namespace.
func (n *Netns) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	return testbed.DialIn(ctx, n.Name, addr)
}

// waitListening dials addr until it answers, p exits, or 30 s pass
// (bounded: 300 tries).
func (n *Netns) waitListening(ctx context.Context, addr string, p *proc) error {
	for range 300 {
		c, err := n.Dial(ctx, "tcp", addr)
		if err == nil {
			c.Close()
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("process %d exited before listening on %s", p.cmd.Process.Pid, addr)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("nothing listens on %s after 30 s", addr)
}

// Close stops the namespace's rpcbind and, if NewNetns created it, deletes
// the namespace. Servers must be stopped first.
func (n *Netns) Close() error {
	stop(n.rpcbind)
	n.rpcbind = nil
	if n.owned {
		if out, err := exec.Command("ip", "netns", "del", n.Name).CombinedOutput(); err != nil {
			return fmt.Errorf("ganeshatest: ip netns del %s: %v: %s", n.Name, err, out)
		}
	}
	return nil
}

// stop sends p SIGTERM and waits for it to exit, killing it after 10 s.
func stop(p *proc) {
	if p == nil {
		return
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
	}
}

// lockedBuffer collects a process's output while it runs.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Server is one running ganesha.nfsd serving Export over NFSv3 (and
// MOUNT) on Port, inside a Netns.
type Server struct {
	Dir       string // the server's folder: config, log, recovery
	Export    string // the exported directory on the host
	Port      int
	MountPort int    // Port+1
	Path      string // the export's path as clients mount it
	cmd       *proc
}

// Addr is the server's host:port inside its namespace.
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.Port)) }

// MountAddr is the host:port of the server's MOUNT service.
func (s *Server) MountAddr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.MountPort)) }

// Log returns the server's log so far.
func (s *Server) Log() string {
	b, _ := os.ReadFile(filepath.Join(s.Dir, "ganesha.log"))
	return string(b)
}

// Start writes a configuration under dir, exporting dir/export over NFSv3
// with AUTH_SYS and no root squashing, starts ganesha.nfsd in n on port
// and waits until it accepts connections. Start servers of one namespace
// one after the other: two registering with rpcbind at once have been
// seen to fail.
func Start(ctx context.Context, n *Netns, dir string, port int) (*Server, error) {
	s := &Server{Dir: dir, Export: filepath.Join(dir, "export"), Port: port, MountPort: port + 1, Path: filepath.Join(dir, "export")}
	for _, d := range []string{s.Export, filepath.Join(dir, "recov")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("ganeshatest: %w", err)
		}
	}
	conf := filepath.Join(dir, "ganesha.conf")
	if err := os.WriteFile(conf, []byte(Config(dir, port)), 0o644); err != nil {
		return nil, fmt.Errorf("ganeshatest: %w", err)
	}
	c := exec.Command("ip", "netns", "exec", n.Name, "ganesha.nfsd", "-F", "-f", conf,
		"-L", filepath.Join(dir, "ganesha.log"), "-p", filepath.Join(dir, "ganesha.pid"), "-N", "NIV_EVENT")
	var errb lockedBuffer
	c.Stdout, c.Stderr = &errb, &errb
	p, err := startProc(c)
	if err != nil {
		return nil, fmt.Errorf("ganeshatest: start ganesha: %w", err)
	}
	s.cmd = p
	if err := n.waitListening(ctx, s.Addr(), p); err != nil {
		s.Stop()
		return nil, fmt.Errorf("ganeshatest: ganesha on %d: %w: %s\n%s", port, err, errb.String(), lastLines(s.Log(), 15))
	}
	return s, nil
}

// Config is the ganesha.conf Start writes: NFSv3 only, TCP only, MOUNT
// on the NFS port, no NLM, RQUOTA or UDP (each would want its own
// portmapper registration), one VFS export of dir/export at its own path.
func Config(dir string, port int) string {
	return fmt.Sprintf(`NFS_CORE_PARAM {
	NFS_Port = %[2]d;
	MNT_Port = %[3]d;
	Protocols = 3;
	Enable_NLM = false;
	Enable_RQUOTA = false;
	Enable_UDP = false;
}
NFSV4 { Graceless = true; RecoveryBackend = fs; RecoveryRoot = %[1]s/recov; }
NFS_KRB5 { Active_krb5 = false; }
EXPORT {
	Export_Id = 1;
	Path = %[1]s/export;
	Pseudo = /export;
	Protocols = 3;
	Transports = TCP;
	Access_Type = RW;
	Squash = No_Root_Squash;
	SecType = sys;
	FSAL { Name = VFS; }
}
`, dir, port, port+1)
}

// Stop kills the server by its PID and waits for it.
func (s *Server) Stop() {
	stop(s.cmd)
	s.cmd = nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
