package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/shoalfs/shoal/internal/ctlproto"
	"github.com/shoalfs/shoal/internal/rpc"
	"github.com/shoalfs/shoal/meta"
)

// Cluster administration: status, drain, remove, rebalance, scrub, and the
// directories' replication policy. The MDS serves these to `shoal admin`
// over the control protocol's ADMIN call (the join secret is the
// credential) and runs the long ones (drain, rebalance, scrub) as one
// background job at a time. A drain is resumable: the Draining state is
// persistent, a job interrupted by `shoal admin cancel` or an MDS restart
// leaves it so, and the MDS resumes draining every Draining data server
// when it starts. Healing (heal.go) runs beside them, always.

// AdminConfig configures an Admin.
type AdminConfig struct {
	Registry *Registry
	Striped  *Striped
	// Hold recalls and holds back a file's layouts while it moves.
	Hold HoldFunc
	// FileSize returns a file's size (the metadata engine's), for status.
	FileSize func(ctx context.Context, ino uint64) (uint64, error)
	// Policy keeps the directories' replication policy (`shoal admin
	// policy`); nil: the command is refused.
	Policy PolicyStore
	// HealRate bounds the bandwidth healing copies with, in bytes per
	// second: 0 is DefaultHealRate, negative is no limit.
	HealRate int64
	// HealInterval is how often the healer scans every stripe map (it
	// also scans when data servers come and go): 0 is
	// DefaultHealInterval, negative turns healing off.
	HealInterval time.Duration
	// FenceFile, if set, fences a file's data on loosely coupled NFSv3
	// data servers (flexv3): the "fence-file" command.
	FenceFile func(ctx context.Context, path string) (*FenceInfo, error)
	// HA, if set, is the metadata servers' election (an MDS on etcd):
	// status lists the MDS nodes, and `shoal admin step-down` hands
	// leadership over. Nil: one MDS, and step-down is refused.
	HA HA
	// Sweep, if set, runs the sweep of data objects no file owns
	// (`shoal admin sweep`); nil: the command is refused.
	Sweep  Sweeper
	Logger *slog.Logger
}

// HA is what the administration sees of the metadata servers' election.
type HA interface {
	// HAStatus lists the MDS nodes and the etcd members.
	HAStatus(ctx context.Context) (*HAStatus, error)
	// StepDown makes this leader stop serving and resign, so that a
	// standby takes over at once; it returns before that happens (the
	// reply must still reach the caller).
	StepDown() error
}

// HAStatus is the MDS election section of Status.
type HAStatus struct {
	// Term is the leader's term (its election key's create revision).
	Term  uint64    `json:"term"`
	Nodes []MDSNode `json:"nodes"`
	// Etcd lists the etcd cluster's members and their health as the
	// leader sees them.
	Etcd []EtcdMember `json:"etcd"`
}

// MDSNode is one metadata server in the election.
type MDSNode struct {
	Node   string `json:"node"`
	Addr   string `json:"addr"`
	Leader bool   `json:"leader"`
	// Term is the create revision of the node's election key (the
	// leader's is the current term; a standby's is its place in line).
	Term uint64 `json:"term"`
	// LeaseLeft is the time left on its lease, which it renews every
	// third of the lease: how recently it was seen.
	LeaseLeft time.Duration `json:"lease_left"`
}

// EtcdMember is one member of the etcd cluster holding the metadata.
type EtcdMember struct {
	Name      string   `json:"name"`
	Endpoints []string `json:"endpoints"`
	Healthy   bool     `json:"healthy"`
	Leader    bool     `json:"leader"`
	Error     string   `json:"error,omitempty"`
}

// PolicyStore keeps the replication policy of directories: how many copies
// of each stripe unit the files created below a directory get.
type PolicyStore interface {
	PolicyOf(ctx context.Context, path string) (PolicyInfo, error)
	// SetPolicy sets path's mirror count; 0 clears it (path then
	// inherits).
	SetPolicy(ctx context.Context, path string, mirrors int) (PolicyInfo, error)
}

// LayoutPolicyStore is an optional capability of a PolicyStore: the pNFS
// layout type of the files created below a directory (`shoal admin
// policy --layout`).
type LayoutPolicyStore interface {
	// SetLayout sets path's layout type: meta.LayoutFiles or
	// meta.LayoutFlexFiles, or meta.LayoutDefault to clear it (path
	// then inherits: files created in it get the export's type). The
	// path's mirror count is left alone.
	SetLayout(ctx context.Context, path string, layout meta.Layout) (PolicyInfo, error)
}

