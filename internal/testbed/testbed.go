// Package testbed emulates a Shoal cluster on one machine: every role (the
// MDS, each data server, each client) gets its own network namespace with
// one veth link to a switch namespace holding a bridge, and every link is
// rate limited with tc tbf in both directions. A benchmark run through the
// testbed therefore sees what it would see on real hosts behind 1 Gbit/s
// (or whatever --rate says) links: a client can pull at most one link's
// worth, N data servers can deliver N links' worth in aggregate, and the
// MDS is a separate hop. With Config.Mirrors copies of every stripe unit
// the data servers forward each other the extra copies over the same
// links, so the cost of replication is measured too.
//
// Design choices:
//
//   - The plumbing is done by exec'ing ip(8) and tc(8) rather than talking
//     netlink: the commands are the documentation, failures are reported
//     with the exact command line, and a human can replay or inspect every
//     step (`ip -n shoaltb-sw link`).
//   - Nothing is attached to the host namespace. Veth pairs are created in
//     the switch namespace with their peer moved straight into the role
//     namespace, addresses (10.77.0.0/16) exist only inside the testbed, and
//     no namespace has a default route, so traffic cannot leave it.
//   - Servers run as separate processes (`ip netns exec NS shoal mds|ds`),
//     in their own sessions so a terminal's Ctrl-C does not reach them, and
//     outlive `up`. Their PIDs and command lines go to a JSON state file
//     that is written before anything is created and updated after every
//     step, so `down` can undo an interrupted `up`. `down` only signals a
//     process whose /proc cmdline is the one recorded (or, for a process
//     started just before `up` died, one running our binary on our data
//     directory), never anything else living in a namespace.
//   - Link measurements (Measure) run in-process: a goroutine locked to an
//     OS thread enters a namespace with setns(2) just long enough to create
//     a socket, which then stays in that namespace. No helper binaries, no
//     iperf3.
package testbed

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shoalfs/shoal/meta"
)

// Role is what runs in a node's namespace.
type Role string

// Node roles.
const (
	RoleMDS    Role = "mds"
	RoleDS     Role = "ds"
	RoleClient Role = "client"
)

// Defaults.
const (
	DefaultName = "shoaltb"
	// DefaultRate is the per-link rate at which this project's 2-core
	// machines move a whole pNFS benchmark (6 data servers, 8 clients,
	// the NFS stack and the kernel's forwarding of every link on the same
	// two cores) without running out of CPU: at 500 Mbit/s the machine
	// stays under half busy and every cell reaches 93-95% of its links;
	// at 1 Gbit/s the links alone are sustained (`shoal testbed check`)
	// but the 4-6 data-server cells become CPU-bound. docs/testbed.md and
	// docs/benchmarks.md have the measurements.
	DefaultRate = "500mbit"
	// StorageTmpfs puts every data server's directory on one tmpfs. A real
	// cluster gives each data server its own disks; here they would all
	// share the machine's one disk, whose fsync bandwidth (about 270 MB/s
	// measured on the 2-core development machine) would cap the aggregate
	// write rate of 3 or more data servers at 1 gbit and hide the network
	// scaling the testbed exists to show. The MDS keeps its metadata on
	// disk either way.
	StorageTmpfs = "tmpfs"
	// StorageDisk keeps the data servers' directories under Dir.
	StorageDisk = "disk"
	// DefaultTmpfsSize bounds the data tmpfs; a benchmark removes its
	// files after every run, so this only needs to hold one run.
	DefaultTmpfsSize = "12g"
	// dataDir is the subdirectory of Dir that holds the data servers'
	// directories (and is the tmpfs mount point).
	dataDir = "data"
	// NFSPort is where the MDS and every DS listen inside their namespace.
	NFSPort = 2049
	// MetricsPort is where the servers serve Prometheus metrics.
	MetricsPort = 9100
	// Subnet holds every testbed address.
	Subnet = "10.77.0.0/16"
	// StateFile is the name of the state file inside the testbed directory.
	StateFile = "testbed.json"
	// marker says a directory belongs to a testbed, so `up` may clear the
	// role directories a previous run left in it.
	marker = ".shoal-testbed"
	// bridge is the bridge device in the switch namespace.
	bridge = "br0"
	// iface is the link's name inside a role namespace.
	iface = "eth0"
	// Max nodes per role: one /24 each.
	maxPerRole = 200
)

