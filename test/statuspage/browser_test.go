package statuspage

import (
	"context"
	"crypto/rand"
	"encoding/json"
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

	"github.com/chromedp/chromedp"
)

// shoalBin is the shoal command TestMain built; repo is the repository's
// root.
var shoalBin, repo string

func TestMain(m *testing.M) {
	os.Exit(buildAndRun(m))
}

func buildAndRun(m *testing.M) int {
	gobin, err := exec.LookPath("go")
	if err != nil {
		// go test may run with a PATH that lacks the toolchain.
		gobin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	out, err := exec.Command(gobin, "env", "GOMOD").Output()
	if err != nil {
		fmt.Fprintf(os.Stderr, "statuspage: go env GOMOD: %v\n", err)
		return 1
	}
	repo = filepath.Dir(strings.TrimSpace(string(out)))
	tmp, err := os.MkdirTemp("", "shoal-statuspage-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "statuspage:", err)
		return 1
	}
	defer os.RemoveAll(tmp)
	shoalBin = filepath.Join(tmp, "shoal")
	build := exec.Command(gobin, "build", "-o", shoalBin, "./cmd/shoal")
	build.Dir = repo
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "statuspage: go build ./cmd/shoal: %v\n%s", err, out)
		return 1
	}
	return m.Run()
}

// chromium returns the browser to drive, or skips the test without one.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{os.Getenv("SHOAL_CHROMIUM"), "chromium", "chromium-browser", "google-chrome"} {
		if name == "" {
			continue
		}
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("SHOAL_BROWSER") == "1" {
		t.Fatal("SHOAL_BROWSER=1 but no Chromium found: apt-get install chromium, or set SHOAL_CHROMIUM")
	}
	t.Skip("no Chromium found (apt-get install chromium); SHOAL_BROWSER=1 makes this a failure")
	return ""
}

// proc is a long-running shoal process of the test.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string // its output file
	done chan struct{}
}

// start starts `shoal ARGS`, logging to dir/NAME.log; it is killed when
// the test ends, and its log shown if the test failed.
func start(t *testing.T, dir, name string, args ...string) *proc {
	t.Helper()
	p := &proc{name: name, log: filepath.Join(dir, name+".log"), done: make(chan struct{})}
	f, err := os.Create(p.log)
	if err != nil {
		t.Fatal(err)
	}
	p.cmd = exec.Command(shoalBin, args...)
	p.cmd.Stdout, p.cmd.Stderr = f, f
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		f.Close()
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		p.cmd.Wait()
		f.Close()
		close(p.done)
	}()
	t.Logf("started %s (pid %d): shoal %s", name, p.cmd.Process.Pid, strings.Join(args, " "))
	t.Cleanup(func() {
		p.kill()
		select {
		case <-p.done:
		case <-time.After(15 * time.Second):
			t.Errorf("%s (pid %d) still running after SIGKILL", name, p.cmd.Process.Pid)
		}
		if t.Failed() {
			b, _ := os.ReadFile(p.log)
			t.Logf("==== %s ====\n%s", name, b)
		}
	})
	return p
}

// kill sends SIGKILL to the process, only to it (os.Process uses a pidfd,
// so never to another process that got its PID).
func (p *proc) kill() {
	select {
	case <-p.done:
	default:
		_ = p.cmd.Process.Kill()
	}
}