// PolicyInfo is a directory's replication policy.
type PolicyInfo struct {
	Path    string `json:"path"`
	Mirrors int    `json:"mirrors"` // copies of each stripe unit of new files
	// Inherited is true when Mirrors is the cluster default, nothing
	// being set on the path or above it.
	Inherited bool `json:"inherited"`
	Default   int  `json:"default"` // the cluster default
	// Layout is the pNFS layout type of files created in the path:
	// "files" or "flexfiles", or "" when none is set on it (they get
	// their export's type).
	Layout string `json:"layout,omitempty"`
	// LayoutsBelow are the layout types set on directories below the
	// path (listed in fs_layout_types).
	LayoutsBelow []string `json:"layouts_below,omitempty"`
}

// ParseLayout parses a layout type as `shoal admin policy --layout` and
// AdminRequest.Layout write it: "files", "flexfiles", or "inherit" to
// clear the setting.
func ParseLayout(s string) (meta.Layout, error) {
	for l := meta.LayoutDefault; l <= meta.LayoutFlexFiles; l++ {
		if s == l.String() {
			return l, nil
		}
	}
	return 0, fmt.Errorf("cluster: layout %q: want files, flexfiles or inherit: %w", s, errInval)
}

// Admin runs cluster administration on the MDS.
type Admin struct {
	cfg AdminConfig
	log *slog.Logger

	heal *healer // nil: healing is off

	mu    sync.Mutex
	job   *Job
	scrub ScrubTotals
}

var _ AdminHandler = (*Admin)(nil)

// Job is the state of a drain, rebalance or scrub, as `shoal admin status`
// shows it.
type Job struct {
	Kind    string    `json:"kind"` // "drain", "rebalance" or "scrub"
	DS      string    `json:"ds,omitempty"`
	Started time.Time `json:"started"`
	Ended   time.Time `json:"ended,omitzero"`
	// Files are the files found that must move (drain, rebalance) or the
	// replicated files checked (scrub); Failed those that could not be
	// moved or checked.
	Files     int    `json:"files"`
	Moved     int    `json:"moved"`
	Failed    int    `json:"failed"`
	Bytes     int64  `json:"bytes"` // bytes copied and verified
	Running   bool   `json:"running"`
	Cancelled bool   `json:"cancelled,omitempty"`
	Err       string `json:"error,omitempty"`
	// Scrub: chunks checked (one per stripe position and MiB), copies
	// found bad and repaired, and the first maxListed of them.
	Chunks   int64          `json:"chunks,omitempty"`
	Bad      int            `json:"bad,omitempty"`
	Repaired int            `json:"repaired,omitempty"`
	Findings []ScrubFinding `json:"findings,omitempty"`

	cancel context.CancelFunc
	done   chan struct{}
}

// NewAdmin returns the MDS's administration, starts healing (unless
// cfg.HealInterval is negative) and resumes every drain that was in
// progress.
func NewAdmin(cfg AdminConfig) *Admin {
	a := &Admin{cfg: cfg, log: cfg.Logger}
	if a.log == nil {
		a.log = slog.New(slog.DiscardHandler)
	}
	if cfg.HealInterval >= 0 {
		a.heal = newHealer(a)
		a.heal.start()
	}
	for _, ds := range cfg.Registry.DataServers() {
		if ds.State == Draining {
			if _, err := a.start("drain", ds.ID); err != nil {
				a.log.Warn("cluster: cannot resume a drain", "ds", ds.ID, "err", err)
			} else {
				a.log.Info("cluster: resuming the drain of a data server", "ds", ds.ID)
			}
			break // one job at a time; the next resumes when asked
		}
	}
	return a
}

// Close stops healing, cancels a running job and waits for them.
func (a *Admin) Close() {
	if a.heal != nil {
		a.heal.stop()
	}
	a.mu.Lock()
	j := a.job
	a.mu.Unlock()
	if j != nil && j.Running {
		j.cancel()
		<-j.done
	}
}

// Kick makes the healer scan the stripe maps now: call it when a copy was
// marked stale. It does nothing when healing is off.
func (a *Admin) Kick() {
	if a.heal != nil {
		a.heal.Kick()
	}
}

