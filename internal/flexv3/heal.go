package flexv3

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/shoalfs/shoal/internal/nfs3"
	"github.com/shoalfs/shoal/pnfs"
)

// Healing.
//
// Heal copies a good mirror of a file onto its stale ones over NFSv3
// (READ from the good data file, WRITE and COMMIT to the stale one,
// SETATTR to the good one's size), then marks them good. No write may be
// lost meanwhile, and writes reach a file by two ways: through the MDS
// (the Store's WriteAt and Truncate) and from clients holding read/write
// layouts, straight to the data servers. The rule:
//
//  1. The file's heal lock is taken for writing: writes through the MDS
//     wait (they hold it for reading), and none is under way.
//  2. The file is marked healing: LAYOUTGET for writing answers
//     NFS4ERR_LAYOUTTRYLATER (pnfs.ErrLayoutHeld) until the heal ends,
//     so no new write layout is handed out; the client writes through
//     the MDS, which waits for the heal (step 1).
//  3. The file's layouts are recalled, and then fenced: every data file
//     gets a fresh owner uid (as Store.Fence), and the data servers
//     refuse the old owner's writes from then on. A client that has not
//     yet returned its layout can write no more; recall is only a
//     request, the fence is what makes the copy safe.
//  4. The copy is made, and checked: the good copy's size, mtime and
//     ctime must be what they were before it (a WRITE a data server let
//     through before the fence's SETATTR could land after it), or it is
//     made again (at most maxCopies times, then the heal fails and the
//     next pass retries).
//  5. The metadata and the cache mark the copies good; then the healing
//     mark and the lock are dropped. A write layout handed out after
//     that names every mirror and the new owner.
//
// So from step 3 on no write reaches the good copy that the stale one
// does not get: there are none until step 5 is over.
//
// Read layouts (the read-only uid, unchanged by the fence) go on being
// handed out and used during a heal: they never name a stale copy.

// maxCopies bounds the copies one heal makes of a good copy that
// changes under it.
const maxCopies = 3

// healLocks is the number of heal locks: a file's is healLocks[ino mod
// it], so a heal holds back writes through the MDS to a few other files
// too, for the time of one copy.
const healLocks = 64

// errHealing is LAYOUTGET's answer for writing while a heal runs.
var errHealing = fmt.Errorf("%w: a copy of the file is being healed", pnfs.ErrLayoutHeld)

// healMetrics are the store's counters.
type healMetrics struct {
	staled, healed, failed prometheus.Counter
}

func newHealMetrics() healMetrics {
	return healMetrics{
		staled: prometheus.NewCounter(prometheus.CounterOpts{Name: "shoal_flexv3_copies_staled_total",
			Help: "Copies of files on NFSv3 data servers marked stale after a client reported its I/O to them failing."}),
		healed: prometheus.NewCounter(prometheus.CounterOpts{Name: "shoal_flexv3_copies_healed_total",
			Help: "Stale copies of files on NFSv3 data servers copied back from a good copy and marked good."}),
		failed: prometheus.NewCounter(prometheus.CounterOpts{Name: "shoal_flexv3_heal_failures_total",
			Help: "Heals of a file's stale copies on NFSv3 data servers that failed (retried by the next pass)."}),
	}
}

// Collectors are the store's metrics, to register with the MDS's.
func (s *Store) Collectors() []prometheus.Collector {
	return []prometheus.Collector{s.metrics.staled, s.metrics.healed, s.metrics.failed}
}

func (s *Store) log() *slog.Logger {
	if s.cfg.Logger != nil {
		return s.cfg.Logger
	}
	return slog.Default()
}

func (s *Store) healLock(ino uint64) *sync.RWMutex { return &s.heals[ino%healLocks] }

// kick asks the healer (RunHealer) for a pass.
func (s *Store) kick() {
	select {
	case s.kicks <- struct{}{}:
	default:
	}
}

