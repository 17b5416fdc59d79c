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
// others cost next to nothing.
func (l *Local) SyncRemoved(inos []uint64) error {
	var subs []uint64
	for _, ino := range inos {
		subs = append(subs, ino&0xff)
	}
	slices.Sort(subs)
	for _, sub := range slices.Compact(subs) {
		d, err := os.Open(l.subdir(sub))
		if err != nil {
			return fmt.Errorf("store: sync removes: %w", err)
		}
		err = d.Sync()
		d.Close()
		if err != nil {
			return fmt.Errorf("store: sync removes in %s: %w", l.subdir(sub), err)
		}
	}
	return nil
}
