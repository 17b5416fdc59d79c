package meta_test

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/shoalfs/shoal/meta"
)

// crashChildEnv tells a re-executed test binary to be the crash test's
// child: it names the database to write.
const crashChildEnv = "SHOAL_META_CRASH_CHILD"

// crashOpts is how both the child and the parent open the database: the
// write-ahead log as servers use it, with a small checkpoint size so that
// kills also land in checkpoints.
var crashOpts = meta.BoltOptions{WAL: true, WALCheckpointBytes: 256 << 10}

// TestCrashAcknowledgedCreates kills a process that is creating files
// (kill -9, at a random moment) and checks, after reopening its database,
// that every create it acknowledged is there and that the namespace is
// consistent. Each trial adds to the same database, so recovery also runs
// over the previous trials' state. In the deferred mode (meta.Deferred,
// what an export with sync: false gets) creates are acknowledged before
// their fdatasync; a killed process must lose none of them either, since
// they were written to the log.
func TestCrashAcknowledgedCreates(t *testing.T) {
	if path := os.Getenv(crashChildEnv); path != "" {
		crashChild(path, os.Getenv(crashDeferredEnv) != "")
		return
	}
	if testing.Short() {
		t.Skip("re-executes the test binary")
	}
	for _, tc := range []struct {
		name     string
		deferred bool
	}{{"sync", false}, {"deferred", true}} {
		t.Run(tc.name, func(t *testing.T) { crashTrials(t, tc.deferred) })
	}
}

// crashDeferredEnv makes the crash test's child create under meta.Deferred.
const crashDeferredEnv = "SHOAL_META_CRASH_DEFERRED"

func crashTrials(t *testing.T, deferred bool) {
	dbPath := filepath.Join(t.TempDir(), "meta.db")
	const trials = 20
	deadline := time.Now().Add(60 * time.Second)
	acked := map[string]meta.Ino{} // name → inode, over all trials
	for trial := range trials {
		if time.Now().After(deadline) {
			t.Logf("stopping after %d trials: time budget used", trial)
			break
		}
		got := runCrashChild(t, dbPath, trial, deferred, time.Duration(50+rand.IntN(400))*time.Millisecond)
		for name, ino := range got {
			acked[name] = ino
		}
		e, err := meta.OpenBolt(dbPath, crashOpts)
		if err != nil {
			t.Fatalf("trial %d: reopen after kill: %v", trial, err)
		}
		checkCrashNamespace(t, e, acked)
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
		t.Logf("trial %d: %d creates acknowledged before the kill, %d in total", trial, len(got), len(acked))
	}
}

// runCrashChild starts the child, kills it with SIGKILL after d and
// returns the creates it acknowledged.
func runCrashChild(t *testing.T, dbPath string, trial int, deferred bool, d time.Duration) map[string]meta.Ino {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashAcknowledgedCreates$", "-test.count=1")
	cmd.Env = append(os.Environ(), crashChildEnv+"="+dbPath, "SHOAL_META_CRASH_TRIAL="+strconv.Itoa(trial))
	if deferred {
		cmd.Env = append(cmd.Env, crashDeferredEnv+"=1")
	}
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	got := map[string]meta.Ino{}
	started := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(out)
		first := true
		for sc.Scan() {
			// Only whole lines count: each is one write of less
			// than PIPE_BUF, so a kill cannot split one.
			f := strings.Fields(sc.Text())
			if len(f) == 1 && f[0] == "ready" && first {
				first = false
				close(started)
				continue
			}
			if len(f) != 3 || f[0] != "created" {
				continue
			}
			ino, err := strconv.ParseUint(f[2], 10, 64)
			if err == nil {
				got[f[1]] = meta.Ino(ino)
			}
		}
	}()
	select {
	case <-started:
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatal("child did not open the database")
	}
	time.Sleep(d)
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-done
	err = cmd.Wait()
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("child ended before the kill: %v", err)
	}
	return got
}

