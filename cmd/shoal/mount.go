package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/shoalfs/shoal/client"
	"github.com/shoalfs/shoal/fusemount"
)

// readyFD is the descriptor on which a background `shoal mount` child
// reports "ok" (or the error) to its parent once the mount is up.
const readyFD = 3

const readyEnv = "SHOAL_MOUNT_READY_FD"

func newMountCmd() *cobra.Command {
	var (
		access     string
		uid, gid   uint32
		allowOther bool
		foreground bool
		cpuprofile string
		readerPs   bool
		debug      bool
		minor      uint32
		attrTTL    time.Duration
		dirTTL     time.Duration
		polFlags   *policyFlags
	)
	cmd := &cobra.Command{
		Use:   "mount nfs://host[:port]/path MOUNTPOINT",
		Short: "Mount an NFSv4.1+ export with FUSE, through Shoal's client library",
		Long: `Mount serves an NFSv4.1 (or later) export on a local directory with FUSE,
doing all NFS work in Shoal's client library rather than the kernel's NFS client.

By default it runs in the foreground until it is unmounted (shoal umount,
fusermount3 -u, umount) or receives SIGINT/SIGTERM, on which it unmounts
cleanly. With --foreground=false it detaches once the mount is up.

Access methods (--access), each also selecting the client library's method
of the same name:
  cached   kernel page cache, kept across opens while the file's NFS change
           attribute is unchanged (close-to-open consistency); the library
           caches and writes back in blocks
  odirect  page cache dropped at every open; O_DIRECT opens bypass it; the
           library gathers small contiguous writes
  direct   no page cache: every read and write goes to the library and on to
           the server (or its data servers, with pNFS) unchanged

The kernel caches file attributes for --attr-timeout (default 3s) and names
and directory attributes for --dir-timeout (default 30s), like the kernel NFS
client's acregmin and acdirmin: another client's change to a file shows in
stat within the first, a rename within the second. Opens always check with
the server (close-to-open), names that do not exist are never cached, and
this mount's own changes show at once.
When run as root with --allow-other, every request uses its caller's uid and
gid as the NFS credential (one NFS session per identity) and the server
checks permissions; otherwise all requests use --uid/--gid.

The client library's policy flags (--block-size, --max-per-ds,
--layout-fetch, --keep-layouts, --small-io-threshold, --readahead,
--cache-size) and --policy FILE (YAML with the same settings) tune the
library below the mount. --readahead also sets the kernel's readahead window
for the mount (root only; default 1M): with a window of 512K or more, the
kernel prefetches for cached reads and the library's cache stays out of
their way.

A cluster with metadata-server failover is named by all its metadata servers'
addresses, comma-separated (nfs://mds1,mds2,mds3:2049/data, or with a port
each): the mount uses whichever answers, and moves to another when the
connection is lost, recovering its open files and locks there.`,
		Example: `  shoal mount nfs://127.0.0.1:2049/ /mnt/shoal
  shoal mount nfs://mds1,mds2,mds3:2049/data /mnt/data
  shoal mount --access direct --foreground=false nfs://mds:2049/data /mnt/data
  sudo shoal mount --allow-other nfs://127.0.0.1:2049/ /mnt/shared`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			u, err := parseNFSURL(args[0])
			if err != nil {
				return err
			}
			acc, err := fusemount.ParseAccess(access)
			if err != nil {
				return err
			}
			pol, err := polFlags.policy()
			if err != nil {
				return err
			}
			// --access selects the kernel's handling and the library's
			// method together (fusemount.Config.Access); a policy file's
			// access setting does not apply to a mount.
			pol.Access = client.AccessDefault
			dir := args[1]
			if st, err := os.Stat(dir); err != nil {
				return fmt.Errorf("mount point: %w", err)
			} else if !st.IsDir() {
				return fmt.Errorf("mount point %s is not a directory", dir)
			}
			if !foreground && os.Getenv(readyEnv) == "" {
				return daemonize(cmd)
			}
			mountGC() // this process serves one mount (mountgc.go)
			cfg := fusemount.Config{
				Addr:        u.addr,
				Root:        u.path,
				Access:      acc,
				UID:         uid,
				GID:         gid,
				PerCaller:   allowOther && os.Geteuid() == 0,
				AllowOther:  allowOther,
				Client:      client.Options{MinorVersion: minor, DialTimeout: 10 * time.Second, Policy: pol},
				Logger:      slog.Default(),
				Debug:       debug,
				AttrTimeout: cacheTimeout(attrTTL),
				DirTimeout:  cacheTimeout(dirTTL),
				ReaderProcs: readerPs, // this process serves one mount
			}
			if cpuprofile != "" {
				stop, err := startCPUProfile(cpuprofile)
				if err != nil {
					return err
				}
				defer stop()
			}
			m, err := fusemount.New(cmd.Context(), dir, cfg)
			notifyReady(err)
			if err != nil {
				return err
			}
			done := make(chan struct{})
			go func() { m.Wait(); close(done) }()
			select {
			case <-done:
				slog.Info("unmounted", "dir", dir)
				return nil
			case <-cmd.Context().Done():
			}
			slog.Info("signal: unmounting", "dir", dir)
			if err := m.Unmount(); err != nil {
				// Still busy: detach it so no stale mount is left behind;
				// programs with open files see ENOTCONN from now on.
				slog.Warn("unmount failed, detaching lazily", "dir", dir, "err", err)
				if err := fusemount.Unmount(dir, true); err != nil {
					return err
				}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&access, "access", "cached", "data access method: cached, odirect or direct")
	f.Uint32Var(&uid, "uid", uint32(os.Getuid()), "user id of the NFS credential (all requests, unless --allow-other as root)")
	f.Uint32Var(&gid, "gid", uint32(os.Getgid()), "group id of the NFS credential")
	f.BoolVar(&allowOther, "allow-other", false, "let other users use the mount; as root, each request uses its caller's uid/gid")
	f.BoolVar(&foreground, "foreground", true, "stay in the foreground until unmounted (false: detach once mounted; the detached process logs nowhere)")
	f.BoolVar(&debug, "debug", false, "log every FUSE request")
	f.StringVar(&cpuprofile, "cpuprofile", "", "write a CPU profile of the mount to this file, until it is unmounted")
	_ = f.MarkHidden("cpuprofile")
	f.BoolVar(&readerPs, "reader-procs", true, "raise GOMAXPROCS by go-fuse's /dev/fuse readers (fusemount.Config.ReaderProcs; false: leave it, to compare)")
	_ = f.MarkHidden("reader-procs")
	f.Uint32Var(&minor, "minor-version", 0, "NFSv4 minor version (default: highest the server speaks)")
	f.DurationVar(&attrTTL, "attr-timeout", fusemount.DefaultAttrTimeout, "how long the kernel caches a file's attributes (0: not at all)")
	f.DurationVar(&dirTTL, "dir-timeout", fusemount.DefaultDirTimeout, "how long the kernel caches names and directory attributes (0: not at all)")
	polFlags = addPolicyFlags(cmd, "access")
	return cmd
}

// cacheTimeout turns a --attr-timeout or --dir-timeout value into
// fusemount.Config's: there zero means the default and negative none.
func cacheTimeout(d time.Duration) time.Duration {
	if d <= 0 {
		return -1
	}
	return d
}

// daemonize re-runs the command in a new session with --foreground and
// waits until the child reports that the mount is up (or why it is not).
func daemonize(cmd *cobra.Command) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	defer r.Close()
	args := append([]string{"mount", "--foreground"}, childArgs(cmd)...)
	child := exec.Command(self, args...)
	child.Env = append(os.Environ(), fmt.Sprintf("%s=%d", readyEnv, readyFD))
	child.ExtraFiles = []*os.File{w} // fd 3
	child.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := child.Start(); err != nil {
		w.Close()
		return err
	}
	w.Close()
	line, _ := bufio.NewReader(r).ReadString('\n')
	line = strings.TrimSpace(line)
	if line == "ok" {
		return child.Process.Release()
	}
	child.Wait()
	if line == "" {
		line = "mount process exited before the mount was up"
	}
	return errors.New(line)
}

