package kernel

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/shoalfs/shoal/client"
)

// The shoal-failover kind: the Linux client rides through the loss of the
// leading MDS. Two `shoal mds` on one etcd prefix (3 etcd members), a
// `shoal vip` beside each moving the service address to the leader's
// host, and 3 `shoal ds` with two copies of every stripe, all in network
// namespaces joined by a bridge with the VM's tap (failover_net_test.go).
// The guest mounts the service address with the kernel's default options
// and runs failover.sh: once per fault (kill -9 of the leader, SIGSTOP of
// it, `shoal admin step-down`) a paced 256 MiB dd with fsync and its
// read-back, a small-file create/rename/remove loop and a lock holder run
// while the driver takes the leader away. A second NFS client (Shoal's, in
// a helper process in the svc namespace) keeps trying to take the lock.

// foFaults are the faults, in the order the guest runs them.
var foFaults = []string{"kill", "stop", "stepdown"}

// foCluster is one test's servers.
type foCluster struct {
	t        *testing.T
	net      *nsNet
	bin, dir string
	meta     string
	secret   string
	mds      map[string]*foMDS // "a", "b"
	ds       []*nsProc
}

// foMDS is one MDS host: its `shoal mds` (restarted after kill -9) and
// its `shoal vip`.
type foMDS struct {
	host, node, dir string
	p, vip          *nsProc
	stopped         bool
}

func (m *foMDS) addr() string { return foMDSIP[m.host] + ":" + strconv.Itoa(foMDSPort) }
func (m *foMDS) http() string { return foMDSIP[m.host] + ":9101" }
func (m *foMDS) vipHTTP() string {
	return foMDSIP[m.host] + ":9103"
}

func startFOCluster(t *testing.T, bin, dir string) *foCluster {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	c := &foCluster{t: t, net: newNSNet(t), bin: bin, dir: dir, mds: map[string]*foMDS{}}
	etcd, err := exec.LookPath("etcd")
	if err != nil {
		t.Fatalf("etcd not installed (Debian package etcd-server; scripts/test.sh installs it): %v", err)
	}
	var initial, eps []string
	for i := range 3 {
		initial = append(initial, fmt.Sprintf("e%d=http://%s:%d", i+1, foEtcdIP, 2380+100*i))
		eps = append(eps, fmt.Sprintf("%s:%d", foEtcdIP, 2379+100*i))
	}
	for i := range 3 {
		client := fmt.Sprintf("http://%s:%d", foEtcdIP, 2379+100*i)
		peer := fmt.Sprintf("http://%s:%d", foEtcdIP, 2380+100*i)
		startIn(t, c.net.ns("svc"), dir, fmt.Sprintf("etcd%d", i+1), etcd,
			"--name", fmt.Sprintf("e%d", i+1), "--data-dir", filepath.Join(dir, fmt.Sprintf("etcd%d", i+1)),
			"--listen-client-urls", client, "--advertise-client-urls", client,
			"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
			"--initial-cluster", strings.Join(initial, ","), "--initial-cluster-state", "new",
			"--initial-cluster-token", c.net.prefix,
			"--heartbeat-interval", "100", "--election-timeout", "1000", "--log-level", "warn")
	}
	if !waitFor(60*time.Second, func() bool {
		b, err := c.net.get("http://" + eps[0] + "/health")
		return err == nil && bytes.Contains(b, []byte(`"true"`))
	}) {
		t.Fatal("etcd cluster not healthy within 60 s")
	}
	c.meta = "etcd://" + strings.Join(eps, ",") + "/shoal-kfail"
	for _, h := range []string{"a", "b"} {
		c.mds[h] = &foMDS{host: h, node: "mds-" + h, dir: filepath.Join(dir, "mds-"+h)}
	}
	c.secret = filepath.Join(c.mds["a"].dir, "join-secret")
	c.startMDS(c.mds["a"])
	if !waitFor(60*time.Second, func() bool { return c.leader() == c.mds["a"] }) {
		t.Fatal("the first MDS does not lead within 60 s")
	}
	if !waitFor(10*time.Second, func() bool { _, err := os.Stat(c.secret); return err == nil }) {
		t.Fatalf("no join secret at %s", c.secret)
	}
	c.startMDS(c.mds["b"])
	for _, m := range c.mds {
		m.vip = startIn(t, c.net.ns(m.host), dir, "vip-"+m.host, bin, "vip", "--meta", c.meta, "--node", m.node,
			"--address", foVIP+"/24", "--interface", "eth0", "--http", "0.0.0.0:9103")
	}
	if !waitFor(30*time.Second, func() bool { return c.net.listens(foVIP + ":2049") }) {
		t.Fatalf("the service address %s does not answer within 30 s", foVIP)
	}
	for i := range 3 {
		c.ds = append(c.ds, startIn(t, c.net.ns("svc"), dir, fmt.Sprintf("ds%d", i), bin, "ds",
			"--mds", c.mds["a"].addr()+","+c.mds["b"].addr(), "--join-secret-file", c.secret,
			"--listen", foDSIP(i)+":2049", "--dir", filepath.Join(dir, fmt.Sprintf("ds%d", i)),
			"--http", foDSIP(i)+":9102"))
	}
	var last string
	if !waitFor(60*time.Second, func() bool {
		up, err := c.dsUp()
		last = fmt.Sprint(up, err)
		return up == 3
	}) {
		t.Fatalf("data servers not in service within 60 s (last: %s)", last)
	}
	return c
}

