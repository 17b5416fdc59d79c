package bench_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/shoalfs/shoal/internal/bench"
	"github.com/shoalfs/shoal/internal/bench/benchtest"
	"github.com/shoalfs/shoal/internal/bytesize"
)

// repoRoot is the checkout this test file lives in, for scripts/ganesha.sh.
func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// TestQuick runs the --quick benchmark against an in-process Shoal server
// (and NFS-Ganesha with SHOAL_GANESHA=1) and checks only that every
// workload completed with a positive rate: timing is not asserted.
func TestQuick(t *testing.T) {
	cfg := bench.QuickConfig()
	cfg.Timeout = 5 * time.Minute
	if testing.Short() {
		cfg.Size, cfg.Files = 8<<20, 20
	}
	var progress bytes.Buffer
	cfg.Progress = &progress
	targets := []bench.Target{{Name: "shoal", Starter: &bench.ShoalInProcess{Dir: t.TempDir()}}}
	if os.Getenv("SHOAL_GANESHA") == "1" {
		targets = append(targets, bench.Target{Name: "ganesha", Starter: &bench.Ganesha{
			Script: filepath.Join(repoRoot(), "scripts", "ganesha.sh"),
			Dir:    t.TempDir(),
		}})
	}
	rep, err := bench.Run(t.Context(), cfg, targets)
	if err != nil {
		t.Fatalf("run: %v\nprogress:\n%s", err, progress.String())
	}
	if len(rep.Targets) != len(targets) {
		t.Fatalf("%d target reports, want %d", len(rep.Targets), len(targets))
	}
	for _, tr := range rep.Targets {
		if tr.Skipped != "" {
			t.Logf("%s skipped: %s", tr.Name, tr.Skipped)
			continue
		}
		if tr.Error != "" {
			t.Errorf("%s: %s", tr.Name, tr.Error)
		}
		if len(tr.Results) != 5 {
			t.Fatalf("%s: %d results, want 5: %+v", tr.Name, len(tr.Results), tr.Results)
		}
		for _, r := range tr.Results {
			if len(r.Samples) != cfg.Reps || r.Median <= 0 || r.Min <= 0 || r.Max < r.Min {
				t.Errorf("%s %s: implausible result %+v", tr.Name, r.Workload, r)
			}
		}
	}

	var table, js bytes.Buffer
	if err := rep.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"seq-write", "seq-read", "create", "stat", "remove", "page cache is warm"} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, table.String())
		}
	}
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back bench.Report
	if err := json.Unmarshal(js.Bytes(), &back); err != nil {
		t.Fatalf("report JSON does not parse: %v", err)
	}
	if back.Machine.NumCPU <= 0 || len(back.Targets) != len(rep.Targets) {
		t.Errorf("JSON round trip lost data: %+v", back)
	}
	t.Logf("\n%s", table.String())
}

// TestUnavailableIsSkipped checks that a target that cannot run here is a
// note in the report and not a failure of the run.
func TestUnavailableIsSkipped(t *testing.T) {
	cfg := bench.QuickConfig()
	cfg.Timeout = time.Minute
	rep, err := bench.Run(t.Context(), cfg, []bench.Target{{
		Name:    "ganesha",
		Starter: &bench.Ganesha{Script: "", Dir: t.TempDir()},
	}})
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	if got := rep.Targets[0].Skipped; got == "" {
		t.Fatalf("target not marked skipped: %+v", rep.Targets[0])
	}
	var table bytes.Buffer
	rep.WriteTable(&table)
	if !strings.Contains(table.String(), "skipped") {
		t.Errorf("table does not say skipped:\n%s", table.String())
	}
}

// TestExistingRefused checks that --addr pointing at nothing fails the
// target with an error rather than hanging or panicking.
func TestExistingRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cfg := bench.QuickConfig()
	rep, err := bench.Run(ctx, cfg, []bench.Target{{Name: "nothing", Starter: bench.Existing{Addr: "127.0.0.1:1"}}})
	if err == nil {
		t.Fatal("run against a closed port succeeded")
	}
	if rep == nil || rep.Targets[0].Error == "" {
		t.Fatalf("report does not carry the error: %+v", rep)
	}
}

