package cluster

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/shoalfs/shoal/internal/ctlproto"
	"github.com/shoalfs/shoal/internal/rpc"
	"github.com/shoalfs/shoal/meta"
	"github.com/shoalfs/shoal/pnfs"
)

// Moving a file's data between data servers (drain, rebalance, healing).
//
// Move never lets a reader see a mixture or a hole: the file's layouts are
// recalled and held back first (clients then do their I/O through the
// MDS), the file's I/O through the MDS waits on its shard lock, every
// stripe unit that a data server must newly hold is copied there from a
// good member of the unit's old position, committed, read back and
// compared, and only then does the stripe map switch (replaceMap: one
// metadata transaction that fails if the map changed meanwhile, then
// MAP_CHANGED to the data servers and a layout recall). Copies the new map
// no longer names are removed last; if the MDS dies before that, the
// leftovers are unreferenced objects, never wrong bytes.
//
// A unit is copied to every good member of its new position that is not a
// good member of its old position: a data server that takes a position
// (drain, rebalance, a replaced member) and a stale member being resynced
// alike. The source is a good member of the old position that is in
// service; with none, the move fails rather than switch to copies that
// were never written.

// HoldFunc recalls every layout of file ino and keeps new ones from being
// granted until release is called (server.Server.HoldLayouts).
type HoldFunc func(ctx context.Context, ino uint64) (release func(), err error)

// MoveStats says what one Move copied.
type MoveStats struct {
	Bytes int64 // bytes copied (and verified), counted once per copy written
}

// limiter bounds the bandwidth of a copy: WaitN(n) returns when n more
// bytes may be written (rate.Limiter).
type limiter interface {
	WaitN(ctx context.Context, n int) error
}

// Move changes file ino's stripe map from old to nm (same stripe unit;
// members, positions and stale copies may all change), copying whatever
// has to move. hold may be nil when no client can hold layouts (tests of
// the MDS alone). It fails with meta.ErrConflict if the map is no longer
// old.
func (s *Striped) Move(ctx context.Context, ino uint64, old, nm meta.StripeMap, hold HoldFunc) (MoveStats, error) {
	return s.move(ctx, ino, old, nm, hold, nil)
}

// copyChunk is a range of one stripe unit that some data servers must be
// given.
type copyChunk struct {
	off  uint64
	n    int
	srcs []string // good members of the old position in service, preferred first
	dsts []string // data servers that must newly hold it
	src  string   // the source it was read from
	sum  [32]byte
}

// move is Move, its copies limited by lim if not nil.
func (s *Striped) move(ctx context.Context, ino uint64, old, nm meta.StripeMap, hold HoldFunc, lim limiter) (MoveStats, error) {
	var st MoveStats
	nm.Gen = old.Gen
	if nm.Equal(old) {
		return st, nil
	}
	if nm.Unit != old.Unit {
		return st, fmt.Errorf("cluster: move ino %d: stripe unit %d to %d: %w", ino, old.Unit, nm.Unit, errInval)
	}
	if hold != nil {
		release, err := hold(ctx, ino)
		if err != nil {
			return st, fmt.Errorf("cluster: move ino %d: recalling layouts: %w", ino, err)
		}
		defer release()
	}
	l := &s.moving[ino%uint64(len(s.moving))]
	l.Lock()
	defer l.Unlock()
	current := func() error {
		cur, err := s.maps.StripeMap(ctx, meta.Ino(ino))
		if err != nil {
			return fmt.Errorf("cluster: move ino %d: %w", ino, err)
		}
		if cur.Gen != old.Gen {
			return fmt.Errorf("cluster: move ino %d: map is at generation %d, not %d: %w", ino, cur.Gen, old.Gen, meta.ErrConflict)
		}
		return nil
	}
	if err := current(); err != nil {
		return st, err
	}
	// Writes made through the MDS must be durable where they are before
	// they are copied. (A member that cannot take the commit is marked
	// stale, which changes the map: then this move starts over.)
	if err := s.Sync(ino); err != nil {
		return st, fmt.Errorf("cluster: move ino %d: %w", ino, err)
	}
	if err := current(); err != nil {
		return st, err
	}
	chunks, size, err := s.copyPlan(ctx, ino, old, nm)
	if err != nil {
		return st, fmt.Errorf("cluster: move ino %d: %w", ino, err)
	}
	// A stale copy being resynced is written again from nothing: nobody
	// reads what it holds, and writing over it could trip on its bad
	// blocks or leave its stale bytes past the copied ones.
	var resync []string
	for _, id := range old.Stale {
		if nm.Holds(id) && !nm.IsStale(id) {
			resync = append(resync, id)
		}
	}
	if err := parallel(len(resync), func(i int) error {
		conn, err := s.r.conn(resync[i])
		if err == nil {
			err = objRemove(ctx, conn, ino)
		}
		return err
	}); err != nil {
		return st, fmt.Errorf("cluster: move ino %d: clearing a stale copy: %w", ino, err)
	}
	if err := s.copyChunks(ctx, ino, chunks, lim); err != nil {
		return st, fmt.Errorf("cluster: move ino %d: %w", ino, err)
	}
	for _, c := range chunks {
		st.Bytes += int64(c.n) * int64(len(c.dsts))
	}
	if _, err := s.replaceMap(ctx, ino, old, nm); err != nil {
		return st, fmt.Errorf("cluster: move ino %d: switching its map: %w", ino, err)
	}
	if err := s.dropCopies(ctx, ino, old, nm, size); err != nil {
		// The map no longer names them: what is left there is garbage,
		// not data anyone can read.
		return st, fmt.Errorf("cluster: move ino %d: removing old copies: %w", ino, errors.Join(err, errLeftover))
	}
	return st, nil
}

