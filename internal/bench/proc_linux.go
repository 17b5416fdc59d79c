package bench

import (
	"os"
	"slices"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// childProcAttr puts a server child in its own process group, so a Ctrl-C
// at the terminal reaches only the benchmark, which then stops the server
// in order (letting it write its profile); and asks the kernel to kill the
// child if the benchmark itself dies without cleaning up.
func childProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// syncLatency measures the disk under dir: the median time of fdatasync
// after overwriting 4 KiB of a preallocated file, over 100 tries. It is
// the floor of one durable metadata change (a write-ahead log append) on
// this machine, which no single stream of creates or removes can beat;
// 0 if it cannot be measured.
func syncLatency(dir string) time.Duration {
	f, err := os.CreateTemp(dir, "shoal-bench-sync-*")
	if err != nil {
		return 0
	}
	defer os.Remove(f.Name())
	defer f.Close()
	const n, block = 100, 4096
	buf := make([]byte, block)
	if _, err := f.WriteAt(make([]byte, n*block), 0); err != nil || f.Sync() != nil {
		return 0
	}
	ts := make([]time.Duration, n)
	for i := range ts {
		t0 := time.Now()
		if _, err := f.WriteAt(buf, int64(i*block)); err != nil {
			return 0
		}
		if err := unix.Fdatasync(int(f.Fd())); err != nil {
			return 0
		}
		ts[i] = time.Since(t0)
	}
	slices.Sort(ts)
	return ts[n/2]
}
