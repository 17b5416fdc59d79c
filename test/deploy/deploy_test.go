package deploy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
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
	section  string // the "## N. ..." heading it is under
	line     int    // of its marker, for messages
	run      bool   // a script; else a file, or a check
	together bool   // run: on every host at once
	check    []string
	hosts    []string
	path     string // file: where it goes
	like     string // file: copy of this machine's file at path
	but      bool   // like: with the block's lines in place of those with the same keys
	body     string
}

func (s step) String() string {
	what := "file " + s.path
	switch {
	case s.run:
		what = "run"
	case s.check != nil:
		return fmt.Sprintf("deploy.md:%d check %s", s.line, strings.Join(s.check, " "))
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
			case len(f) >= 2 && (f[0] == "run" || f[0] == "run-together"):
				s.run, s.together, s.hosts = true, f[0] == "run-together", f[1:]
				pending = &s
			case len(f) == 3 && f[0] == "file":
				s.hosts, s.path = f[1:2], f[2]
				pending = &s
			case len(f) == 5 && f[0] == "file" && f[3] == "like":
				s.hosts, s.path, s.like = f[1:2], f[2], f[4]
				steps = append(steps, s)
			case len(f) == 6 && f[0] == "file" && f[3] == "like" && f[5] == "but":
				s.hosts, s.path, s.like, s.but = f[1:2], f[2], f[4], true
				pending = &s
			case len(f) == 3 && f[0] == "check" && f[1] == "leader":
				s.check, s.hosts = f[1:], f[2:]
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
	netns string // its network namespace, under /run/netns
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
	machines map[string]*machine
	files    map[string]string // "machine path" → the page's text of that file

	// mu guards units and seq: the scripts of a run-together step ask
	// for units at once.
	mu    sync.Mutex
	units map[string]*unit // "machine unit" → the unit's process
	seq   int
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
	start := time.Now()
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
	t.Logf("followed deploy.md in %v", time.Since(start).Round(time.Second))
}

// requireTools skips the test (fails it with SHOAL_DEPLOY=1) without what
// following the page needs.
func requireTools(t *testing.T) {
	var missing []string
	for _, tool := range []string{"etcd", "etcdctl", "jq", "bash", "ip", "nsenter"} {
		if _, err := exec.LookPath(tool); err != nil {
			missing = append(missing, tool)
		}
	}
	if os.Geteuid() != 0 {
		missing = append(missing, "root (network namespaces, port 2049, FUSE)")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		missing = append(missing, "/dev/fuse")
	}
	if len(missing) == 0 {
		return
	}
	msg := fmt.Sprintf("following docs/deploy.md needs %s (apt-get install etcd-server etcd-client jq iproute2 util-linux)", strings.Join(missing, ", "))
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
	for name, docIP := range docIPs {
		m := &machine{name: name, docIP: docIP, root: filepath.Join(base, name)}
		// What the package and Debian would have made.
		for _, d := range []string{"etc/shoal", "etc/default", "var/lib/shoal", "var/lib/etcd", "root"} {
			if err := os.MkdirAll(filepath.Join(m.root, d), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		w.machines[name] = m
	}
	// Registered first, so that the namespaces go last: after the
	// processes in them and the mounts.
	w.network()
	t.Logf("machines under %s", base)
	t.Cleanup(func() {
		if t.Failed() {
			w.dumpLogs()
		}
	})
	t.Cleanup(w.stopAll)
	return w
}

var docPathRe = regexp.MustCompile(`(/etc/shoal|/etc/default/etcd|/var/lib/shoal|/var/lib/etcd|/var/backups/shoal|/mnt/shoal)\b`)

// rewrite makes text of the page concrete on machine m: its paths become
// the machine's directory's, the substitution the page's last section
// lists. Addresses stay as they are: each machine is a network namespace
// with the page's address.
func (w *world) rewrite(m *machine, s string) string {
	return docPathRe.ReplaceAllStringFunc(s, func(p string) string { return m.root + p })
}

// do carries out one step on each of its machines: in turn, or at once
// for run-together.
func (w *world) do(s step) {
	w.t.Helper()
	switch {
	case s.check != nil:
		w.t.Logf("%v", s)
		w.waitHA(s.hosts[0])
		return
	case !s.run:
		w.writeFile(s, w.machines[s.hosts[0]])
		return
	}
	w.t.Logf("%v: %s", s, strings.ReplaceAll(strings.TrimSpace(s.body), "\n", "; "))
	if !s.together {
		for _, host := range s.hosts {
			if err := w.runScript(w.machines[host], s); err != nil {
				w.t.Fatalf("%v on %s: %v", s, host, err)
			}
		}
		return
	}
	errs := make([]error, len(s.hosts))
	var wg sync.WaitGroup
	for i, host := range s.hosts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = w.runScript(w.machines[host], s)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			w.t.Errorf("%v on %s: %v", s, s.hosts[i], err)
		}
	}
	if w.t.Failed() {
		w.t.FailNow()
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
		if s.but {
			var err error
			if text, err = replaceKeys(text, s.body); err != nil {
				w.t.Fatalf("%v: %v", s, err)
			}
		} else {
			text = strings.ReplaceAll(text, other.docIP, m.docIP)
		}
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

// keyRe is the key of a KEY=VALUE or key: value line.
var keyRe = regexp.MustCompile(`^([A-Za-z_][A-Za-z0-9_]*)\s*[=:]`)

// replaceKeys is text with each line of with in place of text's line with
// the same key; a line of with whose key text lacks is an error (the page
// would be saying "in place of" something that is not there).
func replaceKeys(text, with string) (string, error) {
	lines := strings.Split(text, "\n")
	for _, nl := range strings.Split(strings.TrimSpace(with), "\n") {
		k := keyRe.FindStringSubmatch(nl)
		if k == nil {
			return "", fmt.Errorf("line %q has no key", nl)
		}
		found := false
		for i, l := range lines {
			if lk := keyRe.FindStringSubmatch(l); lk != nil && lk[1] == k[1] {
				lines[i], found = nl, true
			}
		}
		if !found {
			return "", fmt.Errorf("the file has no %s to replace", k[1])
		}
	}
	return strings.Join(lines, "\n"), nil
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

// nextSeq numbers the logs in the order they were made.
func (w *world) nextSeq() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.seq++
	return w.seq
}

// runScript runs a block with bash on machine m, in its network namespace,
// serving its systemctl requests.
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
	cmd := m.command(ctx, "bash", "--noprofile", "--norc", "-euo", "pipefail", "-c", prelude+w.rewrite(m, s.body))
	cmd.Dir = filepath.Join(m.root, "root")
	cmd.Env = append(os.Environ(),
		"PATH="+filepath.Dir(shoalBin)+":"+os.Getenv("PATH"),
		"HOME="+filepath.Join(m.root, "root"),
		"DEPLOY_ROOT="+m.root)
	for _, o := range w.machines {
		cmd.Env = append(cmd.Env, "DEPLOY_ROOT_"+strings.ReplaceAll(o.docIP, ".", "_")+"="+o.root)
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
	logPath := filepath.Join(w.logDir, fmt.Sprintf("%02d-%s-script.log", w.nextSeq(), m.name))
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
	var verb, signal string
	var units []string
	for _, a := range args {
		switch {
		case a == "--now":
		case strings.HasPrefix(a, "--signal="):
			signal = strings.TrimPrefix(a, "--signal=")
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
		case "kill":
			if signal != "SIGKILL" && signal != "KILL" && signal != "9" {
				return fmt.Errorf("the test does systemctl kill with --signal=SIGKILL only")
			}
			err = w.crash(m, name)
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
// wait for the shoal units (Type=simple), but the next step of the page
// assumes they are up, and a reader would look. An MDS that stands by is
// as up as it gets until the leader goes.
var readyLines = map[string]*regexp.Regexp{
	"etcd":      regexp.MustCompile(`ready to serve client requests`),
	"shoal-mds": regexp.MustCompile(`shoal mds ready|standing by: another MDS leads`),
	"shoal-ds":  regexp.MustCompile(`shoal ds ready`),
	"shoal-vip": regexp.MustCompile(`shoal vip ready`),
}

var execStartRe = regexp.MustCompile(`(?m)^ExecStart=/usr/bin/shoal (.*)$`)

func (w *world) unit(key string) *unit {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.units[key]
}

// start starts a unit on m unless it runs, and waits for its ready line.
func (w *world) start(m *machine, name string) error {
	key := m.name + " " + name
	if w.unit(key).running() {
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
		cmd = m.command(context.Background(), "etcd", strings.Fields(env["DAEMON_ARGS"])...)
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
		cmd = m.command(context.Background(), shoalBin, strings.Fields(w.rewrite(m, string(line[1])))...)
	}
	u := &unit{name: key, cmd: cmd, logPath: filepath.Join(w.logDir, fmt.Sprintf("%02d-%s-%s.log", w.nextSeq(), m.name, name)), done: make(chan struct{})}
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
	w.mu.Lock()
	w.units[key] = u
	w.mu.Unlock()
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
	u := w.unit(m.name + " " + name)
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

// restartRe is a unit's Restart= setting that restarts it after a crash.
var restartRe = regexp.MustCompile(`(?m)^Restart=(on-failure|on-abnormal|always)$`)

// crash kills a unit's process with SIGKILL and, as its Restart= says
// systemd would, starts it again.
func (w *world) crash(m *machine, name string) error {
	u := w.unit(m.name + " " + name)
	if !u.running() {
		return fmt.Errorf("%s does not run on %s", name, m.name)
	}
	_ = u.cmd.Process.Kill()
	<-u.done
	w.t.Logf("%s: killed %s (%v)", m.name, name, u.err)
	b, err := os.ReadFile(filepath.Join(repoRoot, "dist", "systemd", name+".service"))
	if err != nil {
		return err
	}
	if !restartRe.Match(b) {
		return nil
	}
	return w.start(m, name)
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
	w.mu.Lock()
	defer w.mu.Unlock()
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
