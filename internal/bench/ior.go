package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/shoalfs/shoal/client"
	"github.com/shoalfs/shoal/meta"
)

// IOR is the name of the pNFS scaling workload.
const IOR = "ior"

// Phases of the ior workload.
const (
	PhaseWrite = "write"
	PhaseRead  = "read"
)

// IORConfig says what the ior workload runs: for every data-server count
// and number of copies, a fresh cluster; on it, for every repetition and
// pNFS mode, Clients processes each writing its own file of BlockSize
// bytes in TransferSize requests, then (after all writers finished)
// reading it back.
type IORConfig struct {
	// DataServers are the cluster sizes to measure, such as 1, 2, 4.
	DataServers []int `json:"data_servers"`
	// Mirrors are the numbers of copies of every stripe unit to measure
	// (the cluster's default, `shoal mds --mirrors`), such as 1, 2; each
	// at most the smallest of DataServers. Empty means one copy, and
	// needs no MirroredStarter.
	Mirrors []int `json:"mirrors,omitempty"`
	// PNFS are the client modes: true is pNFS (I/O straight to the data
	// servers), false is every READ and WRITE through the metadata server.
	PNFS []bool `json:"pnfs"`
	// Clients is the number of client processes, one file each.
	Clients int `json:"clients"`
	// BlockSize is how much each client writes and reads (IOR's -b).
	BlockSize int64 `json:"block_size"`
	// TransferSize is the size of each write and read call (IOR's -t).
	TransferSize int `json:"transfer_size"`
	// Reps is how many times each cell of the matrix is measured.
	Reps int `json:"reps"`
	// Shared makes every client write and read its own segment of one
	// shared file (IOR -F off) instead of a file of its own.
	Shared bool `json:"shared,omitempty"`
	// Random visits each client's transfers in a seeded random order
	// (IOR -z) instead of sequentially.
	Random bool `json:"random,omitempty"`
	// Stonewall, if not zero, ends each phase after that long (IOR -D):
	// the bandwidth is what was moved by then; the read phase reads only
	// what its writer wrote.
	Stonewall time.Duration `json:"stonewall,omitempty"`
	// Access is the clients' access method (client.Policy.Access):
	// "direct" (the default: every call an RPC, nothing cached),
	// "odirect" or "cached".
	Access string `json:"access,omitempty"`
	// SmallIOThreshold is the clients' client.Policy.SmallIOThreshold
	// (0: the library's default).
	SmallIOThreshold int `json:"small_io_threshold,omitempty"`
	// LinkBitsPerSec, if not zero, is each node's link rate (the
	// testbed's); the report then gives every cell its ceiling, the raw
	// capacity of the links the traffic crosses.
	LinkBitsPerSec float64 `json:"link_bits_per_sec,omitempty"`
	// Target names the server family measured, "shoal" (default) or
	// "ganesha", and Label the sweep this run belongs to; both are for
	// the report and the plots.
	Target string `json:"target,omitempty"`
	Label  string `json:"label,omitempty"`
	// Timeout bounds the whole run (0: only the caller's context).
	Timeout time.Duration `json:"timeout"`
	// Progress, if set, receives a line per measurement as the run goes;
	// a progress bar is drawn on it too when it is a terminal.
	Progress io.Writer `json:"-"`
}

// AccessDirect is the default access method.
const AccessDirect = "direct"

// DefaultIORConfig is the benchmark of the pNFS issue: 1, 2 and 4 data
// servers, pNFS on and off, 4 clients × 256 MiB in 1 MiB transfers, 3 reps.
func DefaultIORConfig() IORConfig {
	return IORConfig{
		DataServers: []int{1, 2, 4}, PNFS: []bool{true, false},
		Clients: 4, BlockSize: 256 << 20, TransferSize: 1 << 20, Reps: 3,
		Timeout: 30 * time.Minute,
	}
}

// QuickIORConfig is the smoke run used by CI: 1 and 2 data servers, 2
// clients × 16 MiB, one repetition.
func QuickIORConfig() IORConfig {
	c := DefaultIORConfig()
	c.DataServers, c.Clients, c.BlockSize, c.Reps = []int{1, 2}, 2, 16<<20, 1
	c.Timeout = 5 * time.Minute
	return c
}

// Limits on IORConfig, so a typo cannot fill a disk or fork a thousand
// processes.
const (
	maxDataServers = 64
	maxClients     = 256
	maxTotalBytes  = 1 << 40
)

