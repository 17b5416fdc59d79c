package membership

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/shoalfs/shoal/internal/shoalbin"
)

// shoalBin is the shoal command TestMain built (or $SHOAL_BIN).
var shoalBin string

func TestMain(m *testing.M) {
	bin, cleanup, err := shoalbin.Build("shoal-membership-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "membership:", err)
		os.Exit(1)
	}
	shoalBin = bin
	code := m.Run()
	cleanup()
	os.Exit(code)
}

// proc is a long-running shoal process (mds or ds) the test started.
type proc struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{} // closed when the process has been waited for
	err     error         // Wait's result, once done is closed
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// signal sends sig to the process (only to it: never its group, never
// anything found by name). os.Process uses a pidfd, so a process already
// waited for is never confused with a new one holding the same PID.
func (p *proc) signal(sig syscall.Signal) {
	if p.exited() {
		return
	}
	_ = p.cmd.Process.Signal(sig)
}

// wait waits up to d for the process to exit.
func (p *proc) wait(d time.Duration) error {
	select {
	case <-p.done:
		return nil
	case <-time.After(d):
		return fmt.Errorf("%s (pid %d) still running after %v", p.name, p.cmd.Process.Pid, d)
	}
}

func (p *proc) log() string {
	b, _ := os.ReadFile(p.logPath)
	return string(b)
}

// cluster is the processes of one test case and what was written to them.
type cluster struct {
	t       *testing.T
	logDir  string
	work    string // scratch: sources of puts, destinations of gets
	mdsDir  string
	mdsAddr string   // 127.0.0.1:PORT, fixed by the MDS's first start
	metaURL string   // "" for bolt
	mdsArgs []string // extra `shoal mds` flags
	secret  string   // the join-secret file
	mds     *proc
	ds      []*dsNode // in the order they first started
	seq     int

	cmdLogMu sync.Mutex
	cmdLog   *os.File // transcript of every short command

	filesMu sync.Mutex
	files   []*file
	tmpSeq  int
}

// dsNode is one data server: its directory and identity outlive its
// processes.
type dsNode struct {
	name string
	dir  string
	id   string
	p    *proc
}

// file is a file written through `shoal put`, with the sha256 of what was
// written.
type file struct {
	name string
	size int64
	sum  [32]byte
}

func newCluster(t *testing.T, metaURL string) *cluster {
	base := t.TempDir()
	c := &cluster{
		t:       t,
		logDir:  filepath.Join(base, "logs"),
		work:    filepath.Join(base, "work"),
		mdsDir:  filepath.Join(base, "mds"),
		metaURL: metaURL,
	}
	for _, d := range []string{c.logDir, c.work} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	c.secret = filepath.Join(c.mdsDir, "join-secret")
	f, err := os.Create(filepath.Join(c.logDir, "00-commands.log"))
	if err != nil {
		t.Fatal(err)
	}
	c.cmdLog = f
	// Registered first, so it runs last: after every process is gone.
	t.Cleanup(func() {
		c.cmdLog.Close()
		if t.Failed() {
			c.dumpLogs()
		}
	})
	return c
}

// dumpLogs shows every log (the tail of long ones) in the test output.
func (c *cluster) dumpLogs() {
	ents, _ := os.ReadDir(c.logDir)
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(c.logDir, e.Name()))
		if err != nil {
			continue
		}
		const max = 96 << 10
		s := string(b)
		if len(s) > max {
			s = "[... " + strconv.Itoa(len(s)-max) + " bytes cut ...]\n" + s[len(s)-max:]
		}
		c.t.Logf("==== %s ====\n%s", e.Name(), s)
	}
}

// start starts a long-running shoal process; it is killed (SIGKILL) and
// waited for when the test ends, if it has not exited before.
func (c *cluster) start(name string, args ...string) *proc {
	c.t.Helper()
	c.seq++
	logPath := filepath.Join(c.logDir, fmt.Sprintf("%02d-%s.log", c.seq, name))
	lf, err := os.Create(logPath)
	if err != nil {
		c.t.Fatal(err)
	}
	fmt.Fprintf(lf, "$ shoal %s\n", strings.Join(args, " "))
	cmd := exec.Command(shoalBin, args...)
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		lf.Close()
		c.t.Fatalf("start %s: %v", name, err)
	}
	p := &proc{name: name, cmd: cmd, logPath: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		lf.Close()
		close(p.done)
	}()
	c.t.Logf("started %s (pid %d): shoal %s", name, cmd.Process.Pid, strings.Join(args, " "))
	c.t.Cleanup(func() {
		p.signal(syscall.SIGKILL)
		if err := p.wait(15 * time.Second); err != nil {
			c.t.Errorf("cleanup: %v", err)
		}
	})
	return p
}

