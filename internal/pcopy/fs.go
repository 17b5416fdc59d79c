package pcopy

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shoalfs/shoal/client"
)

// Type is the kind of a file system object, as far as copying cares.
type Type uint8

const (
	TypeFile Type = iota
	TypeDir
	TypeSymlink
	TypeOther // devices, FIFOs, sockets: copied only by an archive copy (Info.Special)
)

func (t Type) String() string {
	switch t {
	case TypeFile:
		return "file"
	case TypeDir:
		return "directory"
	case TypeSymlink:
		return "symlink"
	}
	return "special file"
}

// Info describes one object of a source or destination tree.
type Info struct {
	Name  string // base name (ReadDir only)
	Type  Type
	Perm  uint32 // permission bits plus setuid/setgid/sticky (07777)
	Size  int64
	Mtime time.Time

	// What an archive copy (Options.Archive) keeps besides the above.
	UID, GID uint32
	// Nlink and ID find hard links: two regular files of one side with
	// the same ID are the same file. ID is the local (device, inode) or
	// the NFS fileid; it is only compared within one side.
	Nlink uint32
	ID    FileID
	// Special is the file type bits (S_IFCHR, S_IFBLK, S_IFIFO or
	// S_IFSOCK) of a TypeOther object, and RdevMajor/RdevMinor the
	// device number of a device.
	Special              uint32
	RdevMajor, RdevMinor uint32
}

// FileID identifies a file within one side of a copy.
type FileID struct{ Dev, Ino uint64 }

// FS is one side of a copy: a Shoal (or any NFSv4.1+) server through the
// client library, or the local file system. Paths are slash-separated.
// The interface is what a parallel copy needs and nothing more, which is
// also what lets tests wrap a side to count, fail or corrupt I/O.
type FS interface {
	// Lstat describes name without following a final symbolic link.
	Lstat(ctx context.Context, name string) (Info, error)
	// ReadDir lists a directory (without "." and "..").
	ReadDir(ctx context.Context, name string) ([]Info, error)
	Readlink(ctx context.Context, name string) (string, error)
	// Open opens a regular file for reading.
	Open(ctx context.Context, name string) (ReadFile, error)
	// Create opens name for writing with permissions 0600, creating it
	// if needed and emptying it if truncate is set.
	Create(ctx context.Context, name string, truncate bool) (WriteFile, error)
	// MkdirAll creates name and missing parents.
	MkdirAll(ctx context.Context, name string, perm uint32) error
	Symlink(ctx context.Context, target, name string) error
	// Rename moves from to to, replacing a file at to.
	Rename(ctx context.Context, from, to string) error
	// Remove removes a file, a symlink or an empty directory.
	Remove(ctx context.Context, name string) error
	// SetAttr sets the permission bits (not on symlinks) and the
	// modification time of name, without following a symlink.
	SetAttr(ctx context.Context, name string, typ Type, perm uint32, mtime time.Time) error

	// The operations of an archive copy (Options.Archive).

	// Chown sets the numeric owner and group of name, without following
	// a symlink.
	Chown(ctx context.Context, name string, uid, gid uint32) error
	// Link makes newname a hard link to the regular file oldname.
	Link(ctx context.Context, oldname, newname string) error
	// Mknod creates a device, FIFO or socket: mode is the file type bits
	// (S_IFCHR, ...) and the permission bits, as in mknod(2).
	Mknod(ctx context.Context, name string, mode, major, minor uint32) error
}

// ReadFile is an open source file. ReadAt may be called concurrently.
type ReadFile interface {
	ReadAt(ctx context.Context, p []byte, off int64) (int, error)
	Close() error
}

// WriteFile is an open destination file. WriteAt may be called
// concurrently. Sync makes what was written so far survive the death of
// the copying process (and, where the side can, of the machine).
type WriteFile interface {
	WriteAt(ctx context.Context, p []byte, off int64) (int, error)
	Sync(ctx context.Context) error
	Close() error
}

// NFS returns the FS of an NFS client. With pNFS on, every ReadAt and
// WriteAt of a chunk is itself striped over all data servers.
func NFS(c *client.Client) FS { return nfsFS{c} }

type nfsFS struct{ c *client.Client }

var (
	_ FS        = nfsFS{}
	_ ReadFile  = nfsFile{}
	_ WriteFile = nfsFile{}
)