// Validate reports the first unusable setting.
func (c *IORConfig) Validate() error {
	switch {
	case len(c.DataServers) == 0:
		return errors.New("no data-server counts to run")
	case len(c.PNFS) == 0:
		return errors.New("no pNFS modes to run")
	case c.Clients < 1 || c.Clients > maxClients:
		return fmt.Errorf("clients %d out of range (1 to %d)", c.Clients, maxClients)
	case c.BlockSize <= 0 || c.BlockSize > maxSize:
		return fmt.Errorf("block size %d out of range (1 B to %s)", c.BlockSize, FormatSize(maxSize))
	case c.BlockSize*int64(c.Clients) > maxTotalBytes:
		return fmt.Errorf("%d clients × %s is more than %s", c.Clients, FormatSize(c.BlockSize), FormatSize(maxTotalBytes))
	case c.TransferSize < minBlock || c.TransferSize > maxBlock:
		return fmt.Errorf("transfer size %d out of range (%d B to %s)", c.TransferSize, minBlock, FormatSize(maxBlock))
	case c.Reps < 1 || c.Reps > maxReps:
		return fmt.Errorf("reps %d out of range (1 to %d)", c.Reps, maxReps)
	case c.Timeout < 0:
		return errors.New("negative timeout")
	case c.Stonewall < 0:
		return errors.New("negative stonewall")
	}
	if _, err := client.ParseAccess(c.Access); err != nil {
		return err
	}
	if err := (client.Policy{SmallIOThreshold: c.SmallIOThreshold}).Validate(); err != nil {
		return err
	}
	for _, n := range c.DataServers {
		if n < 1 || n > maxDataServers {
			return fmt.Errorf("data-server count %d out of range (1 to %d)", n, maxDataServers)
		}
	}
	for _, m := range c.Mirrors {
		if m < 1 || m > meta.MaxMirrors {
			return fmt.Errorf("copies %d out of range (1 to %d)", m, meta.MaxMirrors)
		}
		if n := slices.Min(c.DataServers); m > n {
			return fmt.Errorf("%d copies of every stripe unit need at least %d data servers, not %d", m, m, n)
		}
	}
	return nil
}

// Copies returns the numbers of copies to measure: Mirrors, or one.
func (c *IORConfig) Copies() []int {
	if len(c.Mirrors) == 0 {
		return []int{1}
	}
	return c.Mirrors
}

// ClusterStarter brings up a fresh pNFS cluster (a metadata server and
// dataServers data servers).
type ClusterStarter interface {
	StartCluster(ctx context.Context, dataServers int) (*ClusterEndpoint, error)
}

// MirroredStarter is a ClusterStarter that can also bring up a cluster
// keeping mirrors copies of every stripe unit by default (`shoal mds
// --mirrors`). StartMirrored(ctx, n, 1) is StartCluster(ctx, n).
type MirroredStarter interface {
	ClusterStarter
	StartMirrored(ctx context.Context, dataServers, mirrors int) (*ClusterEndpoint, error)
}

// startCluster starts a cluster of n data servers keeping m copies.
func startCluster(ctx context.Context, s ClusterStarter, n, m int) (*ClusterEndpoint, error) {
	if ms, ok := s.(MirroredStarter); ok {
		return ms.StartMirrored(ctx, n, m)
	}
	if m != 1 {
		return nil, fmt.Errorf("%w: this cluster cannot keep %d copies (%T is no MirroredStarter)", ErrUnavailable, m, s)
	}
	return s.StartCluster(ctx, n)
}

// Server roles of ClusterEndpoint.Procs.
const (
	RoleMDS = "mds"
	RoleDS  = "ds"
	// RoleAll is a process running the MDS and every data server
	// (`shoal up`).
	RoleAll = "mds+ds"
)

// ServerProc is one server process of a cluster.
type ServerProc struct {
	Role string `json:"role"`
	PID  int    `json:"pid"`
}

// ClusterEndpoint is a running cluster.
type ClusterEndpoint struct {
	// Addr is the metadata server's host:port; Root the directory of its
	// pseudo file system to work under.
	Addr, Root string
	// Procs are the cluster's server processes, whose CPU time the report
	// gives per role; empty when the cluster runs in this process.
	Procs []ServerProc
	// Profiles are the CPU profiles the servers write by the time Stop
	// returned.
	Profiles []string
	// Stop shuts the cluster down and releases what StartCluster created.
	Stop func(ctx context.Context) error
	// Namespace, if set, is the network namespace the harness's own
	// client must dial from (a testbed's addresses exist only there).
	Namespace string
}

