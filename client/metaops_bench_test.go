package client_test

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shoalfs/shoal/client"
	"github.com/shoalfs/shoal/internal/wiring"
	"github.com/shoalfs/shoal/server"
)

// BenchmarkMetaOps measures what the client spends on one small-file
// metadata operation as issue 27's fuse-meta.sh makes them through the
// FUSE mount: procs goroutines at once, each in a directory of its own,
// against a `shoal up --ds 4` cluster (wiring.Start, as the binary builds
// it) that runs in a child process (this test binary, started again), so
// that the CPU this process uses is the client's alone.
//
//   - remove: RemoveAt (SEQUENCE, PUTFH, REMOVE), as Unlink sends it; the
//     files are made before the timer starts.
//   - create: the four COMPOUNDs of a 4 KiB file the mount makes: a LOOKUP
//     that finds nothing, OPEN with O_CREAT|O_EXCL, WriteAtSyncSetAttr
//     (WRITE, SETATTR of the mtime, GETATTR) and CLOSE.
//   - lookup: LookupAt of an existing name (SEQUENCE, PUTFH, LOOKUP,
//     GETFH, GETATTR), with a context that can be cancelled, as the
//     mount's Lookup passes the kernel's request context;
//     lookup-nocancel the same with one that cannot be (the session layer
//     runs the round trip of a call whose context can be cancelled on a
//     goroutine of its own: the difference is what that costs).
//
// cpu-µs/op is this process's CPU time (user and system) per operation,
// srv-cpu-µs/op the server process's (from /proc, in clock ticks: use
// enough operations), allocs/op and B/op the client's. The server commits
// every change before it answers unless async (sync=false).
//
//	go test ./client -run '^$' -bench BenchmarkMetaOps -benchtime 4000x
//
// With SHOAL_BENCH_ADDR set (host:port of a running MDS, and
// SHOAL_BENCH_PID its process for srv-cpu-µs/op, or 0) the operations go
// to that server instead, whatever its mode (the async=false and
// async=true runs are then the same): scripts/fuse-vs-lib.sh compares
// them with the same operations through a FUSE mount of that server.
// ops/s is the rate of all goroutines together.
func BenchmarkMetaOps(b *testing.B) {
	for _, async := range []bool{false, true} {
		for _, op := range []string{"remove", "create", "lookup", "lookup-nocancel"} {
			b.Run(fmt.Sprintf("async=%v/%s", async, op), func(b *testing.B) {
				benchMetaOp(b, async, op, 4)
			})
		}
	}
}

