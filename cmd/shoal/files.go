package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/shoalfs/shoal/client"
	"github.com/shoalfs/shoal/internal/nfs4"
)

// File commands work on nfs://host[:port]/path URLs, where host[:port]
// may be a comma-separated list (parseNFSURL). Each opens its own
// client session, so they suit scripts and smoke tests rather than bulk
// transfers of many small files.

const defaultNFSPort = "2049"

// copyBufSize is the chunk size of put/get/cat: big enough that one chunk
// spans several pipelined READs or WRITEs.
const copyBufSize = 4 << 20

type fileFlags struct {
	uid, gid uint32
	pol      *policyFlags
}

// register adds the credential and client policy flags to cmd, except the
// policy flags named in skip.
func (ff *fileFlags) register(cmd *cobra.Command, skip ...string) {
	cmd.Flags().Uint32Var(&ff.uid, "uid", uint32(os.Getuid()), "user id sent in AUTH_SYS credentials")
	cmd.Flags().Uint32Var(&ff.gid, "gid", uint32(os.Getgid()), "group id sent in AUTH_SYS credentials")
	ff.pol = addPolicyFlags(cmd, skip...)
}

// options returns the client options of the command line.
func (ff *fileFlags) options() (client.Options, error) {
	groups, _ := os.Getgroups()
	gids := make([]uint32, 0, len(groups))
	for _, g := range groups {
		gids = append(gids, uint32(g))
	}
	if ff.gid != uint32(os.Getgid()) {
		gids = nil // an explicit --gid should not come with the caller's groups
	}
	opts := client.Options{UID: ff.uid, GID: ff.gid, GIDs: gids, DialTimeout: 10 * time.Second}
	if ff.pol != nil {
		pol, err := ff.pol.policy()
		if err != nil {
			return client.Options{}, err
		}
		opts.Policy = pol
	}
	return opts, nil
}

// nfsURL is a parsed nfs://host[:port][,host[:port]...]/path.
type nfsURL struct {
	// addr is the server's address list for client.Dial: host:port, or
	// several separated by commas (the metadata servers of a cluster
	// with failover), each with its port.
	addr string
	path string // absolute, slash-separated
	raw  string
}

// parseNFSURL parses nfs://host[:port]/path, where the host part may be a
// comma-separated list of the addresses one server answers on (a cluster
// with metadata-server failover): nfs://mds1,mds2,mds3:2049/data gives all
// three port 2049, nfs://mds1:2049,mds2:2050/data a port each. A host
// without a port takes the port of the next one that has one, and the
// last one defaults to 2049. IPv6 addresses go in brackets.
func parseNFSURL(s string) (nfsURL, error) {
	bad := fmt.Errorf("%q is not an nfs://host[:port]/path URL", s)
	const scheme = "nfs://"
	if len(s) < len(scheme) || !strings.EqualFold(s[:len(scheme)], scheme) {
		return nfsURL{}, bad
	}
	// The host part is split by hand: net/url takes one host, and
	// refuses a list of bracketed IPv6 addresses.
	hosts, rest := s[len(scheme):], ""
	if i := strings.IndexAny(hosts, "/?#"); i >= 0 {
		hosts, rest = hosts[:i], hosts[i:]
	}
	if hosts == "" || strings.Contains(hosts, "@") {
		return nfsURL{}, bad
	}
	u, err := url.Parse("nfs://host" + rest)
	if err != nil {
		return nfsURL{}, fmt.Errorf("%q is not an nfs://host[:port]/path URL: %w", s, err)
	}
	parts := strings.Split(hosts, ",")
	last := parts[len(parts)-1]
	if _, port, err := net.SplitHostPort(last); err == nil {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return nfsURL{}, fmt.Errorf("%s: port %s is not a number from 1 to 65535", s, port)
		}
	} else {
		parts[len(parts)-1] = last + ":" + defaultNFSPort
		if strings.Count(last, ":") > 1 && !strings.HasPrefix(last, "[") {
			return nfsURL{}, fmt.Errorf("%s: IPv6 address %s must be in brackets", s, last)
		}
	}
	addrs, err := client.SplitAddrs(strings.Join(parts, ","))
	if err != nil {
		return nfsURL{}, fmt.Errorf("%s: %w", s, err)
	}
	p := u.Path
	if p == "" {
		p = "/"
	}
	return nfsURL{addr: strings.Join(addrs, ","), path: p, raw: s}, nil
}