// cpuByRole reads the CPU time of every process, summed per role; ok is
// false if there are no processes or one could not be read.
func (ep *ClusterEndpoint) cpuByRole() (map[string]time.Duration, bool) {
	if len(ep.Procs) == 0 {
		return nil, false
	}
	m := map[string]time.Duration{}
	for _, p := range ep.Procs {
		d, ok := procCPU(p.PID)
		if !ok {
			return nil, false
		}
		m[p.Role] += d
	}
	return m, true
}

// ClientLauncher starts one benchmark client (see RunClient for what it
// does and the protocol it speaks).
type ClientLauncher interface {
	Launch(ctx context.Context, spec ClientSpec) (*ClientHandle, error)
}

// ClientHandle is a launched client.
type ClientHandle struct {
	// In receives the start signal ("go" and a newline); closing it
	// before that aborts the client.
	In io.WriteCloser
	// Out carries the client's ready message and then its result, one
	// JSON object per line.
	Out io.Reader
	// PID is the client's process id, 0 if it runs in this process.
	PID int
	// Stop waits for the client to end, forcing it after a grace period,
	// and releases its resources. It is safe to call more than once.
	Stop func() error
}

// IORRun is one measurement: all clients of one phase of one repetition
// in one cell of the matrix.
type IORRun struct {
	DataServers int `json:"data_servers"`
	// Mirrors is the number of copies of every stripe unit the cluster
	// kept (0 in reports written before it was recorded: one).
	Mirrors int    `json:"mirrors"`
	PNFS    bool   `json:"pnfs"`
	Phase   string `json:"phase"`
	Rep     int    `json:"rep"`
	Bytes   int64  `json:"bytes"`
	// DSBytes and MDSBytes are the clients' payload bytes that went to
	// the data servers and through the metadata server; DSShare is
	// DSBytes/(DSBytes+MDSBytes). With pNFS on it should be 1, with pNFS
	// off 0: the report checks what happened rather than what was asked.
	DSBytes   uint64  `json:"ds_bytes"`
	MDSBytes  uint64  `json:"mds_bytes"`
	DSShare   float64 `json:"ds_share"`
	Failovers uint64  `json:"failovers"`
	// Seconds is from the earliest client's start to the latest client's
	// end; MBps is Bytes/Seconds in 10^6 bytes per second.
	Seconds float64 `json:"seconds"`
	MBps    float64 `json:"mb_per_s"`
	// ServerCPU is the CPU time (user+system) of the cluster's processes
	// over CPUWindow seconds of wall time around the phase; -1 when the
	// cluster does not run in processes of its own. RoleCPU splits it by
	// server role (RoleMDS, RoleDS, RoleAll).
	ServerCPU float64            `json:"server_cpu_seconds"`
	RoleCPU   map[string]float64 `json:"server_cpu_seconds_by_role,omitempty"`
	CPUWindow float64            `json:"cpu_window_seconds"`
	// ClientCPU is the sum of the clients' CPU time in their timed
	// regions; -1 when they run in this process.
	ClientCPU float64 `json:"client_cpu_seconds"`
	// CommitSeconds is, for writes, the longest of the clients' closing
	// COMMIT and CLOSE.
	CommitSeconds float64 `json:"commit_seconds,omitempty"`
	// Busy is the whole machine's CPU use over the phase, 0 to 1 (-1
	// unknown): near 1 means the CPU, not the network, was the limit.
	Busy      float64        `json:"machine_cpu_busy"`
	LoadAfter [3]float64     `json:"loadavg_after"`
	Clients   []ClientResult `json:"clients"`
}

// ServerCores is the cluster's CPU use in cores during the run, or -1.
func (r *IORRun) ServerCores() float64 {
	if r.ServerCPU < 0 || r.CPUWindow <= 0 {
		return -1
	}
	return r.ServerCPU / r.CPUWindow
}

// ServerCPUPerGiB is the servers' CPU-seconds per GiB moved, or -1.
// Unlike a rate it hardly depends on what else the machine was doing.
func (r *IORRun) ServerCPUPerGiB() float64 {
	if r.ServerCPU < 0 || r.Bytes <= 0 {
		return -1
	}
	return r.ServerCPU / (float64(r.Bytes) / (1 << 30))
}

// ClientCPUPerGiB is the clients' CPU-seconds per GiB moved, or -1.
func (r *IORRun) ClientCPUPerGiB() float64 {
	if r.ClientCPU < 0 || r.Bytes <= 0 {
		return -1
	}
	return r.ClientCPU / (float64(r.Bytes) / (1 << 30))
}

// ClientCores is the clients' CPU use in cores during the run, or -1.
func (r *IORRun) ClientCores() float64 {
	if r.ClientCPU < 0 || r.Seconds <= 0 {
		return -1
	}
	return r.ClientCPU / r.Seconds
}