// inService reports whether data server id can be called now.
func (s *Striped) inService(id string) bool { return s.r.inService(id) }

// copyPlan returns the ranges that must be copied to go from old to nm,
// and the size it covered: the largest object of old's good members in
// service. Every position whose units must be copied needs such a member.
func (s *Striped) copyPlan(ctx context.Context, ino uint64, old, nm meta.StripeMap) ([]copyChunk, uint64, error) {
	live := s.goodInService(old)
	// Which old positions must give units away: with the width unchanged
	// a unit stays at its position, otherwise any may.
	needs := make([]bool, len(old.DataServers))
	for p := range old.DataServers {
		if len(nm.DataServers) != len(old.DataServers) {
			needs[p] = true
			continue
		}
		for _, id := range nm.Good(p) {
			if !old.IsGood(p, id) {
				needs[p] = true
			}
		}
	}
	for p, need := range needs {
		if need && !slices.ContainsFunc(old.Good(p), func(id string) bool { return slices.Contains(live, id) }) {
			return nil, 0, fmt.Errorf("position %d has no good copy in service (members %v, stale %v): %w",
				p, old.Members(p), old.Stale, pnfs.ErrUnavailable)
		}
	}
	size, err := objectsSize(ctx, s.r, ino, live, nil)
	if err != nil {
		return nil, 0, err
	}
	var chunks []copyChunk
	step := min(old.Unit, maxIO)
	for off := uint64(0); off < size; {
		end := min((off/old.Unit+1)*old.Unit, off+step, size)
		from := old.Good(old.Position(off))
		var dsts []string
		for _, id := range nm.Good(nm.Position(off)) {
			if !slices.Contains(from, id) {
				dsts = append(dsts, id)
			}
		}
		if len(dsts) > 0 {
			srcs := slices.DeleteFunc(from, func(id string) bool { return !slices.Contains(live, id) })
			// Spread the reads over the copies.
			k := int(off/old.Unit) % len(srcs)
			srcs = append(srcs[k:], srcs[:k]...)
			chunks = append(chunks, copyChunk{off: off, n: int(end - off), srcs: srcs, dsts: dsts})
		}
		off = end
	}
	return chunks, size, nil
}

