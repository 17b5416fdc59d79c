package testbed

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Down tears down the testbed whose directory is DirFor(name, dir): it stops
// the server processes it started, deletes its namespaces (which destroys
// the links and their qdiscs) and removes the state file. Data and logs stay
// in the directory. Down is idempotent; without a state file (an `up`
// killed before writing one) it still deletes namespaces named like this
// testbed's.
func Down(ctx context.Context, name, dir string, log *slog.Logger) error {
	if log == nil {
		log = slog.Default()
	}
	if name == "" {
		name = DefaultName
	}
	abs, err := filepath.Abs(DirFor(name, dir))
	if err != nil {
		return err
	}
	s, err := Load(abs)
	switch {
	case errors.Is(err, os.ErrNotExist):
		s, err = orphanState(ctx, name, abs)
		if err != nil {
			return err
		}
	case err != nil:
		return err
	}
	return teardown(ctx, s, log)
}

// orphanState rebuilds enough state to delete namespaces named like testbed
// name's when its state file is gone.
func orphanState(ctx context.Context, name, dir string) (*State, error) {
	re := regexp.MustCompile(`^` + regexp.QuoteMeta(name) + `-(mds|ds[0-9]+|c[0-9]+)$`)
	all, err := listNamespaces(ctx)
	if err != nil {
		return nil, err
	}
	s := &State{Name: name, Dir: dir, Switch: name + "-sw"}
	for _, ns := range all {
		if m := re.FindStringSubmatch(ns); m != nil {
			s.Nodes = append(s.Nodes, Node{Name: m[1], Namespace: ns})
		}
	}
	return s, nil
}

// teardown stops our processes and deletes our namespaces.
func teardown(ctx context.Context, s *State, log *slog.Logger) error {
	var errs []error
	// Processes we recorded, data servers before the MDS.
	var pids []int
	for i := len(s.Nodes) - 1; i >= 0; i-- {
		n := s.Nodes[i]
		if n.PID > 0 && (sameCmdline(n.PID, n.Cmdline) || sameCmdline(n.PID, launcher(n))) {
			pids = append(pids, n.PID)
		}
	}
	// Processes started just before an interrupted `up` could record them:
	// only ones running our binary on our directory.
	for _, ns := range s.Namespaces() {
		if !namespaceExists(ns) {
			continue
		}
		inNS, err := nsPIDs(ctx, ns)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, pid := range inNS {
			if !slices.Contains(pids, pid) && ours(pid, s) {
				pids = append(pids, pid)
			}
		}
	}
	if err := stop(ctx, pids, log); err != nil {
		errs = append(errs, err)
	}
	for _, ns := range s.Namespaces() {
		if !namespaceExists(ns) {
			continue
		}
		if _, err := run(ctx, "ip", "netns", "del", ns); err != nil {
			errs = append(errs, err)
		}
	}
	// After the processes: a data server still running keeps it busy.
	if err := unmountData(s.Dir); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if err := os.Remove(filepath.Join(s.Dir, StateFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	log.Info("testbed: down", "name", s.Name, "processes", len(pids))
	return nil
}

// stop sends SIGTERM to pids, waits up to 10s, then SIGKILLs survivors and
// waits up to 5s more.
func stop(ctx context.Context, pids []int, log *slog.Logger) error {
	signalAll := func(sig syscall.Signal) {
		for _, pid := range pids {
			if alive(pid) {
				if err := syscall.Kill(pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
					log.Warn("testbed: kill", "pid", pid, "signal", sig, "err", err)
				}
			}
		}
	}
	waitAll := func(d time.Duration) bool {
		deadline := time.Now().Add(d)
		for time.Now().Before(deadline) && ctx.Err() == nil {
			if !slices.ContainsFunc(pids, alive) {
				return true
			}
			time.Sleep(50 * time.Millisecond)
		}
		return !slices.ContainsFunc(pids, alive)
	}
	signalAll(syscall.SIGTERM)
	if waitAll(10 * time.Second) {
		return nil
	}
	signalAll(syscall.SIGKILL)
	if waitAll(5 * time.Second) {
		return nil
	}
	var left []string
	for _, pid := range pids {
		if alive(pid) {
			left = append(left, strconv.Itoa(pid))
		}
	}
	return fmt.Errorf("processes still running after SIGKILL: %s", strings.Join(left, " "))
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the parenthesised command name.
	st := string(b)
	if i := strings.LastIndexByte(st, ')'); i >= 0 && i+2 < len(st) {
		return st[i+2] != 'Z' && st[i+2] != 'X'
	}
	return true
}

func cmdline(pid int) []string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || len(b) == 0 {
		return nil
	}
	return strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
}

// launcher is the command line a server has between its start and `ip
// netns exec` exec'ing it: a teardown right after start sees that one.
func launcher(n Node) []string {
	if len(n.Cmdline) == 0 {
		return nil
	}
	return append([]string{"ip", "netns", "exec", n.Namespace}, n.Cmdline...)
}

// sameCmdline guards against PID reuse: pid must still run argv.
func sameCmdline(pid int, argv []string) bool {
	return len(argv) > 0 && slices.Equal(cmdline(pid), argv)
}

// ours reports whether pid is a shoal server of testbed s: our binary (when
// known) with an argument inside our directory.
func ours(pid int, s *State) bool {
	argv := cmdline(pid)
	if len(argv) == 0 || (s.Binary != "" && argv[0] != s.Binary) {
		return false
	}
	if len(argv) < 2 || (argv[1] != "mds" && argv[1] != "ds") {
		return false
	}
	prefix := s.Dir + string(filepath.Separator)
	return slices.ContainsFunc(argv, func(a string) bool { return strings.HasPrefix(a, prefix) })
}