// connect dials the server of u.
func (ff *fileFlags) connect(ctx context.Context, u nfsURL) (*client.Client, error) {
	opts, err := ff.options()
	if err != nil {
		return nil, err
	}
	return client.Dial(ctx, u.addr, opts)
}

// fileErr turns a client error into "op URL: reason" with a reason in
// words ("no such file or directory"), leaving dial errors to describe.
func fileErr(op, target string, err error) error {
	if err == nil {
		return nil
	}
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Op == "dial" {
		return err
	}
	return &wordedError{msg: fmt.Sprintf("%s %s: %s", op, target, reason(err)), err: err}
}

// wordedError is an error in words for the command line that keeps the
// error it describes for errors.Is and errors.As.
type wordedError struct {
	msg string
	err error
}

func (e *wordedError) Error() string { return e.msg }
func (e *wordedError) Unwrap() error { return e.err }

// rootSquashHint adds to a permission error of a command run as root what
// usually causes it: the export maps root to nobody, so a fresh server's
// root directory (owned by root, mode 755) refuses root's writes.
func rootSquashHint(err error, uid uint32) error {
	if err == nil || uid != 0 || !errors.Is(err, fs.ErrPermission) {
		return err
	}
	return fmt.Errorf("%w\n  hint: you are root (uid 0), and the export squashes root to nobody (the default):"+
		" start the server with --no-root-squash (root_squash: false in its --config) to write as root,"+
		" or write as a user (--uid N) into a directory that user owns", err)
}

func reason(err error) string {
	var se *client.StatusError
	var de *client.DataServerError
	if errors.As(err, &de) {
		// Which data server failed, how, and what the metadata server
		// said (in words) when the I/O was redone through it.
		msg := de.Error()
		if errors.As(de.Err, &se) {
			msg = strings.Replace(msg, se.Error(), statusWords(se), 1)
		}
		return msg
	}
	if errors.As(err, &se) {
		// The status in words, with what the client added around it
		// ("still after retrying for 30s"), without the path errors'
		// "op path: " the caller says itself.
		inner := err
		for {
			var pe *fs.PathError
			var le *os.LinkError
			if errors.As(inner, &pe) && errors.As(pe.Err, &se) {
				inner = pe.Err
			} else if errors.As(inner, &le) && errors.As(le.Err, &se) {
				inner = le.Err
			} else {
				break
			}
		}
		return strings.Replace(inner.Error(), se.Error(), statusWords(se), 1)
	}
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return reason(pe.Err)
	}
	var le *os.LinkError
	if errors.As(err, &le) {
		return reason(le.Err)
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return "timed out"
	case errors.Is(err, client.ErrVerifierChanged):
		return "server restarted during the transfer; data may be lost"
	}
	return err.Error()
}

// statusWords is an NFS status in words: its errno's text, else its name.
func statusWords(se *client.StatusError) string {
	if errno := se.Errno(); errno != 0 {
		return errno.Error()
	}
	st := nfs4.Nfsstat4(se.NFSStatus)
	if st == nfs4.NFS4ERR_DELAY {
		return "server busy, try again later (NFS4ERR_DELAY)"
	}
	return strings.ToLower(strings.TrimPrefix(st.String(), "NFS4ERR_"))
}

// withClient parses urls (which must all name one server), connects, and
// runs fn.
func (ff *fileFlags) withClient(cmd *cobra.Command, urls []string, fn func(ctx context.Context, c *client.Client, us []nfsURL) error) error {
	us := make([]nfsURL, len(urls))
	for i, s := range urls {
		u, err := parseNFSURL(s)
		if err != nil {
			return err
		}
		if i > 0 && u.addr != us[0].addr {
			return fmt.Errorf("%s and %s are on different servers", us[0].raw, s)
		}
		us[i] = u
	}
	ctx := cmd.Context()
	c, err := ff.connect(ctx, us[0])
	if err != nil {
		return err
	}
	defer c.Close()
	return rootSquashHint(fn(ctx, c, us), ff.uid)
}

func addFileCmds(root *cobra.Command) {
	root.AddCommand(newLsCmd(), newStatCmd(), newCatCmd(), newPutCmd(), newGetCmd(),
		newMkdirCmd(), newRmCmd(), newMvCmd())
}