// IORCell is one cell of the result table: the summary of its runs.
type IORCell struct {
	DataServers int    `json:"data_servers"`
	Mirrors     int    `json:"mirrors"` // copies; see IORRun.Mirrors
	PNFS        bool   `json:"pnfs"`
	Phase       string `json:"phase"`
	Summary            // MB/s
	// DSShare is the smallest share of bytes that went to the data
	// servers in any of the cell's runs (pNFS off: the largest).
	DSShare float64 `json:"ds_share"`
	// ServerCores and ClientCores are medians over the runs (-1 unknown);
	// RoleCores splits the servers' by role.
	ServerCores float64            `json:"server_cores"`
	RoleCores   map[string]float64 `json:"server_cores_by_role,omitempty"`
	ClientCores float64            `json:"client_cores"`
	// ServerCPUPerGiB and ClientCPUPerGiB are CPU-seconds per GiB moved,
	// medians over the runs (-1 unknown).
	ServerCPUPerGiB float64 `json:"server_cpu_seconds_per_gib"`
	ClientCPUPerGiB float64 `json:"client_cpu_seconds_per_gib"`
	// CommitSeconds is the median of the runs' longest closing COMMIT
	// and CLOSE (writes only).
	CommitSeconds float64 `json:"commit_seconds,omitempty"`
	// Busy is the median machine-wide CPU use (0 to 1, -1 unknown).
	Busy float64 `json:"machine_cpu_busy"`
	// CeilingMBps is the raw capacity of the links this cell's traffic
	// crosses (0 unknown), see ceilingMBps: pNFS, min(clients, data
	// servers) links, for writes with m copies min(clients, data
	// servers/m); through one server, one link (writes: 1/m).
	CeilingMBps float64 `json:"ceiling_mb_per_s,omitempty"`
	Runs        int     `json:"runs"`
}

// IORReport is the outcome of an ior run.
type IORReport struct {
	Kind       string     `json:"kind"` // "ior"
	Start      time.Time  `json:"start"`
	Elapsed    float64    `json:"elapsed_seconds"`
	Config     IORConfig  `json:"config"`
	Machine    Machine    `json:"machine"`
	LoadBefore [3]float64 `json:"loadavg_before"`
	LoadAfter  [3]float64 `json:"loadavg_after"`
	// Servers describes how the cluster ran ("in-process", or its
	// processes' roles such as "mds+ds" or "mds, ds"); Clients is
	// "process" or "in-process".
	Servers string    `json:"servers"`
	Clients string    `json:"clients"`
	Runs    []IORRun  `json:"runs"`
	Cells   []IORCell `json:"cells"`
	Errors  []string  `json:"errors,omitempty"`
	Notes   []string  `json:"notes"`
	// Profiles are the cluster CPU profiles written, if any.
	Profiles []string `json:"cpu_profiles,omitempty"`
}

// IORSetup is where and how the ior workload runs.
type IORSetup struct {
	Cluster ClusterStarter
	Clients ClientLauncher
}

// Timeouts of the ior driver. The run as a whole is bounded by
// IORConfig.Timeout and the caller's context.
const (
	clientReadyTimeout = 60 * time.Second
	setupTimeout       = 2 * time.Minute
	// A phase slower than minPhaseRate (or than minPhaseTimeout, for
	// small ones) is taken to be hung and fails.
	minPhaseRate    = 5e6 // bytes per second
	minPhaseTimeout = 2 * time.Minute
)

// phaseTimeout bounds one phase of cfg.
func phaseTimeout(cfg IORConfig) time.Duration {
	total := float64(cfg.BlockSize) * float64(cfg.Clients)
	return max(minPhaseTimeout, time.Duration(total/minPhaseRate*float64(time.Second)))
}

// RunIOR runs the ior matrix and returns the report. A cluster size that
// fails is recorded with its error and the run goes on to the next; the
// returned error joins the failures, so a caller can print the report and
// still exit non-zero.
func RunIOR(ctx context.Context, cfg IORConfig, setup IORSetup) (*IORReport, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if setup.Cluster == nil || setup.Clients == nil {
		return nil, errors.New("ior: no cluster starter or client launcher")
	}
	if cfg.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.Timeout)
		defer cancel()
	}
	rep := &IORReport{
		Kind:       IOR,
		Start:      time.Now().UTC(),
		Config:     cfg,
		Machine:    MachineInfo(),
		LoadBefore: LoadAvg(),
		Servers:    "in-process",
		Clients:    "in-process",
	}
	var errs []error
	bar := newProgressBar(cfg.Progress, len(cfg.DataServers)*len(cfg.Copies())*len(cfg.PNFS)*cfg.Reps*2, cfg.Stonewall)