// Heal copies a good copy of file ino onto each of its stale copies and
// marks them good (see the rule above). It returns how many copies it
// healed; a file with no stale copy heals none.
func (s *Store) Heal(ctx context.Context, ino uint64) (int, error) {
	df, err := s.lookup(ctx, ino, false)
	if err != nil {
		return 0, err
	}
	// The stale copies' servers must answer before the file is held: a
	// server that is down would hold its write layouts back for nothing.
	s.mu.Lock()
	stale := slices.Clone(df.stale)
	s.mu.Unlock()
	for j, si := range df.servers {
		if stale[j] {
			if err := s.probe(ctx, si); err != nil {
				return 0, &unreachableError{id: s.serverID(si), err: err}
			}
		}
	}
	l := s.healLock(ino)
	l.Lock()
	defer l.Unlock()
	s.mu.Lock()
	stale = slices.Clone(df.stale)
	if !slices.Contains(stale, true) {
		s.mu.Unlock()
		return 0, nil
	}
	s.healing[ino] = true
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.healing, ino)
		s.mu.Unlock()
	}()
	if s.recall != nil {
		s.recall(ino)
	}
	good := slices.Index(stale, false)
	if good < 0 {
		return 0, fmt.Errorf("flexv3: file %d has no good copy to heal from", ino)
	}
	// Fence: a fresh owner on every data file, the stale ones (re)made
	// if they are gone.
	s.mu.Lock()
	owner := s.freshOwner(df.owner)
	s.mu.Unlock()
	fhs := slices.Clone(df.fhs)
	for j, si := range df.servers {
		c, err := s.conn(ctx, si)
		if err == nil && (stale[j] || fhs[j] == nil) {
			fhs[j], _, err = s.open(ctx, si, ino, true, owner)
		}
		if err == nil {
			err = c.Setattr(ctx, fhs[j], nfs3.Attrs{UID: &owner})
		}
		if err != nil {
			return 0, fmt.Errorf("flexv3: heal file %d: fence %s: %w", ino, s.serverID(si), err)
		}
	}
	s.mu.Lock()
	df.owner = owner
	for j := range fhs {
		df.fhs[j] = fhs[j]
	}
	s.mu.Unlock()

	src, err := s.conn(ctx, df.servers[good])
	if err != nil {
		return 0, err
	}
	// Copy, then check that the good copy did not change meanwhile (a
	// WRITE the data server had let through before the fence's SETATTR
	// and applied after it): its size, mtime and ctime are what they were
	// before the copy, or the copy is made again, at most maxCopies times.
	var size uint64
	for try := 1; ; try++ {
		before, err := src.Getattr(ctx, fhs[good])
		if err != nil {
			return 0, fmt.Errorf("flexv3: heal file %d: attributes of the good copy: %w", ino, err)
		}
		size = before.Size
		for j, si := range df.servers {
			if !stale[j] {
				continue
			}
			dst, err := s.conn(ctx, si)
			if err != nil {
				return 0, err
			}
			if err := s.copyData(ctx, src, fhs[good], dst, fhs[j], size); err != nil {
				return 0, fmt.Errorf("flexv3: heal file %d onto %s: %w", ino, s.serverID(si), err)
			}
		}
		after, err := src.Getattr(ctx, fhs[good])
		if err != nil {
			return 0, fmt.Errorf("flexv3: heal file %d: attributes of the good copy: %w", ino, err)
		}
		if after.Size == before.Size && after.Mtime == before.Mtime && after.Ctime == before.Ctime {
			break
		}
		if try == maxCopies {
			return 0, fmt.Errorf("flexv3: heal file %d: the good copy changed during %d copies", ino, try)
		}
	}
	healed := 0
	for j, si := range df.servers {
		if !stale[j] {
			continue
		}
		if err := s.setStale(ctx, ino, df.servers, s.serverID(si), false); err != nil {
			return healed, err
		}
		s.mu.Lock()
		df.stale[j] = false
		s.mu.Unlock()
		healed++
		s.metrics.healed.Inc()
		s.log().Info("flexv3: stale copy healed", "ino", ino, "ds", s.serverID(si), "from", s.serverID(df.servers[good]), "bytes", size)
	}
	return healed, nil
}