func newLsCmd() *cobra.Command {
	var ff fileFlags
	var long bool
	cmd := &cobra.Command{
		Use:     "ls [-l] URL...",
		Short:   "List a directory on an NFS server",
		Example: "  shoal ls -l nfs://127.0.0.1:2049/",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return ff.withClient(cmd, args, func(ctx context.Context, c *client.Client, us []nfsURL) error {
				out := cmd.OutOrStdout()
				for i, u := range us {
					a, err := c.Stat(ctx, u.path)
					if err != nil {
						return fileErr("ls", u.raw, err)
					}
					if a.Type != client.TypeDir {
						printEntry(ctx, out, c, u.path, path.Base(u.path), a, long)
						continue
					}
					if len(us) > 1 {
						if i > 0 {
							fmt.Fprintln(out)
						}
						fmt.Fprintf(out, "%s:\n", u.raw)
					}
					ents, err := c.ReadDir(ctx, u.path)
					if err != nil {
						return fileErr("ls", u.raw, err)
					}
					slices.SortFunc(ents, func(a, b client.DirEntry) int { return strings.Compare(a.Name, b.Name) })
					for _, e := range ents {
						printEntry(ctx, out, c, path.Join(u.path, e.Name), e.Name, e.Attr, long)
					}
				}
				return nil
			})
		},
	}
	cmd.Flags().BoolVarP(&long, "long", "l", false, "long listing: mode, links, owner, group, size, mtime")
	ff.register(cmd)
	return cmd
}

func printEntry(ctx context.Context, out io.Writer, c *client.Client, p, name string, a client.Attr, long bool) {
	if !long {
		fmt.Fprintln(out, name)
		return
	}
	if a.Type == client.TypeSymlink {
		if target, err := c.Readlink(ctx, p); err == nil {
			name += " -> " + target
		}
	}
	fmt.Fprintf(out, "%s %3d %5d %5d %10d %s %s\n", lsMode(a.FileMode()), a.Nlink, a.UID, a.GID, a.Size,
		a.Mtime.Local().Format("2006-01-02 15:04"), name)
}

func newStatCmd() *cobra.Command {
	var ff fileFlags
	cmd := &cobra.Command{
		Use:   "stat URL...",
		Short: "Show the attributes of files on an NFS server",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return ff.withClient(cmd, args, func(ctx context.Context, c *client.Client, us []nfsURL) error {
				out := cmd.OutOrStdout()
				for _, u := range us {
					a, err := c.Stat(ctx, u.path)
					if err != nil {
						return fileErr("stat", u.raw, err)
					}
					fmt.Fprintf(out, "  File: %s\n  Type: %s\n  Size: %d\tUsed: %d\tLinks: %d\n", u.path, a.Type, a.Size, a.Used, a.Nlink)
					fmt.Fprintf(out, "  Mode: %04o (%s)\tUid: %d\tGid: %d\n", a.Mode, a.FileMode(), a.UID, a.GID)
					fmt.Fprintf(out, "Fileid: %d\tChange: %d\n", a.Fileid, a.Change)
					if a.Type == client.TypeBlock || a.Type == client.TypeChar {
						fmt.Fprintf(out, "Device: %d,%d\n", a.RdevMajor, a.RdevMinor)
					}
					for _, t := range []struct {
						name string
						t    time.Time
					}{{"Access", a.Atime}, {"Modify", a.Mtime}, {"Change", a.Ctime}} {
						fmt.Fprintf(out, "%s: %s\n", t.name, t.t.Local().Format("2006-01-02 15:04:05.000000000 -0700"))
					}
				}
				return nil
			})
		},
	}
	ff.register(cmd)
	return cmd
}

// readerOnly hides WriterTo/ReaderFrom so io.CopyBuffer uses our buffer
// size, which decides how many READs or WRITEs go out at once.
type readerOnly struct{ io.Reader }
type writerOnly struct{ io.Writer }

// fileReader reads a File from the start with ctx, so that an interrupt
// stops the READs in flight.
type fileReader struct {
	ctx context.Context
	f   *client.File
	off int64
}

func (r *fileReader) Read(p []byte) (int, error) {
	n, err := r.f.ReadAtContext(r.ctx, p, r.off)
	r.off += int64(n)
	if err == io.EOF && n > 0 {
		err = nil
	}
	return n, err
}