// Config describes a testbed to bring up.
type Config struct {
	// Name prefixes every namespace (NAME-mds, NAME-ds0, NAME-c0, NAME-sw).
	Name string
	// DataServers and Clients count the DS and client namespaces.
	DataServers, Clients int
	// Mirrors is the cluster's default number of copies of every stripe
	// unit (`shoal mds --mirrors`), 1 to meta.MaxMirrors and at most
	// DataServers; 0 means 1. With more than one copy the data server a
	// client writes to forwards the bytes to the other copies' data
	// servers over their peer addresses, which are their own testbed
	// addresses, so replication crosses the same rate-limited links.
	Mirrors int
	// Rate limits every link, both directions (tc notation, e.g. "1gbit").
	Rate string
	// Dir holds the state file, the servers' data directories and logs.
	Dir string
	// Storage is where the data servers keep file data: StorageTmpfs
	// (the default) or StorageDisk. See StorageTmpfs for why.
	Storage string
	// TmpfsSize caps the tmpfs of StorageTmpfs (mount's size=, default
	// DefaultTmpfsSize).
	TmpfsSize string
	// Binary is the shoal executable run in the server namespaces.
	Binary string
	// Ready bounds how long Up waits for the servers (default 60s).
	Ready  time.Duration
	Logger *slog.Logger
}

// Node is one namespace of the testbed.
type Node struct {
	Name      string `json:"name"` // mds, ds0, c0
	Role      Role   `json:"role"`
	Namespace string `json:"namespace"`
	// IP is the node's only address (on eth0 inside its namespace).
	IP string `json:"ip"`
	// SwitchIface is the peer of eth0 in the switch namespace.
	SwitchIface string `json:"switch_iface"`
	// Addr is the NFS address of a server ("" for clients).
	Addr    string `json:"addr,omitempty"`
	Metrics string `json:"metrics,omitempty"`
	// PID and Cmdline identify the server process we started.
	PID     int      `json:"pid,omitempty"`
	Cmdline []string `json:"cmdline,omitempty"`
	Log     string   `json:"log,omitempty"`
}

// State is the JSON state file: everything `exec`, `check` and `down` need.
type State struct {
	Name     string `json:"name"`
	Dir      string `json:"dir"`
	Rate     string `json:"rate"`
	RateBits Rate   `json:"rate_bits_per_sec"`
	Switch   string `json:"switch_namespace"`
	Subnet   string `json:"subnet"`
	MDS      string `json:"mds_addr"`
	Binary   string `json:"binary"`
	Storage  string `json:"storage"`
	// Mirrors is the MDS's --mirrors (0 in a state file written before
	// it was recorded: one copy).
	Mirrors int `json:"mirrors,omitempty"`
	// DataMount is the tmpfs mounted for the data servers ("" if on disk);
	// down unmounts it.
	DataMount string    `json:"data_mount,omitempty"`
	Nodes     []Node    `json:"nodes"`
	Created   time.Time `json:"created"`
	// Ready is set once every server answered.
	Ready bool `json:"ready"`
}

var nameRE = regexp.MustCompile(`^[a-z][a-z0-9]{0,15}$`)

