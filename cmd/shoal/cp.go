package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/shoalfs/shoal/client"
	"github.com/shoalfs/shoal/internal/bytesize"
	"github.com/shoalfs/shoal/internal/pcopy"
)

func newCpCmd() *cobra.Command {
	var (
		ff             fileFlags
		opts           pcopy.Options
		chunk, journal string
		quiet          bool
		maxPerDS       int
	)
	cmd := &cobra.Command{
		Use:   "cp [-r] SRC DST",
		Short: "Copy files and trees in parallel between Shoal clusters and local disk",
		Long: `Copy SRC to DST, each an nfs://host[:port]/path URL (several hosts, comma-
separated, for a cluster with metadata-server failover) or a local path, reading
from all source data servers and writing to all destination data servers at
once: --jobs chunks (of --chunk bytes) are in flight across several files and
within large ones, and with pNFS each chunk is itself striped.

Like cp, a DST that is an existing directory receives SRC under its own name.
Modes and mtimes are kept and symlinks are copied as symlinks. With -a
(--archive, implies -r) numeric owners and groups, hard links, devices, FIFOs
and sockets are kept too, as an operating system's root tree needs (a diskless
node's root, see docs/diskless.md); the destination must then let root set
owners (a server started with --no-root-squash, or an export with
root_squash: false). Files are
written under a temporary name and renamed when complete, so an interrupted
copy never leaves a truncated file under the real name; a journal
(DST/` + pcopy.JournalName + ` unless --journal) records completed files and
chunks, and --resume continues from it.

Exit status: 0 on success, 1 on errors, 2 if --verify found differences,
130 if interrupted.`,
		Example: `  shoal cp -r nfs://127.0.0.1:2049/data nfs://127.0.0.1:3049/backup
  shoal cp -r --verify ./dataset nfs://mds:2049/
  shoal cp -r --resume nfs://127.0.0.1:2049/data /scratch/data
  shoal cp -a /srv/rootfs nfs://mds:2049/images/bookworm-1`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			var err error
			if opts.Chunk, err = bytesize.Parse(chunk); err != nil {
				return fmt.Errorf("--chunk: %w", err)
			}
			if opts.Chunk <= 0 || opts.Chunk > 1<<40 {
				return fmt.Errorf("--chunk %s: want a size from 1 byte to 1TiB, such as 4MiB", chunk)
			}
			if opts.Archive {
				opts.Recursive = true
			}
			if opts.Jobs < 1 {
				return fmt.Errorf("bad --jobs %d: want at least 1", opts.Jobs)
			}
			ctx := cmd.Context()
			d := &dialer{ff: ff, maxPerDS: maxPerDS, maxPerDSFlag: cmd.Flags().Changed("max-per-ds")}
			defer d.close()
			src, err := d.endpoint(ctx, args[0])
			if err != nil {
				return err
			}
			dst, err := d.endpoint(ctx, args[1])
			if err != nil {
				return err
			}
			if journal != "" {
				j, err := d.endpoint(ctx, journal)
				if err != nil {
					return err
				}
				opts.Journal = &j
			}
			return rootSquashHint(runCp(ctx, cmd.OutOrStdout(), cmd.ErrOrStderr(), src, dst, opts, quiet), ff.uid)
		},
	}
	f := cmd.Flags()
	f.BoolVarP(&opts.Recursive, "recursive", "r", false, "copy directories and their contents")
	f.BoolVarP(&opts.Archive, "archive", "a", false, "also keep owners, hard links, devices, FIFOs and sockets (implies -r; needs root and no root squashing)")
	f.IntVarP(&opts.Jobs, "jobs", "j", pcopy.DefaultJobs, "chunks in flight across all files (memory use is about jobs x chunk, twice that with --verify)")
	f.StringVar(&chunk, "chunk", "4MiB", "chunk size (a multiple of the stripe unit works best), e.g. 4MiB or 1048576 (KiB, MiB: powers of 1024; KB, MB: of 1000)")
	f.StringVar(&journal, "journal", "", "journal file, a local path or nfs:// URL (default: DST/"+pcopy.JournalName+")")
	f.BoolVar(&opts.Resume, "resume", false, "continue an interrupted copy from its journal")
	f.BoolVar(&opts.Verify, "verify", false, "check each file's SHA-256 at the destination against the source's")
	f.BoolVarP(&quiet, "quiet", "q", false, "no progress and no summary")
	f.IntVar(&maxPerDS, "max-per-ds", 16, "requests in flight to each data server")
	ff.register(cmd, "max-per-ds")
	return cmd
}

