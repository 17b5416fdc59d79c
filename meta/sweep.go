package meta

import (
	"context"
	"errors"
	"fmt"
)

// Sweeping data objects nobody owns.
//
// A create answered before it was durable (Deferred: a server with
// sync: false) that a machine crash then took back can leave its file's
// data behind: the client wrote data to the new file (a data object named
// by its inode number, on the local store or on data servers) in the
// interval whose log records the crash lost. No namespace refers to the
// object, so it does no harm, but its space would be lost for good. The
// metadata server sweeps such objects away after an unclean start
// (server/sweep.go), and Check reports them (unreferenced-data-object).
//
// The engine tells the sweep when and how far to look with the sweep
// mark: opening a database whose last run did not Close (log files
// present) advances the inode counter past every number the lost records
// could have allocated (walKV.inoGap) and, in the same durable
// transaction, records the new counter as the mark. Every data object a
// lost create can have left has a number below it, and since the counter
// never goes back, no inode with a number below the mark is created after
// the open. So, once the mark is set, a data object whose number is below
// it and that no regular file owns in any snapshot read after the open
// is owned by nobody for good, whatever the server does meanwhile: the
// sweep can remove it without racing a create in flight (those allocate
// numbers at or above the mark). The mark stays until a sweep that
// listed every object (ClearSweepMark), so a sweep cut short by a
// shutdown or a data server that was down is redone at the next start,
// and a later unclean open raises it.

// sweepMarkKey is the configuration key of the sweep mark: the inode
// counter right after the last unclean open, 8 bytes big-endian.
const sweepMarkKey = "sweep-below"

// SweepMark returns the sweep mark: ok is false if no sweep is pending.
// Data objects with numbers below the mark that no regular file owns are
// left by changes a crash took back (see Unowned).
func SweepMark(ctx context.Context, e Engine) (below Ino, ok bool, err error) {
	v, err := e.GetConfig(ctx, sweepMarkKey)
	switch {
	case errors.Is(err, ErrNotFound):
		return 0, false, nil
	case err != nil:
		return 0, false, fmt.Errorf("meta: sweep mark: %w", err)
	case len(v) != 8:
		return 0, false, fmt.Errorf("meta: sweep mark is %d bytes, not 8", len(v))
	}
	return Ino(be.Uint64(v)), true, nil
}

// ClearSweepMark removes the sweep mark once a sweep below below has
// listed every data object; it leaves a mark that is not below (set by
// an open after the sweep read it) in place.
func ClearSweepMark(ctx context.Context, e Engine, below Ino) error {
	k, ok := e.(*kvEngine)
	if !ok {
		return fmt.Errorf("meta: clear sweep mark: engine %T is not one of this package's", e)
	}
	return k.update(Durable(ctx), func(x *tx) error {
		v, err := x.t.Get(configKey(sweepMarkKey))
		if err != nil || v == nil {
			return err
		}
		if len(v) == 8 && Ino(be.Uint64(v)) != below {
			return nil
		}
		return x.t.Delete(configKey(sweepMarkKey))
	})
}

// markSweep records the sweep mark in x: the inode counter next, after an
// unclean open skipped numbers (skipInodes). A mark already there is
// below next (the counter only grows), so next covers what it covered.
func (x *tx) markSweep(next uint64) error {
	return x.t.Put(configKey(sweepMarkKey), be.AppendUint64(nil, next))
}

// Unowned returns those of inos that no regular file owns: no inode has
// the number, or the inode is not a regular file (which never has a data
// object). It reads them all in one snapshot; orphans (unlinked files
// still open or not freed yet) own their data. An inode record that does
// not decode counts as owning its data: a sweep must never remove data on
// a guess.
//
// A number that is not owned in a snapshot read at some moment is never
// owned again if it was allocated before that moment, because inode
// numbers are never handed out twice; the caller makes sure of the
// "allocated before" (the sweep mark, or the inode counter read before
// the objects were listed: StatFS.NextIno).
func Unowned(ctx context.Context, e Engine, inos []Ino) ([]Ino, error) {
	k, ok := e.(*kvEngine)
	if !ok {
		return nil, fmt.Errorf("meta: unowned: engine %T is not one of this package's", e)
	}
	var out []Ino
	err := k.view(ctx, func(x *tx) error {
		out = out[:0]
		keys := make([][]byte, len(inos))
		for i, ino := range inos {
			keys[i] = inodeKey(ino)
		}
		vals, err := getMany(x.t, keys)
		if err != nil {
			return err
		}
		for i, v := range vals {
			if v == nil {
				out = append(out, inos[i])
				continue
			}
			n, err := decodeInode(v)
			if err == nil && n.Type != TypeRegular {
				out = append(out, inos[i])
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("meta: unowned: %w", err)
	}
	return out, nil
}
