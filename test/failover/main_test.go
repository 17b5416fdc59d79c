package failover

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// shoalBin is the shoal command TestMain built (or $SHOAL_BIN).
var shoalBin string

func TestMain(m *testing.M) {
	os.Exit(buildAndRun(m))
}

func buildAndRun(m *testing.M) int {
	if bin := os.Getenv("SHOAL_BIN"); bin != "" {
		shoalBin = bin
		return m.Run()
	}
	gobin, err := exec.LookPath("go")
	if err != nil {
		gobin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	out, err := exec.Command(gobin, "env", "GOMOD").Output()
	if err != nil {
		fmt.Fprintf(os.Stderr, "failover: go env GOMOD: %v\n", err)
		return 1
	}
	gomod := strings.TrimSpace(string(out))
	tmp, err := os.MkdirTemp("", "shoal-failover-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "failover:", err)
		return 1
	}
	defer os.RemoveAll(tmp)
	shoalBin = filepath.Join(tmp, "shoal")
	build := exec.Command(gobin, "build", "-o", shoalBin, "./cmd/shoal")
	build.Dir = filepath.Dir(gomod)
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "failover: go build ./cmd/shoal: %v\n%s", err, out)
		return 1
	}
	return m.Run()
}