func TestFormatSizeRoundTrip(t *testing.T) {
	for _, n := range []int64{1 << 30, 1536 << 20, 64 << 20, 4096, 1000, 1} {
		s := bench.FormatSize(n)
		back, err := bytesize.Parse(s)
		if err != nil || back != n {
			t.Errorf("FormatSize(%d) = %q, parses back as %d, %v", n, s, back, err)
		}
	}
}

func TestSummarize(t *testing.T) {
	tests := []struct {
		in   []float64
		want bench.Summary
	}{
		{nil, bench.Summary{}},
		{[]float64{5}, bench.Summary{Median: 5, Min: 5, Max: 5}},
		{[]float64{3, 1, 2}, bench.Summary{Median: 2, Min: 1, Max: 3}},
		{[]float64{4, 1, 3, 2}, bench.Summary{Median: 2.5, Min: 1, Max: 4}},
	}
	for _, tc := range tests {
		if got := bench.Summarize(tc.in); got != tc.want {
			t.Errorf("Summarize(%v) = %+v, want %+v", tc.in, got, tc.want)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	ok := bench.DefaultConfig()
	tests := []struct {
		name   string
		mutate func(c *bench.Config)
		valid  bool
	}{
		{"default", func(c *bench.Config) {}, true},
		{"zero size", func(c *bench.Config) { c.Size = 0 }, false},
		{"tiny block", func(c *bench.Config) { c.Block = 8 }, false},
		{"zero depth", func(c *bench.Config) { c.Depth = 0 }, false},
		{"zero files", func(c *bench.Config) { c.Files = 0 }, false},
		{"zero reps", func(c *bench.Config) { c.Reps = 0 }, false},
		{"size not a block multiple", func(c *bench.Config) { c.Size = 3<<20 + 17 }, true},
		{"seq only", func(c *bench.Config) { c.Groups = []string{bench.GroupSeq} }, true},
		{"unknown group", func(c *bench.Config) { c.Groups = []string{"fsync"} }, false},
		{"four streams", func(c *bench.Config) { c.Streams = 4 }, true},
		{"negative streams", func(c *bench.Config) { c.Streams = -1 }, false},
		{"more streams than files", func(c *bench.Config) { c.Files, c.Streams = 3, 4 }, false},
	}
	for _, tc := range tests {
		c := ok
		tc.mutate(&c)
		if err := c.Validate(); (err == nil) != tc.valid {
			t.Errorf("%s: Validate() = %v, want valid %v", tc.name, err, tc.valid)
		}
	}
}

func TestMachineInfo(t *testing.T) {
	m := bench.MachineInfo()
	if m.NumCPU <= 0 || m.Go == "" {
		t.Errorf("MachineInfo() = %+v", m)
	}
}

// TestOddSizes runs a file whose size is not a multiple of the block, with
// a last block shorter than the offset stamp, and an even number of reps.
func TestOddSizes(t *testing.T) {
	cfg := bench.Config{Size: 3<<20 + 5, Block: 64<<10 + 1, Depth: 3, Files: 3, Reps: 2, Timeout: 2 * time.Minute}
	rep, err := bench.Run(t.Context(), cfg, []bench.Target{{Name: "shoal", Starter: &bench.ShoalInProcess{Dir: t.TempDir()}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rep.Targets[0].Results {
		if len(r.Samples) != 2 || r.Median <= 0 {
			t.Errorf("%s: %+v", r.Workload, r)
		}
	}
}

// TestStreams runs the small-file workload as concurrent streams over a
// number of files the streams do not divide evenly: every stat must find
// its file, and the stream directories must be empty when they are removed
// (a file created twice, or one left behind, fails the run).
func TestStreams(t *testing.T) {
	cfg := bench.Config{Size: 1 << 20, Block: 256 << 10, Depth: 2, Files: 23, Streams: 4, Reps: 2,
		Groups: []string{bench.GroupSmall}, Timeout: time.Minute}
	rep, err := bench.Run(t.Context(), cfg, []bench.Target{{Name: "shoal", Starter: &bench.ShoalInProcess{Dir: t.TempDir()}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Targets[0].Results) != 3 {
		t.Fatalf("results: %+v", rep.Targets[0].Results)
	}
	for _, r := range rep.Targets[0].Results {
		if len(r.Samples) != 2 || r.Median <= 0 {
			t.Errorf("%s: %+v", r.Workload, r)
		}
	}
}

// TestGroups checks that Config.Groups runs only the selected workloads.
func TestGroups(t *testing.T) {
	tests := []struct {
		groups []string
		want   []string
	}{
		{[]string{bench.GroupSeq}, []string{bench.SeqWrite, bench.SeqRead}},
		{[]string{bench.GroupSmall}, []string{bench.Create, bench.Stat, bench.Remove}},
	}
	for _, tc := range tests {
		cfg := bench.Config{Size: 1 << 20, Block: 256 << 10, Depth: 2, Files: 2, Reps: 1, Groups: tc.groups, Timeout: time.Minute}
		rep, err := bench.Run(t.Context(), cfg, []bench.Target{{Name: "shoal", Starter: &bench.ShoalInProcess{Dir: t.TempDir()}}})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, r := range rep.Targets[0].Results {
			got = append(got, strings.Fields(r.Workload)[0])
		}
		if strings.Join(got, ",") != strings.Join(tc.want, ",") {
			t.Errorf("groups %v ran %v, want %v", tc.groups, got, tc.want)
		}
	}
}

// TestIORQuick runs the --quick ior matrix (1 and 2 data servers, pNFS on
// and off, 2 clients × 16 MiB, one rep) with an in-process cluster and
// in-process clients, and checks only that every cell completed with a
// positive bandwidth.
func TestIORQuick(t *testing.T) {
	cfg := bench.QuickIORConfig()
	if testing.Short() {
		cfg.BlockSize = 2 << 20
	}
	var progress bytes.Buffer
	cfg.Progress = &progress
	rep, err := bench.RunIOR(t.Context(), cfg, bench.IORSetup{
		Cluster: &bench.ClusterInProcess{Dir: t.TempDir()},
		Clients: bench.InProcessLauncher{},
	})
	if err != nil {
		t.Fatalf("run: %v\nprogress:\n%s", err, progress.String())
	}
	if want := len(cfg.DataServers) * len(cfg.PNFS) * 2 * cfg.Reps; len(rep.Runs) != want {
		t.Fatalf("%d runs, want %d", len(rep.Runs), want)
	}
	for _, r := range rep.Runs {
		if r.Bytes != int64(cfg.Clients)*cfg.BlockSize || r.MBps <= 0 || len(r.Clients) != cfg.Clients {
			t.Errorf("implausible run %+v", r)
		}
	}
	if want := len(cfg.DataServers) * len(cfg.PNFS) * 2; len(rep.Cells) != want {
		t.Fatalf("%d cells, want %d", len(rep.Cells), want)
	}
	for _, c := range rep.Cells {
		if c.Median <= 0 || c.Min <= 0 || c.Max < c.Min {
			t.Errorf("implausible cell %+v", c)
		}
	}
	var table, js bytes.Buffer
	if err := rep.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"write pNFS on", "read pNFS off", "MB/s", "loopback"} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, table.String())
		}
	}
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back bench.IORReport
	if err := json.Unmarshal(js.Bytes(), &back); err != nil {
		t.Fatalf("report JSON does not parse: %v", err)
	}
	if len(back.Runs) != len(rep.Runs) || back.Machine.NumCPU <= 0 {
		t.Errorf("JSON round trip lost data")
	}
	t.Logf("\n%s", table.String())
}

// TestIORClientErrors checks that a client that cannot do its job (its
// file does not exist) fails the cell with the client's error instead of
// hanging, and that the run goes on to the next cluster size.
func TestIORClientErrors(t *testing.T) {
	cfg := bench.QuickIORConfig()
	cfg.BlockSize, cfg.Clients, cfg.PNFS = 1<<20, 1, []bool{false}
	rep, err := bench.RunIOR(t.Context(), cfg, bench.IORSetup{
		Cluster: &bench.ClusterInProcess{Dir: t.TempDir()},
		Clients: readOnly{},
	})
	if err == nil {
		t.Fatal("run with failing clients succeeded")
	}
	if len(rep.Errors) != len(cfg.DataServers) {
		t.Errorf("errors %q, want one per cluster size", rep.Errors)
	}
	for _, e := range rep.Errors {
		if !strings.Contains(e, "client 0") {
			t.Errorf("error %q does not name the client", e)
		}
	}
}

// readOnly launches in-process clients that always read, so the write
// phase reads a file that does not exist.
type readOnly struct{}

func (readOnly) Launch(ctx context.Context, spec bench.ClientSpec) (*bench.ClientHandle, error) {
	spec.Phase = bench.PhaseRead
	return bench.InProcessLauncher{}.Launch(ctx, spec)
}

func TestParsePNFSModes(t *testing.T) {
	tests := []struct {
		in      []string
		want    string
		wantErr bool
	}{
		{[]string{"on", "off"}, "on,off", false},
		{[]string{"off"}, "off", false},
		{[]string{"ON", "on", " false "}, "on,off", false},
		{[]string{"maybe"}, "", true},
	}
	for _, tc := range tests {
		got, err := bench.ParsePNFSModes(tc.in)
		if (err != nil) != tc.wantErr || (err == nil && bench.FormatPNFSModes(got) != tc.want) {
			t.Errorf("ParsePNFSModes(%q) = %v, %v; want %s, error %v", tc.in, got, err, tc.want, tc.wantErr)
		}
	}
}

func TestIORConfigValidate(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(c *bench.IORConfig)
		valid  bool
	}{
		{"default", func(c *bench.IORConfig) {}, true},
		{"no ds", func(c *bench.IORConfig) { c.DataServers = nil }, false},
		{"zero ds", func(c *bench.IORConfig) { c.DataServers = []int{0} }, false},
		{"no modes", func(c *bench.IORConfig) { c.PNFS = nil }, false},
		{"zero clients", func(c *bench.IORConfig) { c.Clients = 0 }, false},
		{"tiny transfer", func(c *bench.IORConfig) { c.TransferSize = 16 }, false},
		{"too much data", func(c *bench.IORConfig) { c.Clients, c.BlockSize = 200, 1<<40 }, false},
		{"zero reps", func(c *bench.IORConfig) { c.Reps = 0 }, false},
		{"shared random stonewall", func(c *bench.IORConfig) { c.Shared, c.Random, c.Stonewall = true, true, time.Second }, true},
		{"negative stonewall", func(c *bench.IORConfig) { c.Stonewall = -1 }, false},
		{"direct access", func(c *bench.IORConfig) { c.Access = bench.AccessDirect }, true},
		{"cached access", func(c *bench.IORConfig) { c.Access = "cached" }, true},
		{"unknown access", func(c *bench.IORConfig) { c.Access = "mmap" }, false},
		{"copies", func(c *bench.IORConfig) { c.DataServers, c.Mirrors = []int{2, 4}, []int{1, 2} }, true},
		{"three copies", func(c *bench.IORConfig) { c.DataServers, c.Mirrors = []int{3}, []int{3} }, true},
		{"more copies than data servers", func(c *bench.IORConfig) { c.DataServers, c.Mirrors = []int{1, 4}, []int{2} }, false},
		{"four copies", func(c *bench.IORConfig) { c.DataServers, c.Mirrors = []int{6}, []int{4} }, false},
		{"zero copies", func(c *bench.IORConfig) { c.Mirrors = []int{0} }, false},
	}
	for _, tc := range tests {
		c := bench.DefaultIORConfig()
		tc.mutate(&c)
		if err := c.Validate(); (err == nil) != tc.valid {
			t.Errorf("%s: Validate() = %v, want valid %v", tc.name, err, tc.valid)
		}
	}
}

// TestIORMirrors runs the ior matrix over the number of copies on an
// in-process cluster: every run and cell records its copies, the write
// ceiling with two copies is half the read's, and the table and notes say
// so.
func TestIORMirrors(t *testing.T) {
	cfg := bench.QuickIORConfig()
	cfg.DataServers, cfg.Mirrors, cfg.PNFS, cfg.Clients = []int{2}, []int{1, 2}, []bool{true}, 2
	cfg.BlockSize = 4 << 20
	if testing.Short() {
		cfg.BlockSize = 1 << 20
	}
	cfg.LinkBitsPerSec = 1e9 // 125 MB/s per link, for the ceilings only
	var progress bytes.Buffer
	cfg.Progress = &progress
	rep, err := bench.RunIOR(t.Context(), cfg, bench.IORSetup{
		Cluster: &bench.ClusterInProcess{Dir: t.TempDir()},
		Clients: bench.InProcessLauncher{},
	})
	if err != nil {
		t.Fatalf("run: %v\nprogress:\n%s", err, progress.String())
	}
	if len(rep.Runs) != 4 || len(rep.Cells) != 4 {
		t.Fatalf("%d runs and %d cells, want 4 and 4", len(rep.Runs), len(rep.Cells))
	}
	want := map[string]float64{"1 write": 250, "1 read": 250, "2 write": 125, "2 read": 250}
	for _, c := range rep.Cells {
		k := fmt.Sprintf("%d %s", c.Mirrors, c.Phase)
		if c.Median <= 0 || c.CeilingMBps != want[k] {
			t.Errorf("cell %s: %.1f MB/s, ceiling %.0f, want ceiling %.0f", k, c.Median, c.CeilingMBps, want[k])
		}
	}
	for _, r := range rep.Runs {
		if r.Mirrors != 1 && r.Mirrors != 2 {
			t.Errorf("run with %d copies", r.Mirrors)
		}
		if r.Bytes != int64(cfg.Clients)*cfg.BlockSize {
			t.Errorf("%d copies, %s: %d bytes, want %d", r.Mirrors, r.Phase, r.Bytes, int64(cfg.Clients)*cfg.BlockSize)
		}
	}
	var table bytes.Buffer
	if err := rep.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"copies", "min(clients, DS/m)", "2 data servers, 2 copies"} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, table.String())
		}
	}
	var js bytes.Buffer
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(js.String(), `"mirrors": 2`) {
		t.Errorf("JSON does not record the copies")
	}
	t.Logf("\n%s", table.String())
}

