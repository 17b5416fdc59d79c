package bench

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shoalfs/shoal/client"
)

// Workload names, as they appear in reports.
const (
	SeqWrite = "seq-write"
	SeqRead  = "seq-read"
	Create   = "create"
	Stat     = "stat"
	Remove   = "remove"
)

// Workload groups for Config.Groups.
const (
	GroupSeq   = "seq"
	GroupSmall = "small"
)

// Config says what to run. The zero value is not usable; start from
// DefaultConfig or QuickConfig.
type Config struct {
	// Size is the size of the sequentially written and read file.
	Size int64 `json:"size"`
	// Block is the size of each READ and WRITE request.
	Block int `json:"block"`
	// Depth is how many sequential requests are in flight at once.
	Depth int `json:"depth"`
	// Files is the number of files in the small-file workloads.
	Files int `json:"files"`
	// Streams is how many small-file operations run at once: the files
	// are split between that many goroutines, each in a directory of its
	// own, sharing the one client (its session's slots), as several
	// processes of one NFS client machine would. 1 (or 0) runs one
	// operation at a time, which measures a round trip's latency; more
	// measures what the server does with concurrent changes, where a
	// server that syncs can share its syncs.
	Streams int `json:"streams,omitempty"`
	// Reps is how many times each workload is measured.
	Reps int `json:"reps"`
	// Groups selects the workload groups to run: GroupSeq (seq-write and
	// seq-read) and GroupSmall (create, stat, remove). Empty means all;
	// running one group alone gives a CPU profile of just that path.
	Groups []string `json:"groups,omitempty"`
	// Timeout bounds the whole run (0: only the caller's context).
	Timeout time.Duration `json:"timeout"`
	// Progress, if set, receives a line per measurement as the run goes.
	Progress io.Writer `json:"-"`
}

// DefaultConfig is the full benchmark of the documentation: 1 GiB in 1 MiB
// requests, 2000 small files, 3 repetitions.
func DefaultConfig() Config {
	return Config{Size: 1 << 30, Block: 1 << 20, Depth: 16, Files: 2000, Reps: 3, Timeout: 10 * time.Minute}
}

// QuickConfig is a smoke run that finishes in seconds: 64 MiB, 200 files,
// one repetition.
func QuickConfig() Config {
	c := DefaultConfig()
	c.Size, c.Files, c.Reps = 64<<20, 200, 1
	return c
}

// Limits on Config, so a typo cannot fill a disk or run for a day.
const (
	maxSize    = 1 << 40
	maxBlock   = 64 << 20
	minBlock   = 512
	maxDepth   = 256
	maxFiles   = 1_000_000
	maxStreams = 256
	maxReps    = 100
)

// Validate reports the first unusable setting.
func (c *Config) Validate() error {
	switch {
	case c.Size <= 0 || c.Size > maxSize:
		return fmt.Errorf("size %d out of range (1 B to %s)", c.Size, FormatSize(maxSize))
	case c.Block < minBlock || c.Block > maxBlock:
		return fmt.Errorf("block %d out of range (%d B to %s)", c.Block, minBlock, FormatSize(maxBlock))
	case c.Depth < 1 || c.Depth > maxDepth:
		return fmt.Errorf("depth %d out of range (1 to %d)", c.Depth, maxDepth)
	case c.Files < 1 || c.Files > maxFiles:
		return fmt.Errorf("files %d out of range (1 to %d)", c.Files, maxFiles)
	case c.Streams < 0 || c.Streams > maxStreams || c.Streams > c.Files:
		return fmt.Errorf("streams %d out of range (1 to %d, at most --files)", c.Streams, maxStreams)
	case c.Reps < 1 || c.Reps > maxReps:
		return fmt.Errorf("reps %d out of range (1 to %d)", c.Reps, maxReps)
	case c.Timeout < 0:
		return errors.New("negative timeout")
	}
	for _, g := range c.Groups {
		if g != GroupSeq && g != GroupSmall {
			return fmt.Errorf("unknown workload group %q (want %s or %s)", g, GroupSeq, GroupSmall)
		}
	}
	return nil
}

func (c *Config) runs(group string) bool {
	return len(c.Groups) == 0 || slices.Contains(c.Groups, group)
}

// Target is a named server to benchmark.
type Target struct {
	Name    string
	Starter Starter
}