cluster:
	for _, n := range cfg.DataServers {
		for _, m := range cfg.Copies() {
			err := runCluster(ctx, cfg, setup, n, m, rep, bar)
			if err != nil {
				err = fmt.Errorf("%s: %w", clusterName(cfg, n, m), err)
				errs = append(errs, err)
				rep.Errors = append(rep.Errors, err.Error())
				progress(cfg.Progress, "ior: %v\n", err)
			}
			if ctx.Err() != nil {
				break cluster
			}
		}
	}
	rep.LoadAfter = LoadAvg()
	rep.Elapsed = time.Since(rep.Start).Seconds()
	rep.Cells = summarizeIOR(cfg, rep.Runs)
	rep.Notes = iorNotes(rep)
	return rep, errors.Join(errs...)
}

func progress(w io.Writer, format string, args ...any) {
	if w != nil {
		fmt.Fprintf(w, format, args...)
	}
}

// clusterName says which cluster of the matrix this is, for errors and
// progress: "4 data servers", and ", 2 copies" when copies are swept or
// more than one.
func clusterName(cfg IORConfig, n, m int) string {
	s := fmt.Sprintf("%d data servers", n)
	switch {
	case m != 1:
		s += fmt.Sprintf(", %d copies", m)
	case len(cfg.Mirrors) > 1:
		s += ", 1 copy"
	}
	return s
}

// runCluster measures every repetition and pNFS mode on a fresh cluster
// of n data servers keeping m copies of every stripe unit.
func runCluster(ctx context.Context, cfg IORConfig, setup IORSetup, n, m int, rep *IORReport, bar *progressBar) (err error) {
	ep, err := startCluster(ctx, setup.Cluster, n, m)
	if err != nil {
		return fmt.Errorf("start cluster: %w", err)
	}
	if len(ep.Procs) > 0 {
		var roles []string
		for _, p := range ep.Procs {
			if !slices.Contains(roles, p.Role) {
				roles = append(roles, p.Role)
			}
		}
		rep.Servers = fmt.Sprintf("processes (%s)", strings.Join(roles, ", "))
	}
	defer func() {
		if ep.Stop != nil {
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			serr := ep.Stop(sctx)
			cancel()
			if serr != nil && err == nil {
				err = fmt.Errorf("stop cluster: %w", serr)
			}
		}
		rep.Profiles = append(rep.Profiles, ep.Profiles...)
	}()

	// The harness's own client only creates and removes directories; it
	// never carries benchmark data.
	sctx, cancel := context.WithTimeout(ctx, setupTimeout)
	defer cancel()
	opts := pnfsOptions(false)
	opts.Root = ep.Root
	c, err := dialIn(sctx, ep.Namespace, ep.Addr, opts)
	if err != nil {
		return fmt.Errorf("dial %s: %w", ep.Addr, err)
	}
	defer c.Close()

	for r := 0; r < cfg.Reps; r++ {
		// The modes alternate within each repetition, so a slow spell on
		// a shared machine hits both rather than one.
		for _, on := range cfg.PNFS {
			dir := fmt.Sprintf("/ior-ds%d-m%d-%s-rep%d", n, m, modeName(on), r)
			if err := c.Mkdir(ctx, dir, 0o755); err != nil {
				return fmt.Errorf("mkdir %s: %w", dir, err)
			}
			var written []int64
			for _, phase := range []string{PhaseWrite, PhaseRead} {
				run, err := runPhase(ctx, cfg, setup.Clients, ep, dir, n, m, on, phase, r, written, bar)
				if run != nil && phase == PhaseWrite {
					for _, cr := range run.Clients {
						written = append(written, cr.Transfers)
					}
				}
				if run != nil {
					rep.Runs = append(rep.Runs, *run)
					if run.ClientCPU >= 0 {
						rep.Clients = "process"
					}
				}
				if err != nil {
					return fmt.Errorf("pNFS %s, %s, rep %d: %w", modeName(on), phase, r+1, err)
				}
			}
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), setupTimeout)
			err := c.RemoveAll(rctx, dir)
			cancel()
			if err != nil {
				return fmt.Errorf("remove %s: %w", dir, err)
			}
		}
	}
	return nil
}

func modeName(on bool) string {
	if on {
		return "on"
	}
	return "off"
}

