package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/shoalfs/shoal/client"
)

// The scale workload (issue 13): a namespace of Files empty files, DirFiles
// of them in one large directory and the rest in directories of
// SmallDirFiles each. Sessions client sessions create them in parallel,
// drawing file numbers from one counter, so the files of the first and of
// the last tenth are created when the namespace is nearly empty and nearly
// full. The large directory's files are spread evenly over the numbers,
// so it grows all along. Afterwards fresh sessions look up and stat the
// first and the last tenth, one session lists the large directory with
// the attributes `ls -l` shows, and the report gives the metadata
// database's size and the MDS's memory.
//
// Creates go to a directory handle (OPEN with CREATE in the parent, as a
// kernel client that has the directory in its cache sends it), stats are
// LOOKUP plus GETATTR in the parent: the path is not walked from the root
// for every file, so the numbers are about the namespace's size, not the
// depth of the path.

// ScaleConfig is the scale workload's settings.
type ScaleConfig struct {
	Files         int    `json:"files"`
	DirFiles      int    `json:"dir_files"`
	SmallDirFiles int    `json:"small_dir_files"`
	Sessions      int    `json:"sessions"`
	DataServers   int    `json:"data_servers"`
	Servers       string `json:"servers,omitempty"` // up or split, for the report
	// Timeout bounds the whole run.
	Timeout  time.Duration `json:"timeout"`
	Progress io.Writer     `json:"-"`
}

// DefaultScaleConfig is issue 13's size: a million files, 100,000 of them
// in one directory.
func DefaultScaleConfig() ScaleConfig {
	return ScaleConfig{Files: 1_000_000, DirFiles: 100_000, SmallDirFiles: 1000, Sessions: 4,
		DataServers: 1, Timeout: 3 * time.Hour}
}

// QuickScaleConfig is the CI smoke size.
func QuickScaleConfig() ScaleConfig {
	c := DefaultScaleConfig()
	c.Files, c.DirFiles, c.SmallDirFiles, c.Timeout = 2000, 500, 250, 5*time.Minute
	return c
}

// maxScaleFiles bounds the namespace (and the harness's own memory: two
// timestamps per file).
const maxScaleFiles = 100_000_000

// Validate reports the first unusable setting.
func (c *ScaleConfig) Validate() error {
	switch {
	case c.Files < 10 || c.Files > maxScaleFiles:
		return fmt.Errorf("files %d out of range (10 to %d)", c.Files, maxScaleFiles)
	case c.DirFiles < 1 || c.DirFiles > c.Files:
		return fmt.Errorf("files in the large directory %d out of range (1 to --files %d)", c.DirFiles, c.Files)
	case c.SmallDirFiles < 1:
		return fmt.Errorf("files per small directory %d: want at least 1", c.SmallDirFiles)
	case c.Sessions < 1 || c.Sessions > maxClients:
		return fmt.Errorf("sessions %d out of range (1 to %d)", c.Sessions, maxClients)
	case c.DataServers < 1 || c.DataServers > maxDataServers:
		return fmt.Errorf("data servers %d out of range (1 to %d)", c.DataServers, maxDataServers)
	case c.Timeout < 0:
		return errors.New("negative timeout")
	}
	return nil
}

// place says where file i goes: in the large directory, or in small
// directory dir. File i is in the large directory when ⌊(i+1)·D/N⌋ passes
// ⌊i·D/N⌋, which spreads exactly D of the N files evenly; ⌊i·D/N⌋ files
// before i are in it.
func (c *ScaleConfig) place(i int) (big bool, dir int) {
	n, d := int64(c.Files), int64(c.DirFiles)
	before := int64(i) * d / n
	if (int64(i)+1)*d/n > before {
		return true, 0
	}
	return false, (i - int(before)) / c.SmallDirFiles
}

func (c *ScaleConfig) smallDirs() int {
	return (c.Files - c.DirFiles + c.SmallDirFiles - 1) / c.SmallDirFiles
}

