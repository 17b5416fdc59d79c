// Package sweep tests, with real processes, that `shoal serve --sync=false`
// removes the data objects a machine crash leaves without their file.
//
// A create answered before its metadata log record is durable, whose
// file then got data (a WRITE creates the file's object in DIR/data), is
// taken back by a machine crash that lost the log's unsynced tail, while
// the object, written back by the page cache, survives. The test makes
// that state with real processes: it runs `shoal serve --sync=false`
// with a long commit interval, creates files whose data is made durable
// (a FILE_SYNC WRITE, which waits for the log) and copies the metadata
// files then (the disk as the next crash will leave it: everything up to
// the log's last fdatasync), creates more files with UNSTABLE WRITEs
// (answered early: the metadata log is not synced, which the server's
// own counter of fdatasyncs confirms), kills the server with SIGKILL and
// puts the copied metadata files back, which is what the machine crash
// would have left of them. `shoal admin fsck` must then report the lost
// files' objects, the restarted server must sweep exactly those after
// its grace period (its metrics say so), and fsck after a clean stop
// must find the directory consistent with the surviving files' objects
// in place. The machine-crash harness (test/crash) checks the same with
// real power cuts in a VM.
package sweep

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/shoalbin"
	"github.com/shoalfs/shoal/internal/wiretest"
	"github.com/shoalfs/shoal/store"
)

var shoalBin string

func TestMain(m *testing.M) {
	bin, cleanup, err := shoalbin.Build("shoal-sweep-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "sweep:", err)
		os.Exit(1)
	}
	shoalBin = bin
	code := m.Run()
	cleanup()
	os.Exit(code)
}

func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// serve is a running `shoal serve`.
type serve struct {
	cmd           *exec.Cmd
	addr, metrics string
	log           *os.File
	done          chan error
}

