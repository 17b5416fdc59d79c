package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// lockName is the file in a server's --dir that the server holds an
// exclusive flock on while it runs, and that holds its pid.
const lockName = "shoal.lock"

// created matches the entries Shoal servers create in their --dir: the
// lock, the metadata database, file data, the join secret, a data
// server's identity and port, and `shoal up`'s per-server directories.
// Only these are removed after a failed start, so a --dir that holds
// other things (say, /tmp) keeps them.
var created = regexp.MustCompile(`^(` + regexp.QuoteMeta(lockName) +
	`|meta\.db|data|join-secret|election-lease|ds-identity\.json(\.tmp)?|ds-port|ds-id|mds|ds[0-9]+)$`)

// dirClaim is a server process's hold on its --dir. Two servers on one
// directory would corrupt each other (and bbolt's own lock only makes the
// second wait, then fail with "timeout"), so the second fails at once and
// names the first. A start that fails before the server is ready removes
// what it created in the directory, so that it leaves no fresh, empty
// database behind to be mistaken for a cluster.
type dirClaim struct {
	dir     string
	lock    *os.File
	made    bool            // the directory did not exist before
	before  map[string]bool // its entries before the claim
	isReady bool
	subs    []*dirClaim // claims of server directories inside (claimSub)
}

// claimDir takes dir (creating it if need be) for this process.
func claimDir(dir string) (*dirClaim, error) {
	_, err := os.Stat(dir)
	made := errors.Is(err, fs.ErrNotExist)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("--dir: %w", err)
	}
	c := &dirClaim{dir: dir, made: made, before: map[string]bool{}}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("--dir: %w", err)
	}
	for _, e := range ents {
		c.before[e.Name()] = true
	}
	path := filepath.Join(dir, lockName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		c.cleanup()
		return nil, fmt.Errorf("--dir %s: %w", dir, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			who := "another shoal process"
			if b, err := os.ReadFile(path); err == nil {
				if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 0 {
					who = fmt.Sprintf("%s (pid %d)", who, pid)
				}
			}
			return nil, fmt.Errorf("%s is in use by %s: stop that one first, or give this one another --dir", dir, who)
		}
		c.cleanup()
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	// The pid is for the message above; the flock is what counts, so a
	// stale pid left by a process that died is harmless.
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	c.lock = f
	return c, nil
}

// claimSub claims the directory name inside c's for a server of the same
// process: `shoal up` holds its MDS's and data servers' directories, so a
// `shoal mds` or `shoal ds` started on one of them by mistake fails at once
// and names this process, instead of waiting on bbolt's lock.
func (c *dirClaim) claimSub(name string) error {
	sub, err := claimDir(filepath.Join(c.dir, name))
	if err != nil {
		return err
	}
	c.subs = append(c.subs, sub)
	return nil
}

// ready records that the server started: from now on its directory is
// kept whatever happens.
func (c *dirClaim) ready() {
	c.isReady = true
	for _, s := range c.subs {
		s.ready()
	}
}

// release lets the directory go. If the server never became ready, what
// the start created there goes too.
func (c *dirClaim) release() {
	for _, s := range c.subs {
		s.release()
	}
	c.subs = nil
	if !c.isReady {
		c.cleanup()
	}
	if c.lock != nil {
		c.lock.Close() // releases the flock
		c.lock = nil
	}
}

// cleanup removes what appeared in the directory since the claim: the
// directory itself if the claim made it, else the new entries that Shoal
// creates.
func (c *dirClaim) cleanup() {
	if c.made {
		os.RemoveAll(c.dir)
		return
	}
	ents, err := os.ReadDir(c.dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		if !c.before[e.Name()] && created.MatchString(e.Name()) {
			os.RemoveAll(filepath.Join(c.dir, e.Name()))
		}
	}
}