// oneCopy is a ClusterStarter that cannot keep copies.
type oneCopy struct{ bench.ClusterStarter }

// TestIORMirrorsUnsupported: asking a cluster that cannot keep copies for
// two fails the cell instead of measuring one copy under the wrong name.
func TestIORMirrorsUnsupported(t *testing.T) {
	cfg := bench.QuickIORConfig()
	cfg.DataServers, cfg.Mirrors, cfg.PNFS, cfg.Clients, cfg.BlockSize = []int{2}, []int{2}, []bool{true}, 1, 1<<20
	rep, err := bench.RunIOR(t.Context(), cfg, bench.IORSetup{
		Cluster: oneCopy{&bench.ClusterInProcess{Dir: t.TempDir()}},
		Clients: bench.InProcessLauncher{},
	})
	if err == nil || !strings.Contains(err.Error(), "2 copies") || len(rep.Runs) != 0 {
		t.Fatalf("RunIOR: %v, %d runs; want an error about 2 copies and no runs", err, len(rep.Runs))
	}
}

// TestIORModes runs the ior workload in its other modes: one shared file
// with random order, and a stonewall so short that every client stops
// after its first transfer (the first transfer always runs), so the read
// phase must read exactly that one transfer back.
func TestIORModes(t *testing.T) {
	tests := []struct {
		name      string
		shared    bool
		random    bool
		stonewall time.Duration
		perClient int64 // bytes each client moves
		pnfs      bool
		access    string
	}{
		{"odirect", false, false, 0, 1 << 20, true, "odirect"},
		{"cached random", false, true, 0, 1 << 20, true, "cached"},
		{"shared sequential", true, false, 0, 1 << 20, false, ""},
		{"per-process random", false, true, 0, 1 << 20, true, ""},
		{"shared random", true, true, 0, 1 << 20, false, ""},
		{"stonewall", false, false, time.Nanosecond, 64 << 10, true, ""},
		// Concurrent writers of one file through pNFS: their
		// LAYOUTCOMMITs must only ever grow the file (they once raced
		// and shrank it, and readers saw EOF early).
		{"shared pNFS", true, false, 0, 1 << 20, true, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := bench.QuickIORConfig()
			cfg.DataServers, cfg.PNFS, cfg.Clients = []int{2}, []bool{tc.pnfs}, 3
			cfg.BlockSize, cfg.TransferSize = 1<<20, 64<<10
			cfg.Shared, cfg.Random, cfg.Stonewall, cfg.Access = tc.shared, tc.random, tc.stonewall, tc.access
			rep, err := bench.RunIOR(t.Context(), cfg, bench.IORSetup{
				Cluster: &bench.ClusterInProcess{Dir: t.TempDir()},
				Clients: bench.InProcessLauncher{},
			})
			if err != nil {
				t.Fatalf("run: %v", err)
			}
			if len(rep.Runs) != 2 {
				t.Fatalf("%d runs, want 2", len(rep.Runs))
			}
			for _, r := range rep.Runs {
				for _, c := range r.Clients {
					if c.Bytes != tc.perClient {
						t.Errorf("%s: client %d moved %d bytes, want %d", r.Phase, c.Index, c.Bytes, tc.perClient)
					}
				}
			}
		})
	}
}

