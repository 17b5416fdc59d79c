package crash

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shoalfs/shoal/client"
)

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func envInt(t *testing.T, name string, def int) int {
	v, err := strconv.Atoi(env(name, strconv.Itoa(def)))
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return v
}

func envDur(t *testing.T, name string, def time.Duration) time.Duration {
	v, err := time.ParseDuration(env(name, def.String()))
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return v
}

// settings are the harness's knobs (README.md lists them).
type settings struct {
	rounds, negRounds, workers int
	interval, slack            time.Duration
	killMin, killMax           time.Duration
	artifacts                  string
}

// row is one round's result, as the JSON output and the table show it.
type row struct {
	Mode         string  `json:"mode"`
	Round        int     `json:"round"`
	KillAfterS   float64 `json:"kill_after_s"`
	Sent         int     `json:"ops_sent"`
	Acked        int     `json:"ops_acked"`
	Lost         int     `json:"acked_ops_lost"`
	MaxLostAgeMS float64 `json:"max_lost_age_ms"` // kill time minus the ack time of the oldest lost ack
	InFlight     int     `json:"in_flight_found"` // ops sent, unanswered, whose effect is there
	// LeakedObjects counts the data objects fsck found unreferenced that
	// belong to creates a crash took back (async mode only).
	LeakedObjects int     `json:"leaked_data_objects"`
	FsckOK        bool    `json:"fsck_ok"`
	Inodes        uint64  `json:"inodes"`
	BootS         float64 `json:"boot_to_serving_s"`
	Result        string  `json:"result"` // pass, fail
	Detail        string  `json:"detail,omitempty"`

	// Swept is true when the server completed its sweep of data objects
	// no file owns in the boot this round ran in, before the kill: no
	// object of an earlier round's lost creates may be left then.
	Swept bool `json:"swept"`
}

var (
	rowsMu sync.Mutex
	rows   []row
)

// TestMachineCrash is the machine-crash harness (see doc.go).
func TestMachineCrash(t *testing.T) {
	if os.Getenv("SHOAL_CRASH") != "1" {
		t.Skip("machine-crash tests are opt-in: set SHOAL_CRASH=1")
	}
	s := settings{
		rounds:    envInt(t, "SHOAL_CRASH_ROUNDS", 2),
		negRounds: envInt(t, "SHOAL_CRASH_NEG_ROUNDS", 3),
		workers:   envInt(t, "SHOAL_CRASH_WORKERS", 4),
		interval:  envDur(t, "SHOAL_CRASH_INTERVAL", 100*time.Millisecond),
		slack:     envDur(t, "SHOAL_CRASH_SLACK", time.Second),
		killMin:   envDur(t, "SHOAL_CRASH_KILL_MIN", 3*time.Second),
		killMax:   envDur(t, "SHOAL_CRASH_KILL_MAX", 9*time.Second),
		artifacts: os.Getenv("SHOAL_CRASH_ARTIFACTS"),
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	img := setupImages(t)
	work := t.TempDir()
	modes := strings.Split(env("SHOAL_CRASH_MODES", "sync,async,nofsync"), ",")
	bins := map[string]string{}
	for _, m := range modes {
		tags := ""
		if m == "nofsync" {
			tags = "shoal_crashtest"
		}
		if _, ok := bins[tags]; ok {
			continue
		}
		bin := filepath.Join(work, "shoal"+tags)
		cmd := exec.Command("go", "build", "-tags", tags, "-o", bin, "./cmd/shoal")
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build -tags %q ./cmd/shoal: %v\n%s", tags, err, out)
		}
		bins[tags] = bin
	}
	t.Cleanup(func() {
		out := os.Getenv("SHOAL_CRASH_OUT")
		if out == "" {
			return
		}
		rowsMu.Lock()
		defer rowsMu.Unlock()
		b, _ := json.MarshalIndent(rows, "", "  ")
		if err := os.WriteFile(out, append(b, '\n'), 0o644); err != nil {
			t.Errorf("write %s: %v", out, err)
		}
	})
	for _, m := range modes {
		t.Run(m, func(t *testing.T) {
			tags := ""
			switch m {
			case "sync", "async":
			case "nofsync":
				tags = "shoal_crashtest"
			default:
				t.Fatalf("SHOAL_CRASH_MODES: unknown mode %q (sync, async, nofsync)", m)
			}
			dir := filepath.Join(work, m)
			if s.artifacts != "" {
				dir = filepath.Join(s.artifacts, m)
			}
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			initrd, err := withBinary(img.initrd, bins[tags], dir)
			if err != nil {
				t.Fatal(err)
			}
			mi := img
			mi.initrd = initrd
			runMode(t, m, mi, dir, s)
		})
	}
}

