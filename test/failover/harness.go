// Package failover tests metadata-server failover with real processes: a
// 3-member etcd cluster (Debian's etcd), several `shoal mds` on one etcd
// prefix, `shoal ds` data servers, and Shoal's own client in the test
// process. Faults are real: kill -9, SIGSTOP and SIGCONT of the processes,
// `shoal admin step-down`. Every process listens on 127.0.0.1 only and is
// killed by PID when the test ends.
//
// The harness (World) is shared by the tests, the failover benchmark
// (TestFailoverBench, run by scripts/failover-bench.sh) and the
// linearizability check (TestLinearizable).
package failover

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// testLease is the NFSv4 lease of the test clusters' metadata servers.
const testLease = 10 * time.Second

// Proc is a process the test started.
type Proc struct {
	Name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{}
	err     error
	stopped atomic.Bool // SIGSTOPped and not yet continued
}

// Exited reports whether the process has exited.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Signal sends sig to the process only (never its group, never anything
// found by name; os.Process uses a pidfd).
func (p *Proc) Signal(sig syscall.Signal) {
	if p.Exited() {
		return
	}
	_ = p.cmd.Process.Signal(sig)
	switch sig {
	case syscall.SIGSTOP:
		p.stopped.Store(true)
	case syscall.SIGCONT:
		p.stopped.Store(false)
	}
}

// Wait waits up to d for the process to exit.
func (p *Proc) Wait(d time.Duration) error {
	select {
	case <-p.done:
		return nil
	case <-time.After(d):
		return fmt.Errorf("%s (pid %d) still running after %v", p.Name, p.cmd.Process.Pid, d)
	}
}

// Log returns what the process wrote so far.
func (p *Proc) Log() string {
	b, _ := os.ReadFile(p.logPath)
	return string(b)
}

// Pid is the process's PID.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// MDS is one `shoal mds` node: its address, directory and HTTP endpoint
// outlive its processes.
type MDS struct {
	Node, Addr, HTTP, Dir string
	P                     *Proc
	// Env is added to the environment of the node's processes (test
	// hooks such as server.DropReplyAfterEnv).
	Env []string
}

// DS is one data server.
type DS struct {
	Name, Addr, Dir string
	P               *Proc
}

// Etcd is one etcd member.
type Etcd struct {
	Name, Client, Peer, Dir string
	P                       *Proc
}

// World is one test's processes.
type World struct {
	T       testing.TB
	Bin     string // the shoal binary
	Base    string
	LogDir  string
	Etcd    []*Etcd
	MDS     []*MDS
	DS      []*DS
	Prefix  string
	Secret  string // a join-secret file (the first MDS's)
	Mirrors int
	seq     int
	given   map[string]bool // addresses handed out by addr
}

// NewWorld prepares a world in a fresh directory; bin is the shoal
// binary.
func NewWorld(t testing.TB, bin string) *World {
	base := t.TempDir()
	w := &World{T: t, Bin: bin, Base: base, LogDir: filepath.Join(base, "logs"), Prefix: "/shoal-failover", Mirrors: 2}
	if err := os.MkdirAll(w.LogDir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			w.DumpLogs()
		}
	})
	return w
}

// DumpLogs puts every log's tail into the test output.
func (w *World) DumpLogs() {
	ents, _ := os.ReadDir(w.LogDir)
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(w.LogDir, e.Name()))
		if err != nil {
			continue
		}
		const max = 48 << 10
		s := string(b)
		if len(s) > max {
			s = "[... " + strconv.Itoa(len(s)-max) + " bytes cut ...]\n" + s[len(s)-max:]
		}
		w.T.Logf("==== %s ====\n%s", e.Name(), s)
	}
}

// start starts a long-running process, killed (SIGCONT, then SIGKILL) and
// waited for when the test ends.
func (w *World) start(name, bin string, args ...string) *Proc {
	w.T.Helper()
	return w.startEnv(name, nil, bin, args...)
}

// startEnv is start with env added to the test's environment.
func (w *World) startEnv(name string, env []string, bin string, args ...string) *Proc {
	w.T.Helper()
	w.seq++
	logPath := filepath.Join(w.LogDir, fmt.Sprintf("%02d-%s.log", w.seq, name))
	lf, err := os.Create(logPath)
	if err != nil {
		w.T.Fatal(err)
	}
	fmt.Fprintf(lf, "$ %s %s\n", filepath.Base(bin), strings.Join(args, " "))
	cmd := exec.Command(bin, args...)
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		lf.Close()
		w.T.Fatalf("start %s: %v", name, err)
	}
	p := &Proc{Name: name, cmd: cmd, logPath: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		lf.Close()
		close(p.done)
	}()
	w.T.Cleanup(func() {
		p.Signal(syscall.SIGCONT)
		p.Signal(syscall.SIGKILL)
		if err := p.Wait(15 * time.Second); err != nil {
			w.T.Errorf("cleanup: %v", err)
		}
	})
	return p
}