func scaleName(i int) string { return "f" + strconv.Itoa(i) }

// ScaleRate is the rate of one tenth of the files.
type ScaleRate struct {
	Files   int     `json:"files"`
	Seconds float64 `json:"seconds"`
	Rate    float64 `json:"ops_per_s"`
}

// ScaleReport is the outcome of RunScale.
type ScaleReport struct {
	Kind       string      `json:"kind"` // "scale"
	Start      time.Time   `json:"start"`
	Elapsed    float64     `json:"elapsed_seconds"`
	Config     ScaleConfig `json:"config"`
	Machine    Machine     `json:"machine"`
	LoadBefore [3]float64  `json:"loadavg_before"`
	LoadAfter  [3]float64  `json:"loadavg_after"`
	// CreateAll is the create rate over all files; CreateFirst and
	// CreateLast over the first and the last tenth by file number.
	CreateAll   ScaleRate `json:"create_all"`
	CreateFirst ScaleRate `json:"create_first_10pct"`
	CreateLast  ScaleRate `json:"create_last_10pct"`
	// CreateServerCores is the servers' CPU use over the create phase
	// (-1 unknown).
	CreateServerCores float64   `json:"create_server_cores"`
	StatFirst         ScaleRate `json:"stat_first_10pct"`
	StatLast          ScaleRate `json:"stat_last_10pct"`
	// ListSeconds is the time to list the large directory with every
	// entry's attributes (READDIR pages, as `ls -l` needs them);
	// ListEntries what it returned.
	ListSeconds float64 `json:"list_seconds"`
	ListEntries int     `json:"list_entries"`
	// MetaDBBytes is the size of the MDS's meta.db; MDSDirBytes of every
	// file in its directory (the join secret, and the write-ahead log,
	// preallocated, which holds the changes since the last checkpoint
	// into meta.db: while the MDS runs, meta.db alone lags behind).
	MetaDBBytes int64 `json:"meta_db_bytes"`
	MDSDirBytes int64 `json:"mds_dir_bytes"`
	// ServerRole is the process whose memory RSSBytes (VmRSS) and
	// HWMBytes (VmHWM, the peak) are, at the end: RoleMDS alone, or
	// RoleAll when the data servers share its process.
	ServerRole string   `json:"server_role,omitempty"`
	RSSBytes   int64    `json:"rss_bytes"`
	HWMBytes   int64    `json:"hwm_bytes"`
	Profiles   []string `json:"profiles,omitempty"`
	Errors     []string `json:"errors,omitempty"`
}

// ScaleSetup is where RunScale's cluster comes from: Cluster starts it,
// DataDir is the directory its data goes under (searched for meta.db).
type ScaleSetup struct {
	Cluster ClusterStarter
	DataDir string
}

