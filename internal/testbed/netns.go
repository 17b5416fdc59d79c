package testbed

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// netnsDir is where `ip netns add` pins named namespaces.
const netnsDir = "/run/netns"

// cmdTimeout bounds every ip/tc invocation: they are local and fast, so a
// hang means something is badly wrong and must not wedge `up` or `down`.
const cmdTimeout = 15 * time.Second

// run executes an ip/tc command and returns its error with the command line
// and stderr attached.
func run(ctx context.Context, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, cmdTimeout)
	defer cancel()
	c := exec.CommandContext(ctx, name, args...)
	var out, errb bytes.Buffer
	c.Stdout, c.Stderr = &out, &errb
	if err := c.Run(); err != nil {
		return out.String(), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return out.String(), nil
}

// listNamespaces returns the names of all named network namespaces.
func listNamespaces(ctx context.Context) ([]string, error) {
	out, err := run(ctx, "ip", "netns", "list")
	if err != nil {
		return nil, err
	}
	var names []string
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			names = append(names, f[0])
		}
	}
	return names, nil
}

// nsPIDs returns the processes living in namespace ns.
func nsPIDs(ctx context.Context, ns string) ([]int, error) {
	out, err := run(ctx, "ip", "netns", "pids", ns)
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, f := range strings.Fields(out) {
		var pid int
		if _, err := fmt.Sscanf(f, "%d", &pid); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// inNamespace runs fn on an OS thread switched into the named network
// namespace. Sockets created by fn stay in that namespace for their whole
// life, wherever the goroutines using them later run, which is what lets one
// process measure links between many namespaces without helper processes.
// The thread is switched back before it is released; if that fails the
// thread stays locked and the runtime discards it when the goroutine ends.
func inNamespace(ns string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("open current netns: %w", err)
			return
		}
		defer unix.Close(orig)
		target, err := unix.Open(filepath.Join(netnsDir, ns), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("open netns %s: %w", ns, err)
			return
		}
		defer unix.Close(target)
		if err := unix.Setns(target, unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("enter netns %s: %w", ns, err)
			return
		}
		ferr := fn()
		if err := unix.Setns(orig, unix.CLONE_NEWNET); err != nil {
			// Leave the thread locked: it exits with this goroutine.
			errc <- fmt.Errorf("leave netns %s: %w", ns, err)
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// DialIn opens a TCP connection to addr from inside network namespace ns.
func DialIn(ctx context.Context, ns, addr string) (net.Conn, error) {
	var c net.Conn
	err := inNamespace(ns, func() error {
		var d net.Dialer
		var err error
		c, err = d.DialContext(ctx, "tcp", addr)
		return err
	})
	return c, err
}

// listenIn opens a TCP listener on addr inside network namespace ns.
func listenIn(ns, addr string) (net.Listener, error) {
	var ln net.Listener
	err := inNamespace(ns, func() error {
		var err error
		ln, err = net.Listen("tcp", addr)
		return err
	})
	return ln, err
}

// namespaceExists reports whether a named namespace is pinned.
func namespaceExists(ns string) bool {
	_, err := os.Stat(filepath.Join(netnsDir, ns))
	return err == nil
}