// waitLog waits until the process's log matches re and returns the match.
func (p *proc) waitLog(t *testing.T, re *regexp.Regexp) []string {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		b, _ := os.ReadFile(p.log)
		if m := re.FindStringSubmatch(string(b)); m != nil {
			return m
		}
		select {
		case <-p.done:
			t.Fatalf("%s exited before logging %q", p.name, re)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not log %q within a minute", p.name, re)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

var (
	mdsReady = regexp.MustCompile(`shoal mds ready.* listen=(\S+) status=(\S+)`)
	dsReady  = regexp.MustCompile(`shoal ds ready.* id=(\S+)`)
)

// dsRow is a data server's row as the page shows it.
type dsRow struct {
	ID    string `json:"id"`
	Up    string `json:"up"` // the row's data-up
	Held  string `json:"held"`
	State string `json:"state"`
}

// rowsJS reads the data servers' rows, and whether the page's script
// ran (the live indicator) without a reload since (marker).
const rowsJS = `JSON.stringify({
	live: document.getElementById("live").textContent,
	marker: window.shoalTestMarker || "",
	rows: Array.from(document.querySelectorAll("#ds-rows tr[data-ds]")).map(r => ({
		id: r.dataset.ds, up: r.dataset.up, state: r.cells[2].textContent, held: r.cells[6].textContent})),
	events: Array.from(document.querySelectorAll("#event-rows tr")).map(r => r.textContent.replace(/\s+/g, " ").trim()),
})`

type pageState struct {
	Live   string   `json:"live"`
	Marker string   `json:"marker"`
	Rows   []dsRow  `json:"rows"`
	Events []string `json:"events"`
}

func TestStatusPageInBrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster and a browser")
	}
	browser := chromium(t)
	dir := t.TempDir()

	mds := start(t, dir, "mds", "mds", "--listen", "127.0.0.1:0", "--dir", filepath.Join(dir, "mds"),
		"--no-root-squash", "--http", "127.0.0.1:0")
	m := mds.waitLog(t, mdsReady)
	mdsAddr, pageURL := m[1], m[2]
	var ds []*proc
	var ids []string
	for i := range 3 {
		name := fmt.Sprintf("ds%d", i+1)
		p := start(t, dir, name, "ds", "--mds", mdsAddr, "--join-secret-file", filepath.Join(dir, "mds", "join-secret"),
			"--listen", "127.0.0.1:0", "--dir", filepath.Join(dir, name))
		ds = append(ds, p)
		ids = append(ids, p.waitLog(t, dsReady)[1])
	}

	// A file striped over all three (1 MiB stripe unit), so each holds
	// some of it.
	src := filepath.Join(dir, "f")
	data := make([]byte, 24<<20)
	rand.Read(data)
	if err := os.WriteFile(src, data, 0o644); err != nil {
		t.Fatal(err)
	}
	put(t, src, "nfs://"+mdsAddr+"/f")

	allocOpts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(browser), chromedp.WindowSize(1440, 1100),
		// /dev/shm is small in containers; Chromium then crashes tabs.
		chromedp.Flag("disable-dev-shm-usage", true))
	if os.Geteuid() == 0 {
		// Chromium refuses to run as root inside its sandbox.
		allocOpts = append(allocOpts, chromedp.NoSandbox)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, allocOpts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(actx)
	defer cancelBrowser()

	// The page is opened once: everything below must come from its own
	// polling.
	if err := chromedp.Do(bctx, chromedp.Navigate(pageURL)); err != nil {
		t.Fatalf("open %s: %v", pageURL, err)
	}
	if _, err := chromedp.Run(bctx, chromedp.Evaluate[any](`window.shoalTestMarker = "opened once"`)); err != nil {
		t.Fatal(err)
	}
	read := func() pageState {
		t.Helper()
		js, err := chromedp.Run(bctx, chromedp.Evaluate[string](rowsJS))
		if err != nil {
			t.Fatalf("reading the page: %v", err)
		}
		var s pageState
		if err := json.Unmarshal([]byte(js), &s); err != nil {
			t.Fatalf("%v: %s", err, js)
		}
		if s.Marker != "opened once" {
			t.Fatalf("the page was reloaded: %+v", s)
		}
		return s
	}
	waitPage := func(what string, cond func(pageState) bool) pageState {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for {
			s := read()
			if cond(s) {
				return s
			}
			if time.Now().After(deadline) {
				t.Fatalf("the page did not show %s within a minute; it shows %+v", what, s)
			}
			time.Sleep(250 * time.Millisecond)
		}
	}
	row := func(s pageState, id string) *dsRow {
		for i := range s.Rows {
			if s.Rows[i].ID == id {
				return &s.Rows[i]
			}
		}
		return nil
	}

	s := waitPage("three data servers in service holding the file, updated by its script", func(s pageState) bool {
		if s.Live != "live" || len(s.Rows) != 3 {
			return false
		}
		for _, id := range ids {
			if r := row(s, id); r == nil || r.Up != "true" || r.State != "active" || r.Held == "0 B" {
				return false
			}
		}
		return true
	})
	t.Logf("page before the kill: %+v", s.Rows)

	// SIGKILL: the data server's connection to the MDS closes, and the
	// MDS takes it out of service at once.
	dead := ids[1]
	ds[1].kill()
	s = waitPage("the killed data server down", func(s pageState) bool {
		r := row(s, dead)
		return r != nil && r.Up == "false"
	})
	for _, id := range []string{ids[0], ids[2]} {
		if r := row(s, id); r == nil || r.Up != "true" {
			t.Errorf("data server %s: %+v after another was killed", id, r)
		}
	}
	waitPage("the leaving in the events", func(s pageState) bool {
		return len(s.Events) > 0 && strings.Contains(s.Events[0], "ds left") && strings.Contains(s.Events[0], dead)
	})

	if path := os.Getenv("SHOAL_SCREENSHOT"); path != "" {
		screenshot(t, bctx, mdsAddr, dir, path)
	}
}

