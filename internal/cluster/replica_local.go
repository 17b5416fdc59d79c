package cluster

import (
	"github.com/shoalfs/shoal/store"
)

// LocalCopy returns the backend for I/O a client addresses to this data
// server's copy alone: a flexfiles layout's client writes every copy of a
// stripe unit itself (RFC 8435 mirrors), so this data server writes only
// its own copy and forwards nothing. It keeps ReplicaStore's rules of
// membership: a data server that holds no good copy of a range refuses it
// with pnfs.ErrNotMember (the client reports the error and asks for a new
// layout), and reads are checked as ReplicaStore's.
func (s *ReplicaStore) LocalCopy() store.Backend { return localCopy{s} }

// localCopy is ReplicaStore.LocalCopy.
type localCopy struct{ s *ReplicaStore }

var _ store.Backend = localCopy{}

func (l localCopy) Open(ino uint64, create bool) (store.File, error) {
	f, err := l.s.Open(ino, create)
	if err != nil {
		return nil, err
	}
	return &localCopyFile{replicaFile: f.(*replicaFile)}, nil
}

func (l localCopy) Remove(ino uint64) error                { return l.s.Remove(ino) }
func (l localCopy) Truncate(ino uint64, size uint64) error { return l.s.Truncate(ino, size) }

// Sync makes this copy durable; peers are the client's to commit.
func (l localCopy) Sync(ino uint64) error { return l.s.local.Sync(ino) }

func (l localCopy) StatFS() (total, free, avail uint64, err error) { return l.s.local.StatFS() }
func (l localCopy) Close() error                                   { return nil }

// localCopyFile is a replicaFile whose writes and syncs stay local.
type localCopyFile struct {
	*replicaFile
}

// WriteAt writes p to this copy only, after checking that this data
// server is a good member of every unit the range touches.
func (f *localCopyFile) WriteAt(p []byte, off int64) (int, error) {
	if err := f.checkWrite(p, off); err != nil {
		return 0, err
	}
	if len(p) == 0 {
		return f.File.WriteAt(p, off)
	}
	if err := f.checkMember("write", off, len(p)); err != nil {
		return 0, err
	}
	n, err := f.s.writeLocal(f.ino, f.File, p, uint64(off))
	f.s.a.stats.clientWriteBytes.Add(uint64(n))
	return n, err
}

// Sync syncs this copy only.
func (f *localCopyFile) Sync() error {
	if err := f.check(); err != nil {
		return err
	}
	return f.File.Sync()
}