// writeLocal makes the local file path hold what fill writes, atomically:
// fill writes a new file beside it, which is synced and renamed over path
// once complete. If fill or anything else fails, the new file is removed
// and path is left as it was (absent, or with its old contents), so a
// failed copy never leaves a file that looks complete. A symlink at path
// is followed, so its target receives the data, as with O_TRUNC. perm is
// the new file's permission bits, before the umask.
// lsMode is a mode as ls -l prints it: Go's FileMode.String marks a
// symlink "L", a named pipe "p" and a device "D"; ls prints l, p, b and c.
func lsMode(m fs.FileMode) string {
	s := m.Perm().String()[1:]
	switch {
	case m&fs.ModeDir != 0:
		return "d" + s
	case m&fs.ModeSymlink != 0:
		return "l" + s
	case m&fs.ModeNamedPipe != 0:
		return "p" + s
	case m&fs.ModeSocket != 0:
		return "s" + s
	case m&fs.ModeCharDevice != 0:
		return "c" + s
	case m&fs.ModeDevice != 0:
		return "b" + s
	}
	return "-" + s
}

func writeLocal(path string, perm fs.FileMode, fill func(w io.Writer) error) (err error) {
	if target, lerr := filepath.EvalSymlinks(path); lerr == nil {
		path = target
	}
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	var tmp *os.File
	for range 100 {
		name := filepath.Join(dir, fmt.Sprintf(".%s.shoal-get-%08x", base, rand.Uint32()))
		tmp, err = os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
		if !errors.Is(err, fs.ErrExist) {
			break
		}
	}
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if err := fill(tmp); err != nil {
		return err
	}
	if err := tmp.Sync(); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

func newCatCmd() *cobra.Command {
	var ff fileFlags
	cmd := &cobra.Command{
		Use:   "cat URL...",
		Short: "Print files from an NFS server",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return ff.withClient(cmd, args, func(ctx context.Context, c *client.Client, us []nfsURL) error {
				buf := make([]byte, copyBufSize)
				for _, u := range us {
					f, err := c.Open(ctx, u.path, os.O_RDONLY, 0)
					if err != nil {
						return fileErr("cat", u.raw, err)
					}
					_, err = io.CopyBuffer(writerOnly{cmd.OutOrStdout()}, readerOnly{&fileReader{ctx: ctx, f: f}}, buf)
					f.Close()
					if err != nil {
						return fileErr("cat", u.raw, err)
					}
				}
				return nil
			})
		},
	}
	ff.register(cmd)
	return cmd
}

func newPutCmd() *cobra.Command {
	var ff fileFlags
	cmd := &cobra.Command{
		Use:     "put LOCAL URL",
		Short:   "Copy a local file to an NFS server",
		Example: "  shoal put ./data.bin nfs://127.0.0.1:2049/dir/",
		Args:    cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			local := args[0]
			src, err := os.Open(local)
			if err != nil {
				return fmt.Errorf("put %s: %s", local, reason(err))
			}
			defer src.Close()
			st, err := src.Stat()
			if err != nil {
				return fmt.Errorf("put %s: %s", local, reason(err))
			}
			if st.IsDir() {
				return fmt.Errorf("put %s: is a directory", local)
			}
			return ff.withClient(cmd, args[1:], func(ctx context.Context, c *client.Client, us []nfsURL) error {
				u := us[0]
				dst := u.path
				if strings.HasSuffix(dst, "/") {
					dst = path.Join(dst, filepath.Base(local))
				} else if a, err := c.Stat(ctx, dst); err == nil && a.Type == client.TypeDir {
					dst = path.Join(dst, filepath.Base(local))
				}
				target := u.raw // the file put creates, as a URL
				if dst != u.path {
					target = strings.TrimSuffix(u.raw, "/") + "/" + filepath.Base(local)
				}
				f, err := c.Open(ctx, dst, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, uint32(st.Mode().Perm()))
				if err != nil {
					return fileErr("put", target, err)
				}
				_, err = io.CopyBuffer(writerOnly{f}, readerOnly{src}, make([]byte, copyBufSize))
				if cerr := f.Close(); err == nil {
					err = cerr
				}
				return fileErr("put", target, err)
			})
		},
	}
	ff.register(cmd)
	return cmd
}