// runPhase runs the clients of one phase together and sums up their
// results. written, for a read after a stonewalled write, is how many
// transfers each client wrote.
func runPhase(ctx context.Context, cfg IORConfig, launcher ClientLauncher, ep *ClusterEndpoint, dir string, n, m int, on bool, phase string, r int, written []int64, bar *progressBar) (*IORRun, error) {
	specs := make([]ClientSpec, cfg.Clients)
	for i := range specs {
		path := fmt.Sprintf("%s/file.%04d", dir, i)
		if cfg.Shared {
			path = dir + "/shared"
		}
		specs[i] = ClientSpec{
			Addr: ep.Addr, Root: ep.Root, Path: path, Index: i,
			Phase: phase, Size: cfg.BlockSize, Transfer: cfg.TransferSize, PNFS: on,
			Shared: cfg.Shared, Random: cfg.Random, Stonewall: cfg.Stonewall, Access: cfg.Access,
			SmallIOThreshold: cfg.SmallIOThreshold,
		}
		if phase == PhaseRead && cfg.Stonewall > 0 && i < len(written) {
			specs[i].Count = max(written[i], 1)
		}
	}
	where := fmt.Sprintf("%d DS", n)
	if len(cfg.Mirrors) > 1 || m != 1 {
		where += fmt.Sprintf(" x%d", m)
	}
	bar.next(fmt.Sprintf("%s, pNFS %s, %s", where, modeName(on), phase))
	cr, err := runClients(ctx, launcher, ep, specs, phaseTimeout(cfg), bar)
	if cr == nil {
		return nil, err
	}
	run := &IORRun{DataServers: n, Mirrors: m, PNFS: on, Phase: phase, Rep: r,
		ServerCPU: -1, ClientCPU: cr.ClientCPU, Clients: cr.Results, LoadAfter: LoadAvg(), Busy: cr.Busy}
	for i, res := range cr.Results {
		if cfg.Stonewall == 0 && res.Bytes != cfg.BlockSize {
			return run, fmt.Errorf("client %d moved %d bytes, want %d", i, res.Bytes, cfg.BlockSize)
		}
		if res.Bytes <= 0 {
			return run, fmt.Errorf("client %d moved nothing", i)
		}
		run.Bytes += res.Bytes
		run.DSBytes += res.DSBytes
		run.MDSBytes += res.MDSBytes
		run.Failovers += res.Failovers
		run.CommitSeconds = max(run.CommitSeconds, res.CommitSeconds)
	}
	if t := run.DSBytes + run.MDSBytes; t > 0 {
		run.DSShare = float64(run.DSBytes) / float64(t)
	}
	run.Seconds = cr.span()
	run.MBps = float64(run.Bytes) / 1e6 / run.Seconds
	if cr.RoleCPU != nil {
		run.ServerCPU, run.RoleCPU, run.CPUWindow = 0, cr.RoleCPU, cr.Window.Seconds()
		for _, d := range cr.RoleCPU {
			run.ServerCPU += d
		}
	}
	cores := ""
	if c := run.ServerCores(); c >= 0 {
		cores += fmt.Sprintf(", servers %.2f cores", c)
	}
	if c := run.ClientCores(); c >= 0 {
		cores += fmt.Sprintf(", clients %.2f cores", c)
	}
	if run.Busy >= 0 {
		cores += fmt.Sprintf(", machine %.0f%% busy", 100*run.Busy)
	}
	progress(cfg.Progress, "ior: %s, pNFS %s, %s rep %d/%d: %s MB/s (%.2fs%s; %.0f%% of bytes via data servers, %d failovers)\n",
		where, modeName(on), phase, r+1, cfg.Reps, FormatRate(run.MBps), run.Seconds, cores, 100*run.DSShare, run.Failovers)
	return run, err
}

// ceilingMBps is the raw link capacity a cell's traffic can use, in
// 10^6 bytes per second, for n data servers keeping m copies of every
// stripe unit. Every node has one link, limited to the rate in each
// direction (the testbed shapes a node's upload on its own end of the
// link and its download on the switch's end, and the bridge between them
// is not limited), so a ceiling is the tightest single direction of one
// kind of link:
//
//   - pNFS reads: each client's download and each data server's upload
//     carry their share, min(clients, n) links. A read goes to one copy
//     (the layout names one member per position), so m does not matter.
//   - pNFS writes: the clients' uploads carry W; the data servers'
//     downloads carry m·W (the client's bytes to the first copy, and the
//     first copy's forwards to the m-1 others, spread evenly by the
//     placement), so min(clients, n/m) links. The forwards also leave
//     through the data servers' uploads, (m-1)·W/n each, which is below
//     m·W/n and so never the limit.
//   - Without pNFS every byte crosses the one server's link; the MDS
//     sends a write's m copies out of its one upload, so 1/m link for
//     writes (NFS-Ganesha: one link, it keeps one copy).
func ceilingMBps(cfg IORConfig, n, m int, on bool, phase string) float64 {
	if cfg.LinkBitsPerSec <= 0 {
		return 0
	}
	link := cfg.LinkBitsPerSec / 8 / 1e6
	m = max(m, 1)
	write := phase == PhaseWrite
	switch {
	case cfg.Target == TargetGanesha:
		return link
	case !on && write:
		return link / float64(m)
	case !on:
		return link
	case write:
		return min(float64(cfg.Clients), float64(n)/float64(m)) * link
	}
	return float64(min(cfg.Clients, n)) * link
}