// Plan computes the testbed layout for cfg without touching the system.
func Plan(cfg Config) (*State, error) {
	if cfg.Name == "" {
		cfg.Name = DefaultName
	}
	if !nameRE.MatchString(cfg.Name) {
		return nil, fmt.Errorf("bad testbed name %q: want [a-z][a-z0-9]{0,15}", cfg.Name)
	}
	if cfg.DataServers < 1 || cfg.DataServers > maxPerRole {
		return nil, fmt.Errorf("--ds %d out of range 1..%d", cfg.DataServers, maxPerRole)
	}
	if cfg.Clients < 1 || cfg.Clients > maxPerRole {
		return nil, fmt.Errorf("--clients %d out of range 1..%d", cfg.Clients, maxPerRole)
	}
	if cfg.Rate == "" {
		cfg.Rate = DefaultRate
	}
	if cfg.Mirrors == 0 {
		cfg.Mirrors = 1
	}
	if cfg.Mirrors < 1 || cfg.Mirrors > meta.MaxMirrors || cfg.Mirrors > cfg.DataServers {
		return nil, fmt.Errorf("--mirrors %d out of range 1..%d (and at most --ds %d)", cfg.Mirrors, meta.MaxMirrors, cfg.DataServers)
	}
	switch cfg.Storage {
	case "":
		cfg.Storage = StorageTmpfs
	case StorageTmpfs, StorageDisk:
	default:
		return nil, fmt.Errorf("bad --storage %q: want %s or %s", cfg.Storage, StorageTmpfs, StorageDisk)
	}
	rate, err := ParseRate(cfg.Rate)
	if err != nil {
		return nil, err
	}
	dir, err := filepath.Abs(DirFor(cfg.Name, cfg.Dir))
	if err != nil {
		return nil, err
	}
	s := &State{
		Name: cfg.Name, Dir: dir, Rate: rate.String(), RateBits: rate,
		Switch: cfg.Name + "-sw", Subnet: Subnet, Binary: cfg.Binary, Created: time.Now().UTC(),
		Storage: cfg.Storage, Mirrors: cfg.Mirrors,
	}
	add := func(name string, role Role, ip string) {
		n := Node{Name: name, Role: role, Namespace: cfg.Name + "-" + name, IP: ip, SwitchIface: "v-" + name}
		if role != RoleClient {
			n.Addr = net.JoinHostPort(ip, strconv.Itoa(NFSPort))
			n.Metrics = net.JoinHostPort(ip, strconv.Itoa(MetricsPort))
			n.Log = filepath.Join(dir, "logs", name+".log")
		}
		s.Nodes = append(s.Nodes, n)
	}
	add("mds", RoleMDS, "10.77.0.1")
	for i := range cfg.DataServers {
		add(fmt.Sprintf("ds%d", i), RoleDS, fmt.Sprintf("10.77.1.%d", i+1))
	}
	for i := range cfg.Clients {
		add(fmt.Sprintf("c%d", i), RoleClient, fmt.Sprintf("10.77.2.%d", i+1))
	}
	s.MDS = s.Nodes[0].Addr
	return s, nil
}

// DirFor returns the testbed directory: dir, or $TMPDIR/NAME.
func DirFor(name, dir string) string {
	if dir != "" {
		return dir
	}
	if name == "" {
		name = DefaultName
	}
	return filepath.Join(os.TempDir(), name)
}

// Node returns the node called name (mds, ds0, c0, or its namespace name).
func (s *State) Node(name string) (Node, bool) {
	for _, n := range s.Nodes {
		if n.Name == name || n.Namespace == name {
			return n, true
		}
	}
	return Node{}, false
}

// ByRole returns the nodes of role r in order.
func (s *State) ByRole(r Role) []Node {
	var out []Node
	for _, n := range s.Nodes {
		if n.Role == r {
			out = append(out, n)
		}
	}
	return out
}

// Copies is the number of copies of every stripe unit the MDS keeps by
// default (its --mirrors).
func (s *State) Copies() int {
	return max(s.Mirrors, 1)
}

// Namespaces returns every namespace of the testbed, the switch last.
func (s *State) Namespaces() []string {
	var out []string
	for _, n := range s.Nodes {
		out = append(out, n.Namespace)
	}
	return append(out, s.Switch)
}

// Command returns a command running args inside node's namespace, with
// SHOAL_TESTBED_MDS set to the MDS address.
func (s *State) Command(ctx context.Context, node string, args ...string) (*exec.Cmd, error) {
	n, ok := s.Node(node)
	if !ok {
		return nil, fmt.Errorf("no node %q in testbed %s (have %s)", node, s.Name, strings.Join(s.nodeNames(), ", "))
	}
	if len(args) == 0 {
		return nil, errors.New("no command")
	}
	c := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", n.Namespace}, args...)...)
	c.Env = append(os.Environ(), "SHOAL_TESTBED_MDS="+s.MDS)
	return c, nil
}

func (s *State) nodeNames() []string {
	var out []string
	for _, n := range s.Nodes {
		out = append(out, n.Name)
	}
	return out
}

// Save writes the state file atomically.
func (s *State) Save() error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	p := filepath.Join(s.Dir, StateFile)
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, p)
}

// Load reads the state file of the testbed in dir.
func Load(dir string) (*State, error) {
	b, err := os.ReadFile(filepath.Join(dir, StateFile))
	if err != nil {
		return nil, err
	}
	var s State
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, StateFile), err)
	}
	return &s, nil
}