func startServe(t *testing.T, dir, addr, metrics string) *serve {
	t.Helper()
	logf, err := os.OpenFile(filepath.Join(dir, "..", "serve.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(shoalBin, "serve", "--dir", dir, "--listen", addr, "--http", metrics,
		"--sync=false", "--commit-interval", "1m", "--lease", "3s", "--no-root-squash")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &serve{cmd: cmd, addr: addr, metrics: metrics, log: logf, done: make(chan error, 1)}
	go func() { s.done <- cmd.Wait() }()
	t.Cleanup(func() {
		if s.cmd.ProcessState == nil {
			s.cmd.Process.Kill()
			<-s.done
		}
		logf.Close()
	})
	for i := 0; ; i++ {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return s
		}
		select {
		case err := <-s.done:
			t.Fatalf("shoal serve exited: %v (log %s)", err, logf.Name())
		default:
		}
		if i == 300 {
			t.Fatalf("shoal serve not listening on %s after 30 s", addr)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// metric reads the series name of the server's metrics endpoint whose
// labels include label (name="value", or "" for any); 0 if absent.
func (s *serve) metric(t *testing.T, name, label string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + s.metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		series, value, ok := strings.Cut(line, " ")
		if !ok || (series != name && !strings.HasPrefix(series, name+"{")) || !strings.Contains(series, label) {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", line, err)
		}
		return v
	}
	return 0
}

func (s *serve) stop(t *testing.T, sig syscall.Signal) {
	t.Helper()
	s.cmd.Process.Signal(sig)
	select {
	case <-s.done:
	case <-time.After(60 * time.Second):
		t.Fatalf("shoal serve did not stop within 60 s of %v", sig)
	}
}

type fsckResult struct {
	OK          bool     `json:"ok"`
	DataObjects uint64   `json:"data_objects"`
	Problems    []string `json:"problems"`
}

func fsck(t *testing.T, dir string) (fsckResult, int) {
	t.Helper()
	out, err := exec.Command(shoalBin, "admin", "fsck", "--dir", dir, "--json").Output()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	var res fsckResult
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("fsck output %q (exit %d): %v", out, code, err)
	}
	return res, code
}

func TestSweepAfterCrash(t *testing.T) {
	const kept, lost = 3, 5
	root := t.TempDir()
	dir := filepath.Join(root, "srv")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	addr, metrics := freePort(t), freePort(t)
	s := startServe(t, dir, addr, metrics)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cl, err := wiretest.Setup(ctx, addr, []byte("sweep-test"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	data := bytes.Repeat([]byte("orphan? "), 4096)
	// create makes a file and writes data to it in one COMPOUND.
	create := func(name string, stable nfs4.StableHow4) {
		t.Helper()
		res, err := cl.Compound(
			nfs4.NfsArgop4{Argop: nfs4.OP_PUTROOTFH},
			nfs4.NfsArgop4{Argop: nfs4.OP_OPEN, Opopen: &nfs4.OPEN4args{
				ShareAccess: nfs4.OPEN4_SHARE_ACCESS_BOTH,
				Owner:       nfs4.OpenOwner4{Clientid: cl.ClientID, Owner: []byte("o")},
				Openhow: nfs4.Openflag4{Opentype: nfs4.OPEN4_CREATE, How: &nfs4.Createhow4{
					Mode: nfs4.UNCHECKED4, Createattrs: &nfs4.Fattr4{}}},
				Claim: nfs4.OpenClaim4{Claim: nfs4.CLAIM_NULL, File: ptr(nfs4.Component4(name))},
			}},
			nfs4.NfsArgop4{Argop: nfs4.OP_WRITE, Opwrite: &nfs4.WRITE4args{
				Stateid: nfs4.Stateid4{Seqid: 1}, Stable: stable, Data: data}},
		)
		if err != nil {
			t.Fatal(err)
		}
		if res.Status != nfs4.NFS4_OK {
			t.Fatalf("create %s: %v", name, wiretest.Check(res))
		}
	}
	for i := range kept {
		create("kept"+strconv.Itoa(i), nfs4.FILE_SYNC4)
	}
	// The disk as a crash now would leave it: the FILE_SYNC WRITEs made
	// everything before them durable, and nothing runs meanwhile.
	disk := copyMetaFiles(t, dir)
	syncs := s.metric(t, "shoal_metadata_log_syncs_total", "")
	if syncs == 0 {
		t.Fatal("no metadata log fdatasync counted after FILE_SYNC WRITEs: the metric is not read")
	}
	for i := range lost {
		create("lost"+strconv.Itoa(i), nfs4.UNSTABLE4)
	}
	if after := s.metric(t, "shoal_metadata_log_syncs_total", ""); after != syncs {
		t.Fatalf("the metadata log was synced %v times after the copy: the lost creates would have survived", after-syncs)
	}
	var objs []uint64
	if err := store.WalkLocal(dir, func(ino uint64) error { objs = append(objs, ino); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(objs) != kept+lost {
		t.Fatalf("data objects %v, want %d", objs, kept+lost)
	}
	cl.Close()

	// The crash.
	s.stop(t, syscall.SIGKILL)
	restoreMetaFiles(t, dir, disk)
	res, code := fsck(t, dir)
	if code != 4 || len(res.Problems) != lost {
		t.Fatalf("fsck after the crash: exit %d, %+v; want the %d lost files' objects reported", code, res, lost)
	}
	for _, p := range res.Problems {
		if !strings.HasPrefix(p, "unreferenced-data-object") {
			t.Fatalf("fsck after the crash: %q", p)
		}
	}

	// The restart sweeps them (fsck's open kept the mark for it).
	s = startServe(t, dir, addr, metrics)
	for i := 0; s.metric(t, "shoal_data_sweep_runs_total", `outcome="complete"`) < 1; i++ {
		if s.metric(t, "shoal_data_sweep_runs_total", `outcome="incomplete"`) > 0 {
			t.Fatalf("the sweep did not complete (log %s)", s.log.Name())
		}
		if i == 600 {
			logText, _ := os.ReadFile(s.log.Name())
			t.Fatalf("no sweep within 60 s of the restart:\n%s", tail(logText))
		}
		time.Sleep(100 * time.Millisecond)
	}
	if got := s.metric(t, "shoal_data_sweep_objects_total", `result="removed"`); got != lost {
		t.Fatalf("the sweep removed %v objects, want %d", got, lost)
	}
	s.stop(t, syscall.SIGTERM)
	res, code = fsck(t, dir)
	if code != 0 || !res.OK || res.DataObjects != kept {
		t.Fatalf("fsck after the sweep: exit %d, %+v; want consistent with %d data objects", code, res, kept)
	}
	logText, err := os.ReadFile(s.log.Name())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(logText, []byte("swept data objects no file owns")) {
		t.Fatalf("the server's log does not tell of the sweep:\n%s", tail(logText))
	}
}

func ptr[T any](v T) *T { return &v }

func tail(b []byte) string {
	lines := strings.Split(string(b), "\n")
	return strings.Join(lines[max(0, len(lines)-20):], "\n")
}

// copyMetaFiles copies the metadata database and its log files in dir.
func copyMetaFiles(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	for _, n := range metaFiles(t, dir) {
		b, err := os.ReadFile(filepath.Join(dir, n))
		if err != nil {
			t.Fatal(err)
		}
		files[n] = b
	}
	if len(files) < 2 {
		t.Fatalf("metadata files in %s: %v, want the database and a log", dir, slices.Sorted(mapKeys(files)))
	}
	return files
}

// restoreMetaFiles puts the metadata files back as copyMetaFiles found
// them, and removes the others.
func restoreMetaFiles(t *testing.T, dir string, files map[string][]byte) {
	t.Helper()
	for _, n := range metaFiles(t, dir) {
		if err := os.Remove(filepath.Join(dir, n)); err != nil {
			t.Fatal(err)
		}
	}
	for n, b := range files {
		if err := os.WriteFile(filepath.Join(dir, n), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

func metaFiles(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if n := e.Name(); n == "meta.db" || strings.HasPrefix(n, "meta.db-wal") {
			out = append(out, n)
		}
	}
	return out
}

func mapKeys(m map[string][]byte) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}