// Notes that every report carries, so nobody has to guess what was timed.
var standardNotes = []string{
	"seq-write is timed until COMMIT and CLOSE return: the data is on stable storage when the clock stops",
	"seq-read: the server's page cache is warm (the file was written just before and nothing was dropped)",
	"create = OPEN(CREATE)+CLOSE of an empty file; create, stat and remove run one operation at a time in one directory unless the report's streams say otherwise",
	"MB/s is 10^6 bytes per second; server CPU is CPU-seconds per wall-second of the server process (- if it is not a separate process)",
	"client: Shoal's Go client library over loopback TCP, the same for every target",
}

// Run benchmarks each target in turn and returns the report. A target that
// is unavailable is recorded as skipped; a target that fails is recorded
// with its error and the run goes on to the next. The error is the join of
// the failures, so a caller can print the report and still exit non-zero.
func Run(ctx context.Context, cfg Config, targets []Target) (*Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.Timeout)
		defer cancel()
	}
	rep := &Report{
		Start:      time.Now().UTC(),
		Config:     cfg,
		Machine:    MachineInfo(),
		LoadBefore: LoadAvg(),
		Notes:      append([]string(nil), standardNotes...),
	}
	var errs []error
	for _, t := range targets {
		tr, err := runTarget(ctx, cfg, t)
		rep.Targets = append(rep.Targets, tr)
		if err != nil {
			errs = append(errs, fmt.Errorf("target %s: %w", t.Name, err))
		}
		if ctx.Err() != nil {
			break
		}
	}
	rep.LoadAfter = LoadAvg()
	rep.Elapsed = time.Since(rep.Start).Seconds()
	rep.Ratios = computeRatios(rep.Targets, TargetGanesha)
	return rep, errors.Join(errs...)
}

// runner measures one target.
type runner struct {
	cfg  Config
	name string
	c    *client.Client
	pid  int
	dir  string // benchmark directory on the server, relative to the root
	tmpl []byte // block template: random bytes, offset stamped in front

	commit time.Duration // how long the last seq-write's COMMIT took
}

func runTarget(ctx context.Context, cfg Config, t Target) (tr TargetReport, err error) {
	tr.Name = t.Name
	ep, err := t.Starter.Start(ctx)
	if errors.Is(err, ErrUnavailable) {
		tr.Skipped = err.Error()
		return tr, nil
	}
	if err != nil {
		tr.Error = fmt.Sprintf("start: %v", err)
		return tr, fmt.Errorf("start: %w", err)
	}
	tr.Addr, tr.Root = ep.Addr, ep.Root
	defer func() {
		if ep.Stop != nil {
			// The run's context may be over (timeout, Ctrl-C); stopping
			// must happen anyway.
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			serr := ep.Stop(sctx)
			cancel()
			if serr != nil && err == nil {
				err = fmt.Errorf("stop: %w", serr)
				tr.Error = err.Error()
			}
		}
		if ep.Profile != "" {
			if _, serr := os.Stat(ep.Profile); serr == nil {
				tr.Profile = ep.Profile
			}
		}
	}()

	c, err := client.Dial(ctx, ep.Addr, client.Options{Root: ep.Root})
	if err != nil {
		tr.Error = fmt.Sprintf("dial: %v", err)
		return tr, fmt.Errorf("dial: %w", err)
	}
	defer c.Close()
	tr.MaxRead, tr.MaxWrite = c.MaxRead(), c.MaxWrite()

	var rnd [6]byte
	rand.Read(rnd[:])
	r := &runner{cfg: cfg, name: t.Name, c: c, pid: ep.PID, dir: "/shoal-bench-" + hex.EncodeToString(rnd[:])}
	r.tmpl = make([]byte, cfg.Block)
	rand.Read(r.tmpl)
	if err := c.Mkdir(ctx, r.dir, 0o755); err != nil {
		tr.Error = err.Error()
		return tr, err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		c.RemoveAll(cctx, r.dir)
	}()

	results, err := r.all(ctx)
	for i := range results {
		results[i].Summary = Summarize(results[i].Samples)
	}
	tr.Results = results
	if err != nil {
		tr.Error = err.Error()
	}
	return tr, err
}