// TestMetaQuick runs the mdtest- and postmark-like workloads and checks
// that every phase did all its operations.
func TestMetaQuick(t *testing.T) {
	cfg := bench.QuickMetaConfig()
	cfg.Clients, cfg.Files, cfg.PoolFiles, cfg.Transactions = 2, 8, 4, 12
	rep, err := bench.RunMeta(t.Context(), cfg, bench.IORSetup{
		Cluster: &bench.ClusterInProcess{Dir: t.TempDir()},
		Clients: bench.InProcessLauncher{},
	})
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	if want := len(cfg.Dirs)*4 + 1; len(rep.Runs) != want {
		t.Fatalf("%d runs, want %d: %+v", len(rep.Runs), want, rep.Runs)
	}
	for _, r := range rep.Runs {
		want := int64(cfg.Clients * cfg.Files)
		if r.Phase == bench.PhasePostmark {
			want = int64(cfg.Clients * cfg.Transactions)
		}
		if r.Ops != want || r.Rate <= 0 {
			t.Errorf("%s %s: %d ops at %.0f/s, want %d", r.Phase, r.Dir, r.Ops, r.Rate, want)
		}
	}
	var table bytes.Buffer
	if err := rep.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(table.String(), "postmark") {
		t.Errorf("table lacks postmark:\n%s", table.String())
	}
}

