// Package readme tests the README's run command the way a new user meets
// it: the command is read from README.md, run, and each command that
// `shoal up` prints when it is ready is pasted into a shell as printed.
// Then the cluster gets SIGINT or SIGTERM, must exit 0, and must have freed
// every port it listened on.
//
// Two substitutions keep the test off the machine's shared state, and are
// the only ones: the binary the README builds into /usr/local/bin is built
// into a temporary bin directory that is put first on PATH, and the cluster
// listens on 127.0.0.1:0 in a temporary --dir instead of 127.0.0.1:2049 and
// /tmp/shoal. The printed mount command needs a kernel NFS client, which
// the host has none of (test/kernel mounts from qemu); it is checked for
// its form only.
package readme

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

// runCommand finds the README's run command: the first line of the first
// sh block that starts the cluster.
func runCommand(t *testing.T, root string) (build, up []string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	block := regexp.MustCompile("(?s)```sh\n(.*?)```").FindSubmatch(b)
	if block == nil {
		t.Fatal("README.md has no sh block")
	}
	for _, line := range strings.Split(string(block[1]), "\n") {
		if strings.HasPrefix(line, "#") || !strings.Contains(line, "shoal up") {
			continue
		}
		parts := strings.Split(line, "&&")
		if len(parts) != 2 {
			t.Fatalf("README run command %q: want BUILD && shoal up ...", line)
		}
		return strings.Fields(parts[0]), strings.Fields(parts[1])
	}
	t.Fatal("README.md's sh block has no shoal up command")
	return nil, nil
}

func repoRoot(t *testing.T) string {
	t.Helper()
	out, err := exec.Command(goTool(), "env", "GOMOD").Output()
	if err != nil {
		t.Fatalf("go env GOMOD: %v", err)
	}
	return filepath.Dir(strings.TrimSpace(string(out)))
}

func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return filepath.Join(runtime.GOROOT(), "bin", "go")
}

// substitute applies the test's two substitutions to the README's words.
func substitute(words []string, bin, dir string) []string {
	var out []string
	for _, w := range words {
		switch w {
		case "/usr/local/bin/shoal":
			w = filepath.Join(bin, "shoal")
		case "/tmp/shoal":
			w = dir
		}
		out = append(out, w)
	}
	return out
}

var (
	readyLine  = regexp.MustCompile(`^shoal up: ready: MDS (\S+), \d+ data servers \[([^\]]*)\]`)
	printedCmd = regexp.MustCompile(`^  (mount|files|bench|admin|stop):\s+(.*)$`)
)

type cluster struct {
	cmd     *exec.Cmd
	done    chan struct{}     // closed once the process and its output are done
	waitErr error             // Wait's result, once done is closed
	addrs   []string          // every address it listens on
	cmds    map[string]string // printed commands by label
}

// start runs the README's command line and waits for the ready lines.
func start(t *testing.T, dir, name string, args []string, env []string) *cluster {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = env
	cmd.Stderr = &logWriter{t: t}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &cluster{cmd: cmd, done: make(chan struct{}), cmds: map[string]string{}}
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			t.Log("up:", line)
			if m := readyLine.FindStringSubmatch(line); m != nil {
				c.addrs = append([]string{m[1]}, strings.Fields(m[2])...)
			}
			if m := printedCmd.FindStringSubmatch(line); m != nil {
				c.cmds[m[1]] = m[2]
				if m[1] == "stop" {
					close(ready)
				}
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
		c.waitErr = cmd.Wait()
		close(c.done)
	}()
	t.Cleanup(func() {
		// Only the process this test started, by PID.
		select {
		case <-c.done:
		default:
			_ = cmd.Process.Kill()
			select {
			case <-c.done:
			case <-time.After(time.Minute):
				t.Errorf("%s (pid %d) or a child holding its output still running a minute after SIGKILL", name, cmd.Process.Pid)
			}
		}
	})
	select {
	case <-ready:
	case <-c.done:
		t.Fatalf("%s exited before it was ready: %v", name, c.waitErr)
	case <-time.After(3 * time.Minute):
		t.Fatalf("%s not ready after 3 minutes", name)
	}
	return c
}

// stop sends sig to the process the test started and waits for it and
// everything holding its output to exit; clean asks for exit status 0.
func (c *cluster) stop(t *testing.T, sig syscall.Signal, clean bool) {
	t.Helper()
	if err := c.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	select {
	case <-c.done:
		if c.waitErr != nil && clean {
			t.Fatalf("after %v: exit %v", sig, c.waitErr)
		}
	case <-time.After(90 * time.Second):
		t.Fatalf("still running 90 s after %v", sig)
	}
}

// portsFree checks that every address can be listened on again.
func portsFree(t *testing.T, addrs []string) {
	t.Helper()
	if len(addrs) == 0 {
		t.Fatal("no addresses from the ready line")
	}
	for _, a := range addrs {
		ln, err := net.Listen("tcp", a)
		if err != nil {
			t.Errorf("port of %s not freed: %v", a, err)
			continue
		}
		ln.Close()
	}
}