// all runs every workload Reps times and returns what it measured, even
// when it stops early with an error.
func (r *runner) all(ctx context.Context) ([]Result, error) {
	mb := func(n int64) float64 { return float64(n) / 1e6 }
	size := FormatSize(r.cfg.Size)
	var out []Result
	if r.cfg.runs(GroupSeq) {
		out = append(out, Result{Workload: SeqWrite + " " + size, Unit: "MB/s"}, Result{Workload: SeqRead + " " + size, Unit: "MB/s"})
	}
	for rep := 0; rep < r.cfg.Reps && r.cfg.runs(GroupSeq); rep++ {
		path := fmt.Sprintf("%s/seq-%d", r.dir, rep)
		if err := r.measure(&out[0], rep, mb(r.cfg.Size), func() error { return r.seqWrite(ctx, path) }); err != nil {
			return out, err
		}
		out[0].CommitSeconds = append(out[0].CommitSeconds, r.commit.Seconds())
		a, err := r.c.Stat(ctx, path)
		if err != nil {
			return out, err
		}
		if int64(a.Size) != r.cfg.Size {
			return out, fmt.Errorf("%s: size %d after writing %d bytes", SeqWrite, a.Size, r.cfg.Size)
		}
		if err := r.measure(&out[1], rep, mb(r.cfg.Size), func() error { return r.seqRead(ctx, path) }); err != nil {
			return out, err
		}
		if err := r.c.Remove(ctx, path); err != nil {
			return out, err
		}
	}

	if !r.cfg.runs(GroupSmall) {
		return out, nil
	}
	n := float64(r.cfg.Files)
	base := len(out)
	out = append(out,
		Result{Workload: fmt.Sprintf("%s %d files", Create, r.cfg.Files), Unit: "ops/s"},
		Result{Workload: fmt.Sprintf("%s %d files", Stat, r.cfg.Files), Unit: "ops/s"},
		Result{Workload: fmt.Sprintf("%s %d files", Remove, r.cfg.Files), Unit: "ops/s"})
	small := out[base:]
	for rep := 0; rep < r.cfg.Reps; rep++ {
		dir := fmt.Sprintf("%s/small-%d", r.dir, rep)
		if err := r.c.Mkdir(ctx, dir, 0o755); err != nil {
			return out, err
		}
		if err := r.smallDirs(ctx, dir, false); err != nil {
			return out, err
		}
		if err := r.measure(&small[0], rep, n, func() error { return r.create(ctx, dir) }); err != nil {
			return out, err
		}
		if err := r.measure(&small[1], rep, n, func() error { return r.stat(ctx, dir) }); err != nil {
			return out, err
		}
		if err := r.measure(&small[2], rep, n, func() error { return r.remove(ctx, dir) }); err != nil {
			return out, err
		}
		if err := r.smallDirs(ctx, dir, true); err != nil {
			return out, err
		}
		if err := r.c.Remove(ctx, dir); err != nil {
			return out, err
		}
	}
	return out, nil
}

// measure times fn, which does amount units of work, and appends the rate,
// wall time and server CPU time to res.
func (r *runner) measure(res *Result, rep int, amount float64, fn func() error) error {
	cpu0, ok0 := procCPU(r.pid)
	start := time.Now()
	err := fn()
	elapsed := time.Since(start)
	cpu1, ok1 := procCPU(r.pid)
	if err != nil {
		return fmt.Errorf("%s: %w", res.Workload, err)
	}
	secs := max(elapsed.Seconds(), 1e-9)
	rate := amount / secs
	res.Samples = append(res.Samples, rate)
	res.Seconds = append(res.Seconds, secs)
	cpu := ""
	if ok0 && ok1 {
		res.ServerCPU = append(res.ServerCPU, (cpu1 - cpu0).Seconds())
		cpu = fmt.Sprintf(", server CPU %.2fs", (cpu1 - cpu0).Seconds())
	}
	if r.cfg.Progress != nil {
		fmt.Fprintf(r.cfg.Progress, "%s: %s rep %d/%d: %s %s (%.2fs%s)\n",
			r.name, res.Workload, rep+1, r.cfg.Reps, FormatRate(rate), res.Unit, secs, cpu)
	}
	return nil
}

// stamp writes off into the first bytes of a block, so a block read back
// from the wrong offset is detected.
func stamp(b []byte, off int64) { binary.BigEndian.PutUint64(b, uint64(off)) }