// FreeAddr returns a 127.0.0.1 address nobody listens on now.
func FreeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// addr returns a 127.0.0.1 address nobody listens on now and that was
// not handed out before in this World: a standby MDS does not listen on
// its address, so FreeAddr alone may give it to a data server started
// later, and the MDS cannot listen when it is elected.
func (w *World) addr() string {
	w.T.Helper()
	if w.given == nil {
		w.given = map[string]bool{}
	}
	for range 100 {
		a := FreeAddr(w.T)
		if !w.given[a] {
			w.given[a] = true
			return a
		}
	}
	w.T.Fatal("no fresh loopback address in 100 tries")
	return ""
}

// StartEtcd starts an etcd cluster of n members (Debian's etcd binary).
func (w *World) StartEtcd(n int) {
	w.T.Helper()
	bin, err := exec.LookPath("etcd")
	if err != nil {
		w.T.Fatalf("etcd not installed (Debian package etcd-server; scripts/test.sh installs it): %v", err)
	}
	var initial []string
	for i := range n {
		e := &Etcd{Name: fmt.Sprintf("e%d", i+1), Client: w.addr(), Peer: w.addr(), Dir: filepath.Join(w.Base, fmt.Sprintf("etcd%d", i+1))}
		w.Etcd = append(w.Etcd, e)
		initial = append(initial, e.Name+"=http://"+e.Peer)
	}
	for _, e := range w.Etcd {
		e.P = w.start("etcd-"+e.Name, bin, e.args(strings.Join(initial, ","), "new")...)
	}
	w.WaitEtcd(30 * time.Second)
}

func (e *Etcd) args(initial, state string) []string {
	return []string{"--name", e.Name, "--data-dir", e.Dir,
		"--listen-client-urls", "http://" + e.Client, "--advertise-client-urls", "http://" + e.Client,
		"--listen-peer-urls", "http://" + e.Peer, "--initial-advertise-peer-urls", "http://" + e.Peer,
		"--initial-cluster", initial, "--initial-cluster-state", state, "--initial-cluster-token", "shoal-failover",
		"--heartbeat-interval", "100", "--election-timeout", "1000", "--log-level", "warn"}
}

// RestartEtcd starts member i again on its data directory.
func (w *World) RestartEtcd(i int) {
	w.T.Helper()
	bin, _ := exec.LookPath("etcd")
	var initial []string
	for _, e := range w.Etcd {
		initial = append(initial, e.Name+"=http://"+e.Peer)
	}
	e := w.Etcd[i]
	e.P = w.start("etcd-"+e.Name, bin, e.args(strings.Join(initial, ","), "existing")...)
}

