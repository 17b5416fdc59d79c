package fusemount

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// minKernelReadahead is the smallest kernel readahead window with which
// read-only opens leave prefetching to the kernel (see fsys.readAccess).
// The kernel's default for a FUSE mount is 128 KiB, which keeps one 128
// KiB READ ahead of a sequential reader: too little to cover a round trip
// to a data server, so the library's own readahead is kept then.
const minKernelReadahead = 512 << 10

// setKernelReadahead sets the kernel's readahead window for the FUSE
// connection mounted on dir to bytes (rounded down to KiB) and returns the
// window the kernel then reports. The window lives in the connection's
// backing device, /sys/class/bdi/MAJOR:MINOR/read_ahead_kb, named after
// the mount's device number; FUSE_INIT can only lower it from the
// kernel's 128 KiB default, so it is raised here, after mounting. Writing
// it needs root; other users keep the default and get an error.
func setKernelReadahead(dir string, bytes int) (int, error) {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return 0, fmt.Errorf("readahead: stat %s: %w", dir, err)
	}
	p := fmt.Sprintf("/sys/class/bdi/%d:%d/read_ahead_kb", unix.Major(st.Dev), unix.Minor(st.Dev))
	if err := os.WriteFile(p, []byte(strconv.Itoa(bytes>>10)), 0); err != nil {
		return 0, fmt.Errorf("readahead: %w", err)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return 0, fmt.Errorf("readahead: %w", err)
	}
	kb, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, fmt.Errorf("readahead: %s: %w", p, err)
	}
	return kb << 10, nil
}