// Up brings a testbed up: namespaces, links, rate limits, the MDS and the
// data servers, and waits until every data server has registered. On any
// failure, or when ctx is cancelled, it tears down what it built.
func Up(ctx context.Context, cfg Config) (st *State, err error) {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	if cfg.Binary == "" {
		return nil, errors.New("testbed: no shoal binary")
	}
	bin, err := exec.LookPath(cfg.Binary)
	if err == nil {
		bin, err = filepath.Abs(bin)
	}
	if err != nil {
		return nil, fmt.Errorf("testbed: shoal binary: %w", err)
	}
	cfg.Binary = bin
	if cfg.Ready == 0 {
		cfg.Ready = 60 * time.Second
	}
	s, err := Plan(cfg)
	if err != nil {
		return nil, err
	}
	for _, ns := range s.Namespaces() {
		if namespaceExists(ns) {
			return nil, fmt.Errorf("namespace %s exists: testbed %s is already up (run `shoal testbed down --name %s`)", ns, s.Name, s.Name)
		}
	}
	if err := prepareDir(s.Dir); err != nil {
		return nil, err
	}
	if err := s.Save(); err != nil {
		return nil, err
	}
	b := &builder{s: s, log: log, exited: map[string]chan struct{}{}}
	if s.Storage == StorageTmpfs {
		size := cfg.TmpfsSize
		if size == "" {
			size = DefaultTmpfsSize
		}
		mp := filepath.Join(s.Dir, dataDir)
		if err := unix.Mount("shoal-testbed", mp, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size="+size+",mode=0755"); err != nil {
			return nil, fmt.Errorf("testbed: mount tmpfs on %s: %w", mp, err)
		}
		s.DataMount = mp
		if err := s.Save(); err != nil {
			_ = unix.Unmount(mp, 0)
			return nil, err
		}
	}
	defer func() {
		if err == nil {
			return
		}
		log.Warn("testbed up failed; tearing down", "err", err)
		down, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		if derr := teardown(down, s, log); derr != nil {
			log.Warn("teardown", "err", derr)
		}
		if ctx.Err() != nil {
			err = fmt.Errorf("testbed up interrupted: %w", err)
		}
	}()
	if err := b.network(ctx); err != nil {
		return nil, err
	}
	if err := b.servers(ctx, cfg.Ready); err != nil {
		return nil, err
	}
	s.Ready = true
	if err := s.Save(); err != nil {
		return nil, err
	}
	return s, nil
}

// prepareDir creates dir, or clears the role directories of an earlier
// testbed in it. It refuses a non-empty directory that is not a testbed's.
func prepareDir(dir string) error {
	ents, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, os.ErrNotExist) || (err == nil && len(ents) == 0):
	case err != nil:
		return err
	default:
		if _, err := os.Stat(filepath.Join(dir, marker)); err != nil {
			return fmt.Errorf("%s is not empty and not a testbed directory; pick another --dir", dir)
		}
		if _, err := os.Stat(filepath.Join(dir, StateFile)); err == nil {
			return fmt.Errorf("%s holds a testbed state file: run `shoal testbed down --dir %s` first", dir, dir)
		}
		unmountData(dir)
		for _, e := range ents {
			if e.Name() == marker {
				continue
			}
			if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	for _, sub := range []string{"logs", dataDir} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			return err
		}
	}
	return os.WriteFile(filepath.Join(dir, marker), []byte("shoal testbed directory\n"), 0o644)
}

type builder struct {
	s   *State
	log *slog.Logger
	// exited is closed when a server process ends (Up reaps its children).
	exited map[string]chan struct{}
}

func (b *builder) ip(ctx context.Context, args ...string) error {
	_, err := run(ctx, "ip", args...)
	return err
}

