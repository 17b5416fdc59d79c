package cluster

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/shoalfs/shoal/internal/ctlproto"
	"github.com/shoalfs/shoal/internal/rpc"
	"github.com/shoalfs/shoal/meta"
)

// Scrub (`shoal admin scrub`): a job that checks every copy of every
// replicated file and repairs the bad ones.
//
// Each stripe position's units are checked a chunk at a time (scrubChunk
// bytes, aligned, never across a unit): every good member in service
// sums the chunk with OBJ_SUM, reading it through its block checksums. A
// copy is bad when its data server answers CTL_ERR_CORRUPT (a block failed
// its checksum), or when its sum differs from the one most of the sound
// copies agree on (the first member's, on a tie). The file's bad chunks
// are then checked again under the file's layout hold and move lock, so
// that no write is in flight, and each bad copy that is still bad is
// rewritten whole from a sound one, committed, and summed again. A copy
// that cannot be repaired is marked stale, so healing resyncs it. Nothing
// is repaired from a chunk no sound copy has.

// scrubChunk is the size of the ranges scrub sums and repairs: one copy
// call, and a whole number of blocks of any data server's store.
const scrubChunk = maxIO

// ScrubFinding is a bad copy of a chunk of a file.
type ScrubFinding struct {
	Ino    uint64 `json:"ino"`
	Offset uint64 `json:"offset"`
	Length uint64 `json:"length"`
	DS     string `json:"ds"`
	// Problem is "corrupt" (the copy failed its block checksums) or
	// "differs" (it disagrees with the sound copies).
	Problem  string `json:"problem"`
	Repaired bool   `json:"repaired"`
	Err      string `json:"error,omitempty"` // why it was not repaired
}

// ScrubTotals counts what scrubs checked and found since the MDS started.
type ScrubTotals struct {
	Files    int64 `json:"files"`
	Chunks   int64 `json:"chunks"`
	Bad      int64 `json:"bad"`
	Repaired int64 `json:"repaired"`
}

// runScrub scrubs every replicated file for job j.
func (a *Admin) runScrub(ctx context.Context, j *Job) ([]error, error) {
	var failures []error
	err := a.cfg.Striped.eachMap(ctx, func(fm meta.FileStripeMap) bool {
		if fm.Map.Mirrors() < 2 {
			return true
		}
		a.mu.Lock()
		j.Files++
		a.scrub.Files++
		a.mu.Unlock()
		err := a.scrubFile(ctx, j, uint64(fm.Ino), fm.Map)
		if err != nil && ctx.Err() == nil && !errors.Is(err, meta.ErrNotFound) && !errors.Is(err, meta.ErrStale) {
			a.mu.Lock()
			j.Failed++
			failures = append(failures, err)
			a.mu.Unlock()
			a.log.Warn("cluster: could not scrub a file", "ino", fm.Ino, "err", err)
		}
		return true
	})
	return failures, err
}

// sumVerdict is what the copies of one chunk say.
type sumVerdict struct {
	ref    string // a sound copy with the agreed sum; "" if none
	sum    [32]byte
	bad    []string // copies that are corrupt or differ
	reason []string // "corrupt" or "differs", per bad copy
	errs   []error  // copies that could not be asked
}