// blocks runs do on every block of the file with Depth workers taking
// blocks in increasing order, and stops at the first error.
func (r *runner) blocks(ctx context.Context, do func(ctx context.Context, buf []byte, off int64) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	nblocks := (r.cfg.Size + int64(r.cfg.Block) - 1) / int64(r.cfg.Block)
	var (
		next     atomic.Int64
		wg       sync.WaitGroup
		errOnce  sync.Once
		firstErr error
	)
	for w := 0; w < r.cfg.Depth; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := bytes.Clone(r.tmpl)
			for ctx.Err() == nil {
				i := next.Add(1) - 1
				if i >= nblocks {
					return
				}
				off := i * int64(r.cfg.Block)
				n := min(int64(r.cfg.Block), r.cfg.Size-off)
				if err := do(ctx, buf[:n], off); err != nil {
					errOnce.Do(func() { firstErr = err; cancel() })
					return
				}
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	return ctx.Err()
}

func (r *runner) seqWrite(ctx context.Context, path string) error {
	f, err := r.c.Open(ctx, path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	err = r.blocks(ctx, func(ctx context.Context, buf []byte, off int64) error {
		if len(buf) >= 8 {
			stamp(buf, off)
		}
		_, err := f.WriteAtContext(ctx, buf, off)
		return err
	})
	if err == nil {
		start := time.Now()
		err = f.SyncContext(ctx)
		r.commit = time.Since(start)
	}
	return errors.Join(err, f.Close())
}

func (r *runner) seqRead(ctx context.Context, path string) error {
	f, err := r.c.Open(ctx, path, os.O_RDONLY, 0)
	if err != nil {
		return err
	}
	err = r.blocks(ctx, func(ctx context.Context, buf []byte, off int64) error {
		n, err := f.ReadAtContext(ctx, buf, off)
		if n == len(buf) && err == io.EOF {
			err = nil // the last block may report EOF with all its bytes
		}
		if n < len(buf) && (err == nil || err == io.EOF) {
			return fmt.Errorf("short read at offset %d: %d of %d bytes", off, n, len(buf))
		}
		if err != nil {
			return err
		}
		if len(buf) >= 8 && (binary.BigEndian.Uint64(buf) != uint64(off) || !bytes.Equal(buf[8:], r.tmpl[8:len(buf)])) {
			return fmt.Errorf("block at offset %d: data read differs from data written", off)
		}
		return nil
	})
	return errors.Join(err, f.Close())
}

// smallName is the name of small file i: with one stream directly in dir,
// with several in the directory of the stream that owns it (i modulo
// Streams), so that streams do not contend for one directory.
func (r *runner) smallName(dir string, i int) string {
	if r.streams() > 1 {
		return fmt.Sprintf("%s/s%03d/f%06d", dir, i%r.streams(), i)
	}
	return fmt.Sprintf("%s/f%06d", dir, i)
}

func (r *runner) streams() int { return max(r.cfg.Streams, 1) }

// smallDirs makes (mkdir) or removes the streams' directories under dir.
func (r *runner) smallDirs(ctx context.Context, dir string, remove bool) error {
	if r.streams() == 1 {
		return nil
	}
	for s := 0; s < r.streams(); s++ {
		d := fmt.Sprintf("%s/s%03d", dir, s)
		var err error
		if remove {
			err = r.c.Remove(ctx, d)
		} else {
			err = r.c.Mkdir(ctx, d, 0o755)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// eachFile runs do on every small file, Streams of them at once (stream s
// takes files s, s+Streams, ...), and returns the first error.
func (r *runner) eachFile(ctx context.Context, do func(ctx context.Context, i int) error) error {
	n := r.streams()
	if n == 1 {
		for i := 0; i < r.cfg.Files; i++ {
			if err := do(ctx, i); err != nil {
				return err
			}
		}
		return nil
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make([]error, n)
	var wg sync.WaitGroup
	for s := 0; s < n; s++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := s; i < r.cfg.Files && ctx.Err() == nil; i += n {
				if err := do(ctx, i); err != nil {
					errs[s] = err
					cancel()
					return
				}
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return ctx.Err()
}

func (r *runner) create(ctx context.Context, dir string) error {
	return r.eachFile(ctx, func(ctx context.Context, i int) error {
		f, err := r.c.Open(ctx, r.smallName(dir, i), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
		if err != nil {
			return err
		}
		return f.Close()
	})
}

func (r *runner) stat(ctx context.Context, dir string) error {
	return r.eachFile(ctx, func(ctx context.Context, i int) error {
		a, err := r.c.Stat(ctx, r.smallName(dir, i))
		if err != nil {
			return err
		}
		if a.Size != 0 || a.IsDir() {
			return fmt.Errorf("%s: size %d, dir %v; want an empty file", r.smallName(dir, i), a.Size, a.IsDir())
		}
		return nil
	})
}

func (r *runner) remove(ctx context.Context, dir string) error {
	return r.eachFile(ctx, func(ctx context.Context, i int) error {
		return r.c.Remove(ctx, r.smallName(dir, i))
	})
}
