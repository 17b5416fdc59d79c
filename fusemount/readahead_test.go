package fusemount

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shoalfs/shoal/client"
)

// bdiReadaheadKB reads the kernel readahead window of the mount on dir.
func bdiReadaheadKB(t *testing.T, dir string) int {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(fmt.Sprintf("/sys/class/bdi/%d:%d/read_ahead_kb", unix.Major(st.Dev), unix.Minor(st.Dev)))
	if err != nil {
		t.Fatal(err)
	}
	kb, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return kb
}

// TestKernelReadahead checks that a mount sets the kernel's readahead
// window from the policy's Readahead, that read-only opens of a cached
// mount then bypass the library's cache (and keep it when the window stays
// small), and that reads return the file's bytes either way.
func TestKernelReadahead(t *testing.T) {
	requireFUSE(t)
	if os.Geteuid() != 0 {
		t.Skip("setting the readahead window needs root")
	}
	addr := startCluster(t)
	data := pattern(6<<20+12345, 7)
	libWrite(t, dialLib(t, addr, 0, 0), "/ra", data, 0o644)
	for _, tt := range []struct {
		name      string
		access    Access
		readahead int // client.Policy.Readahead
		wantKB    int // read_ahead_kb after mounting; 0: the kernel's default, unchanged
		wantRO    client.Access
		roDirect  bool // read-only opens switch to the library's direct method
	}{
		{"cached default", AccessCached, 0, client.DefaultReadahead >> 10, client.AccessDirect, true},
		{"cached 2M", AccessCached, 2 << 20, 2048, client.AccessDirect, true},
		{"cached 256K keeps the library's readahead", AccessCached, 256 << 10, 256, 0, false},
		{"cached readahead off", AccessCached, -1, 0, 0, false},
		{"odirect default", AccessODirect, 0, client.DefaultReadahead >> 10, 0, false},
		{"direct leaves it alone", AccessDirect, 0, 0, 0, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			m, err := New(ctx, dir, Config{
				Addr: addr, Access: tt.access,
				Client: client.Options{DialTimeout: 10 * time.Second, Policy: client.Policy{Readahead: tt.readahead}},
				Logger: quietLogger(),
			})
			if err != nil {
				t.Fatalf("mount: %v", err)
			}
			defer func() {
				if err := m.Unmount(); err != nil {
					t.Errorf("unmount: %v", err)
				}
			}()
			kb := bdiReadaheadKB(t, dir)
			if tt.wantKB != 0 && kb != tt.wantKB {
				t.Errorf("read_ahead_kb = %d, want %d", kb, tt.wantKB)
			}
			if tt.wantKB == 0 && m.fsys.kernelRA.Load() != 0 {
				t.Errorf("kernelRA = %d, want 0 (left alone; read_ahead_kb %d)", m.fsys.kernelRA.Load(), kb)
			}
			a, ok := m.fsys.readAccess()
			if ok != tt.roDirect || (ok && a != tt.wantRO) {
				t.Errorf("readAccess() = %v, %v; want %v, %v", a, ok, tt.wantRO, tt.roDirect)
			}
			got, err := os.ReadFile(dir + "/ra")
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, data) {
				t.Fatalf("read %d bytes through the mount, differing from the %d written", len(got), len(data))
			}
		})
	}
}