func TestMetaConfigValidate(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(c *bench.MetaConfig)
		valid  bool
	}{
		{"default", func(c *bench.MetaConfig) {}, true},
		{"no clients", func(c *bench.MetaConfig) { c.Clients = 0 }, false},
		{"nothing", func(c *bench.MetaConfig) { c.Files, c.Transactions = 0, 0 }, false},
		{"bad dir", func(c *bench.MetaConfig) { c.Dirs = []string{"both"} }, false},
		{"bad sizes", func(c *bench.MetaConfig) { c.MinSize, c.MaxSize = 10, 5 }, false},
	}
	for _, tc := range tests {
		c := bench.DefaultMetaConfig()
		tc.mutate(&c)
		if err := c.Validate(); (err == nil) != tc.valid {
			t.Errorf("%s: Validate() = %v, want valid %v", tc.name, err, tc.valid)
		}
	}
}

// TestResults writes reports of every sweep as JSON, reads them back as
// `shoal bench plot` does and checks the tables (the charts are
// benchplot's).
func TestResults(t *testing.T) {
	dir := t.TempDir()
	benchtest.WriteSweeps(t, dir)
	res, err := bench.LoadResults(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.IOR) != benchtest.IORReports || len(res.Meta) != benchtest.MetaReports {
		t.Fatalf("loaded %d ior and %d meta reports, want %d and %d", len(res.IOR), len(res.Meta), benchtest.IORReports, benchtest.MetaReports)
	}
	var md bytes.Buffer
	if err := res.WriteMarkdown(&md); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Sweep: ds", "Sweep: clients", "NFS-Ganesha", "Small files", "postmark",
		"Sweep: mirrors", "cost of copies", "| Shoal pNFS | 4 | 4 | 2 | 1MiB | write | 235 [235-235] | 250 | 94% |"} {
		if !strings.Contains(md.String(), want) {
			t.Errorf("markdown lacks %q", want)
		}
	}
}