// startMDS starts host m's MDS.
func (c *foCluster) startMDS(m *foMDS) {
	c.t.Helper()
	if err := c.restartMDS(m); err != nil {
		c.t.Fatal(err)
	}
}

// restartMDS starts host m's MDS (again); it may run off the test's
// goroutine.
func (c *foCluster) restartMDS(m *foMDS) error {
	p, err := startInErr(c.t, c.net.ns(m.host), c.dir, "mds-"+m.host, c.bin, "mds",
		"--listen", fmt.Sprintf("0.0.0.0:%d", foMDSPort), "--advertise", m.addr(),
		"--dir", m.dir, "--meta", c.meta, "--node", m.node,
		"--join-secret-file", c.secret, "--http", "0.0.0.0:9101", "--mirrors", "2", "--no-root-squash",
		"--lease", "15s", "--leader-lease", "3s")
	if err != nil {
		return err
	}
	m.p, m.stopped = p, false
	return nil
}

// leader is the MDS whose process says it leads and listens, or nil. A
// stopped process is not asked.
func (c *foCluster) leader() *foMDS {
	for _, h := range []string{"a", "b"} {
		m := c.mds[h]
		if m.p == nil || m.p.exited() || m.stopped {
			continue
		}
		if v, err := c.net.metric(m.http(), "shoal_mds_leader"); err == nil && v == 1 && c.net.listens(m.addr()) {
			return m
		}
	}
	return nil
}

// admin runs `shoal admin ARGS` in svc against both MDS hosts.
func (c *foCluster) admin(ctx context.Context, args ...string) (string, error) {
	args = append(append([]string{"netns", "exec", c.net.ns("svc"), c.bin, "admin"}, args...),
		"--mds", c.mds["a"].addr()+","+c.mds["b"].addr(), "--join-secret-file", c.secret)
	out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput()
	return string(out), err
}

func (c *foCluster) dsUp() (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := c.admin(ctx, "status", "--json")
	if err != nil {
		return 0, fmt.Errorf("%w: %s", err, out)
	}
	var st adminStatus
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		return 0, fmt.Errorf("%w: %s", err, out)
	}
	return st.up(), nil
}

// dsBytes is the data servers' READ and WRITE bytes so far, summed.
func (c *foCluster) dsBytes() (float64, error) {
	var sum float64
	for i := range c.ds {
		b, err := c.net.get("http://" + foDSIP(i) + ":9102/metrics")
		if err != nil {
			return 0, err
		}
		s, err := parseMetrics(bytes.NewReader(b))
		if err != nil {
			return 0, err
		}
		sum += s.get("shoal_nfs_bytes_total", "role", "ds")
	}
	return sum, nil
}

// ioPoint is one sample of the data servers' byte counters.
type ioPoint struct {
	t     time.Time
	bytes float64
}

// foRound is what the driver learned about one fault.
type foRound struct {
	fault     string // the round's name: its kind, and ".NN" when rounds repeat
	kind      string // kill, stop or stepdown
	old, next string
	at        time.Time
	detect    time.Duration // the new leader leads and listens
	vipMoved  time.Duration // the new leader's host holds the service address
	injectErr error
	// SIGSTOP: what the stopped MDS's counters gained once continued.
	fenced, lost float64
	stoppedErr   error
	done         chan struct{} // closed when the fault handling ended

	io     []ioPoint
	ioStop chan struct{}
	ioDone chan struct{}

	thief *thief

	// From the guest (centiseconds after the fault, guest clock).
	times map[string]int // FOTIME name -> cs
	ops   [][2]int       // FOOP start, end
	stats []string       // FOSTATS lines
}