func nfsInfo(name string, a client.Attr) Info {
	in := Info{
		Name: name, Perm: a.Mode & 0o7777, Size: int64(a.Size), Mtime: a.Mtime,
		UID: a.UID, GID: a.GID, Nlink: a.Nlink, ID: FileID{Ino: a.Fileid},
	}
	switch a.Type {
	case client.TypeRegular:
		in.Type = TypeFile
	case client.TypeDir:
		in.Type = TypeDir
	case client.TypeSymlink:
		in.Type = TypeSymlink
	default:
		in.Type = TypeOther
		switch a.Type {
		case client.TypeBlock:
			in.Special = unix.S_IFBLK
		case client.TypeChar:
			in.Special = unix.S_IFCHR
		case client.TypeFIFO:
			in.Special = unix.S_IFIFO
		case client.TypeSocket:
			in.Special = unix.S_IFSOCK
		}
		in.RdevMajor, in.RdevMinor = a.RdevMajor, a.RdevMinor
	}
	return in
}

func (n nfsFS) Lstat(ctx context.Context, name string) (Info, error) {
	a, err := n.c.Stat(ctx, name)
	if err != nil {
		return Info{}, err
	}
	return nfsInfo(path.Base(name), a), nil
}

func (n nfsFS) ReadDir(ctx context.Context, name string) ([]Info, error) {
	ents, err := n.c.ReadDir(ctx, name)
	if err != nil {
		return nil, err
	}
	out := make([]Info, len(ents))
	for i, e := range ents {
		out[i] = nfsInfo(e.Name, e.Attr)
	}
	return out, nil
}

func (n nfsFS) Readlink(ctx context.Context, name string) (string, error) {
	return n.c.Readlink(ctx, name)
}

func (n nfsFS) Open(ctx context.Context, name string) (ReadFile, error) {
	f, err := n.c.Open(ctx, name, os.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	return nfsFile{f}, nil
}

func (n nfsFS) Create(ctx context.Context, name string, truncate bool) (WriteFile, error) {
	flag := os.O_CREATE | os.O_WRONLY
	if truncate {
		flag |= os.O_TRUNC
	}
	f, err := n.c.Open(ctx, name, flag, 0o600)
	if err != nil {
		return nil, err
	}
	return nfsFile{f}, nil
}

func (n nfsFS) MkdirAll(ctx context.Context, name string, perm uint32) error {
	return n.c.MkdirAll(ctx, name, perm)
}

func (n nfsFS) Symlink(ctx context.Context, target, name string) error {
	return n.c.Symlink(ctx, target, name)
}

func (n nfsFS) Rename(ctx context.Context, from, to string) error { return n.c.Rename(ctx, from, to) }
func (n nfsFS) Remove(ctx context.Context, name string) error     { return n.c.Remove(ctx, name) }

func (n nfsFS) SetAttr(ctx context.Context, name string, typ Type, perm uint32, mtime time.Time) error {
	sa := client.SetAttr{Mtime: &mtime}
	if typ != TypeSymlink {
		sa.Mode = &perm
	}
	return n.c.SetAttr(ctx, name, sa)
}

func (n nfsFS) Chown(ctx context.Context, name string, uid, gid uint32) error {
	return n.c.SetAttr(ctx, name, client.SetAttr{UID: &uid, GID: &gid})
}

func (n nfsFS) Link(ctx context.Context, oldname, newname string) error {
	return n.c.Link(ctx, oldname, newname)
}

func (n nfsFS) Mknod(ctx context.Context, name string, mode, major, minor uint32) error {
	return n.c.Mknod(ctx, name, mode, major, minor)
}

type nfsFile struct{ f *client.File }

func (f nfsFile) ReadAt(ctx context.Context, p []byte, off int64) (int, error) {
	return f.f.ReadAtContext(ctx, p, off)
}
func (f nfsFile) WriteAt(ctx context.Context, p []byte, off int64) (int, error) {
	return f.f.WriteAtContext(ctx, p, off)
}
func (f nfsFile) Sync(ctx context.Context) error { return f.f.SyncContext(ctx) }
func (f nfsFile) Close() error                   { return f.f.Close() }

// Local returns the FS of the local file system. Paths are used as given,
// so relative ones are relative to the working directory.
func Local() FS { return localFS{} }

type localFS struct{}

var (
	_ FS        = localFS{}
	_ ReadFile  = localFile{}
	_ WriteFile = localFile{}
)

func localInfo(fi fs.FileInfo) Info {
	in := Info{Name: fi.Name(), Perm: uint32(fi.Mode().Perm()), Size: fi.Size(), Mtime: fi.ModTime()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		in.Perm = st.Mode & 0o7777
		in.UID, in.GID, in.Nlink = st.Uid, st.Gid, uint32(st.Nlink)
		in.ID = FileID{Dev: st.Dev, Ino: st.Ino}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFCHR, unix.S_IFBLK, unix.S_IFIFO, unix.S_IFSOCK:
			in.Special = st.Mode & unix.S_IFMT
			in.RdevMajor, in.RdevMinor = unix.Major(st.Rdev), unix.Minor(st.Rdev)
		}
	}
	switch {
	case fi.Mode().IsRegular():
		in.Type = TypeFile
	case fi.IsDir():
		in.Type = TypeDir
	case fi.Mode()&fs.ModeSymlink != 0:
		in.Type = TypeSymlink
	default:
		in.Type = TypeOther
	}
	return in
}