// RunScale runs the scale workload on one fresh cluster.
func RunScale(ctx context.Context, cfg ScaleConfig, setup ScaleSetup) (rep *ScaleReport, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if setup.Cluster == nil {
		return nil, errors.New("scale: no cluster starter")
	}
	if cfg.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.Timeout)
		defer cancel()
	}
	rep = &ScaleReport{Kind: "scale", Start: time.Now().UTC(), Config: cfg, Machine: MachineInfo(),
		LoadBefore: LoadAvg(), CreateServerCores: -1}
	defer func() {
		rep.LoadAfter = LoadAvg()
		rep.Elapsed = time.Since(rep.Start).Seconds()
		if err != nil {
			rep.Errors = append(rep.Errors, err.Error())
		}
	}()
	ep, err := setup.Cluster.StartCluster(ctx, cfg.DataServers)
	if err != nil {
		return rep, fmt.Errorf("start cluster: %w", err)
	}
	defer func() {
		if ep.Stop != nil {
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 60*time.Second)
			err = errors.Join(err, ep.Stop(sctx))
			cancel()
			rep.Profiles = ep.Profiles
		}
	}()
	opts := client.Options{Root: ep.Root, NoDelegations: true}
	dial := func() (*client.Client, error) {
		dctx, cancel := context.WithTimeout(ctx, setupTimeout)
		defer cancel()
		return client.Dial(dctx, ep.Addr, opts)
	}
	c, err := dial()
	if err != nil {
		return rep, fmt.Errorf("dial %s: %w", ep.Addr, err)
	}
	defer c.Close()

	// The directories, outside the timed regions.
	base := fmt.Sprintf("/scale-%d", time.Now().UnixNano())
	if err := c.Mkdir(ctx, base, 0o755); err != nil {
		return rep, fmt.Errorf("mkdir %s: %w", base, err)
	}
	baseFH, _, err := c.Lookup(ctx, base)
	if err != nil {
		return rep, fmt.Errorf("lookup %s: %w", base, err)
	}
	mkdir := func(name string) ([]byte, error) {
		fh, _, err := c.MkdirAt(ctx, baseFH, name, 0o755)
		if err != nil {
			return nil, fmt.Errorf("mkdir %s/%s: %w", base, name, err)
		}
		return fh, nil
	}
	bigFH, err := mkdir("big")
	if err != nil {
		return rep, err
	}
	small := make([][]byte, cfg.smallDirs())
	for d := range small {
		if small[d], err = mkdir(fmt.Sprintf("d%05d", d)); err != nil {
			return rep, err
		}
	}
	dirOf := func(i int) []byte {
		if big, d := cfg.place(i); !big {
			return small[d]
		}
		return bigFH
	}
	progress(cfg.Progress, "scale: %d files (%d in one directory, the rest in %d directories of %d), %d sessions\n",
		cfg.Files, cfg.DirFiles, len(small), cfg.SmallDirFiles, cfg.Sessions)

	// Create every file.
	cpu0, cpuOK0 := ep.cpuByRole()
	tenth := max(cfg.Files/10, 1)
	all := makeSpan(0, cfg.Files)
	first, last := makeSpan(0, tenth), makeSpan(cfg.Files-tenth, cfg.Files)
	err = runScalePhase(ctx, cfg, dial, "create", []*span{all}, func(ctx context.Context, cl *client.Client, i int) error {
		f, err := cl.OpenAt(ctx, dirOf(i), scaleName(i), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
		if err != nil {
			return err
		}
		return f.Close()
	})
	if cpu1, ok := ep.cpuByRole(); ok && cpuOK0 && err == nil {
		var d time.Duration
		for role, t := range cpu1 {
			d += t - cpu0[role]
		}
		rep.CreateServerCores = d.Seconds() / all.seconds()
	}
	rep.CreateAll, rep.CreateFirst, rep.CreateLast = all.rate(), all.sub(first).rate(), all.sub(last).rate()
	if err != nil {
		return rep, err
	}

	// Stat the first and the last tenth, from fresh sessions (no cached
	// attributes).
	stat := func(ctx context.Context, cl *client.Client, i int) error {
		_, a, err := cl.LookupAt(ctx, dirOf(i), scaleName(i))
		if err == nil && a.Type != client.TypeRegular {
			err = fmt.Errorf("type %v, want a regular file", a.Type)
		}
		return err
	}
	if err := runScalePhase(ctx, cfg, dial, "stat first 10%", []*span{first}, stat); err != nil {
		return rep, err
	}
	rep.StatFirst = first.rate()
	if err := runScalePhase(ctx, cfg, dial, "stat last 10%", []*span{last}, stat); err != nil {
		return rep, err
	}
	rep.StatLast = last.rate()

	// ls -l of the large directory, from a fresh session.
	lc, err := dial()
	if err != nil {
		return rep, fmt.Errorf("dial %s: %w", ep.Addr, err)
	}
	t0 := time.Now()
	ents, err := lc.ReadDirHandle(ctx, bigFH)
	rep.ListSeconds = time.Since(t0).Seconds()
	rep.ListEntries = len(ents)
	lc.Close()
	if err != nil {
		return rep, fmt.Errorf("list %s/big: %w", base, err)
	}
	for _, e := range ents {
		if e.Attr.Type != client.TypeRegular || e.Attr.Nlink == 0 {
			return rep, fmt.Errorf("list %s/big: entry %s without the attributes of a created file: %+v", base, e.Name, e.Attr)
		}
	}
	if len(ents) != cfg.DirFiles {
		return rep, fmt.Errorf("list %s/big: %d entries, want %d", base, len(ents), cfg.DirFiles)
	}
	progress(cfg.Progress, "scale: ls -l of %d entries: %.2fs\n", len(ents), rep.ListSeconds)

	// What the MDS holds at the end.
	rep.MetaDBBytes, rep.MDSDirBytes = metaDBSize(setup.DataDir)
	for _, p := range ep.Procs {
		if p.Role == RoleMDS || p.Role == RoleAll {
			rep.ServerRole = p.Role
			rep.RSSBytes, rep.HWMBytes = procMemory(p.PID)
			break
		}
	}
	return rep, nil
}