// network creates the switch and one rate-limited link per node.
func (b *builder) network(ctx context.Context) error {
	s := b.s
	sw := s.Switch
	steps := [][]string{
		{"netns", "add", sw},
		{"-n", sw, "link", "set", "lo", "up"},
		{"-n", sw, "link", "add", bridge, "type", "bridge"},
		{"-n", sw, "link", "set", bridge, "up"},
	}
	for _, st := range steps {
		if err := b.ip(ctx, st...); err != nil {
			return err
		}
	}
	for _, n := range s.Nodes {
		if err := ctx.Err(); err != nil {
			return err
		}
		steps := [][]string{
			{"netns", "add", n.Namespace},
			{"-n", n.Namespace, "link", "set", "lo", "up"},
			// Created in the switch, peer moved straight into the node:
			// the host namespace never sees either end.
			{"-n", sw, "link", "add", n.SwitchIface, "type", "veth", "peer", "name", iface, "netns", n.Namespace},
			{"-n", sw, "link", "set", n.SwitchIface, "master", bridge},
			{"-n", sw, "link", "set", n.SwitchIface, "up"},
			{"-n", n.Namespace, "addr", "add", n.IP + "/16", "dev", iface},
			{"-n", n.Namespace, "link", "set", iface, "up"},
		}
		for _, st := range steps {
			if err := b.ip(ctx, st...); err != nil {
				return err
			}
		}
	}
	return SetRate(ctx, s, s.RateBits)
}

// SetRate (re)applies rate to both ends of every link of a running testbed.
// It does not change the state file: Check uses it to try other rates.
func SetRate(ctx context.Context, s *State, rate Rate) error {
	for _, n := range s.Nodes {
		for _, end := range [][2]string{{n.Namespace, iface}, {s.Switch, n.SwitchIface}} {
			args := append([]string{"-n", end[0], "qdisc", "replace", "dev", end[1], "root"}, rate.tbfArgs()...)
			if _, err := run(ctx, "tc", args...); err != nil {
				return err
			}
		}
	}
	return nil
}

// servers starts the MDS, then the data servers, and waits for them.
func (b *builder) servers(ctx context.Context, ready time.Duration) error {
	s := b.s
	ctx, cancel := context.WithTimeout(ctx, ready)
	defer cancel()
	mds := s.ByRole(RoleMDS)[0]
	if err := b.start(ctx, mds.Name, "mds", "--listen", mds.Addr, "--dir", filepath.Join(s.Dir, mds.Name),
		"--no-root-squash", "--http", mds.Metrics, "--mirrors", strconv.Itoa(s.Copies())); err != nil {
		return err
	}
	// Listening means started: the MDS made its join secret (the file
	// wiring.JoinSecretName in its --dir) before it listened.
	if err := b.waitTCP(ctx, mds); err != nil {
		return err
	}
	// Clients and the other data servers reach a DS at the same address:
	// its namespace's only one, so replicated writes (a DS forwarding a
	// client's bytes to the other copies) cross the sender's upload and
	// the receiver's download links like client traffic.
	for _, d := range s.ByRole(RoleDS) {
		if err := b.start(ctx, d.Name, "ds", "--listen", d.Addr, "--dir", filepath.Join(s.Dir, dataDir, d.Name),
			"--mds", s.MDS, "--join-secret-file", filepath.Join(s.Dir, mds.Name, "join-secret"),
			"--advertise", d.Addr, "--peer-advertise", d.Addr, "--http", d.Metrics); err != nil {
			return err
		}
	}
	for _, d := range s.ByRole(RoleDS) {
		if err := b.waitRegistered(ctx, d); err != nil {
			return err
		}
	}
	// Every data server must reach every other one's peer address (a
	// policy can ask for copies even when the default is one).
	for _, from := range s.ByRole(RoleDS) {
		for _, to := range s.ByRole(RoleDS) {
			if from.Name == to.Name {
				continue
			}
			if err := probe(ctx, from.Namespace, to.Addr); err != nil {
				return fmt.Errorf("data server %s cannot reach its peer %s at %s: %w", from.Name, to.Name, to.Addr, err)
			}
		}
	}
	// Every client must reach every server.
	for _, c := range s.ByRole(RoleClient) {
		for _, n := range s.Nodes {
			if n.Addr == "" {
				continue
			}
			if err := probe(ctx, c.Namespace, n.Addr); err != nil {
				return fmt.Errorf("client %s cannot reach %s at %s: %w", c.Name, n.Name, n.Addr, err)
			}
		}
	}
	return nil
}

