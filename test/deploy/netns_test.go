package deploy

import (
	"context"
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
	"time"

	"github.com/vishvananda/netns"
)

// The page's network, made of namespaces: one per machine, each with its
// own loopback and an eth0 holding the machine's address from the page,
// and one more (the switch) holding a bridge that every eth0's peer is
// attached to. Nothing is added to the host's own namespace, so the
// page's addresses (192.0.2.0/24, TEST-NET-1) and ports are used as they
// are, and shoal vip can add and remove the service address on eth0 as it
// would on a real machine.

// netnsDir is where `ip netns add` keeps its namespaces.
const netnsDir = "/run/netns"

// network creates the switch and one namespace per machine, deleted when
// the test ends (after the processes in them are stopped: registered
// before them).
func (w *world) network() {
	w.t.Helper()
	w.sweepNetns()
	base := fmt.Sprintf("shoaldep%d", os.Getpid())
	sw := base + "-sw"
	w.addNetns(sw)
	w.ip("-n", sw, "link", "add", "br0", "type", "bridge")
	w.ip("-n", sw, "link", "set", "br0", "up")
	for _, m := range w.machines {
		m.netns = base + "-" + m.name
		w.addNetns(m.netns)
		peer := "v-" + m.name
		w.ip("link", "add", "eth0", "netns", m.netns, "type", "veth", "peer", "name", peer, "netns", sw)
		w.ip("-n", sw, "link", "set", peer, "master", "br0", "up")
		w.ip("-n", m.netns, "addr", "add", m.docIP+"/24", "dev", "eth0")
		w.ip("-n", m.netns, "link", "set", "eth0", "up")
		w.ip("-n", m.netns, "link", "set", "lo", "up")
	}
	w.t.Logf("machines: network namespaces %s-*, on a bridge in %s", base, sw)
}

// staleNetnsRe names the namespaces of a run of this test, with its PID.
var staleNetnsRe = regexp.MustCompile(`^shoaldep(\d+)-`)

// sweepNetns deletes the namespaces a run of this test left behind when it
// was killed before its cleanup: those of a PID that no longer runs.
func (w *world) sweepNetns() {
	ents, _ := os.ReadDir(netnsDir)
	for _, e := range ents {
		m := staleNetnsRe.FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		pid, err := strconv.Atoi(m[1])
		if err != nil || pid == os.Getpid() || !errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
			continue
		}
		if out, err := exec.Command("ip", "netns", "del", e.Name()).CombinedOutput(); err != nil {
			w.t.Logf("ip netns del %s (left by an earlier run): %v: %s", e.Name(), err, out)
			continue
		}
		w.t.Logf("deleted network namespace %s, left by an earlier run (pid %d)", e.Name(), pid)
	}
}

func (w *world) addNetns(name string) {
	w.t.Helper()
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		w.t.Fatalf("ip netns add %s: %v: %s", name, err, out)
	}
	w.t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			w.t.Errorf("ip netns del %s: %v: %s", name, err, out)
		}
	})
}

func (w *world) ip(args ...string) {
	w.t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		w.t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// command is name args run in machine m's network namespace. nsenter
// enters only the network namespace and then executes the command in its
// own process, so the PID is the command's, and mounts (FUSE) are the
// host's.
func (m *machine) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "nsenter", append([]string{"--net=" + filepath.Join(netnsDir, m.netns), "--", name}, args...)...)
}

// hasAddr reports whether m's eth0 carries addr (a.b.c.d).
func (w *world) hasAddr(m *machine, addr string) bool {
	w.t.Helper()
	out, err := exec.Command("ip", "-n", m.netns, "-4", "-o", "addr", "show", "dev", "eth0").CombinedOutput()
	if err != nil {
		w.t.Fatalf("ip -n %s addr show dev eth0: %v: %s", m.netns, err, out)
	}
	return strings.Contains(string(out), " "+addr+"/")
}

// dialIn opens a TCP connection from m's network namespace: the socket is
// created on a thread that has entered the namespace, and stays in it.
func dialIn(ctx context.Context, m *machine, network, addr string) (net.Conn, error) {
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return nil, err
	}
	defer orig.Close()
	target, err := netns.GetFromName(m.netns)
	if err != nil {
		runtime.UnlockOSThread()
		return nil, err
	}
	defer target.Close()
	if err := netns.Set(target); err != nil {
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("enter %s: %w", m.netns, err)
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, network, addr)
	if serr := netns.Set(orig); serr != nil {
		// The thread stays locked, and so is discarded with this
		// goroutine rather than reused in the wrong namespace.
		if conn != nil {
			conn.Close()
		}
		return nil, fmt.Errorf("return from %s: %w", m.netns, serr)
	}
	runtime.UnlockOSThread()
	return conn, err
}

// httpGet returns the body at url, fetched from m's network namespace.
func httpGet(m *machine, url string) (string, error) {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return dialIn(ctx, m, network, addr)
		},
		DisableKeepAlives: true,
	}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return string(b), nil
}