// span records when each of the files [lo, hi) started and finished.
type span struct {
	lo         int
	start, end []atomic.Int64 // Unix ns; 0 if not done
}

func makeSpan(lo, hi int) *span {
	return &span{lo: lo, start: make([]atomic.Int64, hi-lo), end: make([]atomic.Int64, hi-lo)}
}

// sub is the part of s covering o's files.
func (s *span) sub(o *span) *span {
	a := o.lo - s.lo
	return &span{lo: o.lo, start: s.start[a : a+len(o.start)], end: s.end[a : a+len(o.end)]}
}

// rate is the number of finished files over the time from the earliest
// start to the latest end among them.
func (s *span) rate() ScaleRate {
	var first, last int64
	n := 0
	for i := range s.end {
		st, e := s.start[i].Load(), s.end[i].Load()
		if e == 0 {
			continue
		}
		n++
		if first == 0 || st < first {
			first = st
		}
		last = max(last, e)
	}
	r := ScaleRate{Files: n}
	if n > 0 {
		r.Seconds = max(time.Duration(last-first).Seconds(), 1e-9)
		r.Rate = float64(n) / r.Seconds
	}
	return r
}

func (s *span) seconds() float64 { return max(s.rate().Seconds, 1e-9) }

// runScalePhase runs op over every file of the spans, in order, with
// cfg.Sessions sessions drawing file numbers from one counter. The first
// error stops every session.
func runScalePhase(ctx context.Context, cfg ScaleConfig, dial func() (*client.Client, error), name string, spans []*span,
	op func(context.Context, *client.Client, int) error) error {
	total := 0
	for _, s := range spans {
		total += len(s.end)
	}
	files := make([]int, 0, total)
	where := make([]*span, 0, total)
	for _, s := range spans {
		for i := range s.end {
			files = append(files, s.lo+i)
			where = append(where, s)
		}
	}
	clients := make([]*client.Client, cfg.Sessions)
	defer func() {
		for _, cl := range clients {
			if cl != nil {
				cl.Close()
			}
		}
	}()
	for k := range clients {
		var err error
		if clients[k], err = dial(); err != nil {
			return fmt.Errorf("%s: dial session %d: %w", name, k, err)
		}
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var next, done atomic.Int64
	report := max(int64(total)/10, 1)
	t0 := time.Now()
	var wg sync.WaitGroup
	for _, cl := range clients {
		wg.Go(func() {
			for ctx.Err() == nil {
				k := int(next.Add(1) - 1)
				if k >= total {
					return
				}
				i, s := files[k], where[k]
				s.start[i-s.lo].Store(time.Now().UnixNano())
				if err := op(ctx, cl, i); err != nil {
					cancel(fmt.Errorf("%s %s: %w", name, scaleName(i), err))
					return
				}
				s.end[i-s.lo].Store(time.Now().UnixNano())
				if d := done.Add(1); d%report == 0 {
					el := time.Since(t0).Seconds()
					progress(cfg.Progress, "scale: %s: %d/%d (%.0f%%) after %.0fs, %.0f/s\n",
						name, d, total, 100*float64(d)/float64(total), el, float64(d)/el)
				}
			}
		})
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		return err
	}
	return nil
}

// metaDBSize finds the meta.db under dir (the MDS's) and returns its size
// and the total size of the regular files beside it.
func metaDBSize(dir string) (db, all int64) {
	var mdsDir string
	filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && d.Name() == "meta.db" {
			mdsDir = filepath.Dir(path)
			if fi, err := d.Info(); err == nil {
				db = fi.Size()
			}
			return filepath.SkipAll
		}
		return nil
	})
	if mdsDir == "" {
		return -1, -1
	}
	filepath.WalkDir(mdsDir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				all += fi.Size()
			}
		}
		return nil
	})
	return db, all
}

