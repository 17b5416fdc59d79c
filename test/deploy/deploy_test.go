package deploy

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
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
	"testing"
	"time"

	"github.com/shoalfs/shoal/fusemount"
)

// shoalBin is the shoal command TestMain built from the checkout, in a
// directory of its own that goes first on the blocks' PATH.
var shoalBin string

func TestMain(m *testing.M) {
	os.Exit(buildAndRun(m))
}

func buildAndRun(m *testing.M) int {
	tmp, err := os.MkdirTemp("", "shoal-deploy-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "deploy:", err)
		return 1
	}
	defer os.RemoveAll(tmp)
	gobin, err := exec.LookPath("go")
	if err != nil { // go test may run with a PATH that lacks the toolchain
		gobin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	shoalBin = filepath.Join(tmp, "shoal")
	build := exec.Command(gobin, "build", "-o", shoalBin, "./cmd/shoal")
	build.Dir = repoRoot
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "deploy: go build ./cmd/shoal: %v\n%s", err, out)
		return 1
	}
	return m.Run()
}

// repoRoot is the checkout, from this package's directory.
const repoRoot = "../.."

// step is one marked block of the page.
type step struct {
	section string // the "## N. ..." heading it is under
	line    int    // of its marker, for messages
	run     bool   // a script; else a file
	hosts   []string
	path    string // file: where it goes
	like    string // file: copy of this machine's file at path
	body    string
}

func (s step) String() string {
	what := "file " + s.path
	if s.run {
		what = "run"
	}
	return fmt.Sprintf("deploy.md:%d %s on %s", s.line, what, strings.Join(s.hosts, " "))
}

var (
	markerRe  = regexp.MustCompile(`^<!-- deploy-test: (.*) -->$`)
	machineRe = regexp.MustCompile("^\\| (\\w+)\\s+\\| (192\\.0\\.2\\.\\d+)\\s+\\|")
)

// parseDoc returns the page's marked steps in order, and its machines
// (name → 192.0.2.N) from the table that lists them.
func parseDoc(doc string) ([]step, map[string]string, error) {
	var (
		steps    []step
		pending  *step // a marker waiting for its block
		section  string
		inBlock  bool
		body     strings.Builder
		machines = map[string]string{}
	)
	for i, line := range strings.Split(doc, "\n") {
		n := i + 1
		if inBlock {
			if strings.HasPrefix(line, "```") {
				inBlock = false
				if pending != nil {
					pending.body = body.String()
					steps = append(steps, *pending)
					pending = nil
				}
				continue
			}
			body.WriteString(line + "\n")
			continue
		}
		switch {
		case strings.HasPrefix(line, "```"):
			inBlock = true
			body.Reset()
		case strings.HasPrefix(line, "## "):
			section = strings.TrimPrefix(line, "## ")
		case machineRe.MatchString(line):
			m := machineRe.FindStringSubmatch(line)
			machines[m[1]] = m[2]
		case markerRe.MatchString(line):
			if pending != nil {
				return nil, nil, fmt.Errorf("deploy.md:%d: marker with no block after it", pending.line)
			}
			f := strings.Fields(markerRe.FindStringSubmatch(line)[1])
			s := step{section: section, line: n}
			switch {
			case len(f) >= 2 && f[0] == "run":
				s.run, s.hosts = true, f[1:]
				pending = &s
			case len(f) == 3 && f[0] == "file":
				s.hosts, s.path = f[1:2], f[2]
				pending = &s
			case len(f) == 5 && f[0] == "file" && f[3] == "like":
				s.hosts, s.path, s.like = f[1:2], f[2], f[4]
				steps = append(steps, s)
			default:
				return nil, nil, fmt.Errorf("deploy.md:%d: cannot read marker %q", n, line)
			}
		}
	}
	if pending != nil {
		return nil, nil, fmt.Errorf("deploy.md:%d: marker with no block after it", pending.line)
	}
	for _, s := range steps {
		for _, h := range append(s.hosts, s.like) {
			if _, ok := machines[h]; h != "" && !ok {
				return nil, nil, fmt.Errorf("%v: machine %s is not in the page's table", s, h)
			}
		}
	}
	return steps, machines, nil
}

// machine is one of the page's machines: a directory, and a loopback
// address for its 192.0.2.N.
type machine struct {
	name  string
	docIP string // 192.0.2.N
	ip    string // 127.A.B.N
	root  string
}