// setupImages runs setup.sh (kernel, initramfs).
func setupImages(t *testing.T) images {
	t.Helper()
	cmd := exec.Command("./setup.sh")
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("setup.sh: %v", err)
	}
	var img images
	for _, l := range strings.Split(string(out), "\n") {
		k, v, _ := strings.Cut(l, "=")
		switch k {
		case "KVER":
			img.kver = v
		case "KERNEL":
			img.kernel = v
		case "INITRD":
			img.initrd = v
		}
	}
	if img.kernel == "" || img.initrd == "" {
		t.Fatalf("setup.sh printed no KERNEL=/INITRD=:\n%s", out)
	}
	return img
}

// freePort picks a free loopback port for qemu's forward.
func freePort(t *testing.T) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// roundState is one round's workload, kept until the next boot checks it.
type roundState struct {
	n       int
	top     *worker // the round's directory, "rN": one op
	workers []*worker
	kill    time.Time
	killed  time.Duration // after the workload began
	// swept: the boot the round ran in had completed its sweep of data
	// objects no file owns when the power was cut.
	swept bool
}

// runMode runs the rounds of one mode on a fresh disk: boot, check what
// the last round left, run a round and cut the power, s.rounds times,
// then one boot more for the last check.
func runMode(t *testing.T, mode string, img images, dir string, s settings) {
	disk := filepath.Join(dir, "disk.img")
	os.Remove(disk)
	if out, err := exec.Command("truncate", "-s", "1G", disk).CombinedOutput(); err != nil {
		t.Fatalf("truncate: %v %s", err, out)
	}
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", disk).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v %s", err, out)
	}
	defer func() {
		if s.artifacts == "" {
			os.Remove(disk)
		}
	}()
	params := map[string]string{"t_sync": "true", "t_interval": s.interval.String(), "t_lease": "15s"}
	switch mode {
	case "async":
		params["t_sync"] = "false"
	case "nofsync":
		params["t_skipfsync"] = "1"
	}
	rounds := s.rounds
	if mode == "nofsync" {
		rounds = s.negRounds
	}
	stable := tree{} // what earlier rounds left, checked on every boot
	leaks := map[uint64]bool{}
	var prev *roundState
	caught := ""
	for boot := 0; boot <= rounds; boot++ {
		port := freePort(t)
		start := time.Now()
		v, err := startVM(vmConfig{
			img: img, disk: disk, port: port, params: params,
			console: filepath.Join(dir, "console.log"), logf: t.Logf, deadline: 10 * time.Minute,
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := v.waitServe(5 * time.Minute); err != nil {
			v.kill()
			t.Fatalf("boot %d: %v", boot, err)
		}
		c, err := dial(port, v)
		if err != nil {
			v.kill()
			rep, rc, _, _ := v.fsck()
			if prev != nil {
				record(t, row{Mode: mode, Round: prev.n, KillAfterS: prev.killed.Seconds(), Result: "fail",
					Detail: fmt.Sprintf("the server does not serve after the crash (fsck exit status %d %v): %v", rc, rep.Problems, err)})
			}
			if mode == "nofsync" && prev != nil {
				caught = fmt.Sprintf("round %d: the server does not serve after the crash (fsck exit status %d): %v", prev.n, rc, err)
				break
			}
			t.Fatalf("boot %d: %v; last console lines:\n%s", boot, err, v.lastLines())
		}
		bootS := time.Since(start).Seconds()
		if prev != nil {
			// A sweep that completed in the boot the last round ran
			// in removed every object of the creates lost before:
			// they are excused no more.
			swept := map[uint64]bool{}
			if prev.swept {
				swept, leaks = leaks, map[uint64]bool{}
			}
			r := verify(t, mode, v, c, prev, stable, leaks, swept, s)
			r.BootS = bootS
			record(t, r)
			if r.Result != "pass" {
				if mode == "nofsync" {
					caught = fmt.Sprintf("round %d: %s", r.Round, r.Detail)
					c.Close()
					v.kill()
					break
				}
				t.Errorf("%s round %d: %s", mode, r.Round, r.Detail)
			}
		}
		if boot == rounds {
			c.Close()
			if mode == "async" {
				finalSweep(t, v, img, disk, dir, params)
			} else {
				v.kill()
			}
			break
		}
		prev = runRound(t, boot, v, c, s, filepath.Join(dir, fmt.Sprintf("ops-r%d.jsonl", boot)))
	}
	if mode == "nofsync" {
		if caught == "" {
			t.Errorf("with the log's fdatasync skipped, %d crashes lost no acknowledged change the harness saw: it would not catch a loss", rounds)
		} else {
			t.Logf("the harness caught the loss: %s", caught)
		}
	}
}

func record(t *testing.T, r row) {
	t.Logf("%s round %d: killed %.1fs in, %d sent, %d acked, %d acked lost (oldest %.0f ms before the kill), fsck ok=%v (%d inodes), boot %.1fs: %s %s",
		r.Mode, r.Round, r.KillAfterS, r.Sent, r.Acked, r.Lost, r.MaxLostAgeMS, r.FsckOK, r.Inodes, r.BootS, r.Result, r.Detail)
	rowsMu.Lock()
	rows = append(rows, r)
	rowsMu.Unlock()
}

// dial connects the client through qemu's forward; the server may still
// be starting (TCG is slow), so it retries for a bounded time.
func dial(port int, v *vm) (*client.Client, error) {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	var last error
	for range 60 {
		select {
		case <-v.done:
			return nil, fmt.Errorf("the VM stopped: %w", errors.Join(last, errors.New(v.lastLines())))
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		c, err := client.Dial(ctx, addr, client.Options{
			// One client owner for every boot: after a restart the
			// server ends its grace period as soon as this client,
			// its only one, reclaimed (nothing).
			OwnerID: "shoal-crash-harness", NoDelegations: true, DialTimeout: 20 * time.Second,
		})
		cancel()
		if err == nil {
			return c, nil
		}
		last = err
		time.Sleep(time.Second)
	}
	return nil, fmt.Errorf("dial %s: %w", addr, last)
}

// runRound makes the round's changes from s.workers workers and cuts the
// power at a random moment.
func runRound(t *testing.T, n int, v *vm, c *client.Client, s settings, opsLog string) *roundState {
	rs := &roundState{n: n}
	top := fmt.Sprintf("r%d", n)
	rs.top = newWorker(top, 0)
	rs.top.n = 1
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// The round's directory is the first change; a worker each after.
	o := op{kind: opMkdir, path: top, sent: time.Now()}
	if err := retryGrace(ctx, func() error { return c.Mkdir(ctx, top, 0o755) }); err != nil {
		t.Fatalf("round %d: mkdir %s: %v", n, top, err)
	}
	o.acked = time.Now()
	rs.top.ops = []op{o}
	seed := rand.Uint64()
	for i := range s.workers {
		rs.workers = append(rs.workers, newWorker(fmt.Sprintf("%s/w%d", top, i), seed+uint64(i)))
	}
	killAfter := s.killMin + time.Duration(rand.Int64N(int64(s.killMax-s.killMin)+1))
	begin := time.Now()
	var wg sync.WaitGroup
	var errMu sync.Mutex
	var errs []error
	var killed sync.WaitGroup
	killed.Add(1)
	payload := []byte(strings.Repeat("shoal-crash-data", 4)) // 64 bytes
	for _, w := range rs.workers {
		wg.Go(func() {
			for range 100000 {
				if ctx.Err() != nil {
					return
				}
				o := w.next()
				o.sent = time.Now()
				w.ops = append(w.ops, o)
				ino, err := do(ctx, c, o, payload)
				w.ops[len(w.ops)-1].ino = ino
				if err != nil {
					if ctx.Err() != nil || v.isKilled() {
						return // the power is off: no answer
					}
					errMu.Lock()
					errs = append(errs, fmt.Errorf("%s %s: %w", o.kind, o.path, err))
					errMu.Unlock()
					return
				}
				w.ops[len(w.ops)-1].acked = time.Now()
				w.now.apply(o)
			}
		})
	}
	time.Sleep(killAfter)
	rs.swept = v.sweptDone()
	rs.kill = v.kill()
	rs.killed = rs.kill.Sub(begin)
	defer writeOps(t, opsLog, rs)
	cancel()
	c.Close()
	waited := make(chan struct{})
	go func() { wg.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-time.After(2 * time.Minute):
		t.Fatalf("round %d: workers still blocked 2 min after the kill", n)
	}
	if len(errs) > 0 {
		t.Fatalf("round %d: a change failed before the kill: %v", n, errors.Join(errs...))
	}
	return rs
}

func (v *vm) isKilled() bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.killed
}

// retryGrace retries fn while the server is in its grace period.
func retryGrace(ctx context.Context, fn func() error) error {
	var err error
	for range 60 {
		if err = fn(); err == nil || !strings.Contains(err.Error(), "GRACE") {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
	return err
}

// do makes one change through the client. For a create with data it
// returns the file's inode number, known before its data is sent (the
// client writes it back at Close), so that a data object left by a
// create the crash took back can be told from any other.
func do(ctx context.Context, c *client.Client, o op, payload []byte) (ino uint64, err error) {
	switch o.kind {
	case opMkdir:
		return 0, c.Mkdir(ctx, o.path, 0o755)
	case opCreate:
		f, err := c.Open(ctx, o.path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
		if err != nil {
			return 0, err
		}
		if o.data {
			a, err := f.Stat(ctx)
			if err != nil {
				f.Close()
				return 0, err
			}
			ino = a.Fileid
			if _, err := f.Write(payload); err != nil {
				f.Close()
				return ino, err
			}
		}
		return ino, f.Close()
	case opRename:
		return 0, c.Rename(ctx, o.path, o.to)
	case opRemove, opRmdir:
		return 0, c.Remove(ctx, o.path)
	}
	return 0, fmt.Errorf("unknown op %v", o.kind)
}

// walk lists the whole export: path → is a directory, and file sizes.
func walk(ctx context.Context, c *client.Client) (tree, map[string]uint64, error) {
	found, sizes := tree{}, map[string]uint64{}
	var rec func(dir string, depth int) error
	rec = func(dir string, depth int) error {
		if depth > 64 {
			return fmt.Errorf("%s: deeper than 64", dir)
		}
		ents, err := c.ReadDir(ctx, "/"+dir)
		if err != nil {
			return fmt.Errorf("readdir /%s: %w", dir, err)
		}
		for _, e := range ents {
			p := e.Name
			if dir != "" {
				p = dir + "/" + e.Name
			}
			isDir := e.Attr.Type == client.TypeDir
			found[p] = isDir
			if isDir {
				if err := rec(p, depth+1); err != nil {
					return err
				}
			} else {
				sizes[p] = e.Attr.Size
			}
		}
		return nil
	}
	return found, sizes, rec("", 0)
}

// verify checks, after the reboot, what the last round's crash left: the
// fsck the guest ran, the tree against every earlier round's, and the
// round's changes against their acknowledgements.
//
// leaks holds the inode numbers of data objects that creates lost to a
// crash (in async mode) left behind since the last complete sweep of the
// server: fsck reports them as unreferenced-data-object, and only those
// are excused. swept holds those the last sweep must have removed.
func verify(t *testing.T, mode string, v *vm, c *client.Client, rs *roundState, stable tree, leaks, swept map[uint64]bool, s settings) (r row) {
	r = row{Mode: mode, Round: rs.n, KillAfterS: rs.killed.Seconds(), Result: "pass", Swept: rs.swept}
	var problems []string
	fail := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	defer func() {
		if len(problems) > 0 {
			r.Result = "fail"
			r.Detail = strings.Join(problems, "; ")
			if len(r.Detail) > 2000 {
				r.Detail = r.Detail[:2000] + "..."
			}
		}
	}()
	rep, rc, ran, ferr := v.fsck()
	r.FsckOK, r.Inodes = rc == 0 && rep.OK, rep.Inodes
	defer func() {
		// After the round's changes are matched: leaks holds this
		// round's lost creates too.
		switch {
		case ferr != nil:
			fail("fsck: %v", ferr)
		case !ran:
			fail("the guest ran no fsck")
		case rc != 0 && rc != 4:
			fail("fsck exit status %d (the database does not open?): %v", rc, rep.Problems)
		}
		var other []string
		for _, p := range rep.Problems {
			var ino uint64
			if _, err := fmt.Sscanf(p, "unreferenced-data-object: inode %d:", &ino); err == nil && leaks[ino] {
				r.LeakedObjects++
				continue
			}
			if swept[ino] {
				fail("the data object of inode %d, a create lost in an earlier crash, survived the server's complete sweep", ino)
				continue
			}
			other = append(other, p)
		}
		if len(other) > 0 || (rc == 4 && len(rep.Problems) == 0) {
			fail("fsck exit status %d: %v", rc, other)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	found, sizes, err := walk(ctx, c)
	if err != nil {
		fail("walk: %v", err)
		return r
	}
	// Earlier rounds: exactly as the boot after each left them.
	for p, d := range stable {
		if got, ok := found[p]; !ok || got != d {
			fail("%s of an earlier round is gone or changed after this crash", p)
		}
	}
	top := fmt.Sprintf("r%d", rs.n)
	for p := range found {
		if !strings.HasPrefix(p, "r") {
			fail("unexpected entry %s", p)
			continue
		}
		first, _, _ := strings.Cut(p, "/")
		if first != top {
			if _, ok := stable[p]; !ok {
				fail("%s appeared in an earlier round's tree", p)
			}
		}
	}
	// This round: each worker's directory must be the result of a
	// prefix of its changes.
	var maxAge time.Duration
	var examples []string
	all := append([]*worker{rs.top}, rs.workers...)
	for _, w := range all {
		var m matchResult
		if w == rs.top {
			_, ok := found[top]
			m = matchResult{found: true, sent: 1, acked: 1}
			if ok {
				m.prefix = 1
			}
		} else {
			m = w.match(found)
		}
		r.Sent += m.sent
		r.Acked += m.acked
		if !m.found {
			fail("%s: no prefix of its %d changes gives the entries found (a change half made, or an old one lost while a later one stayed)", w.root, m.sent)
			continue
		}
		if m.prefix > m.acked {
			r.InFlight += m.prefix - m.acked
		}
		for _, o := range w.ops[min(m.prefix, m.acked):m.acked] {
			r.Lost++
			age := rs.kill.Sub(o.acked)
			maxAge = max(maxAge, age)
			if len(examples) < 3 {
				examples = append(examples, fmt.Sprintf("%s %s acknowledged %.0f ms before the kill", o.kind, o.path, age.Seconds()*1000))
			}
		}
		if mode == "async" {
			// A create taken back may leave its data object: its
			// WRITE made the object (a file on ext4, whose journal
			// commit made it durable) while the create was still
			// only in the log's page cache.
			for _, o := range w.ops[m.prefix:] {
				if o.kind == opCreate && o.ino != 0 {
					leaks[o.ino] = true
				}
			}
		}
		// Files written before their create was answered keep their
		// data (COMMIT is durable in both modes).
		data := map[string]bool{}
		for _, o := range w.ops[:m.prefix] {
			switch o.kind {
			case opCreate:
				data[o.path] = o.data && !o.acked.IsZero()
			case opRename:
				data[o.to] = data[o.path]
				delete(data, o.path)
			case opRemove:
				delete(data, o.path)
			}
		}
		for p, d := range data {
			if d && sizes[p] != 64 {
				fail("%s: %d bytes, want the 64 written and committed", p, sizes[p])
			}
		}
	}
	r.MaxLostAgeMS = maxAge.Seconds() * 1000
	if mode != "async" && r.Lost > 0 {
		fail("%d acknowledged changes lost, the oldest acknowledged %.0f ms before the kill (%s)", r.Lost, r.MaxLostAgeMS, strings.Join(examples, "; "))
	}
	if mode == "async" && r.Lost > 0 && maxAge > s.interval+s.slack {
		fail("an acknowledged change lost was answered %.0f ms before the kill: more than the commit interval %v plus %v allowed for the fdatasync itself",
			maxAge.Seconds()*1000, s.interval, s.slack)
	}
	for p, d := range found {
		if strings.HasPrefix(p, top+"/") || p == top {
			stable[p] = d
		}
	}
	return r
}

// writeOps keeps a round's changes, with their times relative to the
// kill, for diagnosis (in SHOAL_CRASH_ARTIFACTS).
func writeOps(t *testing.T, path string, rs *roundState) {
	f, err := os.Create(path)
	if err != nil {
		t.Logf("op log: %v", err)
		return
	}
	defer f.Close()
	enc := json.NewEncoder(f)
	for _, w := range append([]*worker{rs.top}, rs.workers...) {
		for _, o := range w.ops {
			rec := map[string]any{"op": o.kind.String(), "path": o.path, "sent_ms": o.sent.Sub(rs.kill).Milliseconds()}
			if o.to != "" {
				rec["to"] = o.to
			}
			if o.ino != 0 {
				rec["ino"] = o.ino
			}
			if !o.acked.IsZero() {
				rec["acked_ms"] = o.acked.Sub(rs.kill).Milliseconds()
			}
			_ = enc.Encode(rec)
		}
	}
}

// finalSweep ends an async mode's rounds: the last boot, whose fsck
// excused the objects of the last crash's lost creates, must sweep them.
// It waits for the server's complete sweep, cuts the power again (a
// sweep counts as complete only once its removals are durable), boots
// once more and requires fsck to find nothing at all: no data object
// that no file owns is left.
func finalSweep(t *testing.T, v *vm, img images, disk, dir string, params map[string]string) {
	t.Helper()
	start := time.Now()
	defer func() { t.Logf("async: the check of the last sweep took %.1f s", time.Since(start).Seconds()) }()
	err := v.waitSwept(5 * time.Minute)
	v.kill()
	if err != nil {
		t.Errorf("async: the last boot: %v", err)
		return
	}
	v, err = startVM(vmConfig{
		img: img, disk: disk, port: freePort(t), params: params,
		console: filepath.Join(dir, "console.log"), logf: t.Logf, deadline: 10 * time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer v.kill()
	if err := v.waitServe(5 * time.Minute); err != nil {
		t.Fatalf("async: the boot after the last sweep: %v", err)
	}
	rep, rc, ran, err := v.fsck()
	switch {
	case err != nil || !ran:
		t.Errorf("async: fsck after the last sweep: ran %v, %v", ran, err)
	case rc != 0 || !rep.OK:
		t.Errorf("async: fsck after the server swept the data objects no file owns: exit status %d, %v", rc, rep.Problems)
	default:
		t.Logf("async: after the last sweep fsck finds nothing: %d inodes, %d data objects", rep.Inodes, rep.DataObjects)
	}
}
