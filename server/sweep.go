package server

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/shoalfs/shoal/meta"
	"github.com/shoalfs/shoal/store"
)

// Sweeping data objects no file owns.
//
// With sync: false a create is answered before its log record is durable
// (durability.go), so a machine crash can take the create back after the
// client wrote data to the new file: the data object (on the local store
// of `shoal serve`, or on data servers) stays, owned by no inode. It does
// no harm, since inode numbers are never handed out again, but its space
// would be lost for good. So after an unclean start the server sweeps:
// it lists every data object (store.ObjectLister: the local store's
// folders, or every data server with OBJ_LIST), asks the metadata engine
// which of them no regular file owns (meta.Unowned, one snapshot per
// page) and removes those, in the background, at a bounded rate
// (sweepCheckRate objects checked and sweepRemoveRate removed a second),
// with a log line at the start and the end and the
// shoal_data_sweep_objects_total counter.
//
// The rule that makes this safe against creates in flight: only objects
// whose inode number is below a high-water mark are ever removed, and the
// mark is a value the inode counter had before the objects were listed,
// read durably:
//
//   - after an unclean start it is the engine's sweep mark
//     (meta.SweepMark), set by the open in the same durable transaction
//     that advanced the counter past every number the lost interval can
//     have allocated. Every create of this run allocates a number at or
//     above it, so none of its objects is ever looked at, whatever the
//     timing; and a number below it that no regular file owns in a
//     snapshot read after the open is never owned again (numbers are
//     never reused), so its object is garbage for good;
//   - on demand (Server.SweepUnowned, `shoal admin sweep`), it is the
//     counter read (StatFS) before the listing starts: a number below it
//     was allocated before, by a create whose inode was visible from then
//     on, so if the later snapshot has no regular file of that number the
//     file is gone (freed, or lost to an earlier crash) and cannot come
//     back.
//
// Removing the object of a file that is being freed at the same time is
// harmless: both removals remove the same object, and a missing object is
// no error. A mark left by a sweep that could not list everything (the
// server stopped, a data server was out of service) stays in the engine,
// and the next start sweeps again.

// sweepCheckRate and sweepRemoveRate bound the sweep's pace: objects
// checked against the metadata (one read per page) and objects removed,
// per second, so that a sweep after a crash does not compete with the
// clients for the disks and the engine. A store of ten million objects
// takes about ten minutes to check.
const (
	sweepCheckRate  = 20000
	sweepRemoveRate = 1000
)

// sweepCall bounds one removal on a data server.
const sweepCall = 30 * time.Second

// SweepReport is what a sweep of unowned data objects did.
type SweepReport struct {
	// Below is the high-water mark: only objects of lower inode numbers
	// were considered.
	Below   meta.Ino  `json:"below"`
	Started time.Time `json:"started"`
	Ended   time.Time `json:"ended"`
	// Listed counts the objects listed, Unowned those below the mark
	// that no regular file owns, Removed those removed, Failed those
	// whose removal failed.
	Listed  uint64 `json:"listed"`
	Unowned uint64 `json:"unowned"`
	Removed uint64 `json:"removed"`
	Failed  uint64 `json:"failed"`
	// Complete is true when every object was listed and every unowned
	// one removed.
	Complete bool `json:"complete"`
	// Err says why the sweep was not complete.
	Err string `json:"error,omitempty"`
}

// ErrSweepRunning is returned by SweepUnowned while a sweep runs.
var ErrSweepRunning = errors.New("server: a sweep of unowned data objects is running")

// errNoSweep: a data server has no namespace to sweep against.
var errNoSweep = errors.New("server: a data server does not sweep")