// AdminRequest is the JSON request of every ADMIN command.
type AdminRequest struct {
	DS    string `json:"ds,omitempty"`
	Force bool   `json:"force,omitempty"`
	// Path, Mirrors and Layout are the policy command's: the directory,
	// the mirror count to set (nil: only show it; 0: clear it) and the
	// layout type to set (nil: leave it; "files", "flexfiles", or
	// "inherit" to clear it).
	Path    string  `json:"path,omitempty"`
	Mirrors *int    `json:"mirrors,omitempty"`
	Layout  *string `json:"layout,omitempty"`
}

// Admin implements AdminHandler.
func (a *Admin) Admin(ctx context.Context, command string, request []byte) ([]byte, error) {
	var req AdminRequest
	if len(request) > 0 {
		if err := json.Unmarshal(request, &req); err != nil {
			return nil, fmt.Errorf("cluster: admin %s: bad request: %w", command, errInval)
		}
	}
	var out any
	var err error
	switch command {
	case "status":
		out, err = a.Status(ctx)
	case "drain":
		out, err = a.start("drain", req.DS)
	case "rebalance":
		out, err = a.start("rebalance", "")
	case "scrub":
		out, err = a.start("scrub", "")
	case "policy":
		out, err = a.Policy(ctx, req.Path, req.Mirrors, req.Layout)
	case "cancel":
		out, err = a.Cancel()
	case "remove":
		out, err = a.Remove(ctx, req.DS, req.Force)
	case "fence-file":
		out, err = a.fenceFile(ctx, req.Path)
	case "sweep":
		out, err = a.sweep(true)
	case "sweep-status":
		out, err = a.sweep(false)
	case "step-down":
		if a.cfg.HA == nil {
			return nil, fmt.Errorf("cluster: step-down: this MDS is not elected (its metadata is not on etcd): %w", errInval)
		}
		out, err = struct{}{}, a.cfg.HA.StepDown()
	default:
		return nil, fmt.Errorf("cluster: unknown admin command %q: %w", command, errInval)
	}
	if err != nil {
		return nil, err
	}
	return json.Marshal(out)
}

// errInval marks a request that cannot be carried out as asked
// (CTL_ERR_INVAL); the message says why.
var errInval = fmt.Errorf("invalid request: %w", syscall.EINVAL)

