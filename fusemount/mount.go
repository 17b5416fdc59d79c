package fusemount

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/shoalfs/shoal/client"
)

// Access is how file data moves between applications and the server.
type Access int

const (
	// AccessCached keeps file data in the kernel page cache, revalidated
	// by the change attribute at open.
	AccessCached Access = iota
	// AccessODirect drops the page cache at every open and bypasses it
	// for opens with O_DIRECT.
	AccessODirect
	// AccessDirect bypasses the page cache for every open (FUSE direct_io).
	AccessDirect
)

var accessNames = map[Access]string{AccessCached: "cached", AccessODirect: "odirect", AccessDirect: "direct"}

func (a Access) String() string {
	if s, ok := accessNames[a]; ok {
		return s
	}
	return fmt.Sprintf("Access(%d)", int(a))
}

// client is the client library's access method that goes with a:
// the mount's method decides what the kernel caches, the library's what
// it caches and gathers below that. Under the kernel's writeback cache
// (AccessCached) writable opens switch to client.AccessDirect (see
// fsys.openFile).
func (a Access) client() client.Access {
	switch a {
	case AccessCached:
		return client.AccessCached
	case AccessODirect:
		return client.AccessODirect
	default:
		return client.AccessDirect
	}
}

// ParseAccess parses "cached", "odirect" or "direct".
func ParseAccess(s string) (Access, error) {
	for a, name := range accessNames {
		if name == s {
			return a, nil
		}
	}
	return 0, fmt.Errorf("unknown access method %q (want cached, odirect or direct)", s)
}

// DefaultPort is the NFS port used when an nfs:// URL names none.
const DefaultPort = "2049"

// ParseURL splits "nfs://host[:port]/path" into a dialable address and the
// export path ("/" when empty).
func ParseURL(raw string) (addr, path string, err error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", "", fmt.Errorf("bad NFS URL %q: %w", raw, err)
	}
	if u.Scheme != "nfs" || u.Host == "" {
		return "", "", fmt.Errorf("bad NFS URL %q: want nfs://host[:port]/path", raw)
	}
	host, port := u.Hostname(), u.Port()
	if port == "" {
		port = DefaultPort
	}
	path = u.Path
	if path == "" {
		path = "/"
	}
	return net.JoinHostPort(host, port), path, nil
}

// maxIO is the largest FUSE READ or WRITE: one NFS READ or WRITE at the
// usual 1 MiB server limit, and the kernel's default limit (256 pages of
// /proc/sys/fs/fuse/max_pages_limit). The kernel sends the requests of one
// read(2) or write(2) through a direct_io open one after the other, so at
// 512 KiB a 1 MiB read(2) took two round trips through FUSE and the
// library and 1 MiB direct reads fell behind the cached method's. Replies
// are ReadResultData, which go-fuse writes with writev, not through its
// splice pipe, so they need not fit a pipe.
const maxIO = 1 << 20

// Default cache lifetimes, those of the kernel's NFS client (acregmin and
// acdirmin): see Config.AttrTimeout and Config.DirTimeout.
const (
	DefaultAttrTimeout = 3 * time.Second
	DefaultDirTimeout  = 30 * time.Second
)

// Config configures Mount.
type Config struct {
	// Addr is the server's "host:port".
	Addr string
	// Root is the export path on the server ("/export"). Default "/".
	Root string
	// Access is the data access method.
	Access Access
	// UID and GID are the NFS credential of the mounting identity, used
	// for every request unless PerCaller is set, and for the initial
	// connection check.
	UID, GID uint32
	// PerCaller uses each FUSE request's caller uid and gid as its NFS
	// credential (one client connection per identity).
	PerCaller bool
	// AllowOther lets users other than the mounting one use the mount.
	AllowOther bool
	// Client is the template for every client connection; its UID, GID and
	// Root are overwritten, and Policy.Access, if left at AccessDefault,
	// is set from Access.
	Client client.Options
	// AttrTimeout is how long the kernel trusts the attributes of a file
	// (not a directory) before it asks again: a change another client
	// makes to the file, or its removal, shows in stat(2) within this
	// time. Like the kernel NFS client's acregmin; default
	// DefaultAttrTimeout (3 s), negative: no caching. Opens check the
	// file with the server whatever this says (close-to-open).
	AttrTimeout time.Duration
	// DirTimeout is how long the kernel trusts names (directory entries)
	// and the attributes of directories: a rename by another client
	// shows within this time. Like acdirmin; default DefaultDirTimeout
	// (30 s), negative: no caching. Names that do not exist are never
	// cached, so a file another client creates is visible at once, and
	// a name whose file another client removed fails within AttrTimeout.
	DirTimeout time.Duration
	// EntryCache bounds the mount's own cache of names and attributes,
	// which answers lookups the kernel's caches forgot (after memory
	// pressure or drop_caches) for no longer than AttrTimeout and
	// DirTimeout allow (see entrycache.go): the number of names, and of
	// objects' attributes, it keeps. 0: DefaultEntryCache; negative:
	// none, every lookup the kernel sends goes to the server.
	EntryCache int
	// ReaderProcs raises the process's GOMAXPROCS once the mount is up,
	// by the number of goroutines go-fuse keeps blocked in reads of
	// /dev/fuse, so that they do not hold the Ps the mount's work runs
	// on (see procs.go). It changes the whole process: for `shoal
	// mount`, which serves one mount, not for a program that mounts as
	// a library.
	ReaderProcs bool
	// Logger receives diagnostics. Default: slog.Default().
	Logger *slog.Logger
	// Debug logs every FUSE request (very verbose).
	Debug bool
}