// sweeper runs the sweeps of a metadata server.
type sweeper struct {
	s *Server
	// check and remove pace the sweep: objects checked and removed a
	// second (sweepCheckRate, sweepRemoveRate).
	check, remove *rate.Limiter

	mu      sync.Mutex
	running bool
	last    *SweepReport
	// wg counts the sweeps StartSweep started; Close waits for them.
	wg sync.WaitGroup

	listed, unowned, removed, failed atomic.Uint64
	runs, incomplete                 atomic.Uint64
}

func newSweeper(s *Server) *sweeper {
	return &sweeper{
		s:      s,
		check:  rate.NewLimiter(sweepCheckRate, store.ListPage),
		remove: rate.NewLimiter(sweepRemoveRate, 64),
	}
}

// lister is the data backend's object listing; nil if it has none (a
// data server, or a backend that cannot list).
func (w *sweeper) lister() store.ObjectLister {
	if p := w.s.cfg.PNFS; p != nil {
		l, _ := p.Backend.(store.ObjectLister)
		return l
	}
	l, _ := w.s.data.(store.ObjectLister)
	return l
}

// afterStart runs the sweep the engine's mark asks for, if any, once the
// grace period is over (data servers have registered again by then, and
// clients have reclaimed their state; neither matters to the rule, but a
// data server not back yet could not be listed). It returns when the
// sweep is over or ctx ends.
func (w *sweeper) afterStart(ctx context.Context) {
	below, ok, err := meta.SweepMark(ctx, w.s.meta)
	if err != nil {
		w.s.log.Warn("sweep of unowned data objects: reading the mark", "err", err)
		return
	}
	if !ok {
		return
	}
	if w.lister() == nil {
		w.s.log.Warn("a sweep of data objects no file owns is pending, but this data backend cannot list its objects: not sweeping", "below", uint64(below))
		return
	}
	w.s.log.Info("a sweep of data objects no file owns is pending (a run ended uncleanly): it starts after the grace period", "below", uint64(below))
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for w.s.st.m.InGrace() {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
	if !w.begin() {
		return // one on demand runs: it covers the mark
	}
	if _, err := w.run(ctx, below, true); err != nil && ctx.Err() == nil {
		w.s.log.Warn("sweep of unowned data objects after an unclean start did not finish; it runs again at the next start", "err", err)
	}
}

// SweepUnowned removes the data objects no regular file owns whose inode
// numbers are below the inode counter as read when it starts (see the
// rule above), at the sweep's bounded pace, and reports what it did. It
// returns ErrSweepRunning if a sweep runs already. If it is complete and
// the engine holds a sweep mark at or below that counter, it clears the
// mark.
func (s *Server) SweepUnowned(ctx context.Context) (SweepReport, error) {
	if s.sweep == nil {
		return SweepReport{}, errNoSweep
	}
	if !s.sweep.begin() {
		return SweepReport{}, ErrSweepRunning
	}
	return s.sweep.onDemand(ctx)
}

// StartSweep runs SweepUnowned in the background, until it ends or the
// server closes, unless a sweep runs already; it reports whether it
// started one. LastSweep reports the outcome.
func (s *Server) StartSweep() bool {
	if s.sweep == nil || !s.sweep.begin() {
		return false
	}
	s.sweep.wg.Go(func() {
		if _, err := s.sweep.onDemand(s.life); err != nil && s.life.Err() == nil {
			s.log.Warn("sweep of unowned data objects", "err", err)
		}
	})
	return true
}

// Sweeping reports whether a sweep runs.
func (s *Server) Sweeping() bool {
	if s.sweep == nil {
		return false
	}
	s.sweep.mu.Lock()
	defer s.sweep.mu.Unlock()
	return s.sweep.running
}

// LastSweep reports the last sweep that ended, if any.
func (s *Server) LastSweep() (SweepReport, bool) {
	if s.sweep == nil {
		return SweepReport{}, false
	}
	s.sweep.mu.Lock()
	defer s.sweep.mu.Unlock()
	if s.sweep.last == nil {
		return SweepReport{}, false
	}
	return *s.sweep.last, true
}

// begin marks a sweep running; false if one runs already.
func (w *sweeper) begin() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.running {
		return false
	}
	w.running = true
	return true
}