// scrubFile checks every chunk of file ino (map m) and repairs the bad
// copies.
func (a *Admin) scrubFile(ctx context.Context, j *Job, ino uint64, m meta.StripeMap) error {
	s := a.cfg.Striped
	size, err := objectsSize(ctx, s.r, ino, s.goodInService(m), nil)
	if err != nil {
		return fmt.Errorf("cluster: scrub ino %d: %w", ino, err)
	}
	var suspect []uint64
	var unchecked []error
	for off := uint64(0); off < size && ctx.Err() == nil; {
		end := scrubEnd(m, off, size)
		members := slices.DeleteFunc(m.Good(m.Position(off)), func(id string) bool { return !s.inService(id) })
		v := s.sumChunk(ctx, ino, members, off, int(end-off))
		a.mu.Lock()
		j.Chunks++
		a.scrub.Chunks++
		a.mu.Unlock()
		unchecked = append(unchecked, v.errs...)
		if len(v.bad) > 0 {
			suspect = append(suspect, off)
		}
		off = end
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(suspect) > 0 {
		if err := a.repair(ctx, j, ino, suspect); err != nil {
			return err
		}
	}
	if len(unchecked) > 0 {
		return fmt.Errorf("cluster: scrub ino %d: %d copies of chunks could not be checked: %w", ino, len(unchecked), unchecked[0])
	}
	return nil
}

// scrubEnd returns the end of the chunk of a file of size bytes that
// starts at off.
func scrubEnd(m meta.StripeMap, off, size uint64) uint64 {
	return min((off/scrubChunk+1)*scrubChunk, (off/m.Unit+1)*m.Unit, size)
}

// goodInService returns m's good members in service, each once.
func (s *Striped) goodInService(m meta.StripeMap) []string {
	var out []string
	for p := range m.DataServers {
		for _, id := range m.Good(p) {
			if !slices.Contains(out, id) && s.inService(id) {
				out = append(out, id)
			}
		}
	}
	return out
}

// scrubFix is the repair of one bad copy of a chunk.
type scrubFix struct {
	f    ScrubFinding
	ref  string   // the sound copy to repair it from
	sum  [32]byte // its sum
	size uint64   // the file's size, as its objects say
	unit uint64   // the file's stripe unit
}

// repair checks the chunks starting at offs again under ino's layout hold
// and move lock, and rewrites the copies that are still bad from a sound
// one.
func (a *Admin) repair(ctx context.Context, j *Job, ino uint64, offs []uint64) error {
	s := a.cfg.Striped
	if a.cfg.Hold != nil {
		release, err := a.cfg.Hold(ctx, ino)
		if err != nil {
			return fmt.Errorf("cluster: scrub ino %d: recalling layouts: %w", ino, err)
		}
		defer release()
	}
	l := &s.moving[ino%uint64(len(s.moving))]
	l.Lock()
	defer l.Unlock()
	if err := s.Sync(ino); err != nil {
		return fmt.Errorf("cluster: scrub ino %d: %w", ino, err)
	}
	s.forget(ino)
	m, ok, err := s.Map(ctx, ino)
	if err != nil || !ok {
		return err
	}
	size, err := objectsSize(ctx, s.r, ino, s.goodInService(m), nil)
	if err != nil {
		return fmt.Errorf("cluster: scrub ino %d: %w", ino, err)
	}
	var fixes []scrubFix
	for _, off := range offs {
		if off >= size {
			continue // truncated meanwhile
		}
		end := scrubEnd(m, off, size)
		members := slices.DeleteFunc(m.Good(m.Position(off)), func(id string) bool { return !s.inService(id) })
		v := s.sumChunk(ctx, ino, members, off, int(end-off))
		for i, id := range v.bad {
			fixes = append(fixes, scrubFix{
				f:   ScrubFinding{Ino: ino, Offset: off, Length: end - off, DS: id, Problem: v.reason[i]},
				ref: v.ref, sum: v.sum, size: size, unit: m.Unit,
			})
		}
	}
	w := newCopyWrites()
	var mu sync.Mutex
	var bytes int64
	_ = parallel(len(fixes), func(i int) error {
		n, err := s.rewrite(ctx, ino, &fixes[i], w)
		if err != nil {
			fixes[i].f.Err = err.Error()
			return nil
		}
		mu.Lock()
		bytes += n
		mu.Unlock()
		return nil
	})
	if err := w.commitAll(ctx, s.r, ino); err != nil {
		for i := range fixes {
			if fixes[i].f.Err == "" {
				fixes[i].f.Err = "committing: " + err.Error()
			}
		}
	}
	_ = parallel(len(fixes), func(i int) error {
		f := &fixes[i]
		if f.f.Err != "" {
			return nil
		}
		conn, err := s.r.conn(f.f.DS)
		if err != nil {
			f.f.Err = err.Error()
			return nil
		}
		sum, corrupt, err := objSum(ctx, conn, ino, f.f.Offset, int(f.f.Length))
		switch {
		case err != nil:
			f.f.Err = "checking the repair: " + err.Error()
		case corrupt:
			f.f.Err = "still corrupt after the repair"
		case sum != f.sum:
			f.f.Err = "still differs after the repair"
		default:
			f.f.Repaired = true
		}
		return nil
	})
	// A copy that could not be repaired from a sound one is stale:
	// healing rewrites it whole (or replaces it).
	var stale []string
	for _, f := range fixes {
		if !f.f.Repaired && f.ref != "" && !slices.Contains(stale, f.f.DS) {
			stale = append(stale, f.f.DS)
		}
	}
	for _, id := range stale {
		if _, err := s.markStale(ctx, ino, id); err != nil {
			a.log.Warn("cluster: scrub could not mark a bad copy stale", "ino", ino, "ds", id, "err", err)
		} else {
			a.Kick()
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	j.Bytes += bytes
	for _, f := range fixes {
		j.Bad++
		a.scrub.Bad++
		if f.f.Repaired {
			j.Repaired++
			a.scrub.Repaired++
		}
		if len(j.Findings) < maxListed {
			j.Findings = append(j.Findings, f.f)
		}
		a.log.Warn("cluster: scrub found a bad copy", "ino", ino, "offset", f.f.Offset, "length", f.f.Length, "ds", f.f.DS,
			"problem", f.f.Problem, "repaired", f.f.Repaired, "err", f.f.Err)
	}
	return nil
}

// rewrite writes fix's chunk over its bad copy from the sound one and
// returns the bytes written. The write covers whole blocks, so that the
// data server need not read (and trip on) what is there: a chunk that
// ends with the file mid-block is padded with zeros to the next chunk
// boundary (in the same stripe unit) and the copy truncated back to the
// file's size.
func (s *Striped) rewrite(ctx context.Context, ino uint64, fix *scrubFix, w *copyWrites) (int64, error) {
	f := &fix.f
	if fix.ref == "" {
		return 0, errors.New("no sound copy to repair it from")
	}
	end := f.Offset + f.Length
	wend := end
	if end == fix.size && end%scrubChunk != 0 {
		wend = min((f.Offset/scrubChunk+1)*scrubChunk, (f.Offset/fix.unit+1)*fix.unit)
	}
	buf := make([]byte, wend-f.Offset)
	if _, err := readObj(ctx, s.r, ino, fix.ref, f.Offset, buf[:f.Length]); err != nil {
		return 0, err
	}
	if sha256.Sum256(buf[:f.Length]) != fix.sum {
		return 0, fmt.Errorf("its source on %s changed while being read", fix.ref)
	}
	if err := writeObj(ctx, s.r, ino, f.DS, f.Offset, buf, false, w.note); err != nil {
		return 0, err
	}
	if wend > end {
		conn, err := s.r.conn(f.DS)
		if err != nil {
			return 0, err
		}
		var res ctlproto.CtlStatusRes
		if err := call(ctx, conn, ctlproto.CTLPROC_OBJ_TRUNCATE, &ctlproto.CtlTruncateArgs{Ino: ino, Size: fix.size}, &res); err != nil {
			return 0, err
		}
		if err := errOf(res.Status); err != nil {
			return 0, fmt.Errorf("truncating the copy back to %d: %w", fix.size, err)
		}
	}
	return int64(f.Length), nil
}

// sumChunk asks every one of members for the sum of [off, off+n) of ino
// and judges their copies.
func (s *Striped) sumChunk(ctx context.Context, ino uint64, members []string, off uint64, n int) sumVerdict {
	type answer struct {
		sum     [32]byte
		corrupt bool
		err     error
	}
	answers := make([]answer, len(members))
	_ = parallel(len(members), func(i int) error {
		conn, err := s.r.conn(members[i])
		if err == nil {
			answers[i].sum, answers[i].corrupt, err = objSum(ctx, conn, ino, off, n)
		}
		if err != nil {
			answers[i].err = fmt.Errorf("cluster: sum of ino %d at %d on %s: %w", ino, off, members[i], err)
		}
		return nil
	})
	var v sumVerdict
	// The sum most sound copies agree on; the first member's on a tie.
	best := 0
	for i, x := range answers {
		if x.err != nil || x.corrupt {
			continue
		}
		votes := 0
		for _, y := range answers {
			if y.err == nil && !y.corrupt && y.sum == x.sum {
				votes++
			}
		}
		if votes > best {
			best, v.ref, v.sum = votes, members[i], x.sum
		}
	}
	for i, x := range answers {
		switch {
		case x.err != nil:
			v.errs = append(v.errs, x.err)
		case x.corrupt:
			v.bad, v.reason = append(v.bad, members[i]), append(v.reason, "corrupt")
		case x.sum != v.sum:
			v.bad, v.reason = append(v.bad, members[i]), append(v.reason, "differs")
		}
	}
	return v
}

// objSum returns the SHA-256 of [off, off+n) of ino's object on conn's
// data server (zeros where it holds nothing), and whether the data server
// found the range corrupt.
func objSum(ctx context.Context, conn *rpc.Conn, ino, off uint64, n int) (sum [32]byte, corrupt bool, err error) {
	var res ctlproto.CtlSumRes
	if err := call(ctx, conn, ctlproto.CTLPROC_OBJ_SUM, &ctlproto.CtlSumArgs{Ino: ino, Offset: off, Length: uint64(n)}, &res); err != nil {
		return sum, false, err
	}
	switch res.Status {
	case ctlproto.CTL_OK:
		return res.Ok.Sha256, false, nil
	case ctlproto.CTL_ERR_CORRUPT:
		return sum, true, nil
	case ctlproto.CTL_ERR_NOENT:
		// No object: zeros.
		return sha256.Sum256(make([]byte, n)), false, nil
	}
	return sum, false, errOf(res.Status)
}