// Mount is a served FUSE mount.
type Mount struct {
	Dir    string
	server *fuse.Server
	fsys   *fsys
	root   *node

	unmountOnce sync.Once
	unmountErr  error
}

// New mounts the export described by cfg on dir and serves it in the
// background until Unmount, or until someone else unmounts it (Wait
// returns then).
func New(ctx context.Context, dir string, cfg Config) (*Mount, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Root == "" {
		cfg.Root = "/"
	}
	fsys := &fsys{cfg: cfg, log: cfg.Logger, clients: make(map[ident]*clientSlot),
		fileTTL: timeoutOr(cfg.AttrTimeout, DefaultAttrTimeout), dirTTL: timeoutOr(cfg.DirTimeout, DefaultDirTimeout)}
	fsys.entries = newEntryCache(cfg.EntryCache, fsys.fileTTL, fsys.dirTTL)
	c, err := fsys.clientFor(ctx, ident{cfg.UID, cfg.GID})
	if err != nil {
		return nil, err
	}
	fh, attr, err := c.Lookup(ctx, "/")
	if err != nil {
		fsys.close()
		return nil, fmt.Errorf("export %s on %s: %w", cfg.Root, cfg.Addr, err)
	}
	if !attr.IsDir() {
		fsys.close()
		return nil, fmt.Errorf("export %s on %s is a %s, not a directory", cfg.Root, cfg.Addr, attr.Type)
	}
	root := &node{fsys: fsys}
	root.setFH(fh)
	root.noteAttr(&attr, 0)

	// Nodes set their own timeouts (node.child, Getattr); these are what
	// go-fuse uses where they did not.
	entry, negative := fsys.dirTTL, time.Duration(0)
	opts := &fs.Options{
		EntryTimeout:    &entry,
		AttrTimeout:     &fsys.fileTTL,
		NegativeTimeout: &negative,
		RootStableAttr:  &fs.StableAttr{Ino: attr.Fileid},
		NullPermissions: true, // mode 0 is a mode, not "unknown"
		MountOptions: fuse.MountOptions{
			AllowOther:    cfg.AllowOther,
			FsName:        "nfs://" + cfg.Addr + cfg.Root,
			Name:          "shoal",
			EnableLocks:   true,
			DisableXAttrs: true,
			MaxWrite:      maxIO,
			Debug:         cfg.Debug,
			// go-fuse logs what it recovers from (a splice falling back
			// to a copy when a 1 MiB read plus its header exceeds the
			// pipe: once per read) as well as its debug trace; both go to
			// slog at debug level, unless Debug asked for the trace.
			Logger: slog.NewLogLogger(cfg.Logger.Handler(), fuseLogLevel(cfg.Debug)),
		},
	}
	if cfg.Access == AccessCached {
		// The kernel's writeback cache: write(2) fills the page cache
		// and the kernel sends dirty pages in large WRITEs later (at
		// fsync, close, or when the flusher runs), instead of one
		// synchronous FUSE_WRITE per write(2). That is what makes small
		// sequential writes as fast as large ones. go-fuse offers it
		// only through ExtraCapabilities, which it intersects with what
		// the kernel offers. See doc.go for what it changes.
		opts.MountOptions.ExtraCapabilities |= fuse.CAP_WRITEBACK_CACHE
	}
	if cfg.PerCaller {
		// The kernel checks permissions against the cached attributes
		// with the caller's full credentials (supplementary groups
		// too), as it would for a local file system: without this,
		// paths through directories whose entries it has cached would
		// skip the search permission check. The server checks again.
		opts.MountOptions.Options = append(opts.MountOptions.Options, "default_permissions")
	}
	if os.Geteuid() == 0 {
		// Root may call mount(2) itself; fusermount3 stays the fallback.
		opts.MountOptions.DirectMount = true
	}
	srv, err := fs.Mount(dir, root, opts)
	if err != nil {
		fsys.close()
		return nil, fmt.Errorf("mount %s: %w", dir, err)
	}
	if cfg.ReaderProcs {
		fsys.log.Debug("GOMAXPROCS raised for the FUSE readers", "procs", raiseProcsForReaders())
	}
	if ra := kernelReadaheadFor(cfg); cfg.Access != AccessDirect && ra > 0 {
		// Page-cache reads (cached, and odirect without O_DIRECT) are
		// prefetched by the kernel, which sends READs of up to maxIO
		// ahead of the reader as background requests, several in
		// flight; see fsys.readAccess for what this changes below.
		if got, err := setKernelReadahead(dir, ra); err != nil {
			fsys.log.Info("kernel readahead left at its default", "dir", dir, "err", err)
		} else {
			fsys.kernelRA.Store(int64(got))
		}
	}
	fsys.log.Info("mounted", "dir", dir, "server", cfg.Addr, "export", cfg.Root, "access", cfg.Access,
		"kernel_readahead", fsys.kernelRA.Load())
	return &Mount{Dir: dir, server: srv, fsys: fsys, root: root}, nil
}