// put runs `shoal put` to its end.
func put(t *testing.T, src, dst string, flags ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, shoalBin, append(append([]string{"put"}, flags...), src, dst)...).CombinedOutput()
	if err != nil {
		t.Fatalf("shoal put %s %s: %v\n%s", src, dst, err, out)
	}
}

// screenshot saves the page to path (relative to the repository) with
// some traffic on it: a client writing a stream through a FIFO (so that it
// keeps its session and layout for as long as the stream lasts) and
// another reading a file over and over.
func screenshot(t *testing.T, bctx context.Context, mdsAddr, dir, path string) {
	t.Helper()
	if !filepath.IsAbs(path) {
		path = filepath.Join(repo, path)
	}
	// The file of the first put has a stripe on the data server killed;
	// this one is placed on the two in service.
	readable := filepath.Join(dir, "g")
	if err := os.WriteFile(readable, make([]byte, 16<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	put(t, readable, "nfs://"+mdsAddr+"/g")

	fifo := filepath.Join(dir, "stream")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	writer := exec.Command(shoalBin, "put", fifo, "nfs://"+mdsAddr+"/stream")
	if err := writer.Start(); err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		// About 32 MiB/s, until stopped; closing the FIFO ends the put.
		f, err := os.OpenFile(fifo, os.O_WRONLY, 0)
		if err != nil {
			t.Error(err)
			return
		}
		defer f.Close()
		chunk := make([]byte, 1<<20)
		for tick := time.NewTicker(30 * time.Millisecond); ctx.Err() == nil; <-tick.C {
			if _, err := f.Write(chunk); err != nil {
				t.Errorf("writing the stream: %v", err)
				return
			}
		}
	})
	wg.Go(func() {
		for ctx.Err() == nil {
			_ = exec.CommandContext(ctx, shoalBin, "get", "nfs://"+mdsAddr+"/g", filepath.Join(dir, "g.out")).Run()
		}
	})
	defer func() {
		stop()
		wg.Wait()
		if err := writer.Wait(); err != nil {
			t.Errorf("shoal put of the stream: %v", err)
		}
	}()
	// A few polls of the page: the writer's session and layout,
	// heartbeats carrying the traffic, and a new scan of the stripe maps
	// (at most 5 s old) with the new files.
	time.Sleep(7 * time.Second)
	png, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot saved to %s", path)
}