func runCp(ctx context.Context, out, errOut io.Writer, src, dst pcopy.Endpoint, opts pcopy.Options, quiet bool) error {
	c := pcopy.New(src, dst, opts)
	var wg sync.WaitGroup
	stop := func() {}
	if !quiet {
		tty := isTerminal(out)
		interval := 5 * time.Second
		if tty {
			interval = 250 * time.Millisecond
		}
		rctx, cancel := context.WithCancel(context.Background())
		stop = func() { cancel(); wg.Wait() }
		wg.Add(1)
		go func() {
			defer wg.Done()
			pcopy.Report(rctx, out, tty, interval, c.Progress)
		}()
	}
	sum, err := c.Run(ctx)
	stop()
	for _, m := range sum.Mismatches {
		fmt.Fprintf(errOut, "shoal: cp: %s: checksum mismatch: source %s, destination %s (not installed)\n", m.Path, m.Src, m.Dest)
	}
	started := sum.Files+sum.Dirs+sum.Symlinks+sum.ResumedFiles+sum.Bytes > 0 || err == nil
	if !quiet && started {
		printCpSummary(out, sum, opts.Verify)
	}
	switch {
	case err == nil:
		return nil
	case errors.Is(err, pcopy.ErrVerify):
		return &exitError{code: 2, err: fmt.Errorf("cp: %w; run again with --resume to recopy them", err)}
	case ctx.Err() != nil && errors.Is(err, context.Canceled):
		return &exitError{code: 130, err: errors.New("cp: interrupted; run the same command with --resume to continue")}
	}
	if oe := (*net.OpError)(nil); errors.As(err, &oe) && oe.Op == "dial" {
		return err // a server went away for good: describe words it
	}
	return &wordedError{msg: "cp: " + cpReason(err), err: err}
}

// cpReason keeps the context pcopy adds ("write /dst/x: ...") but puts
// server statuses in words.
func cpReason(err error) string {
	var se *client.StatusError
	if errors.As(err, &se) {
		msg := err.Error()
		if i := strings.Index(msg, se.Error()); i >= 0 {
			return msg[:i] + reason(se) + msg[i+len(se.Error()):]
		}
	}
	return err.Error()
}

func printCpSummary(w io.Writer, s pcopy.Summary, verify bool) {
	secs := s.Elapsed.Seconds()
	rate := 0.0
	if secs > 0 {
		rate = float64(s.Bytes) / secs / 1e6
	}
	fmt.Fprintf(w, "copied %s (%s), %s, %s to %s in %.1fs, %.1f MB/s\n",
		plural(s.Files, "file", "files"), pcopy.FormatBytes(s.Bytes), plural(s.Dirs, "directory", "directories"),
		plural(s.Symlinks, "symlink", "symlinks"), s.Target, secs, rate)
	if s.ResumedFiles > 0 || s.ResumedBytes > 0 {
		fmt.Fprintf(w, "resumed: %s and %s done by an earlier run\n", plural(s.ResumedFiles, "file", "files"), pcopy.FormatBytes(s.ResumedBytes))
	}
	if s.Links > 0 || s.Specials > 0 {
		fmt.Fprintf(w, "kept %s and %s\n", plural(s.Links, "hard link", "hard links"), plural(s.Specials, "special file", "special files"))
	}
	if s.Skipped > 0 {
		fmt.Fprintf(w, "skipped %d special files\n", s.Skipped)
	}
	if verify {
		if len(s.Mismatches) == 0 {
			fmt.Fprintf(w, "verified %d files: SHA-256 of source and destination match\n", s.Verified)
		} else {
			fmt.Fprintf(w, "verified %d files: %d MISMATCHED\n", s.Verified+int64(len(s.Mismatches)), len(s.Mismatches))
		}
	}
}

func plural(n int64, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}

// dialer turns arguments into endpoints, with one client per server.
type dialer struct {
	ff           fileFlags
	maxPerDS     int
	maxPerDSFlag bool // --max-per-ds was given
	clients      map[string]*client.Client
}

func (d *dialer) endpoint(ctx context.Context, arg string) (pcopy.Endpoint, error) {
	if !strings.Contains(arg, "://") {
		return pcopy.Endpoint{FS: pcopy.Local(), Path: arg}, nil
	}
	u, err := parseNFSURL(arg)
	if err != nil {
		return pcopy.Endpoint{}, err
	}
	if d.clients == nil {
		d.clients = map[string]*client.Client{}
	}
	c := d.clients[u.addr]
	if c == nil {
		opts, err := d.ff.options()
		if err != nil {
			return pcopy.Endpoint{}, err
		}
		// cp's own --max-per-ds (default 16, not the library's 8): given
		// on the command line it wins over a --policy file, otherwise the
		// file's max_per_ds does.
		opts.MaxPerDS = d.maxPerDS
		if d.maxPerDSFlag {
			opts.Policy.MaxPerDS = d.maxPerDS
		}
		c, err = client.Dial(ctx, u.addr, opts)
		if err != nil {
			return pcopy.Endpoint{}, err
		}
		d.clients[u.addr] = c
	}
	return pcopy.Endpoint{FS: pcopy.NFS(c), Path: u.path}, nil
}

func (d *dialer) close() {
	for _, c := range d.clients {
		c.Close()
	}
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}
