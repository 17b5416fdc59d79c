package posix

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/shoalfs/shoal/fusemount"
)

// buildShoal builds the shoal command into a temporary directory, or
// returns $SHOAL_BIN if that is set.
func buildShoal(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv("SHOAL_BIN"); bin != "" {
		return bin
	}
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go toolchain in PATH to build the shoal command")
	}
	bin := filepath.Join(t.TempDir(), "shoal")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, gobin, "build", "-o", bin, "github.com/shoalfs/shoal/cmd/shoal").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// waitMounted polls mountinfo until dir's mount state is want, or the
// serving process (if any) exits, for at most 30 seconds.
func waitMounted(t *testing.T, dir string, want bool, exited <-chan struct{}) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for i := 0; i < 600 && time.Now().Before(deadline); i++ {
		if ok, err := fusemount.Mounted(dir); err != nil {
			t.Fatal(err)
		} else if ok == want {
			return
		}
		select {
		case <-exited:
			if want {
				t.Fatal("shoal mount exited before the mount was up")
			}
		case <-time.After(50 * time.Millisecond):
		}
	}
	t.Fatalf("%s: mounted != %v after 30s", dir, want)
}

// TestCLI runs `shoal mount` and `shoal umount` as a user would: a
// foreground mount ended by SIGTERM, and a background one ended by
// `shoal umount`. Neither may leave a mount behind.
func TestCLI(t *testing.T) {
	requireFUSE(t)
	bin := buildShoal(t)
	url := "nfs://" + startServer(t) + "/"

	t.Run("sigterm", func(t *testing.T) {
		dir := mountpoint(t)
		cmd := exec.Command(bin, "mount", "--access", "direct", url, dir)
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan struct{})
		var waitErr error
		go func() { waitErr = cmd.Wait(); close(exited) }()
		t.Cleanup(func() {
			cmd.Process.Kill()
			<-exited
			if ok, _ := fusemount.Mounted(dir); ok {
				fusemount.Unmount(dir, true)
			}
		})
		waitMounted(t, dir, true, exited)
		write(t, filepath.Join(dir, "via-cli"), "cli")
		if got := read(t, filepath.Join(dir, "via-cli")); got != "cli" {
			t.Fatalf("read back %q", got)
		}
		if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			t.Fatal("shoal mount did not exit within 30s of SIGTERM")
		}
		if waitErr != nil {
			t.Errorf("shoal mount: %v", waitErr)
		}
		if ok, err := fusemount.Mounted(dir); ok || err != nil {
			t.Fatalf("still mounted after SIGTERM (err %v)", err)
		}
	})

	t.Run("background-umount", func(t *testing.T) {
		dir := mountpoint(t)
		out, err := exec.Command(bin, "mount", "--foreground=false", url, dir).CombinedOutput()
		if err != nil {
			t.Fatalf("shoal mount --foreground=false: %v\n%s", err, out)
		}
		t.Cleanup(func() {
			if ok, _ := fusemount.Mounted(dir); ok {
				fusemount.Unmount(dir, true)
			}
		})
		// The parent returns only once the mount is up.
		if ok, err := fusemount.Mounted(dir); !ok || err != nil {
			t.Fatalf("not mounted when shoal mount returned (err %v)", err)
		}
		write(t, filepath.Join(dir, "via-daemon"), "daemon")
		if got := read(t, filepath.Join(dir, "via-daemon")); got != "daemon" {
			t.Fatalf("read back %q", got)
		}
		if out, err := exec.Command(bin, "umount", dir).CombinedOutput(); err != nil {
			t.Fatalf("shoal umount: %v\n%s", err, out)
		}
		waitMounted(t, dir, false, nil)
	})
}
