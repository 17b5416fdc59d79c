package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// selfCommand is how the commands Shoal prints (the ready lines of
// `shoal up` and `shoal mds`) name the shoal binary, so that they work when
// pasted as printed: "shoal" when that resolves on PATH to this very binary,
// otherwise this binary's absolute path. Under `go run` the binary is a
// temporary file that is deleted when the run ends, so it is "shoal" and a
// note (see goRunNote) says how to get one on PATH.
func selfCommand() string {
	exe, err := os.Executable()
	if err != nil || underGoRun(exe) {
		return "shoal"
	}
	if p, err := exec.LookPath("shoal"); err == nil && sameFile(p, exe) {
		return "shoal"
	}
	return exe
}

// goRunNote is printed with the ready lines when the binary runs under
// `go run`: the printed commands need a shoal binary on PATH, and a signal
// sent to the go process does not reach this one.
func goRunNote() string {
	exe, err := os.Executable()
	if err != nil || !underGoRun(exe) {
		return ""
	}
	return "  note:   running under `go run`: build the binary for the commands above with\n" +
		"          go build -buildvcs=auto -o /usr/local/bin/shoal ./cmd/shoal\n" +
		"          (kill -INT of the go process does not reach this one; Ctrl-C, or kill " + strconv.Itoa(os.Getpid()) + ")\n"
}

// underGoRun reports whether exe is a binary `go run` built: it lives in a
// go-build work directory under the temporary directory.
func underGoRun(exe string) bool {
	rel, err := filepath.Rel(os.TempDir(), exe)
	if err != nil || strings.HasPrefix(rel, "..") {
		return false
	}
	return strings.HasPrefix(rel, "go-build")
}

func sameFile(a, b string) bool {
	fa, err := os.Stat(a)
	if err != nil {
		return false
	}
	fb, err := os.Stat(b)
	if err != nil {
		return false
	}
	return os.SameFile(fa, fb)
}

// stopWithGoRun makes this process receive SIGTERM when its parent dies, if
// it runs under `go run`. go run waits for its child but does not forward
// signals: SIGINT and SIGQUIT it ignores, and SIGTERM or SIGKILL end the go
// process alone, which left a cluster running with nobody to stop it. With
// the parent-death signal, killing go stops Shoal cleanly (listeners closed,
// ports freed). It is not set otherwise, because a shoal started from a
// shell that then exits (nohup, a service script) must keep running.
func stopWithGoRun() {
	exe, err := os.Executable()
	if err != nil || !underGoRun(exe) {
		return
	}
	ppid := os.Getppid()
	if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(syscall.SIGTERM), 0, 0, 0); err != nil {
		return
	}
	// The parent may have died before the prctl; then the signal will
	// never come, so send it now.
	if os.Getppid() != ppid {
		_ = syscall.Kill(os.Getpid(), syscall.SIGTERM)
	}
}