func benchMetaOp(b *testing.B, async bool, op string, procs int) {
	addr, srvPID := benchServer(b, async)
	ctx := b.Context()
	c, err := client.Dial(ctx, addr, client.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	per := (b.N + procs - 1) / procs
	data := make([]byte, 4096)
	dirs := make([][]byte, procs)
	top := fmt.Sprintf("/bench-%s-%d", op, time.Now().UnixNano())
	if err := c.Mkdir(ctx, top, 0o755); err != nil {
		b.Fatal(err)
	}
	for p := range procs {
		dir := top + "/d" + strconv.Itoa(p)
		if err := c.Mkdir(ctx, dir, 0o755); err != nil {
			b.Fatal(err)
		}
		if dirs[p], _, err = c.Lookup(ctx, dir); err != nil {
			b.Fatal(err)
		}
		if op == "create" {
			continue
		}
		for i := range per {
			f, err := c.OpenAt(ctx, dirs[p], "f"+strconv.Itoa(i), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := f.Write(data); err != nil {
				b.Fatal(err)
			}
			if err := f.Close(); err != nil {
				b.Fatal(err)
			}
		}
	}
	// The kernel's request context can be cancelled (the caller is
	// interrupted); the mount's operations that change something drop
	// that (fusemount's mutating), and so does this benchmark's.
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	mctx := context.WithoutCancel(ctx)
	do := map[string]func(dir []byte, name string) error{
		"remove": func(dir []byte, name string) error { return c.RemoveAt(mctx, dir, name) },
		"create": func(dir []byte, name string) error {
			// What the kernel sends for open(O_CREAT|O_EXCL), write
			// and close through the mount with its writeback cache:
			// a LOOKUP that finds nothing, CREATE (OPEN), FLUSH (the
			// held write with its mtime: WRITE, SETATTR, GETATTR) and
			// RELEASE (CLOSE).
			if _, _, err := c.LookupAt(lctx, dir, name); !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("lookup of %s before create: %v", name, err)
			}
			f, err := c.OpenAt(mctx, dir, name, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
			if err != nil {
				return err
			}
			now := time.Now()
			if _, _, _, _, err := f.WriteAtSyncSetAttr(mctx, data, 0, client.SetAttr{Mtime: &now}); err != nil {
				f.Close()
				return err
			}
			return f.Close()
		},
		"lookup": func(dir []byte, name string) error {
			_, _, err := c.LookupAt(lctx, dir, name)
			return err
		},
		"lookup-nocancel": func(dir []byte, name string) error {
			_, _, err := c.LookupAt(mctx, dir, name)
			return err
		},
	}[op]
	cpu0, srv0 := processCPU(b), time.Duration(0)
	if srvPID != 0 {
		srv0 = procCPU(b, srvPID)
	}
	b.ReportAllocs()
	b.ResetTimer()
	var wg sync.WaitGroup
	errs := make(chan error, procs)
	for p := range procs {
		wg.Go(func() {
			for i := range per {
				if err := do(dirs[p], "f"+strconv.Itoa(i)); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	n := float64(per * procs)
	b.ReportMetric(n/b.Elapsed().Seconds(), "ops/s")
	b.ReportMetric(float64((processCPU(b)-cpu0).Microseconds())/n, "cpu-µs/op")
	if srvPID != 0 {
		b.ReportMetric(float64((procCPU(b, srvPID)-srv0).Microseconds())/n, "srv-cpu-µs/op")
	}
}

// benchServer returns the MDS address and process of SHOAL_BENCH_ADDR and
// SHOAL_BENCH_PID if set, else of a cluster started for the benchmark
// (startClusterProcess).
func benchServer(b *testing.B, async bool) (string, int) {
	addr := os.Getenv("SHOAL_BENCH_ADDR")
	if addr == "" {
		return startClusterProcess(b, async)
	}
	pid, err := strconv.Atoi(cmp.Or(os.Getenv("SHOAL_BENCH_PID"), "0"))
	if err != nil {
		b.Fatalf("SHOAL_BENCH_PID: %v", err)
	}
	return addr, pid
}

// clusterEnv makes this test binary serve a cluster instead of running
// tests (serveCluster, from TestMain): its value is the data directory.
const clusterEnv = "SHOAL_BENCH_CLUSTER_DIR"

// startClusterProcess starts this test binary again as a `shoal up --ds 4`
// cluster on 127.0.0.1 and returns its MDS address and PID. The child
// stops when its stdin closes; the cleanup closes it and waits.
func startClusterProcess(b *testing.B, async bool) (string, int) {
	b.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), clusterEnv+"="+b.TempDir(), "SHOAL_BENCH_ASYNC="+strconv.FormatBool(async))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		stdin.Close()
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				b.Errorf("cluster process: %v", err)
			}
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-done
			b.Error("cluster process did not stop within 30 s; killed")
		}
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		b.Fatalf("cluster process: no address: %v", err)
	}
	return strings.TrimSpace(line), cmd.Process.Pid
}

// serveCluster runs the cluster of startClusterProcess if this process
// was started as one, and reports whether it was.
func serveCluster() bool {
	dir := os.Getenv(clusterEnv)
	if dir == "" {
		return false
	}
	f := false
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	cl, err := wiring.Start(ctx, wiring.Config{
		Dir: dir, DataServers: 4, Listen: "127.0.0.1:0",
		Exports: []*server.Export{{Path: "/", RootSquash: &f}},
		Logger:  slog.New(slog.DiscardHandler),
		Async:   os.Getenv("SHOAL_BENCH_ASYNC") == "true",
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "cluster:", err)
		os.Exit(1)
	}
	fmt.Println(cl.MDS.Addr.String())
	_, _ = io.Copy(io.Discard, os.Stdin) // until the parent closes it
	cl.Close()
	return true
}

// procCPU is the CPU time (user and system) process pid used so far, from
// /proc/PID/stat, in clock ticks of 10 ms.
func procCPU(b *testing.B, pid int) time.Duration {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	s := string(raw)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	ut, _ := strconv.ParseInt(fields[11], 10, 64)
	st, _ := strconv.ParseInt(fields[12], 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond
}