// procMemory reads VmRSS and VmHWM of pid from /proc, in bytes (-1 where
// unknown).
func procMemory(pid int) (rss, hwm int64) {
	rss, hwm = -1, -1
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || (k != "VmRSS" && k != "VmHWM") {
			continue
		}
		fs := strings.Fields(v) // "123456 kB"
		if len(fs) != 2 || fs[1] != "kB" {
			continue
		}
		n, err := strconv.ParseInt(fs[0], 10, 64)
		if err != nil {
			continue
		}
		if k == "VmRSS" {
			rss = n << 10
		} else {
			hwm = n << 10
		}
	}
	return
}

// WriteJSON writes the report as indented JSON.
func (r *ScaleReport) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteTable writes the report for a terminal.
func (r *ScaleReport) WriteTable(w io.Writer) error {
	c := r.Config
	fmt.Fprintf(w, "scale: %d files, %d in one directory, the rest in directories of %d; %d sessions; %d DS (%s); load %.2f before, %.2f after\n",
		c.Files, c.DirFiles, c.SmallDirFiles, c.Sessions, c.DataServers, c.Servers, r.LoadBefore[0], r.LoadAfter[0])
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "measure\tfiles\tseconds\tops/s")
	row := func(name string, s ScaleRate) {
		fmt.Fprintf(tw, "%s\t%d\t%.2f\t%.0f\n", name, s.Files, s.Seconds, s.Rate)
	}
	row("create, all", r.CreateAll)
	row("create, first 10%", r.CreateFirst)
	row("create, last 10%", r.CreateLast)
	row("stat, first 10%", r.StatFirst)
	row("stat, last 10%", r.StatLast)
	fmt.Fprintf(tw, "ls -l of the large directory\t%d\t%.2f\t%.0f\n", r.ListEntries, r.ListSeconds, float64(r.ListEntries)/max(r.ListSeconds, 1e-9))
	if err := tw.Flush(); err != nil {
		return err
	}
	if r.CreateFirst.Rate > 0 {
		fmt.Fprintf(w, "last 10%% create rate / first 10%%: %.2f\n", r.CreateLast.Rate/r.CreateFirst.Rate)
	}
	fmt.Fprintf(w, "servers' CPU during the creates: %s cores\n", cores(r.CreateServerCores))
	fmt.Fprintf(w, "metadata on disk: %s (meta.db %s, the rest write-ahead log); %s process memory: RSS %s, peak %s\n",
		sizeOrUnknown(r.MDSDirBytes), sizeOrUnknown(r.MetaDBBytes), r.ServerRole, sizeOrUnknown(r.RSSBytes), sizeOrUnknown(r.HWMBytes))
	for _, e := range r.Errors {
		fmt.Fprintf(w, "FAILED: %s\n", e)
	}
	return nil
}

func sizeOrUnknown(n int64) string {
	if n < 0 {
		return "unknown"
	}
	if n < 1<<20 {
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
}
