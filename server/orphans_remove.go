package server

import (
	"sync"

	"github.com/shoalfs/shoal/meta"
	"github.com/shoalfs/shoal/server/internal/state"
)

// Freeing a removed file in the REMOVE itself.
//
// A REMOVE that drops a regular file's last link records an orphan, and
// the freer deletes its inode (and data) a moment later in a transaction
// of its own (orphans.go). When the file has no data outside the engine
// and nobody holds it open, that second step has nothing to wait for:
// the REMOVE then asks the engine to delete the inode in its own
// transaction (meta.FreeUnlinked), which spares the orphan record, the
// inode rewritten with no links, and the freer's transaction, about a
// tenth of an async `shoal serve`'s CPU per REMOVE of an empty file
// (docs/benchmarks.md, "Removes, fourth pass").
//
// The open check and the commit happen under the file's orphan stripe
// lock, the lock every free and every OPEN's registration takes
// (orphans.go): an OPEN that registered first is seen by the check (and
// the REMOVE records an orphan as usual); one that registers after finds
// gen changed, reads the file's attributes and backs out on ErrStale,
// exactly as after a free by the freer. Whether the file has data is the
// data store's answer (store.Local.NoData, on `shoal serve`): a store that
// cannot tell, or a file it made a data file for, takes the orphan way.
// A data file made after the check (a WRITE under the anonymous stateid
// that resolved the filehandle before the REMOVE) is found by a second
// look after the commit and handed to the freer, which removes data of
// inodes already gone (removeData) once the REMOVE is durable.

// noDataStore is a data store that knows which files have no data
// (store.Local after NoDataFrom).
type noDataStore interface {
	NoData(ino uint64) bool
}

// removeFree is a REMOVE's free of its file in the engine's transaction,
// between freeAtRemove and done; it holds the file's stripe lock.
type removeFree struct {
	o *orphanSet
	l *sync.Mutex
	f meta.FreeUnlinked
}

// freeAtRemove returns a removeFree, with the stripe lock of the file t
// names held, if the REMOVE of its last link may delete its inode in its own
// transaction: a regular file with one link, not open, outside the
// grace period, without data in the data store. Otherwise nil: the
// REMOVE records an orphan as before.
func (o *orphanSet) freeAtRemove(t *target) *removeFree {
	if o == nil {
		return nil
	}
	ds, ok := o.s.data.(noDataStore)
	if !ok {
		return nil
	}
	nd, err := t.node() // looked up already unless delegations are off
	if err != nil || nd.Attr.Type != meta.TypeRegular || nd.Attr.Nlink != 1 || !ds.NoData(uint64(nd.Ino)) {
		return nil
	}
	l := o.stripe(nd.Ino)
	l.Lock()
	m := o.s.st.m
	if m.InGrace() || m.HasOpen(state.FileID(nd.Ino)) {
		l.Unlock()
		return nil
	}
	return &removeFree{o: o, l: l, f: meta.FreeUnlinked{Ino: nd.Ino}}
}

// done ends the free after the engine's Remove returned err, and
// releases the stripe lock. It reports whether the engine freed the
// inode; if not, the REMOVE goes on as for any other (released).
func (r *removeFree) done(err error) bool {
	freed := err == nil && r.f.Freed
	if freed {
		r.o.s.cache.forget(r.f.Ino)
		r.o.gen.Add(1) // OPENs in flight re-read the file (openGuard)
	}
	r.l.Unlock()
	if freed {
		if ds, ok := r.o.s.data.(noDataStore); ok && !ds.NoData(uint64(r.f.Ino)) {
			// A data file was made since the check: the freer removes
			// it (the inode is gone already, which it takes in its
			// stride) once this REMOVE is durable.
			r.o.orphaned(r.f.Ino)
		}
	}
	return freed
}
