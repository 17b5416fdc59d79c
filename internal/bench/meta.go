package bench

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	mathrand "math/rand/v2"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/shoalfs/shoal/client"
)

// The metadata workloads. The md-* phases are mdtest's: every client
// creates (and writes FileSize bytes into), stats, reads and removes its
// Files files, phase by phase with a barrier in between, either in a
// directory of its own (mdtest -u) or all in one shared directory, where
// the server serialises the directory's updates. PhasePostmark is
// postmark's transaction loop.
const (
	PhaseMDCreate = "md-create"
	PhaseMDStat   = "md-stat"
	PhaseMDRead   = "md-read"
	PhaseMDRemove = "md-remove"
	PhasePostmark = "postmark"
)

// Directory layouts of the mdtest phases.
const (
	DirUnique = "unique"
	DirShared = "shared"
)

var mdPhases = []string{PhaseMDCreate, PhaseMDStat, PhaseMDRead, PhaseMDRemove}

func isMetaPhase(p string) bool {
	return p == PhasePostmark || slices.Contains(mdPhases, p)
}

// MetaSpec is a client's part of a metadata phase.
type MetaSpec struct {
	// Dir is where the client's files live.
	Dir      string `json:"dir"`
	Files    int    `json:"files"`
	FileSize int    `json:"file_size"`
	// Postmark: PoolFiles files of MinSize to MaxSize bytes are created
	// before the barrier; then Transactions transactions run, each a
	// read or an append followed by a create or a delete, chosen by a
	// RNG seeded with Seed and the client's index.
	PoolFiles    int   `json:"pool_files,omitempty"`
	Transactions int   `json:"transactions,omitempty"`
	MinSize      int   `json:"min_size,omitempty"`
	MaxSize      int   `json:"max_size,omitempty"`
	Seed         int64 `json:"seed,omitempty"`
}

func metaName(spec ClientSpec, i int) string {
	return fmt.Sprintf("%s/f.%d.%d", spec.Meta.Dir, spec.Index, i)
}

// fillPattern fills b with bytes derived from name, so a read can check
// it got the file it asked for.
func fillPattern(b []byte, name string) {
	var seed [32]byte
	copy(seed[:], name)
	mathrand.NewChaCha8(seed).Read(b)
}

// clientMeta runs one md-* phase over the client's files and returns the
// bytes moved and the operations done.
func clientMeta(ctx context.Context, c *client.Client, spec ClientSpec) (int64, int64, error) {
	m := spec.Meta
	buf := make([]byte, m.FileSize)
	var bytes, ops int64
	for i := 0; i < m.Files; i++ {
		name := metaName(spec, i)
		var err error
		switch spec.Phase {
		case PhaseMDCreate:
			fillPattern(buf, name)
			var n int
			n, err = writeFile(ctx, c, name, buf, os.O_CREATE|os.O_EXCL|os.O_WRONLY)
			bytes += int64(n)
		case PhaseMDStat:
			var a client.Attr
			a, err = c.Stat(ctx, name)
			if err == nil && a.Size != uint64(m.FileSize) {
				err = fmt.Errorf("size %d, want %d", a.Size, m.FileSize)
			}
		case PhaseMDRead:
			var got []byte
			got, err = nfsReadFile(ctx, c, name, m.FileSize)
			bytes += int64(len(got))
			if err == nil {
				fillPattern(buf, name)
				if string(got) != string(buf) {
					err = errors.New("content differs from what was written")
				}
			}
		case PhaseMDRemove:
			err = c.Remove(ctx, name)
		}
		if err != nil {
			return bytes, ops, fmt.Errorf("%s %s: %w", spec.Phase, name, err)
		}
		ops++
	}
	return bytes, ops, nil
}

// writeFile opens name with flag, writes b at the end of what is there
// (offset off is the file's size for appends) and closes it.
func writeFile(ctx context.Context, c *client.Client, name string, b []byte, flag int) (int, error) {
	return writeFileAt(ctx, c, name, b, flag, 0)
}