// copyData makes the data file dfh a copy of the first size bytes of sfh:
// READ, WRITE UNSTABLE, SETATTR size (which cuts what lies past it), then
// COMMIT.
func (s *Store) copyData(ctx context.Context, src *nfs3.Client, sfh []byte, dst *nfs3.Client, dfh []byte, size uint64) error {
	for off := uint64(0); off < size; {
		want := uint32(min(uint64(s.cfg.IOSize), size-off))
		b, eof, err := src.Read(ctx, sfh, off, want)
		if err != nil {
			return fmt.Errorf("read at %d: %w", off, err)
		}
		for n := 0; n < len(b); {
			res, err := dst.Write(ctx, dfh, off+uint64(n), b[n:], nfs3.UNSTABLE)
			if err != nil {
				return fmt.Errorf("write at %d: %w", off+uint64(n), err)
			}
			if res.Count == 0 {
				return fmt.Errorf("write at %d: no progress", off+uint64(n))
			}
			n += int(res.Count)
		}
		off += uint64(len(b))
		if len(b) == 0 {
			if !eof {
				return fmt.Errorf("read at %d: no progress", off)
			}
			break // shorter than its size now: the rest is zeros, by the SETATTR
		}
	}
	if err := dst.Setattr(ctx, dfh, nfs3.Attrs{Size: &size}); err != nil {
		return fmt.Errorf("set size %d: %w", size, err)
	}
	if _, err := dst.Commit(ctx, dfh, 0, 0); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// probeTimeout bounds probe.
const probeTimeout = 5 * time.Second

// probe checks that server si answers: a GETATTR of its export.
func (s *Store) probe(ctx context.Context, si int) error {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	c, root, err := s.servers[si].client(ctx)
	if err == nil {
		_, err = c.Getattr(ctx, root)
	}
	if err != nil {
		return fmt.Errorf("flexv3: %s does not answer: %w", s.serverID(si), err)
	}
	return nil
}

// unreachableError: a heal did not start because the server of a stale
// copy does not answer.
type unreachableError struct {
	id  string
	err error
}

func (e *unreachableError) Error() string { return e.err.Error() }
func (e *unreachableError) Unwrap() error { return e.err }

// conn is server si's connection.
func (s *Store) conn(ctx context.Context, si int) (*nfs3.Client, error) {
	c, _, err := s.servers[si].client(ctx)
	if err != nil {
		return nil, fmt.Errorf("flexv3: connect to %s: %w", s.serverID(si), err)
	}
	return c, nil
}

// maxHealScan bounds the stripe maps one pass reads, maxHealPass the
// stale files it heals. (A file keeps its map, with no stale copy, once
// healed.)
const (
	maxHealScan = 1 << 14
	maxHealPass = 4096
)

// HealPass heals the stale copies of the files with a stale mark among
// the next maxHealScan stripe maps (after those the last pass read,
// starting over at the end), up to maxHealPass files, and returns how
// many copies it healed. A file that fails is logged and counted, and
// left for the next pass.
func (s *Store) HealPass(ctx context.Context) (int, error) {
	if s.maps == nil {
		return 0, nil
	}
	s.mu.Lock()
	after := s.healAfter
	s.mu.Unlock()
	healed, seen, scanned := 0, 0, 0
	var errs []error
	// Servers found not answering this pass: their stale copies wait for
	// the next pass, with one warning per server.
	down := map[string]bool{}
	for scanned < maxHealScan && seen < maxHealPass {
		ms, err := s.maps.StripeMaps(ctx, after, 256)
		if err != nil {
			return healed, fmt.Errorf("flexv3: heal pass: %w", err)
		}
		if len(ms) == 0 {
			after = 0
			break
		}
		for _, fm := range ms {
			after = fm.Ino
			scanned++
			if len(fm.Map.Stale) == 0 {
				continue
			}
			if slices.ContainsFunc(fm.Map.Stale, func(id string) bool { return down[id] }) {
				continue
			}
			seen++
			n, err := s.Heal(ctx, uint64(fm.Ino))
			healed += n
			var ue *unreachableError
			if errors.As(err, &ue) {
				down[ue.id] = true
				s.metrics.failed.Inc()
				s.log().Warn("flexv3: a data server with stale copies does not answer; the next pass retries", "ds", ue.id, "err", ue.err)
				errs = append(errs, err)
				continue
			}
			if err != nil && !errors.Is(err, fs.ErrNotExist) {
				s.metrics.failed.Inc()
				s.log().Warn("flexv3: heal failed; the next pass retries", "ino", fm.Ino, "err", err)
				errs = append(errs, err)
			}
			if seen >= maxHealPass {
				break
			}
		}
	}
	s.mu.Lock()
	s.healAfter = after
	s.mu.Unlock()
	return healed, errors.Join(errs...)
}

// RunHealer runs heal passes until ctx ends: every interval, and when a
// copy is marked stale.
func (s *Store) RunHealer(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-s.kicks:
		}
		pctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
		if n, err := s.HealPass(pctx); n > 0 || err != nil {
			s.log().Info("flexv3: heal pass", "healed", n, "err", err)
		}
		cancel()
	}
}
