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

// Cluster administration: status, drain, remove, rebalance. The MDS serves
// these to `shoal admin` over the control protocol's ADMIN call (the join
// secret is the credential) and runs the long ones as one background job
// at a time. A drain is resumable: the Draining state is persistent, a job
// interrupted by `shoal admin cancel` or an MDS restart leaves it so, and
// the MDS resumes draining every Draining data server when it starts.

// AdminConfig configures an Admin.
type AdminConfig struct {
	Registry *Registry
	Striped  *Striped
	// Hold recalls and holds back a file's layouts while it moves.
	Hold HoldFunc
	// FileSize returns a file's size (the metadata engine's), for status.
	FileSize func(ctx context.Context, ino uint64) (uint64, error)
	Logger   *slog.Logger
}

// Admin runs cluster administration on the MDS.
type Admin struct {
	cfg AdminConfig
	log *slog.Logger

	mu  sync.Mutex
	job *Job
}

var _ AdminHandler = (*Admin)(nil)

// Job is the state of a drain or rebalance, as `shoal admin status` shows it.
type Job struct {
	Kind      string    `json:"kind"` // "drain" or "rebalance"
	DS        string    `json:"ds,omitempty"`
	Started   time.Time `json:"started"`
	Ended     time.Time `json:"ended,omitzero"`
	Files     int       `json:"files"` // files found that must move
	Moved     int       `json:"moved"`
	Failed    int       `json:"failed"`
	Bytes     int64     `json:"bytes"` // bytes copied and verified
	Running   bool      `json:"running"`
	Cancelled bool      `json:"cancelled,omitempty"`
	Err       string    `json:"error,omitempty"`

	cancel context.CancelFunc
	done   chan struct{}
}