// copyChunks copies every chunk from one of its sources to all its
// destinations, commits the destinations, and reads each copy back to
// compare it with what was read.
func (s *Striped) copyChunks(ctx context.Context, ino uint64, chunks []copyChunk, lim limiter) error {
	step := 0
	for _, c := range chunks {
		step = max(step, c.n)
	}
	bufs := sync.Pool{New: func() any { b := make([]byte, step); return &b }}
	w := newCopyWrites()
	err := parallel(len(chunks), func(i int) error {
		c := &chunks[i]
		bp := bufs.Get().(*[]byte)
		defer bufs.Put(bp)
		buf := (*bp)[:c.n]
		var err error
		for _, src := range c.srcs {
			if _, err = readObj(ctx, s.r, ino, src, c.off, buf); err == nil {
				c.src = src
				break
			}
		}
		if err != nil {
			return err
		}
		c.sum = sha256.Sum256(buf)
		for _, dst := range c.dsts {
			if lim != nil {
				if err := lim.WaitN(ctx, c.n); err != nil {
					return err
				}
			}
			if err := writeObj(ctx, s.r, ino, dst, c.off, buf, false, w.note); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("copying: %w", err)
	}
	if err := w.commitAll(ctx, s.r, ino); err != nil {
		return fmt.Errorf("committing copies: %w", err)
	}
	type check struct {
		c   *copyChunk
		dst string
	}
	var checks []check
	for i := range chunks {
		for _, dst := range chunks[i].dsts {
			checks = append(checks, check{&chunks[i], dst})
		}
	}
	err = parallel(len(checks), func(i int) error {
		c, dst := checks[i].c, checks[i].dst
		bp := bufs.Get().(*[]byte)
		defer bufs.Put(bp)
		buf := (*bp)[:c.n]
		if _, err := readObj(ctx, s.r, ino, dst, c.off, buf); err != nil {
			return err
		}
		if sum := sha256.Sum256(buf); !bytes.Equal(sum[:], c.sum[:]) {
			return fmt.Errorf("copy of %d bytes at %d on %s does not match its source on %s", c.n, c.off, dst, c.src)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("verifying: %w", err)
	}
	return nil
}

// copyWrites tracks the boot verifiers that the writes of a copy
// returned, per data server, so that committing them tells whether a data
// server restarted meanwhile and lost some. It is apart from Striped's
// tracking of the writes made through the MDS, whose commits report such a
// loss to clients.
type copyWrites struct {
	mu   sync.Mutex
	verf map[string][8]byte
	lost map[string]bool
}

func newCopyWrites() *copyWrites {
	return &copyWrites{verf: map[string][8]byte{}, lost: map[string]bool{}}
}

// note records the verifier of a write to data server id.
func (w *copyWrites) note(id string, v [8]byte) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if prev, ok := w.verf[id]; ok && prev != v {
		w.lost[id] = true
	}
	w.verf[id] = v
}

// commitAll commits ino on every data server written to, and fails with
// pnfs.ErrDataLost if one restarted since a write.
func (w *copyWrites) commitAll(ctx context.Context, r *Registry, ino uint64) error {
	w.mu.Lock()
	ids := make([]string, 0, len(w.verf))
	for id := range w.verf {
		ids = append(ids, id)
	}
	w.mu.Unlock()
	return parallel(len(ids), func(i int) error {
		id := ids[i]
		conn, err := r.conn(id)
		if err != nil {
			return err
		}
		var res ctlproto.CtlCommitRes
		if err := call(ctx, conn, ctlproto.CTLPROC_OBJ_COMMIT, &ctlproto.CtlInoArgs{Ino: ino}, &res); err != nil {
			return fmt.Errorf("cluster: commit ino %d on %s: %w", ino, id, err)
		}
		if err := errOf(res.Status); err != nil {
			return fmt.Errorf("cluster: commit ino %d on %s: %w", ino, id, err)
		}
		w.mu.Lock()
		defer w.mu.Unlock()
		if w.lost[id] || w.verf[id] != *res.Verifier {
			return fmt.Errorf("%w (data server %s restarted during the copy)", pnfs.ErrDataLost, id)
		}
		return nil
	})
}

// dropCopies removes what old's members hold that nm no longer has them
// hold: the objects of data servers nm does not name, and the units of
// the others at positions they left. Data servers that are down for good
// (removed, or out of service past DownAfter) are skipped: they are not
// asked, and what they hold is unreferenced.
func (s *Striped) dropCopies(ctx context.Context, ino uint64, old, nm meta.StripeMap, size uint64) error {
	type punch struct {
		id       string
		off, len uint64
	}
	var gone []string
	for _, id := range old.All() {
		if !nm.Holds(id) {
			gone = append(gone, id)
		}
	}
	var punches []punch
	last := map[string]int{} // id -> its last punch, to merge adjacent ones
	for off := uint64(0); off < size; {
		end := min((off/old.Unit+1)*old.Unit, size)
		now := nm.Members(nm.Position(off))
		for _, id := range old.Members(old.Position(off)) {
			if slices.Contains(now, id) || !nm.Holds(id) {
				continue
			}
			if i, ok := last[id]; ok && punches[i].off+punches[i].len == off {
				punches[i].len += end - off
				continue
			}
			last[id] = len(punches)
			punches = append(punches, punch{id: id, off: off, len: end - off})
		}
		off = end
	}
	skip := func(id string) (*rpc.Conn, bool, error) {
		conn, err := s.r.conn(id)
		if err != nil && errors.Is(err, pnfs.ErrDataServerDown) {
			s.r.log.Info("cluster: not removing copies from a data server that is down", "ino", ino, "ds", id)
			return nil, true, nil
		}
		return conn, false, err
	}
	err := parallel(len(gone), func(i int) error {
		conn, skipped, err := skip(gone[i])
		if err == nil && !skipped {
			err = objRemove(ctx, conn, ino)
		}
		return err
	})
	return errors.Join(err, parallel(len(punches), func(i int) error {
		conn, skipped, err := skip(punches[i].id)
		if err == nil && !skipped {
			err = objPunch(ctx, conn, ino, punches[i].off, punches[i].len)
		}
		return err
	}))
}

// errLeftover marks a Move whose map switched but whose old objects were
// not all removed.
var errLeftover = errors.New("cluster: old objects left behind")

func objPunch(ctx context.Context, conn *rpc.Conn, ino, off, length uint64) error {
	var res ctlproto.CtlStatusRes
	if err := call(ctx, conn, ctlproto.CTLPROC_OBJ_PUNCH, &ctlproto.CtlPunchArgs{Ino: ino, Offset: off, Length: length}, &res); err != nil {
		return err
	}
	return errOf(res.Status)
}
