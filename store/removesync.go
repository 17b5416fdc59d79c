//go:build linux

package store

import (
	"fmt"
	"os"
	"slices"
)

// RemoveSyncer is implemented by backends whose Remove is not durable
// when it returns: a local file system commits an unlink with its next
// journal commit, and a machine crash before it brings the data file
// back. A caller that records elsewhere that the data is gone (the
// metadata server frees the inode of an unlinked file) calls SyncRemoved
// in between, or a crash could leave data that no inode owns.
type RemoveSyncer interface {
	// SyncRemoved makes the Removes of inos that have returned durable.
	SyncRemoved(inos []uint64) error
}

var _ RemoveSyncer = (*Local)(nil)

// SyncRemoved fsyncs the folder of each of inos once: on ext4 and XFS
// the first fsync commits the journal with every unlink in it, so the
// others cost next to nothing. A folder in which Remove has unlinked
// nothing since its last fsync here is skipped: a Remove that found no
// file (a small file whose bytes were all kept by the metadata server)
// has nothing to make durable, and the open and fsync of its folder were
// about a sixth of an async metadata server's CPU per remove of an empty
// file.
func (l *Local) SyncRemoved(inos []uint64) error {
	var subs []uint64
	for _, ino := range inos {
		subs = append(subs, ino&0xff)
	}
	slices.Sort(subs)
	for _, sub := range slices.Compact(subs) {
		// The count is taken before the fsync: an unlink made after it
		// is not known to be covered, and one made before is. A
		// concurrent SyncRemoved whose fsync is still running has not
		// raised synced yet, so this one does not skip the folder.
		l.mu.Lock()
		target := l.removed[sub]
		done := l.synced[sub] >= target
		l.mu.Unlock()
		if done {
			continue
		}
		d, err := os.Open(l.subdir(sub))
		if err != nil {
			return fmt.Errorf("store: sync removes: %w", err)
		}
		err = d.Sync()
		d.Close()
		if err != nil {
			return fmt.Errorf("store: sync removes in %s: %w", l.subdir(sub), err)
		}
		l.mu.Lock()
		l.synced[sub] = max(l.synced[sub], target)
		l.mu.Unlock()
	}
	return nil
}