// WaitEtcd waits until the running members answer as a cluster with a
// leader.
func (w *World) WaitEtcd(d time.Duration) {
	w.T.Helper()
	deadline := time.Now().Add(d)
	for {
		ok := 0
		for _, e := range w.Etcd {
			if e.P == nil || e.P.Exited() {
				continue
			}
			resp, err := http.Get("http://" + e.Client + "/health")
			if err == nil {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if bytes.Contains(b, []byte(`"true"`)) {
					ok++
				}
			}
		}
		if ok > 0 && ok*2 > len(w.Etcd) {
			return
		}
		if time.Now().After(deadline) {
			w.T.Fatalf("etcd cluster not healthy within %v", d)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// MetaURL is the etcd URL of the metadata.
func (w *World) MetaURL() string {
	var eps []string
	for _, e := range w.Etcd {
		eps = append(eps, e.Client)
	}
	return "etcd://" + strings.Join(eps, ",") + w.Prefix
}

// MDSAddrs is every MDS node's address, comma-separated (as data
// servers, `shoal admin` and Shoal's client take them).
func (w *World) MDSAddrs() string {
	var a []string
	for _, m := range w.MDS {
		a = append(a, m.Addr)
	}
	return strings.Join(a, ",")
}

// AddMDS adds an MDS node and starts it; it leads or stands by.
func (w *World) AddMDS(extra ...string) *MDS {
	w.T.Helper()
	return w.AddMDSEnv(nil, extra...)
}

// AddMDSEnv is AddMDS with env added to the node's environment.
func (w *World) AddMDSEnv(env []string, extra ...string) *MDS {
	w.T.Helper()
	i := len(w.MDS) + 1
	m := &MDS{Node: fmt.Sprintf("mds%d", i), Addr: w.addr(), HTTP: w.addr(), Dir: filepath.Join(w.Base, fmt.Sprintf("mds%d", i)), Env: env}
	w.MDS = append(w.MDS, m)
	if w.Secret == "" {
		w.Secret = filepath.Join(m.Dir, "join-secret")
	}
	w.StartMDS(m, extra...)
	return m
}

// StartMDS starts node m (again).
func (w *World) StartMDS(m *MDS, extra ...string) {
	w.T.Helper()
	args := append([]string{"mds", "--listen", m.Addr, "--dir", m.Dir, "--meta", w.MetaURL(), "--node", m.Node,
		"--http", m.HTTP, "--mirrors", strconv.Itoa(w.Mirrors), "--no-root-squash", "--lease", testLease.String(),
		"--leader-lease", "3s", "--ds-down-after", "60s"}, extra...)
	m.P = w.startEnv(m.Node, m.Env, w.Bin, args...)
}

// Metric returns the value of the first sample of metric (with labels, as
// in the exposition, e.g. `shoal_mds_leader` or
// `shoal_mds_election_events_total{event="elected"}`) on m's /metrics, or
// an error if m does not answer.
func (m *MDS) Metric(metric string) (float64, error) {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + m.HTTP + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(metric) + ` (\S+)$`)
	mm := re.FindSubmatch(b)
	if mm == nil {
		return 0, fmt.Errorf("%s: no %s", m.Node, metric)
	}
	return strconv.ParseFloat(string(mm[1]), 64)
}

// Listens reports whether something accepts connections on m's address.
func (m *MDS) Listens() bool {
	c, err := net.DialTimeout("tcp", m.Addr, time.Second)
	if err == nil {
		c.Close()
		return true
	}
	return false
}

// Leader returns the MDS whose process says it leads (shoal_mds_leader 1
// on its metrics), or nil. A stopped process is never asked.
func (w *World) Leader() *MDS {
	for _, m := range w.MDS {
		if m.P == nil || m.P.Exited() || m.P.stopped.Load() {
			continue
		}
		if v, err := m.Metric("shoal_mds_leader"); err == nil && v == 1 && m.Listens() {
			return m
		}
	}
	return nil
}

// WaitLeader waits until some MDS other than not leads, and returns it.
func (w *World) WaitLeader(not *MDS, d time.Duration) *MDS {
	w.T.Helper()
	deadline := time.Now().Add(d)
	for {
		if l := w.Leader(); l != nil && l != not {
			return l
		}
		if time.Now().After(deadline) {
			w.T.Fatalf("no MDS leads within %v", d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// WaitSecret waits until the join-secret file exists (the first leader
// writes it).
func (w *World) WaitSecret(d time.Duration) {
	w.T.Helper()
	deadline := time.Now().Add(d)
	for {
		if _, err := os.Stat(w.Secret); err == nil {
			return
		}
		if time.Now().After(deadline) {
			w.T.Fatalf("no join secret at %s within %v", w.Secret, d)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// AddDS adds and starts a data server that follows the MDS nodes.
func (w *World) AddDS() *DS {
	w.T.Helper()
	i := len(w.DS) + 1
	d := &DS{Name: fmt.Sprintf("ds%d", i), Addr: w.addr(), Dir: filepath.Join(w.Base, fmt.Sprintf("ds%d", i))}
	w.DS = append(w.DS, d)
	w.StartDS(d)
	return d
}

// StartDS starts data server d (again).
func (w *World) StartDS(d *DS) {
	w.T.Helper()
	d.P = w.start(d.Name, w.Bin, "ds", "--mds", w.MDSAddrs(), "--join-secret-file", w.Secret, "--listen", d.Addr, "--dir", d.Dir)
}

// Admin runs `shoal admin ARGS --mds (all nodes) --join-secret-file`.
func (w *World) Admin(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	args = append(args, "--mds", w.MDSAddrs(), "--join-secret-file", w.Secret)
	out, err := exec.CommandContext(ctx, w.Bin, append([]string{"admin"}, args...)...).CombinedOutput()
	return string(out), err
}

// Status is the part of `shoal admin status --json` the tests read.
type Status struct {
	DataServers []struct {
		ID string `json:"id"`
		Up bool   `json:"up"`
	} `json:"data_servers"`
	HA *struct {
		Term  uint64 `json:"term"`
		Nodes []struct {
			Node   string `json:"node"`
			Leader bool   `json:"leader"`
		} `json:"nodes"`
		Etcd []struct {
			Name    string `json:"name"`
			Healthy bool   `json:"healthy"`
		} `json:"etcd"`
	} `json:"ha"`
}

// Status returns `shoal admin status --json`.
func (w *World) Status() (*Status, error) {
	out, err := w.Admin("status", "--json")
	if err != nil {
		return nil, fmt.Errorf("%v: %s", err, out)
	}
	var st Status
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		return nil, fmt.Errorf("%v: %s", err, out)
	}
	return &st, nil
}

// WaitDataServers waits until n data servers are up at the leader.
func (w *World) WaitDataServers(n int, d time.Duration) {
	w.T.Helper()
	deadline := time.Now().Add(d)
	var last error
	for time.Now().Before(deadline) {
		st, err := w.Status()
		if err == nil {
			up := 0
			for _, d := range st.DataServers {
				if d.Up {
					up++
				}
			}
			if up >= n {
				return
			}
			last = fmt.Errorf("%d of %d data servers up", up, n)
		} else {
			last = err
		}
		time.Sleep(200 * time.Millisecond)
	}
	w.T.Fatalf("data servers not up within %v: %v", d, last)
}

// ErrNoLeader is returned by helpers that need a leader and find none.
var ErrNoLeader = errors.New("failover: no leader")