func newGetCmd() *cobra.Command {
	var ff fileFlags
	cmd := &cobra.Command{
		Use:   "get URL LOCAL",
		Short: "Copy a file from an NFS server to a local file",
		Long: `Copy the file at URL to LOCAL (or into LOCAL, if it is a directory).

The file is written under a temporary name beside LOCAL (.NAME.shoal-get-*)
and renamed to LOCAL once complete, so a failed or interrupted get leaves
no file behind, nor a partial one: an existing LOCAL keeps its contents.

With pNFS, a data server that is down makes the get fail once the
metadata server gives up on it too (NFS4ERR_IO, after its --ds-down-after)
or after --io-retry-timeout, whichever comes first; the error names the
data server.`,
		Example: "  shoal get nfs://127.0.0.1:2049/dir/data.bin .",
		Args:    cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return ff.withClient(cmd, args[:1], func(ctx context.Context, c *client.Client, us []nfsURL) error {
				u := us[0]
				local := args[1]
				if st, err := os.Stat(local); err == nil && st.IsDir() {
					local = filepath.Join(local, path.Base(u.path))
				}
				f, err := c.Open(ctx, u.path, os.O_RDONLY, 0)
				if err != nil {
					return fileErr("get", u.raw, err)
				}
				defer f.Close()
				a, err := f.Stat(ctx)
				if err != nil {
					return fileErr("get", u.raw, err)
				}
				var copyErr error
				err = writeLocal(local, fs.FileMode(a.Mode&0o777), func(w io.Writer) error {
					_, copyErr = io.CopyBuffer(writerOnly{w}, readerOnly{&fileReader{ctx: ctx, f: f}}, make([]byte, copyBufSize))
					return copyErr
				})
				if copyErr != nil {
					return fileErr("get", u.raw, copyErr)
				}
				if err != nil {
					return fmt.Errorf("get: %s", reason(err))
				}
				return nil
			})
		},
	}
	ff.register(cmd)
	return cmd
}

func newMkdirCmd() *cobra.Command {
	var ff fileFlags
	var parents bool
	var mode string
	cmd := &cobra.Command{
		Use:   "mkdir [-p] URL...",
		Short: "Create directories on an NFS server",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			m, err := strconv.ParseUint(mode, 8, 32)
			if err != nil || m > 0o7777 {
				return fmt.Errorf("bad --mode %q: want octal permission bits such as 755", mode)
			}
			return ff.withClient(cmd, args, func(ctx context.Context, c *client.Client, us []nfsURL) error {
				for _, u := range us {
					var err error
					if parents {
						err = c.MkdirAll(ctx, u.path, uint32(m))
					} else {
						err = c.Mkdir(ctx, u.path, uint32(m))
					}
					if err != nil {
						return fileErr("mkdir", u.raw, err)
					}
				}
				return nil
			})
		},
	}
	cmd.Flags().BoolVarP(&parents, "parents", "p", false, "create missing parents; no error if the directory exists")
	cmd.Flags().StringVarP(&mode, "mode", "m", "755", "permission bits, in octal")
	ff.register(cmd)
	return cmd
}

func newRmCmd() *cobra.Command {
	var ff fileFlags
	var recursive bool
	cmd := &cobra.Command{
		Use:   "rm [-r] URL...",
		Short: "Remove files (or, with -r, directory trees) on an NFS server",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return ff.withClient(cmd, args, func(ctx context.Context, c *client.Client, us []nfsURL) error {
				for _, u := range us {
					var err error
					if recursive {
						if _, serr := c.Stat(ctx, u.path); serr != nil {
							err = serr
						} else {
							err = c.RemoveAll(ctx, u.path)
						}
					} else {
						err = c.Remove(ctx, u.path)
					}
					if err != nil {
						return fileErr("rm", u.raw, err)
					}
				}
				return nil
			})
		},
	}
	cmd.Flags().BoolVarP(&recursive, "recursive", "r", false, "remove directories and their contents")
	ff.register(cmd)
	return cmd
}

func newMvCmd() *cobra.Command {
	var ff fileFlags
	cmd := &cobra.Command{
		Use:   "mv FROM-URL TO-URL",
		Short: "Rename a file or directory on an NFS server",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return ff.withClient(cmd, args, func(ctx context.Context, c *client.Client, us []nfsURL) error {
				from, to := us[0], us[1]
				dst := to.path
				if a, err := c.Stat(ctx, dst); err == nil && a.Type == client.TypeDir {
					dst = path.Join(dst, path.Base(from.path))
				}
				return fileErr("mv", from.raw, c.Rename(ctx, from.path, dst))
			})
		},
	}
	ff.register(cmd)
	return cmd
}