// unit is a systemd unit the page started on a machine: one process at a
// time.
type unit struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{}
	err     error // Wait's, once done is closed
}

func (u *unit) running() bool {
	if u == nil {
		return false
	}
	select {
	case <-u.done:
		return false
	default:
		return true
	}
}

// world is the machines of one run of the page.
type world struct {
	t        *testing.T
	base     string
	logDir   string
	prefix   string // "127.A.B."
	machines map[string]*machine
	files    map[string]string // "machine path" → the page's text of that file
	units    map[string]*unit  // "machine unit" → the unit's process
	seq      int
}

func TestDeployDoc(t *testing.T) {
	requireTools(t)
	b, err := os.ReadFile(filepath.Join(repoRoot, "docs", "deploy.md"))
	if err != nil {
		t.Fatal(err)
	}
	steps, docIPs, err := parseDoc(string(b))
	if err != nil {
		t.Fatal(err)
	}
	w := newWorld(t, docIPs)
	checks := w.checks()
	for i, s := range steps {
		w.do(s)
		last := i == len(steps)-1 || steps[i+1].section != s.section
		if !last {
			continue
		}
		for key, check := range checks {
			if strings.HasPrefix(s.section, key) {
				t.Logf("checking %q", s.section)
				check()
				delete(checks, key)
			}
		}
	}
	for key := range checks {
		t.Errorf("deploy.md has no marked steps in a section %q..., so its check did not run", key)
	}
}

// requireTools skips the test (fails it with SHOAL_DEPLOY=1) without what
// following the page needs.
func requireTools(t *testing.T) {
	var missing []string
	for _, tool := range []string{"etcd", "etcdctl", "jq", "bash"} {
		if _, err := exec.LookPath(tool); err != nil {
			missing = append(missing, tool)
		}
	}
	if os.Geteuid() != 0 {
		missing = append(missing, "root (the MDS listens on port 2049; FUSE)")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		missing = append(missing, "/dev/fuse")
	}
	if len(missing) == 0 {
		return
	}
	msg := fmt.Sprintf("following docs/deploy.md needs %s (apt-get install etcd-server etcd-client jq)", strings.Join(missing, ", "))
	if os.Getenv("SHOAL_DEPLOY") == "1" {
		t.Fatal(msg + "; SHOAL_DEPLOY=1 makes that a failure")
	}
	t.Skip(msg + "; set SHOAL_DEPLOY=1 to fail instead")
}