func testFailover(t *testing.T, shoalBin string, img images, vers, out string) {
	// Network namespaces, a bridge and a tap need root (CAP_NET_ADMIN)
	// and iproute2; the kind is opt-in, so a run without them fails.
	if os.Geteuid() != 0 {
		t.Fatal("shoal-failover creates network namespaces: run as root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Fatal("shoal-failover needs iproute2 (ip)")
	}
	c := startFOCluster(t, shoalBin, filepath.Join(out, "server"))
	t.Logf("cluster up: etcd %s, MDS %s (leads) and %s, data servers %s..%s, service address %s; logs in %s",
		c.meta, c.mds["a"].addr(), c.mds["b"].addr(), foDSIP(0), foDSIP(2), foVIP, filepath.Join(out, "server"))

	// The guest's traffic on its tap: with the service address (and ARP)
	// whole, for the timeout analysis; with the data servers, the headers.
	capture := filepath.Join(out, "capture-mds.pcap")
	var dumpcaps []*nsProc
	if _, err := exec.LookPath("dumpcap"); err == nil {
		dumpcaps = append(dumpcaps,
			startIn(t, c.net.ns("lan"), out, "dumpcap-mds", "dumpcap", "-q", "-i", "tap0",
				"-f", "host "+foVIP+" or arp", "-w", capture),
			startIn(t, c.net.ns("lan"), out, "dumpcap-ds", "dumpcap", "-q", "-i", "tap0", "-s", "200",
				"-f", fmt.Sprintf("host %s or host %s or host %s", foDSIP(0), foDSIP(1), foDSIP(2)),
				"-w", filepath.Join(out, "capture-ds.pcap")))
	}

	rounds := map[string]*foRound{}
	var mu sync.Mutex
	var errs []error
	ctx := context.Background()
	faultList := strings.Fields(strings.ReplaceAll(env("SHOAL_KERNEL_FAILOVER_FAULTS", strings.Join(foFaults, " ")), ",", " "))
	nRounds := env("SHOAL_KERNEL_FAILOVER_ROUNDS", "1")
	faults, err := foRounds(faultList, nRounds)
	if err != nil {
		t.Fatal(err)
	}
	roundOf := func(f string) *foRound {
		mu.Lock()
		defer mu.Unlock()
		r := rounds[f]
		if r == nil {
			kind, _, _ := strings.Cut(f, ".")
			r = &foRound{fault: f, kind: kind, times: map[string]int{}, done: make(chan struct{})}
			rounds[f] = r
		}
		return r
	}
	hook := func(line string) string {
		fields := strings.Fields(line)
		if len(fields) >= 4 {
			switch fields[0] {
			case "FOTIME":
				if v, err := strconv.Atoi(fields[3]); err == nil {
					roundOf(fields[1]).times[fields[2]] = v
				}
				return ""
			case "FOOP":
				if len(fields) >= 4 {
					s, _ := strconv.Atoi(fields[2])
					e, _ := strconv.Atoi(fields[3])
					r := roundOf(fields[1])
					r.ops = append(r.ops, [2]int{s, e})
				}
				return ""
			case "FOSTATS":
				r := roundOf(fields[1])
				r.stats = append(r.stats, strings.Join(fields[2:], " "))
				return ""
			}
		}
		m := syncRE.FindStringSubmatch(line)
		if m == nil {
			return ""
		}
		tag := m[1]
		kind, f, _ := strings.Cut(tag, "-")
		r := roundOf(f)
		fail := func(err error) string {
			mu.Lock()
			errs = append(errs, fmt.Errorf("SYNC %s: %w", tag, err))
			mu.Unlock()
			return "ERR " + tag + " " + strings.Join(strings.Fields(err.Error()), " ")
		}
		switch kind {
		case "locked":
			th, err := startThief(t, c, "/v"+vers+"-"+f+"/lockfile")
			if err != nil {
				return fail(err)
			}
			r.thief = th
			r.ioStop, r.ioDone = make(chan struct{}), make(chan struct{})
			go c.pollIO(r)
			return "OK " + tag + " the other client's LOCK was denied"
		case "fault":
			old := c.leader()
			if old == nil {
				return fail(errNoLeader)
			}
			r.old = old.host
			r.at = time.Now()
			switch r.kind {
			case "kill":
				old.p.signal(syscall.SIGKILL)
			case "stop":
				// What the MDS had counted before; a stopped process
				// counts nothing.
				r.lost, _ = c.net.metric(old.http(), `shoal_mds_election_events_total{event="lost"}`)
				r.fenced, _ = c.net.metric(old.http(), `shoal_mds_election_events_total{event="fenced_txn"}`)
				old.p.signal(syscall.SIGSTOP)
				old.stopped = true
			case "stepdown":
				// Issued in the background: the guest goes on at once.
			default:
				return fail(fmt.Errorf("unknown fault %q", f))
			}
			go c.followFault(r, old)
			return "OK " + tag
		case "unlock":
			select {
			case <-r.done:
			case <-time.After(90 * time.Second):
				return fail(errors.New("the fault handling did not end within 90 s"))
			}
			if r.ioStop != nil {
				close(r.ioStop)
				<-r.ioDone
			}
			if r.thief == nil {
				return fail(errors.New("no second client running"))
			}
			sum, err := r.thief.stop()
			if err != nil {
				return fail(err)
			}
			if sum.granted > 0 {
				return fail(fmt.Errorf("the other client was GRANTED the lock %d times while the guest held it: %s", sum.granted, sum))
			}
			after := sum.deniedAfter(r.at.Add(r.detect))
			if after == 0 {
				return fail(fmt.Errorf("the other client was never denied at the new leader (the lock was not there?): %s", sum))
			}
			return fmt.Sprintf("OK %s %s; denied %d times at the new leader", tag, sum, after)
		}
		return ""
	}
	params := map[string]string{
		"t_host": foVIP, "t_path": "/", "t_vers": vers, "t_phase": "failover",
		"t_ip": foGuest, "t_gw": foVIP, "t_faults": strings.Join(faultList, ","), "t_rounds": nRounds,
	}
	if v := os.Getenv("SHOAL_KERNEL_FAILOVER_MB"); v != "" {
		params["t_big_mb"] = v
	}
	// A round takes 1-3 minutes under TCG with the 256 MiB file.
	timeout, err := time.ParseDuration(env("SHOAL_KERNEL_FAILOVER_VM_TIMEOUT",
		(time.Duration(max(20, 5*len(faults))) * time.Minute).String()))
	if err != nil {
		t.Fatalf("SHOAL_KERNEL_FAILOVER_VM_TIMEOUT: %v", err)
	}
	res := boot(ctx, bootConfig{
		img: img, params: params, timeout: timeout, logf: t.Logf, hook: hook,
		console: filepath.Join(out, "console-failover.log"),
		netns:   c.net.ns("lan"), tap: "tap0",
	})
	for _, d := range dumpcaps {
		d.signal(syscall.SIGTERM)
		_ = d.wait(10 * time.Second)
	}
	report(t, "failover", res)
	for _, err := range errs {
		t.Errorf("driver: %v", err)
	}
	var wire []rpcEvent
	var wireErr error
	if len(dumpcaps) > 0 && tsharkAvailable() {
		wire, wireErr = rpcEvents(ctx, capture)
	} else {
		wireErr = errors.New("dumpcap or tshark not installed")
	}
	for i, f := range faults {
		r := rounds[f]
		t.Run("failover/"+f+"/times", func(t *testing.T) {
			if r == nil || r.at.IsZero() {
				t.Fatal("the fault was never injected")
			}
			r.finish()
			if r.injectErr != nil {
				t.Error(r.injectErr)
			}
			t.Log(r.summary())
			if err := r.writeIO(filepath.Join(out, "ds-io-"+f+".tsv")); err != nil {
				t.Log(err)
			}
			for _, s := range r.stats {
				t.Logf("mountstats %s", s)
			}
			if wireErr != nil {
				t.Logf("capture not analysed: %v", wireErr)
			} else {
				var next time.Time
				if i+1 < len(faults) && rounds[faults[i+1]] != nil {
					next = rounds[faults[i+1]].at
				}
				for _, l := range r.wireSummary(wire, next) {
					t.Logf("wire: %s", l)
				}
			}
			if r.kind == "stop" {
				if r.stoppedErr != nil {
					t.Errorf("stopped MDS after SIGCONT: %v", r.stoppedErr)
				}
				t.Logf("the stopped MDS %s, continued after the takeover: election events fenced_txn +%.0f, lost +%.0f",
					r.old, r.fenced, r.lost)
			}
		})
	}
	var ms []foTimes
	for _, f := range faults {
		if r := rounds[f]; r != nil && !r.at.IsZero() {
			ms = append(ms, r.measure())
		}
	}
	if len(ms) > 0 {
		path := filepath.Join(out, "failover-bench.json")
		if dir := os.Getenv("SHOAL_KERNEL_FAILOVER_OUT"); dir != "" {
			path = filepath.Join(dir, "kernel-"+img.label()+".json")
		}
		if err := foBench(os.Stdout, img.label(), ms, path); err != nil {
			t.Error(err)
		}
		t.Logf("round times in %s", path)
	}
}

// followFault waits for the new leader after r's fault, restarts a killed
// MDS a second after the kill (as systemd would), continues a stopped one
// once another leads and reads what it did then, and issues a step-down.
func (c *foCluster) followFault(r *foRound, old *foMDS) {
	defer close(r.done)
	switch r.kind {
	case "kill":
		// Restarted a second after the kill, as systemd would; the new
		// leader is not seen before (the election lease is 3 s).
		time.Sleep(time.Second)
		if err := old.p.wait(10 * time.Second); err != nil {
			r.injectErr = err
			return
		}
		if err := c.restartMDS(old); err != nil {
			r.injectErr = fmt.Errorf("restart after kill -9: %w", err)
			return
		}
	case "stepdown":
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		out, err := c.admin(ctx, "step-down")
		cancel()
		if err != nil {
			r.injectErr = fmt.Errorf("step-down: %v: %s", err, out)
			return
		}
	}
	other := c.mds["a"]
	if old == other {
		other = c.mds["b"]
	}
	if !waitFor(90*time.Second, func() bool { return c.leader() == other }) {
		r.injectErr = fmt.Errorf("%s does not lead within 90 s of the fault", other.node)
		return
	}
	r.next, r.detect = other.host, time.Since(r.at)
	if waitFor(30*time.Second, func() bool {
		b, err := c.net.get("http://" + other.vipHTTP() + "/metrics")
		if err != nil {
			return false
		}
		s, err := parseMetrics(bytes.NewReader(b))
		return err == nil && s.get("shoal_vip_holding") == 1
	}) {
		r.vipMoved = time.Since(r.at)
	}
	if r.kind == "stop" {
		// r.lost and r.fenced hold the counters from before the stop.
		old.p.signal(syscall.SIGCONT)
		old.stopped = false
		var err error
		if !waitFor(20*time.Second, func() bool {
			var v float64
			v, err = c.net.metric(old.http(), `shoal_mds_election_events_total{event="lost"}`)
			return err == nil && v > r.lost
		}) {
			r.stoppedErr = fmt.Errorf("no lost election event within 20 s of SIGCONT (%v)", err)
		}
		// A moment for requests that were in flight when it stopped.
		time.Sleep(2 * time.Second)
		lost, _ := c.net.metric(old.http(), `shoal_mds_election_events_total{event="lost"}`)
		fenced, _ := c.net.metric(old.http(), `shoal_mds_election_events_total{event="fenced_txn"}`)
		r.lost, r.fenced = lost-r.lost, fenced-r.fenced
		if v, err := c.net.metric(old.http(), "shoal_mds_leader"); err != nil || v != 0 {
			r.stoppedErr = errors.Join(r.stoppedErr, fmt.Errorf("shoal_mds_leader %v (%v) after the takeover, want 0", v, err))
		}
	}
}

// finish waits for the fault handling and stops the poller and the
// second client, if the guest did not get as far as "SYNC unlock-KIND".
func (r *foRound) finish() {
	if r.at.IsZero() {
		return
	}
	select {
	case <-r.done:
	case <-time.After(90 * time.Second):
	}
	if r.ioStop != nil {
		select {
		case <-r.ioDone:
		default:
			close(r.ioStop)
			<-r.ioDone
		}
	}
}

// pollIO samples the data servers' byte counters every 100 ms until
// r.ioStop.
func (c *foCluster) pollIO(r *foRound) {
	defer close(r.ioDone)
	for {
		if b, err := c.dsBytes(); err == nil {
			r.io = append(r.io, ioPoint{time.Now(), b})
		}
		select {
		case <-r.ioStop:
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// ioPause is the longest time without data-server bytes moving between
// the fault and end, and when bytes first moved once the new leader led.
func (r *foRound) ioPause(end time.Time) (pause, resumed time.Duration) {
	resumed = -1
	var last time.Time
	var prev float64
	for i, p := range r.io {
		if i == 0 {
			prev = p.bytes
			continue
		}
		moved := p.bytes > prev
		prev = p.bytes
		if !moved {
			continue
		}
		if p.t.Before(r.at) {
			last = p.t
			continue
		}
		if p.t.After(end) {
			break
		}
		if last.IsZero() || last.Before(r.at) {
			last = r.at
		}
		pause = max(pause, p.t.Sub(last))
		last = p.t
		if resumed < 0 && p.t.Sub(r.at) >= r.detect {
			resumed = p.t.Sub(r.at)
		}
	}
	return pause, resumed
}

// writeIO saves the data servers' byte counters of the round, seconds
// after the fault, for a closer look.
func (r *foRound) writeIO(path string) error {
	var b strings.Builder
	fmt.Fprintf(&b, "# seconds after the fault\tdata-server bytes (read+write, all)\n")
	for _, p := range r.io {
		fmt.Fprintf(&b, "%.3f\t%.0f\n", p.t.Sub(r.at).Seconds(), p.bytes)
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

func cs(v int) time.Duration { return time.Duration(v) * 10 * time.Millisecond }

// foTimes is what one round measured, in seconds after the fault (-1:
// never seen).
type foTimes struct {
	Round string `json:"round"`
	Fault string `json:"fault"`
	// The new leader leads and listens; its host holds the service
	// address.
	Detect   float64 `json:"detect_s"`
	VIPMoved float64 `json:"vip_moved_s"`
	// The first metadata change in the guest that ended once the new
	// leader led, the longest one of the round, and how many ended after
	// the fault.
	FirstMeta   float64 `json:"first_meta_s"`
	LongestMeta float64 `json:"longest_meta_s"`
	MetaOps     int     `json:"meta_ops"`
	// Data-server bytes first moved once the new leader led; the longest
	// time without them moving between the fault and the read-back's end.
	IOResumed float64 `json:"io_resumed_s"`
	IOPause   float64 `json:"io_pause_s"`
	// dd (with fsync) and the read-back ended.
	BigWritten float64 `json:"big_written_s"`
	BigRead    float64 `json:"big_read_s"`
}

func (r *foRound) measure() foTimes {
	m := foTimes{Round: r.fault, Fault: r.kind, Detect: r.detect.Seconds(), VIPMoved: r.vipMoved.Seconds()}
	first, longest := time.Duration(-1), time.Duration(0)
	for _, op := range r.ops {
		if end := cs(op[1]); end >= r.detect && (first < 0 || end < first) {
			first = end
		}
		longest = max(longest, cs(op[1]-op[0]))
	}
	m.FirstMeta, m.LongestMeta, m.MetaOps = first.Seconds(), longest.Seconds(), len(r.ops)
	pause, resumed := r.ioPause(r.at.Add(cs(r.times["big-read"])))
	m.IOResumed, m.IOPause = resumed.Seconds(), pause.Seconds()
	m.BigWritten, m.BigRead = cs(r.times["big-written"]).Seconds(), cs(r.times["big-read"]).Seconds()
	return m
}

func (r *foRound) summary() string {
	m := r.measure()
	var b strings.Builder
	fmt.Fprintf(&b, "%s of the leader (%s): new leader %s after %.2fs, service address on its host after %.2fs",
		r.fault, r.old, r.next, m.Detect, m.VIPMoved)
	fmt.Fprintf(&b, "; first metadata change in the VM after %.2fs (longest one took %.2fs, %d after the fault)",
		m.FirstMeta, m.LongestMeta, m.MetaOps)
	fmt.Fprintf(&b, "; data-server I/O resumed after %.2fs, longest pause of data-server I/O %.2fs", m.IOResumed, m.IOPause)
	fmt.Fprintf(&b, "; dd with fsync ended %.2fs and the read-back %.2fs after the fault", m.BigWritten, m.BigRead)
	if r.thief != nil {
		fmt.Fprintf(&b, "; other client's lock attempts: %s", r.thief.sum)
	}
	return b.String()
}

// foRounds names the rounds: each fault of the list once, or with
// rounds > 1 the list again and again, each round named FAULT.NN. The
// guest names them the same way (failover.sh, t_faults and t_rounds).
func foRounds(faults []string, rounds string) ([]string, error) {
	n, err := strconv.Atoi(rounds)
	if err != nil || n < 1 || n > 99 {
		return nil, fmt.Errorf("SHOAL_KERNEL_FAILOVER_ROUNDS=%q: want 1 to 99", rounds)
	}
	if len(faults) == 0 {
		return nil, errors.New("SHOAL_KERNEL_FAILOVER_FAULTS names no fault")
	}
	for _, f := range faults {
		if !slices.Contains(foFaults, f) {
			return nil, fmt.Errorf("SHOAL_KERNEL_FAILOVER_FAULTS: unknown fault %q (want %s)", f, strings.Join(foFaults, ", "))
		}
	}
	if n == 1 {
		return faults, nil
	}
	var out []string
	for i := range n {
		for _, f := range faults {
			out = append(out, fmt.Sprintf("%s.%02d", f, i+1))
		}
	}
	return out, nil
}

// foBench prints every round's times and, per fault, their median and
// maximum (the kernel half of the failover benchmark,
// scripts/kernel-failover-bench.sh), and writes them as JSON to path.
func foBench(w io.Writer, kernel string, rounds []foTimes, path string) error {
	fmt.Fprintf(w, "\nfailover under the Linux %s client (qemu TCG), %d rounds, seconds after the fault\n", kernel, len(rounds))
	fmt.Fprintf(w, "%-12s %7s %7s %11s %10s %9s %9s\n", "round", "detect", "vip", "first meta", "I/O again", "I/O pause", "dd ended")
	for _, m := range rounds {
		fmt.Fprintf(w, "%-12s %7s %7s %11s %10s %9s %9s\n", m.Round, secs(m.Detect), secs(m.VIPMoved), secs(m.FirstMeta),
			secs(m.IOResumed), secs(m.IOPause), secs(m.BigWritten))
	}
	type agg struct {
		Fault                         string  `json:"fault"`
		Rounds                        int     `json:"rounds"`
		DetectMedian, DetectMax       float64 `json:",omitempty"`
		FirstMetaMedian, FirstMetaMax float64 `json:",omitempty"`
		IOResumeMedian, IOResumeMax   float64 `json:",omitempty"`
		PauseMedian, PauseMax         float64 `json:",omitempty"`
	}
	var aggs []agg
	fmt.Fprintf(w, "\n%-9s %6s %15s %19s %15s %19s\n", "fault", "rounds", "detect", "first metadata op", "I/O resumed", "longest I/O pause")
	for _, f := range foFaults {
		var sel []foTimes
		for _, m := range rounds {
			if m.Fault == f {
				sel = append(sel, m)
			}
		}
		if len(sel) == 0 {
			continue
		}
		a := agg{Fault: f, Rounds: len(sel)}
		a.DetectMedian, a.DetectMax = medianMax(sel, func(m foTimes) float64 { return m.Detect })
		a.FirstMetaMedian, a.FirstMetaMax = medianMax(sel, func(m foTimes) float64 { return m.FirstMeta })
		a.IOResumeMedian, a.IOResumeMax = medianMax(sel, func(m foTimes) float64 { return m.IOResumed })
		a.PauseMedian, a.PauseMax = medianMax(sel, func(m foTimes) float64 { return m.IOPause })
		aggs = append(aggs, a)
		fmt.Fprintf(w, "%-9s %6d %7s / %5s %11s / %5s %7s / %5s %11s / %5s\n", f, a.Rounds,
			secs(a.DetectMedian), secs(a.DetectMax), secs(a.FirstMetaMedian), secs(a.FirstMetaMax),
			secs(a.IOResumeMedian), secs(a.IOResumeMax), secs(a.PauseMedian), secs(a.PauseMax))
	}
	b, err := json.MarshalIndent(struct {
		Kernel  string    `json:"kernel"`
		Rounds  []foTimes `json:"rounds"`
		Summary []agg     `json:"summary"`
	}{kernel, rounds, aggs}, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

// secs prints seconds, or "never" for a time that was not seen (a round
// whose application failed before it).
func secs(v float64) string {
	if v < 0 {
		return "never"
	}
	return strconv.FormatFloat(v, 'f', 2, 64)
}

// medianMax is the median and maximum of f over ms; a value that was
// never seen (negative) counts as the largest.
func medianMax(ms []foTimes, f func(foTimes) float64) (median, maxv float64) {
	v := make([]float64, 0, len(ms))
	for _, m := range ms {
		x := f(m)
		if x < 0 {
			x = math.Inf(1)
		}
		v = append(v, x)
	}
	slices.Sort(v)
	n := len(v)
	median, maxv = v[n/2], v[n-1]
	if n%2 == 0 {
		median = (v[n/2-1] + v[n/2]) / 2
	}
	// JSON has no infinity.
	if math.IsInf(median, 1) {
		median = -1
	}
	if math.IsInf(maxv, 1) {
		maxv = -1
	}
	return median, maxv
}

// ---- the second client: Shoal's, trying to take the guest's lock ----------

// thief is the helper process (TestFailoverLockThief) in svc.
type thief struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string
	sum   thiefSummary
}

// thiefSummary is what the second client's lock attempts got.
type thiefSummary struct {
	denied, granted, errs int
	deniedAt              []time.Time
	firstErr              string
}

func (s thiefSummary) String() string {
	e := ""
	if s.firstErr != "" {
		e = " (first: " + s.firstErr + ")"
	}
	return fmt.Sprintf("denied %d, granted %d, other errors %d%s", s.denied, s.granted, s.errs, e)
}

func (s thiefSummary) deniedAfter(t time.Time) int {
	n := 0
	for _, d := range s.deniedAt {
		if !d.Before(t) {
			n++
		}
	}
	return n
}

// startThief starts the second client on path and returns once its first
// attempt was denied.
func startThief(t *testing.T, c *foCluster, path string) (*thief, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command("ip", "netns", "exec", c.net.ns("svc"), exe, "-test.run=^TestFailoverLockThief$")
	cmd.Env = append(os.Environ(), "SHOAL_KFAIL_THIEF="+foVIP+":2049"+path)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	logf, err := os.Create(filepath.Join(c.dir, "thief-"+filepath.Base(filepath.Dir(path))+".log"))
	if err != nil {
		return nil, err
	}
	cmd.Stderr = logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	th := &thief{cmd: cmd, stdin: stdin, lines: make(chan string, 1024)}
	go func() {
		defer logf.Close()
		defer close(th.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			fmt.Fprintln(logf, sc.Text())
			th.lines <- sc.Text()
		}
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	deadline := time.After(60 * time.Second)
	for {
		select {
		case l, ok := <-th.lines:
			if !ok {
				return nil, errors.New("the second client exited before its first attempt")
			}
			th.add(l)
			if th.sum.granted > 0 {
				return nil, fmt.Errorf("the second client was granted the lock the guest holds")
			}
			if th.sum.denied > 0 {
				return th, nil
			}
		case <-deadline:
			return nil, fmt.Errorf("the second client was not denied within 60 s: %s", th.sum)
		}
	}
}

var thiefRE = regexp.MustCompile(`^R (\d+) (denied|granted|error) ?(.*)$`)

func (th *thief) add(l string) {
	m := thiefRE.FindStringSubmatch(l)
	if m == nil {
		return
	}
	ns, _ := strconv.ParseInt(m[1], 10, 64)
	switch m[2] {
	case "denied":
		th.sum.denied++
		th.sum.deniedAt = append(th.sum.deniedAt, time.Unix(0, ns))
	case "granted":
		th.sum.granted++
	case "error":
		th.sum.errs++
		if th.sum.firstErr == "" {
			th.sum.firstErr = m[3]
		}
	}
}

// stop ends the second client (EOF on its stdin) and returns its summary.
func (th *thief) stop() (thiefSummary, error) {
	th.stdin.Close()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case l, ok := <-th.lines:
			if !ok {
				err := th.cmd.Wait()
				return th.sum, err
			}
			th.add(l)
		case <-timeout:
			return th.sum, errors.New("the second client did not end within 30 s")
		}
	}
}

// TestFailoverLockThief is the second client of the shoal-failover kind,
// run by startThief as a helper process in the svc namespace (it does
// nothing in a normal run). SHOAL_KFAIL_THIEF is HOST:PORT/PATH. Every
// 300 ms it tries to take a write lock on the first byte without waiting
// and prints "R UNIXNANO denied|granted|error MSG"; it ends when its
// stdin closes.
func TestFailoverLockThief(t *testing.T) {
	target := os.Getenv("SHOAL_KFAIL_THIEF")
	if target == "" {
		t.Skip("helper process of the shoal-failover kind")
	}
	addr, path, _ := strings.Cut(target, "/")
	path = "/" + path
	stop := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		close(stop)
	}()
	say := func(what, msg string) {
		fmt.Printf("R %d %s %s\n", time.Now().UnixNano(), what, strings.Join(strings.Fields(msg), " "))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	dctx, dcancel := context.WithTimeout(ctx, 60*time.Second)
	c, err := client.Dial(dctx, addr, client.Options{OwnerID: "shoal-kfail-second-client-" + strconv.Itoa(os.Getpid())})
	dcancel()
	if err != nil {
		say("error", "dial: "+err.Error())
		t.Fatal(err)
	}
	defer c.Close()
	f, err := c.Open(ctx, path, os.O_RDWR, 0)
	if err != nil {
		say("error", "open: "+err.Error())
		t.Fatal(err)
	}
	defer f.Close()
	for i := 0; i < 10000; i++ {
		lctx, lcancel := context.WithTimeout(ctx, 3*time.Second)
		err := f.Lock(lctx, 0, 1, true, false)
		lcancel()
		switch {
		case err == nil:
			say("granted", "")
			uctx, ucancel := context.WithTimeout(ctx, 10*time.Second)
			_ = f.Unlock(uctx, 0, 1)
			ucancel()
		case errors.Is(err, syscall.EAGAIN):
			say("denied", "")
		default:
			say("error", err.Error())
		}
		select {
		case <-stop:
			return
		case <-time.After(300 * time.Millisecond):
		}
	}
}
