package bench

import "syscall"

// childProcAttr puts a server child in its own process group, so a Ctrl-C
// at the terminal reaches only the benchmark, which then stops the server
// in order (letting it write its profile); and asks the kernel to kill the
// child if the benchmark itself dies without cleaning up.
func childProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