// start runs `shoal ARGS` in node's namespace, in a session of its own.
func (b *builder) start(ctx context.Context, node string, args ...string) error {
	s := b.s
	idx := slices.IndexFunc(s.Nodes, func(n Node) bool { return n.Name == node })
	n := &s.Nodes[idx]
	logf, err := os.OpenFile(n.Log, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	argv := append([]string{s.Binary}, args...)
	// `ip netns exec` execs the program in place, so the PID we get is the
	// server's own.
	c := exec.Command("ip", append([]string{"netns", "exec", n.Namespace}, argv...)...)
	c.Stdout, c.Stderr = logf, logf
	c.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := c.Start(); err != nil {
		return fmt.Errorf("start %s: %w", node, err)
	}
	n.PID, n.Cmdline = c.Process.Pid, argv
	done := make(chan struct{})
	b.exited[node] = done
	go func() { _ = c.Wait(); close(done) }()
	b.log.Info("testbed: started", "node", node, "pid", n.PID, "addr", n.Addr)
	return s.Save()
}

// alive fails if node's process has exited, quoting its log.
func (b *builder) alive(n Node) error {
	select {
	case <-b.exited[n.Name]:
		return fmt.Errorf("%s exited during startup; last log lines:\n%s", n.Name, tail(n.Log, 10))
	default:
		return nil
	}
}

// poll calls f every 100ms until it succeeds, node's process dies, or ctx
// ends.
func (b *builder) poll(ctx context.Context, n Node, what string, f func(context.Context) error) error {
	var last error
	for {
		if err := b.alive(n); err != nil {
			return err
		}
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		last = f(pctx)
		cancel()
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s %s: %w (last error: %v)", n.Name, what, ctx.Err(), last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (b *builder) waitTCP(ctx context.Context, n Node) error {
	return b.poll(ctx, n, "not listening", func(ctx context.Context) error {
		return probe(ctx, n.Namespace, n.Addr)
	})
}

// waitRegistered waits until data server n serves its metrics with the
// "ds" role label: the DS only creates its NFS server, and registers that
// collector, after the MDS accepted its REGISTER.
func (b *builder) waitRegistered(ctx context.Context, n Node) error {
	return b.poll(ctx, n, "did not register with the MDS", func(ctx context.Context) error {
		body, err := httpGetIn(ctx, n.Namespace, n.Metrics, "/metrics")
		if err != nil {
			return err
		}
		if !strings.Contains(body, `role="ds"`) {
			return errors.New("no data-server metrics yet")
		}
		return nil
	})
}

// probe opens and closes a TCP connection from namespace ns to addr.
func probe(ctx context.Context, ns, addr string) error {
	c, err := DialIn(ctx, ns, addr)
	if err != nil {
		return err
	}
	return c.Close()
}

// httpGetIn fetches http://addr/path from inside namespace ns. It speaks
// HTTP/1.0 by hand so the request needs no transport with its own dialer
// goroutines, and the server closes the connection after the answer.
func httpGetIn(ctx context.Context, ns, addr, path string) (string, error) {
	c, err := DialIn(ctx, ns, addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.0\r\nHost: %s\r\n\r\n", path, addr); err != nil {
		return "", err
	}
	b, err := io.ReadAll(io.LimitReader(c, 16<<20))
	if err != nil {
		return "", err
	}
	resp := string(b)
	if !strings.HasPrefix(resp, "HTTP/1.") || !strings.Contains(strings.SplitN(resp, "\r\n", 2)[0], " 200 ") {
		return "", fmt.Errorf("GET http://%s%s: %q", addr, path, strings.SplitN(resp, "\r\n", 2)[0])
	}
	return resp, nil
}

// tail returns the last n lines of file p.
func tail(p string, n int) string {
	b, err := os.ReadFile(p)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// unmountData unmounts the data tmpfs of the testbed in dir if one is
// mounted there (a crashed `up` or `down` may leave it behind).
func unmountData(dir string) error {
	mp := filepath.Join(dir, dataDir)
	mounted, err := isMountPoint(mp)
	if err != nil || !mounted {
		return err
	}
	if err := unix.Unmount(mp, 0); err != nil {
		return fmt.Errorf("testbed: unmount %s: %w", mp, err)
	}
	return nil
}

// isMountPoint reports whether path is a mount point, by comparing its
// device with its parent's (tmpfs always has a device of its own).
func isMountPoint(path string) (bool, error) {
	var st, parent unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return false, nil
		}
		return false, err
	}
	if err := unix.Lstat(filepath.Dir(path), &parent); err != nil {
		return false, err
	}
	return st.Dev != parent.Dev, nil
}
