package client_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shoalfs/shoal/client"
	"github.com/shoalfs/shoal/internal/cluster"
	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/wiring"
	"github.com/shoalfs/shoal/server"
)

// mdsDownAfter is how long the metadata server of these tests answers
// NFS4ERR_DELAY for I/O on a data server that is out of service before it
// answers NFS4ERR_IO (`shoal mds --ds-down-after`, default
// cluster.DefaultDownAfter, 10 s); shorter here to save time.
const mdsDownAfter = 5 * time.Second

// startClusterNoFallback runs a metadata server and n data servers like
// separate `shoal mds` and `shoal ds` processes do: unlike
// wiring.Start, the metadata server has no access to the data
// servers' disks (cluster.Striped.SetFallback), so a stopped data server's
// stripe units are unavailable through the metadata server too.
func startClusterNoFallback(t *testing.T, n int) (*wiring.MDS, []*wiring.DS) {
	t.Helper()
	dir := t.TempDir()
	noSquash := false
	mds, err := wiring.StartMDS(wiring.MDSConfig{
		Listen: "127.0.0.1:0", Dir: filepath.Join(dir, "mds"),
		Exports:   []*server.Export{{Path: "/", RootSquash: &noSquash}},
		DownAfter: mdsDownAfter,
		Lease:     10 * time.Second, Logger: quietLogger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mds.Close() })
	secret, err := cluster.ReadJoinSecret(mds.JoinSecretFile)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	var dss []*wiring.DS
	for i := range n {
		d, err := wiring.StartDS(ctx, wiring.DSConfig{
			Listen: "127.0.0.1:0", Dir: filepath.Join(dir, fmt.Sprintf("ds%d", i)),
			MDS: []string{mds.Addr.String()}, JoinSecret: secret, Lease: 10 * time.Second, Logger: quietLogger(),
		})
		if err != nil {
			t.Fatal(err)
		}
		dss = append(dss, d)
	}
	t.Cleanup(func() {
		for _, d := range dss {
			if d != nil {
				d.Close()
			}
		}
	})
	if err := mds.Registry.WaitFor(ctx, n); err != nil {
		t.Fatal(err)
	}
	return mds, dss
}

