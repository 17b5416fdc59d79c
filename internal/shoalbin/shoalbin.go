// Package shoalbin builds the shoal command for tests that run it as real
// processes (test/failover, test/membership), so that each does not carry
// its own copy of the build.
package shoalbin

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
)

// Build builds ./cmd/shoal of the module the test runs in into a fresh
// temporary directory, or returns $SHOAL_BIN when set (to test another
// build). cleanup removes what Build made.
func Build(prefix string) (bin string, cleanup func(), err error) {
	if b := os.Getenv("SHOAL_BIN"); b != "" {
		return b, func() {}, nil
	}
	gobin, err := exec.LookPath("go")
	if err != nil {
		// go test may run with a PATH that lacks the toolchain.
		gobin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	out, err := exec.Command(gobin, "env", "GOMOD").Output()
	if err != nil {
		return "", nil, fmt.Errorf("go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", nil, fmt.Errorf("not inside the shoal module")
	}
	tmp, err := os.MkdirTemp("", prefix)
	if err != nil {
		return "", nil, err
	}
	bin = filepath.Join(tmp, "shoal")
	build := exec.Command(gobin, "build", "-o", bin, "./cmd/shoal")
	build.Dir = filepath.Dir(gomod)
	if out, err := build.CombinedOutput(); err != nil {
		os.RemoveAll(tmp)
		return "", nil, fmt.Errorf("go build ./cmd/shoal: %v\n%s", err, out)
	}
	return bin, func() { os.RemoveAll(tmp) }, nil
}