// start starts a job, or returns the one running.
func (a *Admin) start(kind, ds string) (*Job, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if j := a.job; j != nil && j.Running {
		if j.Kind == kind && j.DS == ds {
			return j.snapshot(), nil
		}
		return nil, fmt.Errorf("%w: %s %s", ErrBusy, j.Kind, j.DS)
	}
	if kind == "drain" {
		d, ok := a.cfg.Registry.DataServer(ds)
		if !ok {
			return nil, fmt.Errorf("%w: %q", ErrUnknownDataServer, ds)
		}
		switch d.State {
		case Removed:
			return nil, fmt.Errorf("cluster: %s was removed: %w", ds, errInval)
		case Drained:
			return &Job{Kind: kind, DS: ds, Started: time.Now(), Ended: time.Now()}, nil
		}
		if err := a.cfg.Registry.setState(context.Background(), ds, Draining); err != nil {
			return nil, err
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	j := &Job{Kind: kind, DS: ds, Started: time.Now(), Running: true, cancel: cancel, done: make(chan struct{})}
	a.job = j
	go a.run(ctx, j)
	return j.snapshot(), nil
}

// snapshot copies j; the caller holds Admin.mu.
func (j *Job) snapshot() *Job {
	c := *j
	c.cancel, c.done = nil, nil
	c.Findings = slices.Clone(j.Findings)
	return &c
}

// Policy shows the replication policy of path, or sets its mirror count
// (0 clears it) if mirrors is not nil, and its layout type if layout is
// not nil (ParseLayout).
func (a *Admin) Policy(ctx context.Context, path string, mirrors *int, layout *string) (*PolicyInfo, error) {
	if a.cfg.Policy == nil {
		return nil, fmt.Errorf("cluster: this MDS keeps no replication policies: %w", errInval)
	}
	if path == "" {
		return nil, fmt.Errorf("cluster: a path is required: %w", errInval)
	}
	var lay meta.Layout
	var lps LayoutPolicyStore
	if layout != nil {
		var err error
		if lay, err = ParseLayout(*layout); err != nil {
			return nil, err
		}
		var ok bool
		if lps, ok = a.cfg.Policy.(LayoutPolicyStore); !ok {
			return nil, fmt.Errorf("cluster: this MDS keeps no layout policies: %w", errInval)
		}
	}
	if mirrors != nil && (*mirrors < 0 || *mirrors > meta.MaxMirrors) {
		return nil, fmt.Errorf("cluster: %d mirrors: must be 1 to %d, or 0 to clear: %w", *mirrors, meta.MaxMirrors, errInval)
	}
	var pi PolicyInfo
	var err error
	if mirrors == nil && layout == nil {
		pi, err = a.cfg.Policy.PolicyOf(ctx, path)
	}
	if err == nil && mirrors != nil {
		pi, err = a.cfg.Policy.SetPolicy(ctx, path, *mirrors)
		if err == nil {
			a.log.Info("cluster: replication policy set", "path", path, "mirrors", *mirrors)
		}
	}
	if err == nil && layout != nil {
		pi, err = lps.SetLayout(ctx, path, lay)
		if err == nil {
			a.log.Info("cluster: layout policy set", "path", path, "layout", lay.String())
		}
	}
	if err != nil {
		return nil, fmt.Errorf("cluster: policy of %s: %w", path, err)
	}
	return &pi, nil
}

// Cancel stops the running job; a drain stays Draining and resumes when
// asked again.
func (a *Admin) Cancel() (*Job, error) {
	a.mu.Lock()
	j := a.job
	a.mu.Unlock()
	if j == nil || !j.Running {
		return nil, fmt.Errorf("cluster: no job is running: %w", errInval)
	}
	j.cancel()
	<-j.done
	a.mu.Lock()
	defer a.mu.Unlock()
	return j.snapshot(), nil
}

// run carries out job j: moves every file a drain or rebalance concerns,
// or scrubs every replicated file.
func (a *Admin) run(ctx context.Context, j *Job) {
	defer close(j.done)
	a.log.Info("cluster: job started", "kind", j.Kind, "ds", j.DS)
	// A job resumed as the MDS starts would find every data server still
	// re-registering and fail every move: give them the time they have
	// before they count as down.
	a.cfg.Registry.waitMembers(ctx, a.cfg.Registry.downAfter)
	var failures []error
	var err error
	if j.Kind == "scrub" {
		failures, err = a.runScrub(ctx, j)
	} else {
		failures, err = a.runMoves(ctx, j)
	}
	if err != nil && ctx.Err() == nil {
		failures = append(failures, err)
	}
	a.mu.Lock()
	j.Running = false
	j.Ended = time.Now()
	j.Cancelled = ctx.Err() != nil
	if len(failures) > 0 {
		what := "files could not be moved"
		if j.Kind == "scrub" {
			what = "files could not be scrubbed"
		}
		j.Err = fmt.Sprintf("%d %s; first error: %v", len(failures), what, failures[0])
	}
	finished := !j.Cancelled && len(failures) == 0
	a.mu.Unlock()
	if j.Kind == "drain" && finished {
		if err := a.cfg.Registry.setState(context.Background(), j.DS, Drained); err != nil {
			a.mu.Lock()
			j.Err = err.Error()
			a.mu.Unlock()
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.log.Info("cluster: job ended", "kind", j.Kind, "ds", j.DS, "files", j.Files, "moved", j.Moved, "failed", j.Failed,
		"bytes", j.Bytes, "bad", j.Bad, "repaired", j.Repaired, "cancelled", j.Cancelled, "err", j.Err)
}

// runMoves moves every file a drain or rebalance concerns.
func (a *Admin) runMoves(ctx context.Context, j *Job) ([]error, error) {
	var failures []error
	err := a.cfg.Striped.eachMap(ctx, func(fm meta.FileStripeMap) bool {
		if err := a.moveFile(ctx, j, fm); err != nil && ctx.Err() == nil {
			a.mu.Lock()
			j.Failed++
			failures = append(failures, err)
			a.mu.Unlock()
			a.log.Warn("cluster: could not move a file", "job", j.Kind, "ino", fm.Ino, "err", err)
		}
		return true
	})
	return failures, err
}

// moveFile moves file fm for job j if it must move, counting it in j. A
// file whose map changed meanwhile (healing, a write that marked a copy
// stale) is judged again on its new map; one that is gone is not counted.
func (a *Admin) moveFile(ctx context.Context, j *Job, fm meta.FileStripeMap) error {
	s := a.cfg.Striped
	counted := false
	count := func(must bool) {
		a.mu.Lock()
		defer a.mu.Unlock()
		switch {
		case must && !counted:
			j.Files++
		case !must && counted:
			j.Files--
		}
		counted = must
	}
	for attempt := 0; ; attempt++ {
		nm, ok, err := a.target(j, fm)
		count(ok || err != nil)
		if !ok {
			return err
		}
		st, err := s.Move(ctx, uint64(fm.Ino), fm.Map, nm, a.cfg.Hold)
		a.mu.Lock()
		j.Bytes += st.Bytes
		if err == nil {
			j.Moved++
		}
		a.mu.Unlock()
		switch {
		case err == nil:
			return nil
		case errors.Is(err, meta.ErrStale), errors.Is(err, meta.ErrNotFound):
			count(false) // gone meanwhile: nothing of it to move
			return nil
		case !errors.Is(err, meta.ErrConflict) || attempt == 3:
			return err
		}
		s.forget(uint64(fm.Ino))
		cur, found, err := s.Map(ctx, uint64(fm.Ino))
		if err != nil {
			return err
		}
		if !found {
			count(false)
			return nil
		}
		fm.Map = cur
	}
}

// target returns the map file fm should move to for job j, and whether it
// must move at all; an error if it must but cannot.
func (a *Admin) target(j *Job, fm meta.FileStripeMap) (meta.StripeMap, bool, error) {
	m := fm.Map
	place := a.cfg.Registry.Placement()
	switch j.Kind {
	case "drain":
		if !m.Holds(j.DS) {
			return meta.StripeMap{}, false, nil
		}
		// Replace the drained data server, at each position it has, by an
		// active one that the file does not use yet, so that only its
		// stripe units move; files take the candidates in turn (by
		// inode), which spreads a drain evenly, skipping any that
		// reported itself nearly full while others have room. With no
		// such candidate, another data server of the file that is not a
		// member of the position yet takes it (it then holds two
		// positions): still only the drained one's units move.
		var spare []string
		for _, id := range place {
			if !m.Holds(id) {
				spare = append(spare, id)
			}
		}
		if roomy := slices.DeleteFunc(slices.Clone(spare), func(id string) bool {
			d, _ := a.cfg.Registry.DataServer(id)
			return d.Capacity > 0 && d.Free < d.Capacity/20
		}); len(roomy) > 0 {
			spare = roomy
		}
		var others []string
		for _, id := range m.All() {
			if id != j.DS && slices.Contains(place, id) {
				others = append(others, id)
			}
		}
		nm := m.Clone()
		k := uint64(fm.Ino)
		for p := range nm.DataServers {
			members := nm.Members(p)
			r := slices.Index(members, j.DS)
			if r < 0 {
				continue
			}
			free := func(ids []string) []string {
				return slices.DeleteFunc(slices.Clone(ids), func(id string) bool { return slices.Contains(members, id) })
			}
			cands := free(spare)
			if len(cands) == 0 {
				cands = free(others)
			}
			if len(cands) == 0 {
				return meta.StripeMap{}, false, fmt.Errorf("cluster: drain %s: no active data server can take position %d of ino %d (members %v)",
					j.DS, p, fm.Ino, members)
			}
			setMember(&nm, p, r, cands[k%uint64(len(cands))])
			k++
		}
		nm.Stale = slices.DeleteFunc(nm.Stale, func(id string) bool { return !nm.Holds(id) })
		return nm, true, nil
	case "rebalance":
		var unused []string
		for _, id := range place {
			if !m.Holds(id) {
				unused = append(unused, id)
			}
		}
		if len(unused) == 0 || m.Degraded() {
			return meta.StripeMap{}, false, nil // a degraded file is healing's business
		}
		for _, id := range m.All() {
			if d, ok := a.cfg.Registry.DataServer(id); !ok || d.State != Active {
				return meta.StripeMap{}, false, nil // a drain's business
			}
		}
		// Positions a data server holds twice go to the unused data
		// servers first (only those units move); the rest widen the file:
		// the units that stay put are those whose index is unchanged.
		ids := slices.Clone(m.DataServers)
		seen := map[string]bool{}
		for p, id := range ids {
			if seen[id] && len(unused) > 0 {
				ids[p], unused = unused[0], unused[1:]
				continue
			}
			seen[id] = true
		}
		ids = append(ids, unused...)
		nm := meta.StripeMap{Unit: m.Unit, First: m.First, DataServers: ids}
		if k := m.Mirrors() - 1; k > 0 {
			// The old positions keep their replicas; a new one takes the
			// data servers after it in stripe order, as placement does.
			nm.Replicas = make([][]string, len(ids))
			for p := range ids {
				if p < len(m.Replicas) {
					nm.Replicas[p] = slices.Clone(m.Replicas[p])
					continue
				}
				for r := 1; len(nm.Replicas[p]) < k && r < len(ids); r++ {
					id := ids[(p+r)%len(ids)]
					if id != ids[p] && !slices.Contains(nm.Replicas[p], id) {
						nm.Replicas[p] = append(nm.Replicas[p], id)
					}
				}
				if len(nm.Replicas[p]) < k {
					return meta.StripeMap{}, false, nil
				}
			}
		}
		return nm, true, nil
	}
	return meta.StripeMap{}, false, nil
}

// Remove retires data server id. A drained one goes at once; one that
// still holds stripes needs force, and the files that lose data are
// listed in the result.
func (a *Admin) Remove(ctx context.Context, id string, force bool) (*RemoveResult, error) {
	d, ok := a.cfg.Registry.DataServer(id)
	if !ok {
		return nil, fmt.Errorf("%w: %q", ErrUnknownDataServer, id)
	}
	a.mu.Lock()
	if j := a.job; j != nil && j.Running && j.DS == id {
		a.mu.Unlock()
		return nil, fmt.Errorf("%w: %s is being drained; cancel it first", ErrBusy, id)
	}
	a.mu.Unlock()
	res := &RemoveResult{DS: id}
	if d.State != Drained && d.State != Removed {
		err := a.cfg.Striped.eachMap(ctx, func(fm meta.FileStripeMap) bool {
			// Every map that names it counts, holding bytes or not: a
			// file that grows writes its later units there.
			if fm.Map.Holds(id) {
				res.FilesLost++
				if len(res.Inodes) < maxListed {
					res.Inodes = append(res.Inodes, uint64(fm.Ino))
				}
			}
			return true
		})
		if err != nil {
			return nil, err
		}
		if res.FilesLost > 0 && !force {
			return nil, fmt.Errorf("cluster: %s holds stripes of %d files; drain it first (`shoal admin drain %s`), or remove it with --force and lose them: %w",
				id, res.FilesLost, id, errInval)
		}
	}
	if err := a.cfg.Registry.setState(ctx, id, Removed); err != nil {
		return nil, err
	}
	if res.FilesLost > 0 {
		a.log.Warn("cluster: data server removed with data; these files lost stripes", "ds", id, "files", res.FilesLost, "inodes", res.Inodes)
	}
	return res, nil
}

// eachMap calls fn for every stripe map in inode order, a page of maps
// (one metadata transaction) at a time, until fn returns false or ctx is
// done.
func (s *Striped) eachMap(ctx context.Context, fn func(meta.FileStripeMap) bool) error {
	var after meta.Ino
	for ctx.Err() == nil {
		page, err := s.maps.StripeMaps(ctx, after, 256)
		if err != nil || len(page) == 0 {
			return err
		}
		after = page[len(page)-1].Ino
		for _, fm := range page {
			if !fn(fm) {
				return nil
			}
		}
	}
	return ctx.Err()
}

// size returns file ino's size for status (0 if unknown).
func (a *Admin) size(ctx context.Context, ino meta.Ino) uint64 {
	var size uint64
	if a.cfg.FileSize != nil {
		size, _ = a.cfg.FileSize(ctx, uint64(ino))
	}
	return size
}

// maxListed bounds the files listed by name in admin results.
const maxListed = 1000

// RemoveResult is what `shoal admin remove` reports.
type RemoveResult struct {
	DS        string   `json:"ds"`
	FilesLost int      `json:"files_lost"`
	Inodes    []uint64 `json:"inodes,omitempty"` // the first maxListed of them
}

// Status is what `shoal admin status` shows.
type Status struct {
	ClusterID   string     `json:"cluster_id"`
	DataServers []DSStatus `json:"data_servers"`
	// Unavailable lists files with data at a stripe position that has no
	// good copy in service (every member out of service, removed or
	// stale; the first maxListed); UnavailableFiles counts them all.
	Unavailable      []FileStatus `json:"unavailable,omitempty"`
	UnavailableFiles int          `json:"unavailable_files"`
	Files            int          `json:"files"` // files with data placed
	// Replication is the state of the files kept in several copies.
	Replication ReplicationStatus `json:"replication"`
	Job         *Job              `json:"job,omitempty"`
	// HA is the metadata servers' election; nil for a single MDS.
	HA *HAStatus `json:"ha,omitempty"`
}

// ReplicationStatus is the replication section of Status.
type ReplicationStatus struct {
	Files int `json:"files"` // files kept in more than one copy
	// DegradedFiles have stale copies or members that are lost (removed,
	// or out of service for longer than DownAfter); DegradedStripes
	// counts their positions that have such a member, StaleCopies the
	// copies marked stale (one per file and data server).
	DegradedFiles   int `json:"degraded_files"`
	DegradedStripes int `json:"degraded_stripes"`
	StaleCopies     int `json:"stale_copies"`
	// UnhealableFiles are degraded files with a position that has no
	// good copy in service: they cannot heal until one comes back.
	// Unhealable lists the first maxListed.
	UnhealableFiles int      `json:"unhealable_files"`
	Unhealable      []uint64 `json:"unhealable,omitempty"`
	// Heal is the healer's progress; nil when healing is off.
	Heal *HealStatus `json:"heal,omitempty"`
	// Scrub counts what scrubs found since the MDS started.
	Scrub ScrubTotals `json:"scrub"`
}

// DSStatus is one data server's line of Status.
type DSStatus struct {
	DataServer
	// Files counts the files with a stripe unit on it below their size
	// (as any member of the unit's position, stale or not), and Bytes
	// those units' bytes, from the files' sizes and maps.
	Files int    `json:"files"`
	Bytes uint64 `json:"bytes"`
}

// FileStatus is a file that is not fully available.
type FileStatus struct {
	Ino  uint64   `json:"ino"`
	Down []string `json:"down"` // members of its unavailable positions that are out of service
}

// Status scans every stripe map and reports the data servers, the files
// that are not fully available, and the state of replication. No lock is
// held while it reads the metadata engine.
func (a *Admin) Status(ctx context.Context) (*Status, error) {
	r := a.cfg.Registry
	st := &Status{ClusterID: fmt.Sprintf("%x", r.ClusterID())}
	if a.cfg.HA != nil {
		ha, err := a.cfg.HA.HAStatus(ctx)
		if err != nil {
			return nil, fmt.Errorf("cluster: status of the MDS election: %w", err)
		}
		st.HA = ha
	}
	idx := map[string]int{}
	for _, d := range r.DataServers() {
		idx[d.ID] = len(st.DataServers)
		st.DataServers = append(st.DataServers, DSStatus{DataServer: d})
	}
	rep := &st.Replication
	v := r.liveView()
	err := a.cfg.Striped.eachMap(ctx, func(fm meta.FileStripeMap) bool {
		m := fm.Map
		st.Files++
		size := a.size(ctx, fm.Ino)
		v = v.fresh(r)
		for _, id := range m.All() {
			// A data server of the map holds part of the file only if a
			// stripe unit below the file's size falls on it; a small file
			// is on one position whatever its map's width.
			held := bytesOn(m, size, id)
			if held == 0 {
				continue
			}
			if i, ok := idx[id]; ok {
				st.DataServers[i].Files++
				st.DataServers[i].Bytes += held
			}
		}
		h := health(m, v)
		var down []string
		for _, p := range h.unavailable {
			if posBytes(m, size, p) == 0 {
				continue
			}
			for _, id := range m.Members(p) {
				if !v.inService(id) && !slices.Contains(down, id) {
					down = append(down, id)
				}
			}
			if len(down) == 0 {
				down = []string{} // only stale copies
			}
		}
		if down != nil {
			st.UnavailableFiles++
			if len(st.Unavailable) < maxListed {
				st.Unavailable = append(st.Unavailable, FileStatus{Ino: uint64(fm.Ino), Down: down})
			}
		}
		if m.Mirrors() > 1 || m.Degraded() {
			rep.Files++
			rep.StaleCopies += len(m.Stale)
			if h.degraded > 0 {
				rep.DegradedFiles++
				rep.DegradedStripes += h.degraded
				if len(h.unavailable) > 0 {
					rep.UnhealableFiles++
					if len(rep.Unhealable) < maxListed {
						rep.Unhealable = append(rep.Unhealable, uint64(fm.Ino))
					}
				}
			}
		}
		return true
	})
	if err != nil {
		return nil, err
	}
	if a.heal != nil {
		hs := a.heal.status()
		rep.Heal = &hs
	}
	a.mu.Lock()
	rep.Scrub = a.scrub
	if a.job != nil {
		st.Job = a.job.snapshot()
	}
	a.mu.Unlock()
	return st, nil
}

// bytesOn returns how many bytes of a file of size bytes data server id
// holds under map m, over every stripe position it is a member of.
func bytesOn(m meta.StripeMap, size uint64, id string) uint64 {
	var total uint64
	for p := range m.DataServers {
		if slices.Contains(m.Members(p), id) {
			total += posBytes(m, size, p)
		}
	}
	return total
}

// posBytes returns how many bytes of a file of size bytes fall on
// position p of map m.
func posBytes(m meta.StripeMap, size uint64, p int) uint64 {
	n := uint64(len(m.DataServers))
	if n == 0 || m.Unit == 0 {
		return 0
	}
	units := size / m.Unit // full units
	rest := size % m.Unit
	// Unit k is at position (First+k) mod n: count the full units k <
	// units at position p, then the partial last unit.
	var total uint64
	k0 := (uint64(p) + n - uint64(m.First)%n) % n // first unit at p
	if units > k0 {
		total += ((units-k0-1)/n + 1) * m.Unit
	}
	if rest > 0 && units%n == k0 {
		total += rest
	}
	return total
}

// CallAdmin sends one ADMIN command to the MDS at addr, presenting the join
// secret, and decodes the JSON result into out (if not nil). The MDS's
// message comes back in the error.
func CallAdmin(ctx context.Context, addr string, secret []byte, command string, req AdminRequest, out any) error {
	conn, err := rpc.Dial(ctx, "tcp", addr, nil)
	if err != nil {
		return fmt.Errorf("cannot reach the MDS at %s: %w", addr, err)
	}
	defer conn.Close()
	b, err := json.Marshal(req)
	if err != nil {
		return err
	}
	var res ctlproto.CtlAdminRes
	if err := call(ctx, conn, ctlproto.CTLPROC_ADMIN, &ctlproto.CtlAdminArgs{Token: secret, Command: command, Request: b}, &res); err != nil {
		return fmt.Errorf("%s at %s: %w (is it a Shoal MDS?)", command, addr, err)
	}
	if err := errOf(res.Status); err != nil {
		if res.Message != "" {
			return &adminError{msg: command + ": " + res.Message, err: err}
		}
		return fmt.Errorf("%s: %w", command, err)
	}
	if out != nil {
		if err := json.Unmarshal(res.Body, out); err != nil {
			return fmt.Errorf("%s: bad reply: %w", command, err)
		}
	}
	return nil
}

// adminError is an MDS's refusal of an ADMIN command: its message for a
// person, and the status's error for errors.Is (ErrNotLeader sends
// `shoal admin` to the next MDS address).
type adminError struct {
	msg string
	err error
}

func (e *adminError) Error() string { return e.msg }
func (e *adminError) Unwrap() error { return e.err }

// FenceInfo is the answer of the fence-file command.
type FenceInfo struct {
	Path  string `json:"path"`
	Ino   uint64 `json:"ino"`
	Owner uint32 `json:"owner"` // the data files' new owner uid
}

// fenceFile gives a file's data files on the NFSv3 data servers a new
// owner and recalls its layouts: clients holding the old layouts' ids are
// refused by the data servers (RFC 8435 section 2.2), and new layouts
// carry the new ids.
func (a *Admin) fenceFile(ctx context.Context, path string) (*FenceInfo, error) {
	if a.cfg.FenceFile == nil {
		return nil, fmt.Errorf("cluster: fence-file: this MDS has no NFSv3 data servers: %w", errInval)
	}
	if path == "" {
		return nil, fmt.Errorf("cluster: fence-file: a path is required: %w", errInval)
	}
	fi, err := a.cfg.FenceFile(ctx, path)
	if err != nil {
		return nil, fmt.Errorf("cluster: fence-file %s: %w", path, err)
	}
	a.log.Info("cluster: file fenced on the NFSv3 data servers", "path", fi.Path, "ino", fi.Ino, "owner", fi.Owner)
	return fi, nil
}