// TestSmallIOThreshold: the workloads pass --small-io-threshold to their
// clients, and the reports show where the bytes went: 4 KiB requests
// through the MDS without layouts below the threshold, to the data
// servers with one (-1: never through the MDS).
func TestSmallIOThreshold(t *testing.T) {
	for _, tt := range []struct {
		name      string
		threshold int
		wantDS    bool
	}{
		{"never", -1, true},
		{"above 4 KiB", 4<<10 + 1, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			mc := bench.QuickMetaConfig()
			mc.DataServers, mc.Clients, mc.Files, mc.Transactions = 2, 1, 4, 0
			mc.Dirs, mc.SmallIOThreshold = []string{bench.DirUnique}, tt.threshold
			mrep, err := bench.RunMeta(t.Context(), mc, bench.IORSetup{
				Cluster: &bench.ClusterInProcess{Dir: t.TempDir()},
				Clients: bench.InProcessLauncher{},
			})
			if err != nil {
				t.Fatalf("meta: %v", err)
			}
			for _, r := range mrep.Runs {
				if r.Phase != bench.PhaseMDCreate && r.Phase != bench.PhaseMDRead {
					continue
				}
				viaDS := r.DSBytes == uint64(r.Bytes) && r.MDSBytes == 0 && r.LayoutGets == uint64(mc.Files)
				viaMDS := r.DSBytes == 0 && r.MDSBytes == uint64(r.Bytes) && r.LayoutGets == 0
				if r.Bytes != int64(mc.Files*mc.FileSize) || (tt.wantDS && !viaDS) || (!tt.wantDS && !viaMDS) {
					t.Errorf("%s: %d bytes, %d via DS, %d via MDS, %d layouts; want via DS %v",
						r.Phase, r.Bytes, r.DSBytes, r.MDSBytes, r.LayoutGets, tt.wantDS)
				}
			}

			ic := bench.QuickIORConfig()
			ic.DataServers, ic.PNFS, ic.Clients = []int{2}, []bool{true}, 1
			ic.BlockSize, ic.TransferSize, ic.SmallIOThreshold = 64<<10, 4<<10, tt.threshold
			irep, err := bench.RunIOR(t.Context(), ic, bench.IORSetup{
				Cluster: &bench.ClusterInProcess{Dir: t.TempDir()},
				Clients: bench.InProcessLauncher{},
			})
			if err != nil {
				t.Fatalf("ior: %v", err)
			}
			for _, r := range irep.Runs {
				if want := map[bool]float64{true: 1, false: 0}[tt.wantDS]; r.DSShare != want {
					t.Errorf("ior %s: %.2f of the bytes via the data servers, want %.0f", r.Phase, r.DSShare, want)
				}
			}
			var table bytes.Buffer
			if err := irep.WriteTable(&table); err != nil {
				t.Fatal(err)
			}
			if want := fmt.Sprintf("small-I/O threshold %d", tt.threshold); !strings.Contains(table.String(), want) {
				t.Errorf("ior table lacks %q:\n%s", want, table.String())
			}
		})
	}
}