// childArgs repeats the command's arguments and changed flags, except
// --foreground.
func childArgs(cmd *cobra.Command) []string {
	var out []string
	cmd.Flags().Visit(func(fl *pflag.Flag) {
		if fl.Name != "foreground" {
			out = append(out, "--"+fl.Name+"="+fl.Value.String())
		}
	})
	return append(out, cmd.Flags().Args()...)
}

// notifyReady tells a waiting parent (daemonize) how the mount went; the
// child then keeps logging to its inherited stderr.
func notifyReady(err error) {
	if os.Getenv(readyEnv) == "" {
		return
	}
	f := os.NewFile(readyFD, "ready")
	if f == nil {
		return
	}
	defer f.Close()
	msg := "ok"
	if err != nil {
		msg = describe(err)
	}
	io.WriteString(f, msg+"\n")
}

func newUmountCmd() *cobra.Command {
	var lazy bool
	cmd := &cobra.Command{
		Use:   "umount MOUNTPOINT",
		Short: "Unmount a `shoal mount` (the serving process then exits)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			// umount2's EINVAL says only "invalid argument"; the usual
			// reason is that nothing is mounted there.
			if ok, err := fusemount.Mounted(args[0]); err == nil && !ok {
				return fmt.Errorf("umount %s: not mounted", args[0])
			}
			return fusemount.Unmount(args[0], lazy)
		},
	}
	cmd.Flags().BoolVarP(&lazy, "lazy", "l", false, "detach now even if files are in use")
	return cmd
}