// NewAdmin returns the MDS's administration and resumes every drain that
// was in progress.
func NewAdmin(cfg AdminConfig) *Admin {
	a := &Admin{cfg: cfg, log: cfg.Logger}
	if a.log == nil {
		a.log = slog.New(slog.DiscardHandler)
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

// Close cancels a running job and waits for it.
func (a *Admin) Close() {
	a.mu.Lock()
	j := a.job
	a.mu.Unlock()
	if j != nil && j.Running {
		j.cancel()
		<-j.done
	}
}

// AdminRequest is the JSON request of every ADMIN command.
type AdminRequest struct {
	DS    string `json:"ds,omitempty"`
	Force bool   `json:"force,omitempty"`
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
	case "cancel":
		out, err = a.Cancel()
	case "remove":
		out, err = a.Remove(ctx, req.DS, req.Force)
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

func (j *Job) snapshot() *Job {
	c := *j
	c.cancel, c.done = nil, nil
	return &c
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

// run moves every file the job concerns.
func (a *Admin) run(ctx context.Context, j *Job) {
	defer close(j.done)
	s := a.cfg.Striped
	a.log.Info("cluster: job started", "kind", j.Kind, "ds", j.DS)
	// A job resumed as the MDS starts would find every data server still
	// re-registering and fail every move: give them the time they have
	// before they count as down.
	a.cfg.Registry.waitMembers(ctx, a.cfg.Registry.downAfter)
	var failures []error
	err := s.eachMap(ctx, func(fm meta.FileStripeMap) bool {
		ids, first, ok := a.target(j, fm)
		if !ok {
			return true
		}
		a.mu.Lock()
		j.Files++
		a.mu.Unlock()
		st, err := s.Move(ctx, uint64(fm.Ino), fm.Map, ids, first, a.cfg.Hold)
		a.mu.Lock()
		defer a.mu.Unlock()
		j.Bytes += st.Bytes
		switch {
		case err == nil:
			j.Moved++
		case errors.Is(err, meta.ErrConflict), errors.Is(err, meta.ErrStale):
			// Changed or gone meanwhile: nothing of it to move now.
			j.Files--
		default:
			if ctx.Err() == nil {
				j.Failed++
				failures = append(failures, err)
				a.log.Warn("cluster: could not move a file", "job", j.Kind, "ino", fm.Ino, "err", err)
			}
		}
		return true
	})
	if err != nil && ctx.Err() == nil {
		failures = append(failures, err)
	}
	a.mu.Lock()
	j.Running = false
	j.Ended = time.Now()
	j.Cancelled = ctx.Err() != nil
	if len(failures) > 0 {
		j.Err = fmt.Sprintf("%d files could not be moved; first error: %v", len(failures), failures[0])
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
	a.log.Info("cluster: job ended", "kind", j.Kind, "ds", j.DS, "moved", j.Moved, "failed", j.Failed,
		"bytes", j.Bytes, "cancelled", j.Cancelled, "err", j.Err)
}

// target returns the data servers file fm should move to for job j, and
// whether it must move at all.
func (a *Admin) target(j *Job, fm meta.FileStripeMap) ([]string, uint32, bool) {
	m := fm.Map
	place := a.cfg.Registry.Placement()
	switch j.Kind {
	case "drain":
		if !m.Holds(j.DS) {
			return nil, 0, false
		}
		// Replace the drained data server, at each position it has, by an
		// active one that the file does not use yet, so that only its
		// stripe units move; files take the candidates in turn (by
		// inode), which spreads a drain evenly, skipping any that
		// reported itself nearly full while others have room. With no
		// such candidate, another data server of the file takes the
		// position too (it then holds two positions): still only the
		// drained one's units move.
		var cands []string
		for _, id := range place {
			if !m.Holds(id) {
				cands = append(cands, id)
			}
		}
		if roomy := slices.DeleteFunc(slices.Clone(cands), func(id string) bool {
			d, _ := a.cfg.Registry.DataServer(id)
			return d.Capacity > 0 && d.Free < d.Capacity/20
		}); len(roomy) > 0 {
			cands = roomy
		}
		if len(cands) == 0 {
			for _, id := range m.DataServers {
				if id != j.DS && slices.Contains(place, id) && !slices.Contains(cands, id) {
					cands = append(cands, id)
				}
			}
		}
		if len(cands) == 0 {
			return nil, 0, false // nowhere to go; reported as not drained
		}
		ids := slices.Clone(m.DataServers)
		k := uint64(fm.Ino)
		for p, id := range ids {
			if id == j.DS {
				ids[p] = cands[k%uint64(len(cands))]
				k++
			}
		}
		return ids, m.First, true
	case "rebalance":
		var unused []string
		for _, id := range place {
			if !m.Holds(id) {
				unused = append(unused, id)
			}
		}
		if len(unused) == 0 {
			return nil, 0, false
		}
		for _, id := range m.DataServers {
			if d, ok := a.cfg.Registry.DataServer(id); !ok || d.State != Active {
				return nil, 0, false // a drain's business
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
		return ids, m.First, true
	}
	return nil, 0, false
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
	// Unavailable lists files with a stripe on a data server that is out
	// of service or removed (the first maxListed); UnavailableFiles
	// counts them all.
	Unavailable      []FileStatus `json:"unavailable,omitempty"`
	UnavailableFiles int          `json:"unavailable_files"`
	Files            int          `json:"files"` // files with data placed
	Job              *Job         `json:"job,omitempty"`
}

// DSStatus is one data server's line of Status.
type DSStatus struct {
	DataServer
	// Files counts the files with a stripe unit on it below their size,
	// and Bytes those units' bytes, from the files' sizes and maps.
	Files int    `json:"files"`
	Bytes uint64 `json:"bytes"`
}

// FileStatus is a file that is not fully available.
type FileStatus struct {
	Ino  uint64   `json:"ino"`
	Down []string `json:"down"` // its data servers that are out of service
}

// Status scans every stripe map and reports the data servers and the
// files that are not fully available.
func (a *Admin) Status(ctx context.Context) (*Status, error) {
	r := a.cfg.Registry
	st := &Status{ClusterID: fmt.Sprintf("%x", r.ClusterID())}
	idx := map[string]int{}
	for _, d := range r.DataServers() {
		idx[d.ID] = len(st.DataServers)
		st.DataServers = append(st.DataServers, DSStatus{DataServer: d})
	}
	err := a.cfg.Striped.eachMap(ctx, func(fm meta.FileStripeMap) bool {
		st.Files++
		size := a.size(ctx, fm.Ino)
		var down []string
		for p, id := range fm.Map.DataServers {
			if slices.Index(fm.Map.DataServers, id) != p {
				continue // a data server at several positions counts once
			}
			// A data server of the map holds part of the file only if a
			// stripe unit below the file's size falls on it; a small file
			// is on one data server whatever its map's width.
			held := bytesOn(fm.Map, size, id)
			if held == 0 {
				continue
			}
			i, ok := idx[id]
			if !ok {
				down = append(down, id)
				continue
			}
			d := &st.DataServers[i]
			d.Files++
			d.Bytes += held
			if !d.Up || d.State == Removed {
				down = append(down, id)
			}
		}
		if len(down) > 0 {
			st.UnavailableFiles++
			if len(st.Unavailable) < maxListed {
				st.Unavailable = append(st.Unavailable, FileStatus{Ino: uint64(fm.Ino), Down: down})
			}
		}
		return true
	})
	if err != nil {
		return nil, err
	}
	a.mu.Lock()
	if a.job != nil {
		st.Job = a.job.snapshot()
	}
	a.mu.Unlock()
	return st, nil
}

// bytesOn returns how many bytes of a file of size bytes data server id
// holds under map m, over every stripe position it has.
func bytesOn(m meta.StripeMap, size uint64, id string) uint64 {
	n := uint64(len(m.DataServers))
	if n == 0 || m.Unit == 0 {
		return 0
	}
	units := size / m.Unit // full units
	rest := size % m.Unit
	var total uint64
	for p, ds := range m.DataServers {
		if ds != id {
			continue
		}
		// Unit k is at position (First+k) mod n: count the full units
		// k < units at position p, then the partial last unit.
		k0 := (uint64(p) + n - uint64(m.First)%n) % n // first unit at p
		if units > k0 {
			total += ((units-k0-1)/n + 1) * m.Unit
		}
		if rest > 0 && units%n == k0 {
			total += rest
		}
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
			return fmt.Errorf("%s: %s", command, res.Message)
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