func writeFileAt(ctx context.Context, c *client.Client, name string, b []byte, flag int, off int64) (int, error) {
	f, err := c.Open(ctx, name, flag, 0o644)
	if err != nil {
		return 0, err
	}
	n := 0
	if len(b) > 0 {
		n, err = f.WriteAtContext(ctx, b, off)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return n, err
}

// nfsReadFile reads the first size bytes of name.
func nfsReadFile(ctx context.Context, c *client.Client, name string, size int) ([]byte, error) {
	f, err := c.Open(ctx, name, os.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	b := make([]byte, size)
	n := 0
	if size > 0 {
		n, err = f.ReadAtContext(ctx, b, 0)
		if err == io.EOF && n == size {
			err = nil
		}
		if err == nil && n < size {
			err = fmt.Errorf("short read: %d of %d bytes", n, size)
		}
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return b[:n], err
}

// postmarkState is one postmark client's pool of files.
type postmarkState struct {
	rng   *mathrand.Rand
	names []string
	sizes map[string]int
	next  int
	buf   []byte
}

func (p *postmarkState) size(m *MetaSpec) int {
	return m.MinSize + p.rng.IntN(m.MaxSize-m.MinSize+1)
}

func (p *postmarkState) create(ctx context.Context, c *client.Client, spec ClientSpec) (int64, error) {
	name := fmt.Sprintf("%s/p.%d.%d", spec.Meta.Dir, spec.Index, p.next)
	p.next++
	n, err := writeFile(ctx, c, name, p.buf[:p.size(spec.Meta)], os.O_CREATE|os.O_EXCL|os.O_WRONLY)
	if err != nil {
		return int64(n), fmt.Errorf("create %s: %w", name, err)
	}
	p.names = append(p.names, name)
	p.sizes[name] = n
	return int64(n), nil
}

// postmarkSetup builds the client's initial pool.
func postmarkSetup(ctx context.Context, c *client.Client, spec ClientSpec) (*postmarkState, error) {
	m := spec.Meta
	if m.MinSize < 0 || m.MaxSize < m.MinSize || m.PoolFiles < 1 || m.Transactions < 1 {
		return nil, fmt.Errorf("bad postmark settings %+v", *m)
	}
	var seed [32]byte
	binary.BigEndian.PutUint64(seed[:], uint64(m.Seed))
	binary.BigEndian.PutUint64(seed[8:], uint64(spec.Index))
	p := &postmarkState{rng: mathrand.New(mathrand.NewChaCha8(seed)), sizes: map[string]int{}, buf: make([]byte, m.MaxSize)}
	fillPattern(p.buf, "postmark")
	for i := 0; i < m.PoolFiles; i++ {
		if _, err := p.create(ctx, c, spec); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// run performs the transactions; it returns the bytes moved and the
// transactions done.
func (p *postmarkState) run(ctx context.Context, c *client.Client, spec ClientSpec) (int64, int64, error) {
	m := spec.Meta
	var bytes, done int64
	for t := 0; t < m.Transactions; t++ {
		if len(p.names) > 0 {
			name := p.names[p.rng.IntN(len(p.names))]
			if p.rng.IntN(2) == 0 {
				b, err := nfsReadFile(ctx, c, name, p.sizes[name])
				bytes += int64(len(b))
				if err != nil {
					return bytes, done, fmt.Errorf("read %s: %w", name, err)
				}
			} else {
				add := p.buf[:p.size(m)]
				n, err := writeFileAt(ctx, c, name, add, os.O_WRONLY, int64(p.sizes[name]))
				bytes += int64(n)
				p.sizes[name] += n
				if err != nil {
					return bytes, done, fmt.Errorf("append %s: %w", name, err)
				}
			}
		}
		if p.rng.IntN(2) == 0 || len(p.names) == 0 {
			n, err := p.create(ctx, c, spec)
			bytes += n
			if err != nil {
				return bytes, done, err
			}
		} else {
			i := p.rng.IntN(len(p.names))
			name := p.names[i]
			if err := c.Remove(ctx, name); err != nil {
				return bytes, done, fmt.Errorf("delete %s: %w", name, err)
			}
			p.names = slices.Delete(p.names, i, i+1)
			delete(p.sizes, name)
		}
		done++
	}
	return bytes, done, nil
}

func (p *postmarkState) cleanup(ctx context.Context, c *client.Client) error {
	var errs []error
	for _, name := range p.names {
		if err := c.Remove(ctx, name); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// MetaConfig says what the metadata workloads run: on one cluster of
// DataServers data servers, Clients processes run the mdtest phases in
// each of Dirs, then postmark (if Transactions > 0).
type MetaConfig struct {
	DataServers int      `json:"data_servers"`
	PNFS        bool     `json:"pnfs"`
	Clients     int      `json:"clients"`
	Files       int      `json:"files_per_client"`
	FileSize    int      `json:"file_size"`
	Dirs        []string `json:"dirs"`
	// Postmark: per client, a pool of PoolFiles files of MinSize to
	// MaxSize bytes and Transactions transactions; Seed seeds the RNGs.
	PoolFiles    int   `json:"pool_files"`
	Transactions int   `json:"transactions"`
	MinSize      int   `json:"min_size"`
	MaxSize      int   `json:"max_size"`
	Seed         int64 `json:"seed"`
	// SmallIOThreshold is the clients' client.Policy.SmallIOThreshold
	// (0: the library's default).
	SmallIOThreshold int           `json:"small_io_threshold,omitempty"`
	Target           string        `json:"target,omitempty"`
	Label            string        `json:"label,omitempty"`
	Timeout          time.Duration `json:"timeout"`
	Progress         io.Writer     `json:"-"`
}

// DefaultMetaConfig: 4 clients × 500 files of 4 KiB, unique and shared
// directories, postmark with 200 files and 1000 transactions per client.
func DefaultMetaConfig() MetaConfig {
	return MetaConfig{DataServers: 1, PNFS: true, Clients: 4, Files: 500, FileSize: 4 << 10,
		Dirs: []string{DirUnique, DirShared}, PoolFiles: 200, Transactions: 1000,
		MinSize: 512, MaxSize: 16 << 10, Seed: 42, Timeout: 20 * time.Minute}
}

// QuickMetaConfig is the CI-sized smoke run.
func QuickMetaConfig() MetaConfig {
	c := DefaultMetaConfig()
	c.Clients, c.Files, c.PoolFiles, c.Transactions = 2, 20, 10, 30
	c.Timeout = 5 * time.Minute
	return c
}

// Validate reports the first unusable setting.
func (c *MetaConfig) Validate() error {
	switch {
	case c.DataServers < 1 || c.DataServers > maxDataServers:
		return fmt.Errorf("data servers %d out of range (1 to %d)", c.DataServers, maxDataServers)
	case c.Clients < 1 || c.Clients > maxClients:
		return fmt.Errorf("clients %d out of range (1 to %d)", c.Clients, maxClients)
	case c.Files < 0 || c.Files*c.Clients > maxFiles:
		return fmt.Errorf("files %d out of range", c.Files)
	case c.FileSize < 0 || c.FileSize > maxBlock:
		return fmt.Errorf("file size %d out of range", c.FileSize)
	case c.Transactions < 0 || c.Transactions > maxFiles:
		return fmt.Errorf("transactions %d out of range", c.Transactions)
	case c.Transactions > 0 && (c.PoolFiles < 1 || c.MinSize < 0 || c.MaxSize < c.MinSize || c.MaxSize > maxBlock):
		return errors.New("postmark needs a pool of at least one file and 0 <= min size <= max size <= 64 MiB")
	case c.Files == 0 && c.Transactions == 0:
		return errors.New("nothing to run: no files and no transactions")
	case c.Timeout < 0:
		return errors.New("negative timeout")
	}
	for _, d := range c.Dirs {
		if d != DirUnique && d != DirShared {
			return fmt.Errorf("directory layout %q: want %s or %s", d, DirUnique, DirShared)
		}
	}
	return (client.Policy{SmallIOThreshold: c.SmallIOThreshold}).Validate()
}

// MetaRun is one measured phase.
type MetaRun struct {
	// Dir is DirUnique or DirShared for md-* phases, "" for postmark.
	Dir   string `json:"dir,omitempty"`
	Phase string `json:"phase"`
	// Ops is files (md-*) or transactions (postmark); Rate is Ops per
	// second over the span from the earliest start to the latest end.
	Ops     int64   `json:"ops"`
	Bytes   int64   `json:"bytes"`
	Seconds float64 `json:"seconds"`
	Rate    float64 `json:"ops_per_s"`
	// ServerCores, ClientCores: CPU use in cores over the phase (-1
	// unknown); Busy the machine's share busy (0 to 1, -1 unknown).
	ServerCores float64            `json:"server_cores"`
	RoleCores   map[string]float64 `json:"server_cores_by_role,omitempty"`
	ClientCores float64            `json:"client_cores"`
	Busy        float64            `json:"machine_cpu_busy"`
	// DSBytes and MDSBytes are the clients' payload bytes that went to
	// the data servers and through the metadata server, LayoutGets the
	// layouts they obtained: what the small-I/O threshold did.
	DSBytes    uint64 `json:"ds_bytes"`
	MDSBytes   uint64 `json:"mds_bytes"`
	LayoutGets uint64 `json:"layout_gets"`
}

// MetaReport is the outcome of RunMeta.
type MetaReport struct {
	Kind       string     `json:"kind"` // "meta"
	Start      time.Time  `json:"start"`
	Elapsed    float64    `json:"elapsed_seconds"`
	Config     MetaConfig `json:"config"`
	Machine    Machine    `json:"machine"`
	LoadBefore [3]float64 `json:"loadavg_before"`
	LoadAfter  [3]float64 `json:"loadavg_after"`
	Runs       []MetaRun  `json:"runs"`
	Errors     []string   `json:"errors,omitempty"`
}

// RunMeta runs the mdtest phases in every directory layout, then
// postmark, on one fresh cluster.
func RunMeta(ctx context.Context, cfg MetaConfig, setup IORSetup) (rep *MetaReport, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if setup.Cluster == nil || setup.Clients == nil {
		return nil, errors.New("meta: no cluster starter or client launcher")
	}
	if cfg.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.Timeout)
		defer cancel()
	}
	rep = &MetaReport{Kind: "meta", Start: time.Now().UTC(), Config: cfg, Machine: MachineInfo(), LoadBefore: LoadAvg()}
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
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			err = errors.Join(err, ep.Stop(sctx))
			cancel()
		}
	}()
	sctx, cancel := context.WithTimeout(ctx, setupTimeout)
	defer cancel()
	opts := pnfsOptions(false)
	opts.Root = ep.Root
	c, err := dialIn(sctx, ep.Namespace, ep.Addr, opts)
	if err != nil {
		return rep, fmt.Errorf("dial %s: %w", ep.Addr, err)
	}
	defer c.Close()

	total := len(cfg.Dirs) * len(mdPhases)
	if cfg.Files == 0 {
		total = 0
	}
	if cfg.Transactions > 0 {
		total++
	}
	bar := newProgressBar(cfg.Progress, total, 0)
	base := fmt.Sprintf("/meta-%d", time.Now().UnixNano())
	if err := c.Mkdir(ctx, base, 0o755); err != nil {
		return rep, fmt.Errorf("mkdir %s: %w", base, err)
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), setupTimeout)
		c.RemoveAll(rctx, base)
		cancel()
	}()
	// dirsFor returns each client's directory under a new top directory
	// name, creating them: one per client, or the top one for all.
	dirsFor := func(name string, shared bool) ([]string, error) {
		top := base + "/" + name
		if err := c.Mkdir(ctx, top, 0o755); err != nil {
			return nil, err
		}
		out := make([]string, cfg.Clients)
		for i := range out {
			out[i] = top
			if !shared {
				out[i] = fmt.Sprintf("%s/c%d", top, i)
				if err := c.Mkdir(ctx, out[i], 0o755); err != nil {
					return nil, err
				}
			}
		}
		return out, nil
	}
	phaseTO := max(minPhaseTimeout, time.Duration(cfg.Clients*max(cfg.Files, cfg.Transactions))*20*time.Millisecond)
	run := func(dir, phase string, dirs []string) error {
		specs := make([]ClientSpec, cfg.Clients)
		for i := range specs {
			specs[i] = ClientSpec{Addr: ep.Addr, Root: ep.Root, Index: i, Phase: phase, PNFS: cfg.PNFS,
				Meta: &MetaSpec{Dir: dirs[i], Files: cfg.Files, FileSize: cfg.FileSize,
					PoolFiles: cfg.PoolFiles, Transactions: cfg.Transactions,
					MinSize: cfg.MinSize, MaxSize: cfg.MaxSize, Seed: cfg.Seed},
				SmallIOThreshold: cfg.SmallIOThreshold}
		}
		bar.next(strings.TrimSpace(phase + " " + dir))
		cr, err := runClients(ctx, setup.Clients, ep, specs, phaseTO, bar)
		if cr == nil {
			return fmt.Errorf("%s %s: %w", phase, dir, err)
		}
		mr := MetaRun{Dir: dir, Phase: phase, Seconds: cr.span(), ServerCores: -1, ClientCores: -1, Busy: cr.Busy}
		for _, r := range cr.Results {
			mr.Ops += r.Transfers
			mr.Bytes += r.Bytes
			mr.DSBytes += r.DSBytes
			mr.MDSBytes += r.MDSBytes
			mr.LayoutGets += r.LayoutGets
		}
		mr.Rate = float64(mr.Ops) / mr.Seconds
		if cr.RoleCPU != nil && cr.Window > 0 {
			mr.ServerCores, mr.RoleCores = 0, map[string]float64{}
			for role, d := range cr.RoleCPU {
				mr.RoleCores[role] = d / cr.Window.Seconds()
				mr.ServerCores += d / cr.Window.Seconds()
			}
		}
		if cr.ClientCPU >= 0 {
			mr.ClientCores = cr.ClientCPU / mr.Seconds
		}
		rep.Runs = append(rep.Runs, mr)
		progress(cfg.Progress, "meta: %s %s: %.0f ops/s (%d ops in %.2fs, servers %s cores, machine %.0f%% busy)\n",
			phase, dir, mr.Rate, mr.Ops, mr.Seconds, cores(mr.ServerCores), 100*mr.Busy)
		if err != nil {
			return fmt.Errorf("%s %s: %w", phase, dir, err)
		}
		return nil
	}
	if cfg.Files > 0 {
		for _, d := range cfg.Dirs {
			dirs, err := dirsFor("md-"+d, d == DirShared)
			if err != nil {
				return rep, fmt.Errorf("mdtest %s: %w", d, err)
			}
			for _, phase := range mdPhases {
				if err := run(d, phase, dirs); err != nil {
					return rep, err
				}
			}
		}
	}
	if cfg.Transactions > 0 {
		dirs, err := dirsFor("postmark", false)
		if err != nil {
			return rep, fmt.Errorf("postmark: %w", err)
		}
		if err := run("", PhasePostmark, dirs); err != nil {
			return rep, err
		}
	}
	return rep, nil
}

// WriteJSON writes the report as indented JSON.
func (r *MetaReport) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteTable writes the rates for a terminal.
func (r *MetaReport) WriteTable(w io.Writer) error {
	c := r.Config
	fmt.Fprintf(w, "meta (%s): %d clients, %d files of %s each (mdtest); postmark %d files of %s-%s, %d transactions each, seed %d; %d DS, pNFS %s",
		TargetName(c.Target), c.Clients, c.Files, FormatSize(int64(c.FileSize)), c.PoolFiles,
		FormatSize(int64(c.MinSize)), FormatSize(int64(c.MaxSize)), c.Transactions, c.Seed, c.DataServers, modeName(c.PNFS))
	if c.SmallIOThreshold != 0 {
		fmt.Fprintf(w, ", small-I/O threshold %d", c.SmallIOThreshold)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "phase\tdir\tops/s\tops\tseconds\tserver cores\tclient cores\tmachine busy\tDS share\tlayouts")
	for _, m := range r.Runs {
		fmt.Fprintf(tw, "%s\t%s\t%.0f\t%d\t%.2f\t%s\t%s\t%.0f%%\t%s\t%d\n", m.Phase, m.Dir, m.Rate, m.Ops, m.Seconds,
			cores(m.ServerCores), cores(m.ClientCores), 100*m.Busy, dsShare(m.DSBytes, m.MDSBytes), m.LayoutGets)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, e := range r.Errors {
		fmt.Fprintf(w, "FAILED: %s\n", e)
	}
	return nil
}

// dsShare renders the data servers' share of the payload bytes, "-"
// when nothing moved.
func dsShare(ds, mds uint64) string {
	if ds+mds == 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f%%", 100*float64(ds)/float64(ds+mds))
}

// TargetName is the server a report's Target names: reports from before
// the target was recorded leave it empty, and measured Shoal.
func TargetName(t string) string {
	if t == "" {
		return TargetShoal
	}
	return t
}
