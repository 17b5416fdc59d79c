package meta

import (
	"context"
	"errors"
)

// OrphanState is what a server's orphan freer needs to know of an orphan
// before it frees it (OrphanStates).
type OrphanState struct {
	// Gone: no such inode any more (freed already).
	Gone bool
	// Nlink is the inode's link count: 0 for an orphan.
	Nlink uint32
	// Placed: the inode has a stripe map, so data on data servers may
	// need removing; without one its data, if any, is inline and goes
	// with the inode.
	Placed bool
}

// OrphanStater is an Engine that reads the states of many orphans in one
// read transaction: the orphan freer's check of a batch, instead of two
// reads per file (its attributes, then its stripe map).
type OrphanStater interface {
	OrphanStates(ctx context.Context, inos []Ino) ([]OrphanState, error)
}

var _ OrphanStater = (*kvEngine)(nil)

// OrphanStates returns the state of each of inos, in order.
func (e *kvEngine) OrphanStates(ctx context.Context, inos []Ino) ([]OrphanState, error) {
	out := make([]OrphanState, len(inos))
	err := e.view(ctx, func(x *tx) error {
		for i, ino := range inos {
			n, err := x.inode(ino)
			if errors.Is(err, ErrStale) {
				out[i] = OrphanState{Gone: true}
				continue
			}
			if err != nil {
				return err
			}
			v, err := x.t.Get(stripeKey(ino))
			if err != nil {
				return err
			}
			out[i] = OrphanState{Nlink: n.Nlink, Placed: v != nil}
		}
		return nil
	})
	return out, err
}