// Targets of IORConfig.Target.
const (
	TargetShoal   = "shoal"
	TargetGanesha = "ganesha"
)

// pnfsShareOK is the share of bytes through the data servers below which
// a pNFS-on cell is marked as (partly) fallen back.
const pnfsShareOK = 0.99

// summarizeIOR groups the runs into cells in matrix order.
func summarizeIOR(cfg IORConfig, runs []IORRun) []IORCell {
	var cells []IORCell
	for _, n := range cfg.DataServers {
		for _, m := range cfg.Copies() {
			cells = append(cells, summarizeCluster(cfg, runs, n, m)...)
		}
	}
	return cells
}

// summarizeCluster summarizes the runs of the cluster of n data servers
// keeping m copies.
func summarizeCluster(cfg IORConfig, runs []IORRun, n, m int) []IORCell {
	var cells []IORCell
	for _, on := range cfg.PNFS {
		for _, phase := range []string{PhaseWrite, PhaseRead} {
			cell := IORCell{DataServers: n, Mirrors: m, PNFS: on, Phase: phase}
			var mbps, sc, cc, sg, cg, commits, busy []float64
			rc := map[string][]float64{}
			for _, r := range runs {
				if r.DataServers != n || max(r.Mirrors, 1) != m || r.PNFS != on || r.Phase != phase {
					continue
				}
				switch {
				case len(mbps) == 0:
					cell.DSShare = r.DSShare
				case on:
					cell.DSShare = min(cell.DSShare, r.DSShare)
				default:
					cell.DSShare = max(cell.DSShare, r.DSShare)
				}
				mbps = append(mbps, r.MBps)
				if c := r.ServerCores(); c >= 0 {
					sc = append(sc, c)
					for role, cpu := range r.RoleCPU {
						rc[role] = append(rc[role], cpu/r.CPUWindow)
					}
				}
				if c := r.ClientCores(); c >= 0 {
					cc = append(cc, c)
				}
				if g := r.ServerCPUPerGiB(); g >= 0 {
					sg = append(sg, g)
				}
				if g := r.ClientCPUPerGiB(); g >= 0 {
					cg = append(cg, g)
				}
				commits = append(commits, r.CommitSeconds)
				if r.Busy >= 0 {
					busy = append(busy, r.Busy)
				}
			}
			if len(mbps) == 0 {
				continue
			}
			cell.Summary, cell.Runs = Summarize(mbps), len(mbps)
			cell.ServerCores, cell.ClientCores = -1, -1
			cell.ServerCPUPerGiB, cell.ClientCPUPerGiB = medianOr(sg, -1), medianOr(cg, -1)
			cell.CommitSeconds = Summarize(commits).Median
			cell.Busy = medianOr(busy, -1)
			cell.CeilingMBps = ceilingMBps(cfg, n, m, on, phase)
			if len(sc) > 0 {
				cell.ServerCores = Summarize(sc).Median
				cell.RoleCores = map[string]float64{}
				for role, v := range rc {
					cell.RoleCores[role] = Summarize(v).Median
				}
			}
			if len(cc) > 0 {
				cell.ClientCores = Summarize(cc).Median
			}
			cells = append(cells, cell)
		}
	}
	return cells
}

func medianOr(v []float64, none float64) float64 {
	if len(v) == 0 {
		return none
	}
	return Summarize(v).Median
}