func TestREADME(t *testing.T) {
	root := repoRoot(t)
	buildWords, upWords := runCommand(t, root)
	bin := t.TempDir()
	build := substitute(buildWords, bin, "")
	if build[0] != "go" {
		t.Fatalf("README build command %q: want go build", build)
	}
	cmd := exec.Command(goTool(), build[1:]...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(build, " "), err, out)
	}
	env := append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"))

	// The binary the README builds knows the commit it was built from
	// (GOFLAGS may say -buildvcs=false, as on these machines; the README's
	// build overrides it). Go stamps a checkout whose .git is a directory,
	// not a git worktree's .git file.
	head, err := exec.Command("git", "-C", root, "rev-parse", "HEAD").Output()
	if fi, serr := os.Stat(filepath.Join(root, ".git")); err == nil && serr == nil && fi.IsDir() {
		out, err := exec.Command(filepath.Join(bin, "shoal"), "version").Output()
		if err != nil {
			t.Fatalf("shoal version: %v", err)
		}
		if !strings.Contains(string(out), "commit "+strings.TrimSpace(string(head))) {
			t.Errorf("shoal version does not name HEAD %s:\n%s", head, out)
		}
	}

	up := func(t *testing.T) []string {
		w := substitute(upWords, bin, filepath.Join(t.TempDir(), "shoal"))
		if w[0] != "shoal" || w[1] != "up" {
			t.Fatalf("README run command %q: want shoal up", w)
		}
		return append(w[1:], "--listen", "127.0.0.1:0")
	}

	t.Run("printed-commands/SIGINT", func(t *testing.T) {
		c := start(t, root, filepath.Join(bin, "shoal"), up(t), env)
		mds := c.addrs[0]
		host, port, _ := net.SplitHostPort(mds)
		if want := fmt.Sprintf("mount -t nfs4 -o vers=4.2,port=%s %s:/ /mnt", port, host); c.cmds["mount"] != want {
			t.Errorf("mount line %q, want %q", c.cmds["mount"], want)
		}
		for _, label := range []string{"files", "admin", "bench"} {
			line := c.cmds[label]
			if !strings.HasPrefix(line, "shoal ") {
				t.Errorf("%s: %q does not start with shoal", label, line)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			run := exec.CommandContext(ctx, "bash", "-c", line)
			run.Env = env
			out, err := run.CombinedOutput()
			cancel()
			if err != nil {
				t.Errorf("%s: %q: %v\n%s", label, line, err, out)
				continue
			}
			t.Logf("%s: %s\n%s", label, line, out)
		}
		if !strings.Contains(c.cmds["stop"], fmt.Sprint(c.cmd.Process.Pid)) {
			t.Errorf("stop line %q does not name pid %d", c.cmds["stop"], c.cmd.Process.Pid)
		}
		c.stop(t, syscall.SIGINT, true)
		portsFree(t, c.addrs)
	})

	t.Run("SIGTERM", func(t *testing.T) {
		c := start(t, root, filepath.Join(bin, "shoal"), up(t), env)
		c.stop(t, syscall.SIGTERM, true)
		portsFree(t, c.addrs)
	})

	// go run does not forward signals to the program it runs; killing the
	// go process must still stop the cluster (shoal asks for SIGTERM when
	// its parent dies, under go run only).
	t.Run("go-run/SIGTERM-to-go", func(t *testing.T) {
		args := append([]string{"run", "./cmd/shoal"}, up(t)...)
		c := start(t, root, goTool(), args, env)
		// The go process is c.cmd; shoal is its child, found through
		// the stop line's PID and checked to be go's child.
		m := regexp.MustCompile(`kill (\d+)`).FindStringSubmatch(c.cmds["stop"])
		if m == nil {
			t.Fatalf("stop line %q names no pid", c.cmds["stop"])
		}
		child := "/proc/" + m[1]
		stat, err := os.ReadFile(child + "/stat")
		if err != nil {
			t.Fatal(err)
		}
		if f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:])); len(f) < 2 || f[1] != fmt.Sprint(c.cmd.Process.Pid) {
			t.Fatalf("pid %s is not the go process's child: %s", m[1], stat)
		}
		// go itself dies of the signal; shoal must exit on its own.
		c.stop(t, syscall.SIGTERM, false)
		deadline := time.Now().Add(60 * time.Second)
		for {
			if _, err := os.Stat(child); os.IsNotExist(err) {
				break
			}
			if b, _ := os.ReadFile(child + "/stat"); strings.Contains(string(b), ") Z") {
				break // exited, waiting for init to reap it
			}
			if time.Now().After(deadline) {
				t.Fatalf("shoal (pid %s) still running 60 s after its go run parent was killed", m[1])
			}
			time.Sleep(100 * time.Millisecond)
		}
		// It shuts down cleanly but nobody waits for it: give the
		// listeners a moment to close as the process exits.
		portsFree(t, c.addrs)
	})
}

// logWriter sends a process's stderr to the test log.
type logWriter struct{ t *testing.T }

func (w *logWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