// waitLog waits until p's log matches re, and returns the match. It fails
// the test if p exits first or d passes.
func (c *cluster) waitLog(p *proc, re *regexp.Regexp, d time.Duration) []string {
	c.t.Helper()
	deadline := time.Now().Add(d)
	for {
		if m := re.FindStringSubmatch(p.log()); m != nil {
			return m
		}
		if p.exited() {
			if m := re.FindStringSubmatch(p.log()); m != nil {
				return m
			}
			c.t.Fatalf("%s exited (%v) before logging %q", p.name, p.err, re)
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("%s did not log %q within %v", p.name, re, d)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

var mdsReady = regexp.MustCompile(`shoal mds ready.* listen=(\S+)`)

// startMDS starts the MDS; the first start picks the port (127.0.0.1:0),
// later ones reuse it, as data servers and clients know it.
func (c *cluster) startMDS() {
	c.t.Helper()
	listen := c.mdsAddr
	if listen == "" {
		listen = "127.0.0.1:0"
	}
	args := []string{"mds", "--listen", listen, "--dir", c.mdsDir, "--no-root-squash", "--ds-down-after", dsDownAfter.String()}
	if c.metaURL != "" {
		args = append(args, "--meta", c.metaURL)
	}
	args = append(args, c.mdsArgs...)
	c.mds = c.start("mds", args...)
	m := c.waitLog(c.mds, mdsReady, 60*time.Second)
	if c.mdsAddr == "" {
		c.mdsAddr = m[1]
	} else if m[1] != c.mdsAddr {
		c.t.Fatalf("restarted MDS listens on %s, not %s", m[1], c.mdsAddr)
	}
}

var dsReady = regexp.MustCompile(`shoal ds ready.* id=(\S+)`)

// startDS starts (or restarts) data server n and checks that its identity
// is the one in its directory and, on a restart, the one it had.
func (c *cluster) startDS(n *dsNode) {
	c.t.Helper()
	n.p = c.start(n.name, "ds", "--mds", c.mdsAddr, "--join-secret-file", c.secret, "--dir", n.dir, "--listen", "127.0.0.1:0")
	m := c.waitLog(n.p, dsReady, 60*time.Second)
	b, err := os.ReadFile(filepath.Join(n.dir, "ds-identity.json"))
	if err != nil {
		c.t.Fatal(err)
	}
	var ident struct {
		ID        string `json:"id"`
		ClusterID string `json:"cluster_id"`
	}
	if err := json.Unmarshal(b, &ident); err != nil {
		c.t.Fatalf("%s: ds-identity.json: %v: %s", n.name, err, b)
	}
	if ident.ID != m[1] {
		c.t.Fatalf("%s logged id %s, its ds-identity.json says %s", n.name, m[1], ident.ID)
	}
	if n.id != "" && n.id != ident.ID {
		c.t.Fatalf("%s restarted as %s, was %s", n.name, ident.ID, n.id)
	}
	n.id = ident.ID
}

// addDS creates and starts a new data server.
func (c *cluster) addDS() *dsNode {
	c.t.Helper()
	n := &dsNode{name: fmt.Sprintf("ds%d", len(c.ds)+1)}
	n.dir = filepath.Join(filepath.Dir(c.mdsDir), n.name)
	c.ds = append(c.ds, n)
	c.startDS(n)
	c.t.Logf("%s is data server %s", n.name, n.id)
	return n
}

// result is how a short shoal command ended.
type result struct {
	args           []string
	stdout, stderr string
	err            error
	dur            time.Duration
}

func (r result) String() string {
	return fmt.Sprintf("shoal %s: %v after %v\nstdout:\n%sstderr:\n%s", strings.Join(r.args, " "), r.err, r.dur.Round(time.Millisecond), r.stdout, r.stderr)
}

// run runs a short shoal command to its end (killed after timeout) and
// records it in the commands log. It is safe from several goroutines.
func (c *cluster) run(timeout time.Duration, args ...string) result {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, shoalBin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.WaitDelay = 5 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	r := result{args: args, stdout: stdout.String(), stderr: stderr.String(), err: err, dur: time.Since(start)}
	if ctx.Err() != nil && err != nil {
		r.err = fmt.Errorf("%w (killed after %v)", err, timeout)
	}
	c.cmdLogMu.Lock()
	fmt.Fprintf(c.cmdLog, "%s %s\n", start.Format("15:04:05.000"), r)
	c.cmdLogMu.Unlock()
	return r
}

// admin runs `shoal admin ARGS` against the MDS.
func (c *cluster) admin(timeout time.Duration, args ...string) result {
	return c.run(timeout, append(append([]string{"admin"}, args...), "--mds", c.mdsAddr, "--join-secret-file", c.secret)...)
}

// dsStatus and status mirror `shoal admin status --json`.
type dsStatus struct {
	ID    string
	Addrs []string
	State string
	Up    bool
	Files int    `json:"files"`
	Bytes uint64 `json:"bytes"`
}

type status struct {
	ClusterID   string     `json:"cluster_id"`
	DataServers []dsStatus `json:"data_servers"`
	Unavailable []struct {
		Ino  uint64   `json:"ino"`
		Down []string `json:"down"`
	} `json:"unavailable"`
	UnavailableFiles int             `json:"unavailable_files"`
	Files            int             `json:"files"`
	Job              json.RawMessage `json:"job"`
	Replication      struct {
		DegradedFiles   int `json:"degraded_files"`
		DegradedStripes int `json:"degraded_stripes"`
	} `json:"replication"`
}

func (s *status) ds(id string) *dsStatus {
	for i := range s.DataServers {
		if s.DataServers[i].ID == id {
			return &s.DataServers[i]
		}
	}
	return nil
}

func (s *status) String() string {
	b, _ := json.MarshalIndent(s, "", "  ")
	return string(b)
}

// status returns `shoal admin status --json`, or an error.
func (c *cluster) statusErr() (*status, error) {
	r := c.admin(60*time.Second, "status", "--json")
	if r.err != nil {
		return nil, errors.New(r.String())
	}
	var st status
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
		return nil, fmt.Errorf("status --json: %v\n%s", err, r)
	}
	return &st, nil
}

func (c *cluster) status() *status {
	c.t.Helper()
	st, err := c.statusErr()
	if err != nil {
		c.t.Fatal(err)
	}
	return st
}

// waitStatus polls `shoal admin status --json` until ok accepts it.
func (c *cluster) waitStatus(what string, d time.Duration, ok func(*status) bool) *status {
	c.t.Helper()
	deadline := time.Now().Add(d)
	var last *status
	var lastErr error
	for {
		st, err := c.statusErr()
		if err == nil && ok(st) {
			return st
		}
		last, lastErr = st, err
		if time.Now().After(deadline) {
			c.t.Fatalf("waited %v for %s; last status: %v %v", d, what, last, lastErr)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// waitUp waits until exactly the data servers up are in service, each in
// state active.
func (c *cluster) waitUp(up ...*dsNode) *status {
	c.t.Helper()
	var names []string
	for _, n := range up {
		names = append(names, n.name)
	}
	return c.waitStatus(fmt.Sprintf("data servers %v up", names), 60*time.Second, func(st *status) bool {
		count := 0
		for _, d := range st.DataServers {
			if d.Up {
				count++
			}
		}
		if count != len(up) {
			return false
		}
		for _, n := range up {
			d := st.ds(n.id)
			if d == nil || !d.Up || d.State != "active" {
				return false
			}
		}
		return true
	})
}

func (c *cluster) url(name string) string { return "nfs://" + c.mdsAddr + "/" + name }

// scratch returns a new empty directory under the work directory.
func (c *cluster) scratch(prefix string) (string, error) {
	c.filesMu.Lock()
	c.tmpSeq++
	n := c.tmpSeq
	c.filesMu.Unlock()
	d := filepath.Join(c.work, fmt.Sprintf("%s-%d", prefix, n))
	return d, os.Mkdir(d, 0o755)
}

// put writes a new file of size random bytes as name and records its
// sha256. It returns an error rather than failing the test, for use from
// goroutines.
func (c *cluster) put(name string, size int64) (*file, error) {
	dir, err := c.scratch("put")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	src := filepath.Join(dir, name)
	f, err := os.Create(src)
	if err != nil {
		return nil, err
	}
	h := sha256.New()
	if _, err := io.CopyN(io.MultiWriter(f, h), rand.Reader, size); err != nil {
		f.Close()
		return nil, err
	}
	if err := f.Close(); err != nil {
		return nil, err
	}
	r := c.run(120*time.Second, "put", src, c.url(name))
	if r.err != nil {
		return nil, errors.New(r.String())
	}
	fl := &file{name: name, size: size}
	h.Sum(fl.sum[:0])
	c.filesMu.Lock()
	c.files = append(c.files, fl)
	c.filesMu.Unlock()
	return fl, nil
}

func (c *cluster) mustPut(name string, size int64) *file {
	c.t.Helper()
	f, err := c.put(name, size)
	if err != nil {
		c.t.Fatal(err)
	}
	return f
}

func (c *cluster) allFiles() []*file {
	c.filesMu.Lock()
	defer c.filesMu.Unlock()
	return append([]*file(nil), c.files...)
}

// getResult is one `shoal get` of a file into an empty directory.
type getResult struct {
	result
	left []string // what the get left in its directory
	sum  [32]byte // of what it wrote, when it succeeded
	size int64
}

// get reads f back with `shoal get` into a fresh directory.
func (c *cluster) get(f *file) (getResult, error) {
	dir, err := c.scratch("get")
	if err != nil {
		return getResult{}, err
	}
	defer os.RemoveAll(dir)
	dst := filepath.Join(dir, "out")
	g := getResult{result: c.run(120*time.Second, "get", c.url(f.name), dst)}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return g, err
	}
	for _, e := range ents {
		g.left = append(g.left, e.Name())
	}
	if g.err == nil {
		lf, err := os.Open(dst)
		if err != nil {
			return g, fmt.Errorf("get %s succeeded but: %v", f.name, err)
		}
		defer lf.Close()
		h := sha256.New()
		if g.size, err = io.Copy(h, lf); err != nil {
			return g, err
		}
		h.Sum(g.sum[:0])
	}
	return g, nil
}

// verify reads f back and checks its bytes; an error says how it failed.
func (c *cluster) verify(f *file) error {
	g, err := c.get(f)
	if err != nil {
		return err
	}
	if g.err != nil {
		return fmt.Errorf("reading %s back failed: %s", f.name, g.result)
	}
	if g.size != f.size || g.sum != f.sum {
		return fmt.Errorf("%s read back as %d bytes sha256 %s; written: %d bytes sha256 %s",
			f.name, g.size, hex.EncodeToString(g.sum[:]), f.size, hex.EncodeToString(f.sum[:]))
	}
	return nil
}

// verifyAll reads every file written so far back and checks it.
func (c *cluster) verifyAll(when string) {
	c.t.Helper()
	start := time.Now()
	files := c.allFiles()
	for _, f := range files {
		if err := c.verify(f); err != nil {
			c.t.Fatalf("%s: %v", when, err)
		}
	}
	c.t.Logf("%s: all %d files read back identical (%v)", when, len(files), time.Since(start).Round(time.Millisecond))
}

// inodes returns the file ids of files, from `shoal stat`.
func (c *cluster) inodes(files []*file) map[string]uint64 {
	c.t.Helper()
	args := []string{"stat"}
	for _, f := range files {
		args = append(args, c.url(f.name))
	}
	r := c.run(60*time.Second, args...)
	if r.err != nil {
		c.t.Fatal(r)
	}
	re := regexp.MustCompile(`(?m)^\s*File: /?(\S+)\n(?:.*\n)*?Fileid: (\d+)`)
	inos := map[string]uint64{}
	for _, m := range re.FindAllStringSubmatch(r.stdout, -1) {
		ino, _ := strconv.ParseUint(m[2], 10, 64)
		inos[m[1]] = ino
	}
	for _, f := range files {
		if _, ok := inos[f.name]; !ok {
			c.t.Fatalf("no Fileid for %s in\n%s", f.name, r)
		}
	}
	return inos
}

// objectFiles counts the objects under a data server's data directory:
// regular files named by an inode number (not the block checksums beside
// them, nor the store's marker file).
func objectFiles(dir string) (int, []string, error) {
	var names []string
	err := filepath.WalkDir(filepath.Join(dir, "data"), func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if _, nerr := strconv.ParseUint(d.Name(), 10, 64); d.Type().IsRegular() && nerr == nil {
			names = append(names, path)
		}
		return nil
	})
	sort.Strings(names)
	return len(names), names, err
}

// holdsData reports whether a data server's directory holds data of inode
// ino: an object with blocks allocated. An object's size alone does not
// say (a truncate goes to every data server of the file's stripe map).
func holdsData(dir string, ino uint64) (bool, error) {
	var st syscall.Stat_t
	err := syscall.Stat(filepath.Join(dir, "data", fmt.Sprintf("%02x", ino&0xff), strconv.FormatUint(ino, 10)), &st)
	if errors.Is(err, syscall.ENOENT) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return st.Blocks > 0, nil
}