// iorNotes says what was measured and what limits the numbers.
func iorNotes(rep *IORReport) []string {
	c := rep.Config
	notes := []string{
		fmt.Sprintf("ior: %d clients, one file each, each writes then reads %s sequentially in %s calls, one call at a time",
			c.Clients, FormatSize(c.BlockSize), FormatSize(int64(c.TransferSize))),
		"write is timed from OPEN to the return of COMMIT (fsync) and CLOSE (which carries LAYOUTCOMMIT with pNFS); the reads start after every writer has finished",
		"MB/s = all clients' bytes / (latest client end - earliest client start), 10^6 bytes per second; each cell is the median of the reps [min-max]",
		"read: the data servers' page cache is warm (the files were just written); this is the protocol and copy path, not the disk",
	}
	if c.LinkBitsPerSec > 0 {
		notes = append(notes, fmt.Sprintf("emulated cluster (shoal testbed): every server and client in its own network namespace behind a %.0f Mbit/s link each way; all of them still share this machine's CPUs, so the machine CPU busy column says whether the links or the CPU were the limit", c.LinkBitsPerSec/1e6))
	} else {
		notes = append(notes, "loopback TCP on one machine: clients, metadata server and data servers share its CPUs, so more data servers add no hardware")
	}
	if rep.replicated() {
		notes = append(notes, fmt.Sprintf("copies %s: the cluster keeps that many copies of every stripe unit (shoal mds --mirrors); a client writes each unit to one copy's data server, which forwards the bytes to the other copies' data servers, so every byte enters the data servers once per copy: the write ceiling is min(clients, DS/copies) links (without pNFS the MDS sends every copy from its one link: 1/copies link); a read is served by one copy, so its ceiling is min(clients, DS) links", joinInts(c.Copies())))
	}
	if strings.Contains(rep.Servers, RoleAll) {
		notes = append(notes, "server CPU is that of the one `shoal up` process running the MDS and all data servers")
	}
	for _, cell := range rep.Cells {
		if cell.PNFS && cell.DSShare < pnfsShareOK {
			notes = append(notes, "* pNFS on, but part of the data went through the MDS (ds_share in the JSON): the client fell back for some or all I/O")
			break
		}
	}
	for _, cell := range rep.Cells {
		if !cell.PNFS && cell.DSShare > 0 {
			notes = append(notes, "! pNFS off, but some data went to the data servers: the client did not honour PNFSOff")
			break
		}
	}
	// Whether the CPU was the limit: the busiest cell's server plus client
	// cores against the machine's.
	busiest := -1.0
	for _, cell := range rep.Cells {
		if cell.ServerCores >= 0 && cell.ClientCores >= 0 {
			busiest = max(busiest, cell.ServerCores+cell.ClientCores)
		}
	}
	ncpu := float64(rep.Machine.NumCPU)
	load := max(rep.LoadBefore[0], rep.LoadAfter[0])
	for _, r := range rep.Runs {
		load = max(load, r.LoadAfter[0])
	}
	// The machine-wide busy fraction also holds what no process is
	// charged for (the kernel forwarding emulated links) and other
	// tenants' work; the load average counts the benchmark's own client
	// processes, so it is reported but judges nothing.
	busy := -1.0
	for _, cell := range rep.Cells {
		busy = max(busy, cell.Busy)
	}
	if busiest >= 0 && ncpu > 0 {
		verdict := "the CPU was not saturated"
		switch {
		case busiest >= 0.8*ncpu:
			verdict = "CPU-BOUND: the figures measure CPU cost per byte, not the network, the disks or pNFS parallelism"
		case busy >= 0.85:
			verdict = fmt.Sprintf("but the machine was %.0f%% busy in the busiest cell (kernel packet forwarding and any other work on top): the CPU may have been the limit there", 100*busy)
		case busy >= 0:
			verdict = fmt.Sprintf("the CPU was not saturated (machine at most %.0f%% busy)", 100*busy)
		}
		notes = append(notes, fmt.Sprintf("the benchmark's processes used at most %.2f of %d cores (busiest cell, servers + clients): %s", busiest, rep.Machine.NumCPU, verdict))
	}
	if ncpu > 0 && load >= ncpu {
		notes = append(notes, fmt.Sprintf("load average up to %.1f on %d cores (it counts the benchmark's own processes): differences within the min-max ranges are noise", load, rep.Machine.NumCPU))
	}
	return notes
}

// FormatPNFSModes renders modes as "on,off".
func FormatPNFSModes(modes []bool) string {
	s := make([]string, len(modes))
	for i, on := range modes {
		s[i] = modeName(on)
	}
	return strings.Join(s, ",")
}

// ParsePNFSModes parses "on,off" (also true/false, 1/0) into modes, in
// order and without duplicates.
func ParsePNFSModes(list []string) ([]bool, error) {
	var modes []bool
	for _, s := range list {
		var on bool
		switch strings.ToLower(strings.TrimSpace(s)) {
		case "on", "true", "1", "yes":
			on = true
		case "off", "false", "0", "no":
			on = false
		case "":
			continue
		default:
			return nil, fmt.Errorf("bad pNFS mode %q (want on or off)", s)
		}
		if !slices.Contains(modes, on) {
			modes = append(modes, on)
		}
	}
	return modes, nil
}
