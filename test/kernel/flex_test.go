package kernel

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The shoal-flex kind: `shoal mds --mirrors 2 --layout flexfiles` (and
// flex_stripe auto: striped mirrors for Linux 6.18 and later, one data
// server per mirror before) with three `shoal ds` processes. The guest
// (workload phase "flex") mounts, checks that mountstats shows
// pnfs=LAYOUT_FLEX_FILES, and writes the DIRECT_SIZES files (O_DIRECT for
// sizes that are multiples of 512, buffered otherwise), each read back
// with O_DIRECT and buffered after a cache drop and compared by sha256.
// Between the SYNC lines around those writes the driver reads every
// process's own counters: the data servers together must have received
// every byte twice from the client (shoal_nfs_bytes_total), none from each
// other (shoal_ds_replica_write_bytes_total), and the MDS almost none.

const flexDS = 3

// flexBytes is what the flex phase writes between its SYNC lines: the
// workload's DIRECT_SIZES.
const flexBytes = 33554432 + 33558528 + 3158073 + 1048064

func testFlex(t *testing.T, shoalBin string, img images, vmTimeout time.Duration, vers, out string) {
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	g, err := newGrowCluster(shoalBin, filepath.Join(out, "server"), port)
	if err != nil {
		t.Fatal(err)
	}
	g.mds.argv = append(g.mds.argv, "--mirrors", "2", "--layout", "flexfiles",
		"--flex-stripe", env("SHOAL_KERNEL_FLEX_STRIPE", "auto"))
	if err := os.MkdirAll(g.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	t.Cleanup(func() {
		if err := g.Stop(); err != nil {
			t.Errorf("stop cluster: %v", err)
		}
	})
	if err := g.mds.Start(ctx); err != nil {
		t.Fatalf("start MDS: %v", err)
	}
	for range flexDS {
		if _, err := g.addDS(ctx); err != nil {
			t.Fatalf("start data server: %v", err)
		}
	}
	if _, err := g.waitUp(ctx, flexDS, time.Minute); err != nil {
		t.Fatal(err)
	}
	t.Logf("server: %s; artifacts in %s", g.Describe(), out)

	snaps := map[string]growSnap{}
	var errs []error
	hook := func(line string) string {
		m := syncRE.FindStringSubmatch(line)
		if m == nil {
			return ""
		}
		tag := m[1]
		s, err := g.snapshot(ctx)
		if err != nil {
			errs = append(errs, fmt.Errorf("SYNC %s: %w", tag, err))
			return "ERR " + tag + " " + strings.Join(strings.Fields(err.Error()), " ")
		}
		snaps[tag] = s
		return "OK " + tag
	}
	res := boot(ctx, bootConfig{
		img: img, port: port, timeout: vmTimeout, logf: t.Logf, hook: hook,
		params: map[string]string{
			"t_host": "10.0.2.2", "t_port": strconv.Itoa(port), "t_path": "/",
			"t_vers": vers, "t_phase": "flex", "t_pnfs": "1",
		},
		capture: filepath.Join(out, "capture-flex.pcap"),
		console: filepath.Join(out, "console-flex.log"),
	})
	report(t, "flex", res)
	for _, err := range errs {
		t.Errorf("driver: %v", err)
	}
	t.Run("flex/client-writes-every-copy", func(t *testing.T) {
		before, okb := snaps["flex-before"]
		after, oka := snaps["flex-after"]
		if !okb || !oka {
			t.Skip("the guest did not reach both SYNC lines (see vm/flex)")
		}
		var dsWrite, dsRead, forwarded float64
		var perDS []float64
		for _, r := range ioSplit(before.metrics, after.metrics) {
			if r.instance == "mds" {
				t.Logf("MDS: wrote %.0f, read %.0f bytes", r.writeBytes, r.readBytes)
				// A few small files' worth at most: LAYOUTGET is
				// declined for nothing here, so every data byte goes
				// to the data servers.
				if r.writeBytes > 1<<20 || r.readBytes > 1<<20 {
					t.Errorf("the MDS carried %.0f bytes written and %.0f read; want the data on the data servers", r.writeBytes, r.readBytes)
				}
				continue
			}
			fwd := after.metrics.get("shoal_ds_replica_write_bytes_total", "instance", r.instance) -
				before.metrics.get("shoal_ds_replica_write_bytes_total", "instance", r.instance)
			t.Logf("data server %s: %.0f bytes written by the client, %.0f forwarded by peers, %.0f read",
				r.instance, r.writeBytes, fwd, r.readBytes)
			dsWrite += r.writeBytes
			perDS = append(perDS, r.writeBytes)
			dsRead += r.readBytes
			forwarded += fwd
		}
		t.Logf("the client wrote %.0f bytes to the data servers for %d bytes of files (%.3f copies); %.0f forwarded",
			dsWrite, flexBytes, dsWrite/flexBytes, forwarded)
		if forwarded != 0 {
			t.Errorf("the data servers forwarded %.0f bytes to each other; with flexfiles the client writes every copy", forwarded)
		}
		// Every byte twice, and not much more (a rewritten partial page
		// of the buffered file).
		if dsWrite < 2*flexBytes || dsWrite > 2*flexBytes*1.02 {
			t.Errorf("the data servers received %.0f bytes from the client, want 2 x %d", dsWrite, flexBytes)
		}
		if stripes(img.kver) && env("SHOAL_KERNEL_FLEX_STRIPE", "auto") != "off" {
			// Striped mirrors: the two 32 MiB files spread evenly over
			// the three data servers, so each takes about 2/3 of the
			// bytes (a 1-wide file puts whole files on two of them).
			share := 2 * flexBytes / float64(flexDS)
			for i, b := range perDS {
				if b < share*0.9 || b > share*1.1 {
					t.Errorf("data server %d received %.0f bytes; a kernel that stripes mirrors spreads them evenly (%.0f each)", i, b, share)
				}
			}
		}
		if dsRead < 2*flexBytes*0.98 {
			t.Errorf("the data servers served %.0f bytes of reads, want about 2 x %d (each file read back twice)", dsRead, flexBytes)
		}
	})
}

// stripes reports whether kernel release kver (uname -r) stripes inside
// a flexfiles mirror: Linux 6.18 and later, which the MDS recognizes by
// its EXCHANGE_ID implementation id (flex_stripe: auto).
func stripes(kver string) bool {
	var major, minor int
	if _, err := fmt.Sscanf(kver, "%d.%d", &major, &minor); err != nil {
		return false
	}
	return major > 6 || major == 6 && minor >= 18
}