// timeoutOr is a cache lifetime from Config: def for zero, none for
// negative.
func timeoutOr(d, def time.Duration) time.Duration {
	switch {
	case d == 0:
		return def
	case d < 0:
		return 0
	}
	return d
}

// attrTimeout is the kernel's attribute lifetime for an object of type t.
func (fs *fsys) attrTimeout(t client.FileType) time.Duration {
	if t == client.TypeDir {
		return fs.dirTTL
	}
	return fs.fileTTL
}

// entryTimeout is the kernel's lifetime of a name.
func (fs *fsys) entryTimeout() time.Duration { return fs.dirTTL }

// kernelReadaheadFor is the kernel readahead window Mount asks for: the
// client policy's Readahead (client.DefaultReadahead when zero), so one
// setting sizes prefetching whichever layer does it; a negative Readahead
// (readahead off) leaves the kernel's default alone.
func kernelReadaheadFor(cfg Config) int {
	switch ra := cfg.Client.Policy.Readahead; {
	case ra < 0:
		return 0
	case ra == 0:
		return client.DefaultReadahead
	default:
		return ra
	}
}

// Wait blocks until the file system is unmounted (by Unmount, umount(8) or
// fusermount3 -u) and then closes the client connections.
func (m *Mount) Wait() {
	m.server.Wait()
	m.fsys.close()
}

// Unmount unmounts the file system, waits for the serving loop to end and
// closes the client connections. It is safe to call more than once.
func (m *Mount) Unmount() error {
	m.unmountOnce.Do(func() {
		var err error
		for i := 0; i < 50; i++ { // EBUSY while the kernel still holds references
			if err = m.server.Unmount(); err == nil || !isBusy(err) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil && !notMounted(err) {
			m.unmountErr = fmt.Errorf("unmount %s: %w", m.Dir, err)
			return
		}
		m.Wait()
	})
	return m.unmountErr
}

func isBusy(err error) bool {
	return err != nil && (strings.Contains(err.Error(), "busy") || errors.Is(err, os.ErrDeadlineExceeded))
}

func notMounted(err error) bool {
	s := err.Error()
	return strings.Contains(s, "not mounted") || strings.Contains(s, "not found in /etc/mtab") || strings.Contains(s, "invalid argument")
}

// Unmount unmounts the FUSE file system at dir, whoever serves it: with
// umount2(2) when running as root, else with fusermount3 -u (or the older
// fusermount). lazy detaches it even while files are in use (MNT_DETACH,
// fusermount -z); the serving process then sees the end of the mount once
// the last user is gone.
func Unmount(dir string, lazy bool) error {
	var errs []error
	if os.Geteuid() == 0 {
		flags := 0
		if lazy {
			flags = unix.MNT_DETACH
		}
		err := unix.Unmount(dir, flags)
		if err == nil {
			return nil
		}
		errs = append(errs, fmt.Errorf("umount2: %w", err))
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("unmount %s: %w", dir, errors.Join(errs...))
		}
	}
	for _, prog := range []string{"fusermount3", "fusermount"} {
		path, err := exec.LookPath(prog)
		if err != nil {
			continue
		}
		args := []string{"-u"}
		if lazy {
			args = append(args, "-z")
		}
		out, err := exec.Command(path, append(args, "--", dir)...).CombinedOutput()
		if err == nil {
			return nil
		}
		errs = append(errs, fmt.Errorf("%s: %w: %s", prog, err, strings.TrimSpace(string(out))))
	}
	if len(errs) == 0 {
		errs = append(errs, errors.New("not root and no fusermount3 or fusermount in PATH"))
	}
	return fmt.Errorf("unmount %s: %w", dir, errors.Join(errs...))
}

// Mounted reports whether dir is a mount point of a Shoal FUSE mount,
// from /proc/self/mountinfo.
func Mounted(dir string) (bool, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return false, err
	}
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		// id parent major:minor root mountpoint options ... - fstype source ...
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		if unescapeMountinfo(f[4]) != abs {
			continue
		}
		for i, x := range f {
			if x == "-" && i+1 < len(f) && f[i+1] == "fuse.shoal" {
				return true, nil
			}
		}
	}
	return false, nil
}

// unescapeMountinfo undoes the octal escapes (\040 for space) of
// /proc/self/mountinfo.
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// fuseLogLevel is the slog level of go-fuse's messages.
func fuseLogLevel(debug bool) slog.Level {
	if debug {
		return slog.LevelInfo
	}
	return slog.LevelDebug
}