func (localFS) Lstat(_ context.Context, name string) (Info, error) {
	fi, err := os.Lstat(name)
	if err != nil {
		return Info{}, err
	}
	return localInfo(fi), nil
}

func (localFS) ReadDir(_ context.Context, name string) ([]Info, error) {
	ents, err := os.ReadDir(name)
	if err != nil {
		return nil, err
	}
	out := make([]Info, 0, len(ents))
	for _, e := range ents {
		fi, err := e.Info()
		if errors.Is(err, fs.ErrNotExist) {
			continue // removed since the listing
		}
		if err != nil {
			return nil, err
		}
		out = append(out, localInfo(fi))
	}
	return out, nil
}

func (localFS) Readlink(_ context.Context, name string) (string, error) { return os.Readlink(name) }

func (localFS) Open(_ context.Context, name string) (ReadFile, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	return localFile{f}, nil
}

func (localFS) Create(_ context.Context, name string, truncate bool) (WriteFile, error) {
	flag := os.O_CREATE | os.O_WRONLY
	if truncate {
		flag |= os.O_TRUNC
	}
	f, err := os.OpenFile(name, flag, 0o600)
	if err != nil {
		return nil, err
	}
	return localFile{f}, nil
}

func (localFS) MkdirAll(_ context.Context, name string, perm uint32) error {
	return os.MkdirAll(name, fs.FileMode(perm&0o777))
}

func (localFS) Symlink(_ context.Context, target, name string) error {
	return os.Symlink(target, name)
}

func (localFS) Rename(_ context.Context, from, to string) error { return os.Rename(from, to) }
func (localFS) Remove(_ context.Context, name string) error     { return os.Remove(name) }

func (localFS) SetAttr(_ context.Context, name string, typ Type, perm uint32, mtime time.Time) error {
	if typ != TypeSymlink {
		if err := syscall.Chmod(name, perm); err != nil {
			return &fs.PathError{Op: "chmod", Path: name, Err: err}
		}
	}
	ts := []unix.Timespec{{Nsec: unix.UTIME_OMIT}, unix.NsecToTimespec(mtime.UnixNano())}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, name, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &fs.PathError{Op: "utimes", Path: name, Err: err}
	}
	return nil
}

func (localFS) Chown(_ context.Context, name string, uid, gid uint32) error {
	return os.Lchown(name, int(uid), int(gid))
}

func (localFS) Link(_ context.Context, oldname, newname string) error {
	return os.Link(oldname, newname)
}

func (localFS) Mknod(_ context.Context, name string, mode, major, minor uint32) error {
	if err := unix.Mknod(name, mode, int(unix.Mkdev(major, minor))); err != nil {
		return &fs.PathError{Op: "mknod", Path: name, Err: err}
	}
	return nil
}

type localFile struct{ f *os.File }

func (f localFile) ReadAt(_ context.Context, p []byte, off int64) (int, error) {
	n, err := f.f.ReadAt(p, off)
	if err == io.EOF && n == len(p) {
		err = nil
	}
	return n, err
}
func (f localFile) WriteAt(_ context.Context, p []byte, off int64) (int, error) {
	return f.f.WriteAt(p, off)
}
func (f localFile) Sync(context.Context) error { return f.f.Sync() }
func (f localFile) Close() error               { return f.f.Close() }