// crashChild creates files from several goroutines until it is killed,
// printing each create once it is acknowledged.
func crashChild(dbPath string, deferred bool) {
	e, err := meta.OpenBolt(dbPath, crashOpts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		os.Exit(2)
	}
	trial := os.Getenv("SHOAL_META_CRASH_TRIAL")
	ctx := context.Background()
	if deferred {
		ctx = meta.Deferred(ctx)
	}
	dir, _, err := e.Create(ctx, meta.RootIno, "t"+trial, meta.CreateArgs{Type: meta.TypeDirectory, Mode: 0o755}, time.Now())
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		os.Exit(2)
	}
	var mu sync.Mutex
	ack := func(name string, ino meta.Ino) {
		mu.Lock()
		defer mu.Unlock()
		os.Stdout.WriteString("created " + name + " " + strconv.FormatUint(uint64(ino), 10) + "\n")
	}
	ack("t"+trial, dir.Ino)
	os.Stdout.WriteString("ready\n")
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			// Bounded even if the parent never kills: 60 s worth.
			for i := range 1_000_000 {
				name := fmt.Sprintf("t%s/g%d-%d", trial, g, i)
				parent, leaf := dir.Ino, name[strings.IndexByte(name, '/')+1:]
				args := meta.CreateArgs{Type: meta.TypeRegular, Mode: 0o644}
				if i%10 == 0 {
					args.Type = meta.TypeDirectory
				}
				n, _, err := e.Create(ctx, parent, leaf, args, time.Now())
				if err != nil {
					fmt.Fprintln(os.Stderr, "child: create:", err)
					os.Exit(2)
				}
				ack(name, n.Ino)
			}
		})
	}
	wg.Wait()
	os.Exit(0)
}

// checkCrashNamespace checks that every acknowledged name resolves to its
// inode, and that the namespace is consistent: directory entries point at
// existing inodes of the right type, directory link counts match their
// subdirectories, and StatFS counts exactly the reachable inodes.
func checkCrashNamespace(t *testing.T, e meta.Engine, acked map[string]meta.Ino) {
	t.Helper()
	ctx := context.Background()
	for name, ino := range acked {
		parent := meta.RootIno
		dirName, leaf, ok := strings.Cut(name, "/")
		if ok {
			n, err := e.Lookup(ctx, meta.RootIno, dirName)
			if err != nil {
				t.Fatalf("acknowledged %s: lookup %s: %v", name, dirName, err)
			}
			parent = n.Ino
		} else {
			leaf = dirName
		}
		n, err := e.Lookup(ctx, parent, leaf)
		if err != nil || n.Ino != ino {
			t.Fatalf("acknowledged %s (inode %d) after the kill: %+v %v", name, ino, n, err)
		}
	}
	inodes := uint64(0)
	var walk func(dir meta.Ino)
	walk = func(dir meta.Ino) {
		inodes++
		a, err := e.GetAttr(ctx, dir)
		if err != nil {
			t.Fatalf("getattr dir %d: %v", dir, err)
		}
		subdirs := uint32(0)
		for cookie, eof := uint64(0), false; !eof; {
			var ents []meta.Entry
			ents, eof, err = e.ReadDir(ctx, dir, cookie, 1000)
			if err != nil {
				t.Fatalf("readdir %d: %v", dir, err)
			}
			for _, en := range ents {
				cookie = en.Cookie
				got, err := e.GetAttr(ctx, en.Ino)
				if err != nil || got.Type != en.Attr.Type {
					t.Fatalf("entry %s of %d: inode %d: %+v %v", en.Name, dir, en.Ino, got, err)
				}
				if en.Attr.Type == meta.TypeDirectory {
					subdirs++
					walk(en.Ino)
				} else {
					inodes++
				}
			}
		}
		if a.Nlink != 2+subdirs {
			t.Fatalf("dir %d: nlink %d with %d subdirectories", dir, a.Nlink, subdirs)
		}
	}
	walk(meta.RootIno)
	st, err := e.StatFS(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Files != inodes {
		t.Fatalf("StatFS counts %d inodes, %d reachable", st.Files, inodes)
	}
	rep, err := meta.Check(ctx, e, meta.CheckOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := rep.Err(); err != nil {
		t.Fatal(err)
	}
}
