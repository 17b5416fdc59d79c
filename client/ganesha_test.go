package client_test

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"

	"github.com/shoalfs/shoal/client"
	"github.com/shoalfs/shoal/client/clienttest"
)

// ganesha is one NFS-Ganesha instance shared by all tests of the package,
// started on first use and stopped by TestMain through its pid file.
var ganesha struct {
	once sync.Once
	dir  string
	addr string
	err  error
}

func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(filepath.Dir(file))
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// ganeshaAddr returns the address of the shared Ganesha, starting it with
// scripts/ganesha.sh if needed. It skips the test unless SHOAL_GANESHA=1.
// SHOAL_GANESHA_ADDR names a Ganesha already running (serving /export)
// instead, for debugging with its logs.
func ganeshaAddr(tb testing.TB) string {
	tb.Helper()
	if os.Getenv("SHOAL_GANESHA") != "1" {
		tb.Skip("set SHOAL_GANESHA=1 to run against NFS-Ganesha")
	}
	if addr := os.Getenv("SHOAL_GANESHA_ADDR"); addr != "" {
		return addr // one started by hand (scripts/ganesha.sh), left running
	}
	ganesha.once.Do(func() {
		dir, err := os.MkdirTemp("", "shoal-ganesha-")
		if err != nil {
			ganesha.err = err
			return
		}
		ganesha.dir = dir
		for attempt := 0; attempt < 3; attempt++ {
			var port int
			if port, err = freePort(); err != nil {
				break
			}
			cmd := exec.Command(filepath.Join(repoRoot(), "scripts", "ganesha.sh"), "start", dir, fmt.Sprint(port))
			out, cerr := cmd.CombinedOutput()
			if cerr == nil {
				ganesha.addr = fmt.Sprintf("127.0.0.1:%d", port)
				return
			}
			err = fmt.Errorf("scripts/ganesha.sh start: %v: %s", cerr, out)
		}
		ganesha.err = err
	})
	if ganesha.err != nil {
		tb.Fatalf("starting NFS-Ganesha: %v", ganesha.err)
	}
	return ganesha.addr
}

func stopGanesha() {
	if ganesha.dir == "" {
		return
	}
	if ganesha.addr != "" {
		out, err := exec.Command(filepath.Join(repoRoot(), "scripts", "ganesha.sh"), "stop", ganesha.dir).CombinedOutput()
		if err != nil {
			fmt.Fprintf(os.Stderr, "stopping ganesha: %v: %s\n", err, out)
			return // keep the directory for the post-mortem
		}
	}
	os.RemoveAll(ganesha.dir)
}

func TestMain(m *testing.M) {
	if serveCluster() { // BenchmarkMetaOps's server process
		return
	}
	code := m.Run()
	stopGanesha()
	os.Exit(code)
}

func TestGanesha(t *testing.T) {
	addr := ganeshaAddr(t)
	for _, minor := range []uint32{2, 1} {
		t.Run(fmt.Sprintf("v4.%d", minor), func(t *testing.T) {
			clienttest.Run(t, dialer(addr, client.Options{Root: "/export", MinorVersion: minor}))
		})
	}
}

// TestGaneshaRestart restarts a private Ganesha with a grace period, in
// which the client reclaims its open and its lock. (A graceless one
// answers the reclaims NFS4ERR_NO_GRACE: the client opens again with
// CLAIM_FH, and reports the lock lost, as TestLockLostAfterGrace checks
// with Shoal.)
func TestGaneshaRestart(t *testing.T) {
	if os.Getenv("SHOAL_GANESHA") != "1" {
		t.Skip("set SHOAL_GANESHA=1 to run against NFS-Ganesha")
	}
	dir := t.TempDir()
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(repoRoot(), "scripts", "ganesha.sh")
	ganeshaCmd := func(args ...string) {
		t.Helper()
		cmd := exec.Command(script, args...)
		cmd.Env = append(os.Environ(), "GANESHA_GRACE=10")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("ganesha.sh %v: %v: %s", args, err, out)
		}
	}
	ganeshaCmd("start", dir, fmt.Sprint(port))
	t.Cleanup(func() { exec.Command(script, "stop", dir).Run() })
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	clienttest.RunRestart(t, dialer(addr, client.Options{Root: "/export"}), func(t *testing.T) {
		ganeshaCmd("stop", dir)
		ganeshaCmd("start", dir, fmt.Sprint(port))
	})
}

func TestGaneshaReplay(t *testing.T) {
	clienttest.RunReplay(t, ganeshaAddr(t), client.Options{Root: "/export"})
}