// onDemand is a begun sweep below the inode counter as it is now.
func (w *sweeper) onDemand(ctx context.Context) (SweepReport, error) {
	st, err := w.s.meta.StatFS(ctx)
	if err != nil {
		err = fmt.Errorf("server: sweep: read the inode counter: %w", err)
		w.end(&SweepReport{Started: time.Now(), Ended: time.Now(), Err: err.Error()})
		return SweepReport{}, err
	}
	return w.run(ctx, st.NextIno, false)
}

func (w *sweeper) end(rep *SweepReport) {
	w.mu.Lock()
	w.running = false
	w.last = rep
	w.mu.Unlock()
}

// run sweeps the objects below below; the caller has begun the sweep.
// fromMark says below is the engine's sweep mark.
func (w *sweeper) run(ctx context.Context, below meta.Ino, fromMark bool) (SweepReport, error) {
	rep := SweepReport{Below: below, Started: time.Now()}
	l := w.lister()
	if l == nil {
		err := errors.New("server: sweep: this data backend cannot list its objects")
		rep.Ended, rep.Err = time.Now(), err.Error()
		w.end(&rep)
		return rep, err
	}
	w.s.log.Info("sweeping data objects no file owns", "below", uint64(below), "after_crash", fromMark)
	err := w.sweep(ctx, l, below, &rep)
	rep.Ended = time.Now()
	rep.Complete = err == nil && rep.Failed == 0
	if err == nil && rep.Failed > 0 {
		err = fmt.Errorf("server: sweep: %d removals failed", rep.Failed)
	}
	if err != nil {
		rep.Err = err.Error()
	}
	w.runs.Add(1)
	if !rep.Complete {
		w.incomplete.Add(1)
	}
	if rep.Complete {
		if cerr := w.clearMark(ctx, below); cerr != nil {
			w.s.log.Warn("sweep of unowned data objects: clearing the mark", "err", cerr)
		}
	}
	args := []any{"below", uint64(below), "listed", rep.Listed, "unowned", rep.Unowned, "removed", rep.Removed,
		"failed", rep.Failed, "took", rep.Ended.Sub(rep.Started).Round(time.Millisecond)}
	if err != nil {
		w.s.log.Warn("sweep of unowned data objects incomplete", append(args, "err", err)...)
	} else {
		w.s.log.Info("swept data objects no file owns", args...)
	}
	w.end(&rep)
	return rep, err
}

// clearMark clears the engine's sweep mark if the sweep that just listed
// everything below below covered it.
func (w *sweeper) clearMark(ctx context.Context, below meta.Ino) error {
	mark, ok, err := meta.SweepMark(ctx, w.s.meta)
	if err != nil || !ok || mark > below {
		return err
	}
	return meta.ClearSweepMark(ctx, w.s.meta, mark)
}

// sweep lists the objects and removes the unowned ones below below, page
// by page.
func (w *sweeper) sweep(ctx context.Context, l store.ObjectLister, below meta.Ino, rep *SweepReport) error {
	r := &sweepRun{w: w, l: l, below: below, rep: rep}
	// A local store's unlinks reach the disk with the file system's next
	// journal commit: they are made durable before the sweep counts as
	// complete (and its mark is cleared), or a crash right after could
	// bring the objects back with nothing left to sweep them.
	r.rs, _ = l.(store.RemoveSyncer)
	err := l.ListObjects(ctx, func(place string, page []uint64) error {
		// A data server's page (cluster.listPage) is larger than the
		// limiter's burst: it is checked in chunks, one metadata
		// snapshot each (any snapshot after the start will do: see
		// the rule).
		for chunk := range slices.Chunk(page, store.ListPage) {
			if err := w.check.WaitN(ctx, len(chunk)); err != nil {
				return err
			}
			if err := r.page(ctx, place, chunk); err != nil {
				return err
			}
		}
		return nil
	})
	if len(r.failures) > 0 {
		w.s.log.Warn("sweep: removing unowned data objects", "failed", rep.Failed, "first_errors", errors.Join(r.failures...))
	}
	if len(r.removed) > 0 {
		if serr := r.rs.SyncRemoved(r.removed); serr != nil && err == nil {
			err = fmt.Errorf("server: sweep: sync removals: %w", serr)
		}
	}
	return err
}

