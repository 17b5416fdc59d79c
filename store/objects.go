package store

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
)

// ObjectLister is implemented by backends that can list the data objects
// they hold and remove one where it lies. The metadata server's sweep of
// objects no file owns (left by creates a machine crash took back: see
// meta.SweepMark) needs both: such an object has no stripe map or other
// record to find it by, only its name.
type ObjectLister interface {
	// ListObjects calls fn with the inode numbers of the objects the
	// backend holds, a batch at a time, each batch with the place that
	// holds it: "" for a local store, a data server's ID for
	// cluster.Striped. It stops at fn's first error and returns it. A
	// place it could not list (a data server out of service) does not
	// stop the others; the error then names it, so the caller knows the
	// listing was not complete.
	ListObjects(ctx context.Context, fn func(place string, inos []uint64) error) error
	// RemoveObject removes the object of ino at place, and there only.
	// A missing object is not an error.
	RemoveObject(ctx context.Context, place string, ino uint64) error
}

var _ ObjectLister = (*Local)(nil)

// ListPage is the most objects one ListObjects batch of Local holds.
const ListPage = 1024

// ListObjects implements ObjectLister: the objects of the local store,
// under the place "", a page (ListPage) at a time.
func (l *Local) ListObjects(ctx context.Context, fn func(place string, inos []uint64) error) error {
	var after uint64
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		inos, eof, err := l.Page(after, ListPage)
		if err != nil {
			return err
		}
		if len(inos) > 0 {
			if err := fn("", inos); err != nil {
				return err
			}
			after = inos[len(inos)-1]
		}
		if eof {
			return nil
		}
	}
}

// RemoveObject implements ObjectLister: Remove.
func (l *Local) RemoveObject(_ context.Context, place string, ino uint64) error {
	if place != "" {
		return fmt.Errorf("store: remove object %d at %q: a local store has no places", ino, place)
	}
	return l.Remove(ino)
}

// Page returns up to max objects of the store that come after the object
// after in the store's listing order, and whether there are no more (a
// data server's OBJ_LIST). after 0 starts the listing. The order is by
// folder (the low byte of the number, Local layout), then by number, so
// that a page reads whole folders and a listing reads each folder about
// once: pages stay cheap in a store of millions of objects, which one
// sorted order over all folders would not allow. Objects created or
// removed during a listing may or may not be listed.
func (l *Local) Page(after uint64, max int) (inos []uint64, eof bool, err error) {
	if max <= 0 {
		return nil, false, fmt.Errorf("store: list page of %d objects", max)
	}
	start := int(after & 0xff)
	for sub := start; sub < 256; sub++ {
		ents, err := os.ReadDir(filepath.Join(l.root, fmt.Sprintf("%02x", sub)))
		if err != nil {
			return nil, false, fmt.Errorf("store: list: %w", err)
		}
		var in []uint64
		for _, de := range ents {
			if !de.Type().IsRegular() || !isObjectName(de.Name(), sub) {
				continue
			}
			ino, _ := strconv.ParseUint(de.Name(), 10, 64)
			if sub == start && ino <= after {
				continue
			}
			in = append(in, ino)
		}
		slices.Sort(in)
		if room := max - len(inos); len(in) > room {
			return append(inos, in[:room]...), false, nil
		}
		inos = append(inos, in...)
		if len(inos) == max && sub < 255 {
			return inos, false, nil
		}
	}
	return inos, true, nil
}

// RemoveLocal removes the object ino (and its checksum sidecar) from the
// store NewLocal(dir) would open, without opening it, and syncs its
// folder: for the offline repair of a stopped server's directory
// (`shoal admin fsck --repair`). A missing object is not an error.
func RemoveLocal(dir string, ino uint64) error {
	sub := filepath.Join(dir, "data", fmt.Sprintf("%02x", ino&0xff))
	name := filepath.Join(sub, strconv.FormatUint(ino, 10))
	for _, p := range []string{name + sidecarExt, name} {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("store: remove %d: %w", ino, err)
		}
	}
	d, err := os.Open(sub)
	if err != nil {
		return fmt.Errorf("store: remove %d: %w", ino, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("store: remove %d: sync folder: %w", ino, err)
	}
	return nil
}
