package client_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

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
func ganeshaAddr(tb testing.TB) string {
	tb.Helper()
	if os.Getenv("SHOAL_GANESHA") != "1" {
		tb.Skip("set SHOAL_GANESHA=1 to run against NFS-Ganesha")
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
	code := m.Run()
	stopGanesha()
	os.Exit(code)
}

func dialGanesha(t *testing.T) *client.Client {
	t.Helper()
	addr := ganeshaAddr(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, addr, client.Options{Root: "/export"})
	if err != nil {
		t.Fatalf("dial ganesha: %v", err)
	}
	return c
}

func TestGanesha(t *testing.T) {
	clienttest.Run(t, dialGanesha)
}