// sweepRun is one sweep's state.
type sweepRun struct {
	w     *sweeper
	l     store.ObjectLister
	below meta.Ino
	rep   *SweepReport
	// rs, if the store needs it, makes removed's removals durable.
	rs       store.RemoveSyncer
	removed  []uint64
	failures []error // the first few
}

// page checks a chunk of the objects listed at place against the
// metadata and removes those below the mark that no file owns.
func (r *sweepRun) page(ctx context.Context, place string, page []uint64) error {
	w, rep := r.w, r.rep
	rep.Listed += uint64(len(page))
	w.listed.Add(uint64(len(page)))
	var cand []meta.Ino
	for _, ino := range page {
		if meta.Ino(ino) < r.below {
			cand = append(cand, meta.Ino(ino))
		}
	}
	if len(cand) == 0 {
		return nil
	}
	gone, err := meta.Unowned(ctx, w.s.meta, cand)
	if err != nil {
		return err
	}
	rep.Unowned += uint64(len(gone))
	w.unowned.Add(uint64(len(gone)))
	for _, ino := range gone {
		if err := w.remove.Wait(ctx); err != nil {
			return err
		}
		rctx, cancel := context.WithTimeout(ctx, sweepCall)
		err := r.l.RemoveObject(rctx, place, uint64(ino))
		cancel()
		if err != nil {
			rep.Failed++
			w.failed.Add(1)
			if len(r.failures) < 10 {
				r.failures = append(r.failures, err)
			}
			continue
		}
		rep.Removed++
		w.removed.Add(1)
		if r.rs != nil {
			r.removed = append(r.removed, uint64(ino))
		}
		w.s.log.Debug("removed a data object no file owns", "ino", uint64(ino), "place", place)
	}
	return nil
}

// sweepCollector exports the sweeps' counters.
type sweepCollector struct {
	w            *sweeper
	objects, run *prometheus.Desc
}

func newSweepCollector(w *sweeper, labels prometheus.Labels) *sweepCollector {
	return &sweepCollector{
		w: w,
		objects: prometheus.NewDesc("shoal_data_sweep_objects_total",
			"Data objects the sweep of objects no file owns (after an unclean start, or `shoal admin sweep`) listed, found unowned, removed, and failed to remove.",
			[]string{"result"}, labels),
		run: prometheus.NewDesc("shoal_data_sweep_runs_total",
			"Sweeps of data objects no file owns that ended, complete or not (a data server out of service, a failed removal, a shutdown).",
			[]string{"outcome"}, labels),
	}
}

func (c *sweepCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.objects
	ch <- c.run
}

func (c *sweepCollector) Collect(ch chan<- prometheus.Metric) {
	w := c.w
	for _, e := range []struct {
		name string
		n    *atomic.Uint64
	}{{"listed", &w.listed}, {"unowned", &w.unowned}, {"removed", &w.removed}, {"failed", &w.failed}} {
		ch <- prometheus.MustNewConstMetric(c.objects, prometheus.CounterValue, float64(e.n.Load()), e.name)
	}
	runs, inc := w.runs.Load(), w.incomplete.Load()
	ch <- prometheus.MustNewConstMetric(c.run, prometheus.CounterValue, float64(runs-inc), "complete")
	ch <- prometheus.MustNewConstMetric(c.run, prometheus.CounterValue, float64(inc), "incomplete")
}