func newWorld(t *testing.T, docIPs map[string]string) *world {
	base := t.TempDir()
	w := &world{
		t: t, base: base, logDir: filepath.Join(base, "logs"),
		machines: map[string]*machine{}, files: map[string]string{}, units: map[string]*unit{},
	}
	if err := os.MkdirAll(w.logDir, 0o755); err != nil {
		t.Fatal(err)
	}
	w.prefix = freeLoopbackNet(t)
	for name, docIP := range docIPs {
		m := &machine{name: name, docIP: docIP, ip: w.prefix + strings.TrimPrefix(docIP, "192.0.2."), root: filepath.Join(base, name)}
		// What the package and Debian would have made.
		for _, d := range []string{"etc/shoal", "etc/default", "var/lib/shoal", "var/lib/etcd", "root"} {
			if err := os.MkdirAll(filepath.Join(m.root, d), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		w.machines[name] = m
	}
	t.Logf("machines on %s0/24 under %s", w.prefix, base)
	// Registered first, so it runs last: after the processes and mounts.
	t.Cleanup(func() {
		if t.Failed() {
			w.dumpLogs()
		}
	})
	t.Cleanup(w.stopAll)
	return w
}

// freeLoopbackNet picks a 127.A.B.0/24 on which nothing listens on the
// page's ports.
func freeLoopbackNet(t *testing.T) string {
	for range 20 {
		prefix := fmt.Sprintf("127.%d.%d.", 1+rand.IntN(254), rand.IntN(256))
		free := true
		for _, host := range []string{"10", "11", "12", "13", "20"} {
			for _, port := range []string{"2049", "2050", "2379", "2380", "9101", "9102"} {
				ln, err := net.Listen("tcp", net.JoinHostPort(prefix+host, port))
				if err != nil {
					free = false
					break
				}
				ln.Close()
			}
		}
		if free {
			return prefix
		}
	}
	t.Fatal("found no free 127.A.B.0/24")
	return ""
}

var (
	docIPRe   = regexp.MustCompile(`192\.0\.2\.(\d+)`)
	docPathRe = regexp.MustCompile(`(/etc/shoal|/etc/default/etcd|/var/lib/shoal|/var/lib/etcd|/var/backups/shoal|/mnt/shoal)\b`)
)

// rewrite makes text of the page concrete on machine m: the substitutions
// the page's last section lists, and no others.
func (w *world) rewrite(m *machine, s string) string {
	s = strings.ReplaceAll(s, "192.0.2.0/24", "127.0.0.0/8")
	s = strings.ReplaceAll(s, "127.0.0.1", m.ip)
	s = docIPRe.ReplaceAllString(s, w.prefix+"$1")
	return docPathRe.ReplaceAllStringFunc(s, func(p string) string { return m.root + p })
}

// do carries out one step on each of its machines.
func (w *world) do(s step) {
	w.t.Helper()
	for _, host := range s.hosts {
		m := w.machines[host]
		if !s.run {
			w.writeFile(s, m)
			continue
		}
		w.t.Logf("%v: %s", s, strings.ReplaceAll(strings.TrimSpace(s.body), "\n", "; "))
		if err := w.runScript(m, s); err != nil {
			w.t.Fatalf("%v: %v", s, err)
		}
	}
}

func (w *world) writeFile(s step, m *machine) {
	w.t.Helper()
	text := s.body
	if s.like != "" {
		other := w.machines[s.like]
		var ok bool
		if text, ok = w.files[s.like+" "+s.path]; !ok {
			w.t.Fatalf("%v: no %s on %s to copy", s, s.path, s.like)
		}
		text = strings.ReplaceAll(text, other.docIP, m.docIP)
	}
	w.files[m.name+" "+s.path] = text
	path := w.rewrite(m, s.path)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		w.t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(w.rewrite(m, text)), 0o644); err != nil {
		w.t.Fatal(err)
	}
	w.t.Logf("%v: wrote %s", s, path)
}

// prelude stands in for what the test cannot do as the page says (see the
// page's last section). systemctl asks the test over file descriptors 3
// (request) and 4 (answer), so the servers it starts are the test's
// children, whichever subshell asked.
const prelude = `
systemctl() {
	local answer
	printf '%s\n' "$*" >&3
	IFS= read -r answer <&4
	[ "$answer" = ok ] && return 0
	printf 'systemctl %s: %s\n' "$*" "$answer" >&2
	return 1
}
# scp [USER@]HOST:PATH DEST copies from HOST's directory; PATH arrives
# rewritten for this machine.
scp() {
	local host=${1%%:*} path=${1#*:} var
	host=${host#*@}
	var=DEPLOY_ROOT_${host//./_}
	[ -n "${!var:-}" ] || { echo "scp: no machine $host" >&2; return 1; }
	cp "${!var}${path#"$DEPLOY_ROOT"}" "$2"
}
# chown [-R] USER:GROUP PATH...: the users of the packages (shoal, etcd)
# may not exist here.
chown() {
	local owner=$1
	[ "$owner" = -R ] && owner=$2
	if getent passwd "${owner%%:*}" >/dev/null; then command chown "$@"; else echo "(test: no user ${owner%%:*}, chown $* skipped)"; fi
}
apt() {
	case "$*" in
	"install ./shoal_"*) echo "(test: apt $* skipped: scripts/deb-check.sh tests the package)" ;;
	*) echo "test: apt $* is not something the test can do" >&2; return 1 ;;
	esac
}
`

// runScript runs a block with bash on machine m, serving its systemctl
// requests.
func (w *world) runScript(m *machine, s step) error {
	reqR, reqW, err := os.Pipe()
	if err != nil {
		return err
	}
	ansR, ansW, err := os.Pipe()
	if err != nil {
		reqR.Close()
		reqW.Close()
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "--noprofile", "--norc", "-euo", "pipefail", "-c", prelude+w.rewrite(m, s.body))
	cmd.Dir = filepath.Join(m.root, "root")
	cmd.Env = append(os.Environ(),
		"PATH="+filepath.Dir(shoalBin)+":"+os.Getenv("PATH"),
		"HOME="+filepath.Join(m.root, "root"),
		"DEPLOY_ROOT="+m.root)
	for _, o := range w.machines {
		cmd.Env = append(cmd.Env, "DEPLOY_ROOT_"+strings.ReplaceAll(o.ip, ".", "_")+"="+o.root)
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.ExtraFiles = []*os.File{reqW, ansR}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		return err
	}
	// The child has its copies; ours would keep the pipes open forever.
	reqW.Close()
	ansR.Close()
	served := make(chan struct{})
	go func() {
		defer close(served)
		sc := bufio.NewScanner(reqR)
		for sc.Scan() {
			answer := "ok"
			if err := w.systemctl(m, strings.Fields(sc.Text())); err != nil {
				answer = strings.ReplaceAll(err.Error(), "\n", " | ")
			}
			fmt.Fprintln(ansW, answer)
		}
	}()
	err = cmd.Wait()
	reqR.Close()
	<-served
	ansW.Close()
	w.seq++
	logPath := filepath.Join(w.logDir, fmt.Sprintf("%02d-%s-script.log", w.seq, m.name))
	_ = os.WriteFile(logPath, []byte(fmt.Sprintf("%v\n$ %s\n%s", s, w.rewrite(m, s.body), out.String())), 0o644)
	if out.Len() > 0 {
		w.t.Logf("%s output:\n%s", m.name, strings.TrimRight(out.String(), "\n"))
	}
	if err != nil {
		return fmt.Errorf("bash: %v\n%s", err, out.String())
	}
	return nil
}

// systemctl does what systemctl would to the units the page uses.
func (w *world) systemctl(m *machine, args []string) error {
	var verb string
	var units []string
	for _, a := range args {
		switch {
		case a == "--now":
		case verb == "":
			verb = a
		default:
			units = append(units, strings.TrimSuffix(a, ".service"))
		}
	}
	if len(units) == 0 {
		return fmt.Errorf("no unit named")
	}
	for _, name := range units {
		var err error
		switch verb {
		case "enable", "start":
			err = w.start(m, name)
		case "restart":
			if err = w.stop(m, name); err == nil {
				err = w.start(m, name)
			}
		case "stop", "disable":
			err = w.stop(m, name)
		default:
			err = fmt.Errorf("the test does not do systemctl %s", verb)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// readyLines are what each unit logs once it serves; systemd would not
// wait for the two of Type=simple, but the next step of the page assumes
// they are up, and a reader would look.
var readyLines = map[string]*regexp.Regexp{
	"etcd":      regexp.MustCompile(`ready to serve client requests`),
	"shoal-mds": regexp.MustCompile(`shoal mds ready`),
	"shoal-ds":  regexp.MustCompile(`shoal ds ready`),
}

var execStartRe = regexp.MustCompile(`(?m)^ExecStart=/usr/bin/shoal (.*)$`)

// start starts a unit on m unless it runs, and waits for its ready line.
func (w *world) start(m *machine, name string) error {
	key := m.name + " " + name
	if w.units[key].running() {
		return nil
	}
	ready, ok := readyLines[name]
	if !ok {
		return fmt.Errorf("the test knows no unit %s", name)
	}
	var cmd *exec.Cmd
	if name == "etcd" {
		// As Debian's etcd.service: EnvironmentFile=-/etc/default/etcd
		// over its own defaults, ExecStart=/usr/bin/etcd $DAEMON_ARGS.
		env, err := readEnvFile(filepath.Join(m.root, "etc/default/etcd"))
		if err != nil {
			return err
		}
		cmd = exec.Command("etcd", strings.Fields(env["DAEMON_ARGS"])...)
		cmd.Env = append(os.Environ(), "ETCD_NAME="+m.name, "ETCD_DATA_DIR="+filepath.Join(m.root, "var/lib/etcd/default"))
		for k, v := range env {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
	} else {
		b, err := os.ReadFile(filepath.Join(repoRoot, "dist", "systemd", name+".service"))
		if err != nil {
			return err
		}
		line := execStartRe.FindSubmatch(b)
		if line == nil {
			return fmt.Errorf("dist/systemd/%s.service has no ExecStart=/usr/bin/shoal", name)
		}
		cmd = exec.Command(shoalBin, strings.Fields(w.rewrite(m, string(line[1])))...)
	}
	w.seq++
	u := &unit{name: key, cmd: cmd, logPath: filepath.Join(w.logDir, fmt.Sprintf("%02d-%s-%s.log", w.seq, m.name, name)), done: make(chan struct{})}
	lf, err := os.Create(u.logPath)
	if err != nil {
		return err
	}
	fmt.Fprintf(lf, "$ %s\n", strings.Join(cmd.Args, " "))
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		lf.Close()
		return err
	}
	go func() {
		u.err = cmd.Wait()
		lf.Close()
		close(u.done)
	}()
	w.units[key] = u
	w.t.Logf("%s: started %s (pid %d): %s", m.name, name, cmd.Process.Pid, strings.Join(cmd.Args, " "))
	deadline := time.Now().Add(60 * time.Second)
	for {
		b, _ := os.ReadFile(u.logPath)
		if ready.Match(b) {
			return nil
		}
		if !u.running() || time.Now().After(deadline) {
			return fmt.Errorf("%s on %s did not become ready (%v): %s", name, m.name, u.err, tail(b))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stop stops a unit as systemd does, with SIGTERM; a shoal server must
// exit cleanly.
func (w *world) stop(m *machine, name string) error {
	u := w.units[m.name+" "+name]
	if !u.running() {
		return nil
	}
	_ = u.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-u.done:
	case <-time.After(60 * time.Second):
		_ = u.cmd.Process.Kill()
		<-u.done
		return fmt.Errorf("%s on %s did not stop within 60s of SIGTERM", name, m.name)
	}
	w.t.Logf("%s: stopped %s (%v)", m.name, name, u.err)
	if name != "etcd" && u.err != nil { // etcd 3.4 re-raises SIGTERM
		b, _ := os.ReadFile(u.logPath)
		return fmt.Errorf("%s on %s exited with %v on SIGTERM: %s", name, m.name, u.err, tail(b))
	}
	return nil
}

// stopAll unmounts what the page mounted and kills what it started, each
// process by its PID.
func (w *world) stopAll() {
	for _, m := range w.machines {
		mnt := filepath.Join(m.root, "mnt/shoal")
		if ok, _ := fusemount.Mounted(mnt); ok {
			w.t.Errorf("%s is still mounted at the end; unmounting", mnt)
			_ = fusemount.Unmount(mnt, true)
		}
	}
	for _, u := range w.units {
		if u.running() {
			_ = u.cmd.Process.Kill()
			<-u.done
		}
	}
}

func (w *world) dumpLogs() {
	ents, _ := os.ReadDir(w.logDir)
	for _, e := range ents {
		b, _ := os.ReadFile(filepath.Join(w.logDir, e.Name()))
		w.t.Logf("==== %s ====\n%s", e.Name(), tail(b))
	}
}

// tail is the end of a log, short enough for a test message.
func tail(b []byte) string {
	const max = 8 << 10
	if len(b) > max {
		return "[...]" + string(b[len(b)-max:])
	}
	return string(b)
}

// readEnvFile reads a systemd EnvironmentFile: KEY=VALUE lines, # comments.
func readEnvFile(path string) (map[string]string, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil // EnvironmentFile=- : optional
	}
	if err != nil {
		return nil, err
	}
	env := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			return nil, fmt.Errorf("%s: not KEY=VALUE: %q", path, line)
		}
		env[k] = strings.Trim(v, `"'`)
	}
	return env, nil
}

// checks are what the page says holds at the end of a section, by the
// section's number.
func (w *world) checks() map[string]func() {
	return map[string]func(){
		"4.": func() {
			w.waitActive("ds1", "ds2")
			w.httpGet("http://" + w.machines["mds"].ip + ":9101/metrics")
		},
		"6.": func() {
			if ok, _ := fusemount.Mounted(filepath.Join(w.machines["client"].root, "mnt/shoal")); ok {
				w.t.Fatal("the client's /mnt/shoal is still mounted after shoal umount")
			}
			w.verifySample()
		},
		"7.": func() {
			st := w.waitActive("ds1", "ds2", "ds3")
			if d := st.ds(w.dsID("ds3")); d.Files == 0 {
				w.t.Fatalf("after shoal admin rebalance ds3 holds no files: %+v", *st)
			}
			w.verifySample()
		},
		"8.": func() {
			st := w.waitActive("ds1", "ds2")
			if d := st.ds(w.dsID("ds3")); d == nil || d.State != "removed" {
				w.t.Fatalf("ds3 is not listed as removed after shoal admin remove: %+v", d)
			}
			if n := objectsWithData(w.t, filepath.Join(w.machines["ds3"].root, "var/lib/shoal/ds")); n != 0 {
				w.t.Fatalf("ds3 still holds %d objects with data after its drain", n)
			}
			w.verifySample()
		},
		"9.": func() {
			// etcd runs on the restored snapshot, and the cluster with it.
			if b, _ := os.ReadFile(w.units["mds etcd"].logPath); !bytes.Contains(b, []byte("data dir = "+filepath.Join(w.machines["mds"].root, "var/lib/etcd/shoal-restored"))) {
				w.t.Fatalf("etcd does not run in the restored data directory:\n%s", tail(b))
			}
			w.waitActive("ds1", "ds2")
			w.verifySample()
		},
		"10.": func() {
			w.waitActive("ds1", "ds2")
			w.verifySample()
		},
	}
}

// status and dsStatus mirror `shoal admin status --json`.
type status struct {
	DataServers []dsStatus `json:"data_servers"`
}

type dsStatus struct {
	ID    string
	State string
	Up    bool
	Files int `json:"files"`
}

func (s *status) ds(id string) *dsStatus {
	for i := range s.DataServers {
		if s.DataServers[i].ID == id {
			return &s.DataServers[i]
		}
	}
	return nil
}

func (w *world) mdsAddr() string { return w.machines["mds"].ip + ":2049" }

// shoal runs a short shoal command.
func (w *world) shoal(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, shoalBin, args...).Output()
	if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
		err = fmt.Errorf("shoal %s: %v: %s", strings.Join(args, " "), err, ee.Stderr)
	}
	return string(out), err
}

// waitActive waits until exactly the named data servers are in the
// cluster (not counting removed ones, which status lists as such), each
// active and up.
func (w *world) waitActive(names ...string) *status {
	w.t.Helper()
	secret := filepath.Join(w.machines["mds"].root, "var/lib/shoal/mds/join-secret")
	deadline := time.Now().Add(60 * time.Second)
	var last string
	for {
		out, err := w.shoal("admin", "status", "--json", "--mds", w.mdsAddr(), "--join-secret-file", secret)
		var st status
		if err == nil {
			err = json.Unmarshal([]byte(out), &st)
		}
		members := 0
		for _, d := range st.DataServers {
			if d.State != "removed" {
				members++
			}
		}
		if err == nil && members == len(names) {
			ok := true
			for _, n := range names {
				d := st.ds(w.dsID(n))
				ok = ok && d != nil && d.Up && d.State == "active"
			}
			if ok {
				return &st
			}
		}
		last = fmt.Sprintf("%v %s", err, out)
		if time.Now().After(deadline) {
			w.t.Fatalf("waited 60s for data servers %v to be the active ones; last status: %s", names, last)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// httpGet fails the test unless url answers 200 OK.
func (w *world) httpGet(url string) {
	w.t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		w.t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		w.t.Fatalf("GET %s: %s", url, resp.Status)
	}
}

// dsID is a data server's identity, from its directory.
func (w *world) dsID(name string) string {
	w.t.Helper()
	b, err := os.ReadFile(filepath.Join(w.machines[name].root, "var/lib/shoal/ds/ds-identity.json"))
	if err != nil {
		w.t.Fatal(err)
	}
	var ident struct{ ID string }
	if err := json.Unmarshal(b, &ident); err != nil {
		w.t.Fatalf("%s's ds-identity.json: %v", name, err)
	}
	return ident.ID
}

// verifySample reads the file the page wrote through the mount back with
// `shoal get` (from the data servers, not a cache of the client's) and
// compares sha256 with the client's local copy.
func (w *world) verifySample() {
	w.t.Helper()
	want := sha256File(w.t, filepath.Join(w.machines["client"].root, "root/sample"))
	got := filepath.Join(w.base, "sample.get")
	if _, err := w.shoal("get", "nfs://"+w.mdsAddr()+"/sample", got); err != nil {
		w.t.Fatal(err)
	}
	defer os.Remove(got)
	if sum := sha256File(w.t, got); sum != want {
		w.t.Fatalf("sample reads back with sha256 %s, written %s", sum, want)
	}
	w.t.Logf("sample reads back identical (sha256 %s)", want[:16])
}

func sha256File(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// objectsWithData counts a data server's objects (files named by an inode
// number under data/) that have blocks allocated.
func objectsWithData(t *testing.T, dir string) int {
	t.Helper()
	n := 0
	err := filepath.WalkDir(filepath.Join(dir, "data"), func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if _, nerr := strconv.ParseUint(d.Name(), 10, 64); !d.Type().IsRegular() || nerr != nil {
			return nil
		}
		var st syscall.Stat_t
		if err := syscall.Stat(path, &st); err != nil {
			return err
		}
		if st.Blocks > 0 {
			n++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}