// writeFile creates path with data and closes it.
func writeFile(t *testing.T, c *client.Client, path string, data []byte) {
	t.Helper()
	f, err := c.Open(t.Context(), path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := f.WriteAt(data, 0); n != len(data) || err != nil {
		t.Fatalf("write %s: %d, %v", path, n, err)
	}
	if err := f.Close(); err != nil {
		t.Fatalf("close %s: %v", path, err)
	}
}

// stripeOf returns the data server address and stripe index that path's
// layout puts offset off on.
func stripeOf(t *testing.T, c *client.Client, path string, off int64) (string, int) {
	t.Helper()
	f, err := c.Open(t.Context(), path, os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	addr, stripe, stripes, err := client.StripeOf(t.Context(), f, off)
	if err != nil {
		t.Fatal(err)
	}
	if stripes != 2 {
		t.Fatalf("%s: layout of %d stripe indices, want 2", path, stripes)
	}
	return addr, stripe
}

// readAll opens path and reads it whole, timing the read.
func readAll(t *testing.T, c *client.Client, path string, size int) ([]byte, time.Duration, error) {
	t.Helper()
	f, err := c.Open(t.Context(), path, os.O_RDONLY, 0)
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	buf := make([]byte, size+1)
	start := time.Now()
	n, err := f.ReadAt(buf, 0)
	took := time.Since(start)
	if err == io.EOF && n == size {
		err = nil
	}
	return buf[:n], took, err
}

// TestPNFSDataServerDown stops one data server of two, with a metadata
// server that cannot read its disk: I/O on a file with a stripe unit on
// it must fail within a bound, with an error naming the data server, and
// files without one must stay usable.
//
// The bounds, as documented in the package documentation ("Data server
// failures"): the client retries the metadata server's NFS4ERR_DELAY for
// Policy.IORetryTimeout at most, and the metadata server answers
// NFS4ERR_DELAY for mdsDownAfter after the data server went out of service
// and NFS4ERR_IO after that.
func TestPNFSDataServerDown(t *testing.T) {
	const (
		unit = wiring.DefaultStripeUnit
		big  = 4 * unit // striped over both data servers
		tiny = 100 << 10
		// slack covers what the bounds leave out: a failed dial on
		// loopback (refused at once), the requests around the retries,
		// and a busy test machine.
		slack = 5 * time.Second
	)
	mds, dss := startClusterNoFallback(t, 2)
	addr := mds.Addr.String()
	c := dialer(addr, client.Options{})(t)
	defer c.Close()

	bigData := make([]byte, big)
	pattern(bigData, 0)
	writeFile(t, c, "/striped", bigData)
	// Small files: one stripe unit each, on the data server the file's
	// first stripe index names. Keep writing until both data servers have
	// one.
	small := map[string]string{} // data server address -> file
	tinyData := make([]byte, tiny)
	pattern(tinyData, 7)
	for i := 0; len(small) < 2; i++ {
		if i == 16 {
			t.Fatalf("16 small files, all on the same data server: %v", small)
		}
		p := fmt.Sprintf("/small-%d", i)
		writeFile(t, c, p, tinyData)
		a, _ := stripeOf(t, c, p, 0)
		if _, ok := small[a]; !ok {
			small[a] = p
		}
	}
	dead := dss[1]
	deadAddr, liveAddr := dead.Addr.String(), dss[0].Addr.String()
	safe, doomed := small[liveAddr], small[deadAddr]
	if safe == "" || doomed == "" {
		t.Fatalf("small files by data server %v; data servers %s, %s", small, liveAddr, deadAddr)
	}
	// Where the striped file's units are, by the layout.
	var deadStripe = -1
	deadUnits := map[int64]bool{}
	for off := int64(0); off < big; off += unit {
		a, s := stripeOf(t, c, "/striped", off)
		if a == deadAddr {
			deadUnits[off], deadStripe = true, s
		}
	}
	if len(deadUnits) != 2 {
		t.Fatalf("/striped has %d of its 4 units on %s, want 2", len(deadUnits), deadAddr)
	}
	// c stays: a long-lived client (a mount) that has used the file's
	// layout and both data servers, with the file open.
	held, err := c.Open(t.Context(), "/striped", os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	if got, _, err := readAll(t, c, "/striped", big); err != nil || !bytes.Equal(got, bigData) {
		t.Fatalf("read /striped before the stop: %d bytes, %v", len(got), err)
	}

	if err := dead.Close(); err != nil {
		t.Fatal(err)
	}
	dss[1] = nil
	stopped := time.Now()

	// checkDSError checks that err names the dead data server and a unit
	// of /striped that is on it.
	checkDSError := func(t *testing.T, err error) {
		t.Helper()
		var de *client.DataServerError
		if !errors.As(err, &de) {
			t.Errorf("error does not name a data server: %v", err)
			return
		}
		if de.Addr != deadAddr || de.Stripe != deadStripe || de.Stripes != 2 {
			t.Errorf("error names data server %s (stripe %d of %d), want %s (stripe %d of 2): %v",
				de.Addr, de.Stripe, de.Stripes, deadAddr, deadStripe, err)
		}
		if !deadUnits[de.Offset/unit*unit] {
			t.Errorf("error is about offset %d, which is not on the dead data server: %v", de.Offset, err)
		}
		if msg := err.Error(); !strings.Contains(msg, deadAddr) || !strings.Contains(msg, fmt.Sprintf("stripe index %d of 2", deadStripe)) {
			t.Errorf("message does not name the data server: %q", msg)
		}
	}
	// checkFreshError checks the error of a client that never held a
	// layout of /striped: the MDS gives none while a data server of the
	// file is out of service, so the error cannot name it and must say
	// so, pointing at `shoal admin status`.
	checkFreshError := func(t *testing.T, err error) {
		t.Helper()
		var de *client.DataServerError
		if errors.As(err, &de) {
			checkDSError(t, err)
			return
		}
		if msg := err.Error(); !strings.Contains(msg, "gave no layout") || !strings.Contains(msg, "shoal admin status") {
			t.Errorf("error neither names the data server nor says why it cannot: %q", msg)
		}
	}
	// checkSafe reads (and with write set, rewrites and reads) the small
	// file that has nothing on the dead data server.
	checkSafe := func(t *testing.T, c *client.Client, write bool) {
		t.Helper()
		if write {
			// Overwritten in place: a truncate is a metadata operation
			// that may need every data server.
			pattern(tinyData, 11)
			f, err := c.Open(t.Context(), safe, os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			if n, err := f.WriteAt(tinyData, 0); n != tiny || err != nil {
				t.Fatalf("%s, all on the live data server: write %d, %v", safe, n, err)
			}
			if err := f.Close(); err != nil {
				t.Fatalf("%s, all on the live data server: close: %v", safe, err)
			}
			if took := time.Since(start); took > slack {
				t.Errorf("%s, all on the live data server, took %v to write", safe, took)
			}
		}
		got, took, err := readAll(t, c, safe, tiny)
		if err != nil || !bytes.Equal(got, tinyData) {
			t.Fatalf("%s, all on the live data server: read %d bytes in %v, %v (equal=%v)", safe, len(got), took, err, bytes.Equal(got, tinyData))
		}
		if took > slack {
			t.Errorf("%s, all on the live data server, took %v to read", safe, took)
		}
	}

	// A fresh client (`shoal get`) while the metadata server still answers
	// NFS4ERR_DELAY: the client's own bound decides.
	t.Run("client bound", func(t *testing.T) {
		const budget = 1500 * time.Millisecond
		c := dialer(addr, client.Options{Policy: client.Policy{IORetryTimeout: budget}})(t)
		defer c.Close()
		checkSafe(t, c, false)
		for i := range 2 { // the second read finds the data server marked down
			_, took, err := readAll(t, c, "/striped", big)
			if err == nil {
				t.Fatalf("read %d of /striped with a data server down succeeded", i)
			}
			t.Logf("read %d failed after %v: %v", i, took, err)
			if took > budget+slack {
				t.Errorf("read %d took %v, more than the client's bound %v", i, took, budget)
			}
			checkFreshError(t, err)
			var se *client.StatusError
			if !errors.As(err, &se) || (nfs4.Nfsstat4(se.NFSStatus) != nfs4.NFS4ERR_DELAY && nfs4.Nfsstat4(se.NFSStatus) != nfs4.NFS4ERR_IO) {
				t.Errorf("read %d: want NFS4ERR_DELAY or NFS4ERR_IO from the metadata server: %v", i, err)
			}
		}
		if since := time.Since(stopped); since >= mdsDownAfter {
			t.Logf("note: %v since the data server stopped, the metadata server's bound is %v", since, mdsDownAfter)
		}
		checkSafe(t, c, false)
	})

	// The long-lived client: its open File still holds the layout (unless
	// the metadata server recalled it meanwhile) and a new File of the
	// same file gets none; both must name the data server. Its default
	// bound outlasts the metadata server's, whose NFS4ERR_IO ends it.
	t.Run("long-lived client", func(t *testing.T) {
		for i, f := range []*client.File{held, nil} {
			if f == nil {
				var err error
				if f, err = c.Open(t.Context(), "/striped", os.O_RDONLY, 0); err != nil {
					t.Fatal(err)
				}
				defer f.Close()
			}
			start := time.Now()
			_, err := f.ReadAt(make([]byte, big), 0)
			took := time.Since(start)
			if err == nil {
				t.Fatalf("read %d of /striped with a data server down succeeded", i)
			}
			t.Logf("read %d failed after %v, %v after the data server stopped: %v", i, took, time.Since(stopped), err)
			checkDSError(t, err)
			if !errors.Is(err, syscall.EIO) {
				t.Errorf("read %d: want NFS4ERR_IO from the metadata server: %v", i, err)
			}
			if limit := max(time.Until(stopped.Add(mdsDownAfter)), 0) + slack; took > limit {
				t.Errorf("read %d took %v; the metadata server should have answered NFS4ERR_IO within %v", i, took, limit)
			}
		}
		checkSafe(t, c, false)
	})

	// A fresh client once the data server has been out of service for
	// mdsDownAfter: the metadata server answers NFS4ERR_IO at once.
	t.Run("metadata server bound", func(t *testing.T) {
		c := dialer(addr, client.Options{})(t)
		defer c.Close()
		for i := range 2 {
			_, took, err := readAll(t, c, "/striped", big)
			if err == nil {
				t.Fatalf("read %d of /striped with a data server down succeeded", i)
			}
			t.Logf("read %d failed after %v, %v after the data server stopped: %v", i, took, time.Since(stopped), err)
			checkFreshError(t, err)
			if !errors.Is(err, syscall.EIO) {
				t.Errorf("read %d: want NFS4ERR_IO from the metadata server (out of service for over %v): %v", i, mdsDownAfter, err)
			}
			if limit := max(time.Until(stopped.Add(mdsDownAfter)), 0) + slack; took > limit {
				t.Errorf("read %d took %v; the metadata server should have answered NFS4ERR_IO within %v", i, took, limit)
			}
			if took > client.DefaultIORetryTimeout+slack {
				t.Errorf("read %d took %v, more than the client's bound %v", i, took, client.DefaultIORetryTimeout)
			}
		}
		// The small file on the dead data server fails the same way.
		_, took, err := readAll(t, c, doomed, tiny)
		if err == nil {
			t.Fatalf("read %s, on the dead data server, succeeded", doomed)
		}
		t.Logf("%s failed after %v: %v", doomed, took, err)
		if !errors.Is(err, syscall.EIO) {
			t.Errorf("%s: want NFS4ERR_IO: %v", doomed, err)
		}
		checkFreshError(t, err)
		checkSafe(t, c, true)
	})
}

// TestIORetryTimeoutDefault: the default outlasts the MDS's bound on a
// dead data server (cmd/shoal tests the setting's file and flag).
func TestIORetryTimeoutDefault(t *testing.T) {
	if d := client.DefaultPolicy().IORetryTimeout; d != client.DefaultIORetryTimeout || d < 2*cluster.DefaultDownAfter {
		t.Errorf("default IORetryTimeout %v: want DefaultIORetryTimeout, at least twice the MDS's default bound %v", d, cluster.DefaultDownAfter)
	}
}
