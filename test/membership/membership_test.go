package membership

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/shoalfs/shoal/meta/etcdtest"
)

const (
	mib = 1 << 20
	// stripeUnit is the MDS's default stripe unit.
	stripeUnit = mib
	// dsDownAfter is the MDS's --ds-down-after.
	dsDownAfter = 3 * time.Second
	// failSlack bounds how long past dsDownAfter a get of a file with a
	// stripe on a dead data server may take to fail.
	failSlack = 30 * time.Second
)

func TestMembership(t *testing.T) {
	for _, tc := range []struct {
		name    string
		metaURL func(t *testing.T) string
	}{
		{"bolt", func(*testing.T) string { return "" }},
		{"etcd", func(t *testing.T) string {
			e := etcdtest.Start(t, 1, etcdtest.Options{NoFsync: true})
			var b [6]byte
			rand.Read(b[:])
			return fmt.Sprintf("etcd://%s/membership-%x", e.Endpoints[0], b)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			membership(t, newCluster(t, tc.metaURL(t)))
			t.Logf("%s: the story took %v", tc.name, time.Since(start).Round(time.Millisecond))
		})
	}
}

func membership(t *testing.T, c *cluster) {
	step := func(s string) { t.Logf("==== %s ====", s) }

	step("1: MDS and two data servers; files of several sizes")
	c.startMDS()
	ds1, ds2 := c.addDS(), c.addDS()
	c.waitUp(ds1, ds2)
	for _, s := range []struct {
		name string
		size int64
	}{
		{"s1-zero", 0}, {"s1-one", 1}, {"s1-unit-1", stripeUnit - 1}, {"s1-unit", stripeUnit},
		{"s1-3unit+17", 3*stripeUnit + 17}, {"s1-20m", 20 * mib},
	} {
		c.mustPut(s.name, s.size)
	}
	st := c.status()
	for _, n := range []*dsNode{ds1, ds2} {
		if d := st.ds(n.id); d == nil || d.Files == 0 || d.Bytes == 0 {
			t.Fatalf("after the first files, %s holds none:\n%v", n.name, st)
		}
	}
	c.verifyAll("step 1")

	step("2: a third data server joins")
	ds3 := c.addDS()
	before := c.waitUp(ds1, ds2, ds3)
	if d := before.ds(ds3.id); d.Files != 0 {
		t.Fatalf("the new data server already holds %d files:\n%v", d.Files, before)
	}
	c.verifyAll("step 2, after the third data server joined")
	c.mustPut("s2-20m", 20*mib)
	for i := range 3 {
		c.mustPut(fmt.Sprintf("s2-small-%d", i), 100<<10)
	}
	after := c.status()
	for _, n := range []*dsNode{ds1, ds2, ds3} {
		b, a := before.ds(n.id), after.ds(n.id)
		if a == nil || a.Files <= b.Files || a.Bytes < b.Bytes+6*mib {
			t.Fatalf("a new 20 MiB file is not striped over %s (%+v before, %+v after):\n%v", n.name, *b, a, after)
		}
	}
	t.Logf("files per data server after the 20 MiB file: ds1 %d, ds2 %d, ds3 %d",
		after.ds(ds1.id).Files, after.ds(ds2.id).Files, after.ds(ds3.id).Files)
	c.verifyAll("step 2, after new files")

	step("3: SIGKILL one of the first two data servers")
	files := c.allFiles()
	inos := c.inodes(files)
	victim := ds1
	victim.p.signal(syscall.SIGKILL)
	if err := victim.p.wait(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	killedAt := time.Now()
	st = c.waitStatus(victim.name+" down", 30*time.Second, func(st *status) bool {
		d := st.ds(victim.id)
		return d != nil && !d.Up
	})
	vst := st.ds(victim.id)
	unavail := map[uint64]bool{}
	for _, u := range st.Unavailable {
		if len(u.Down) != 1 || u.Down[0] != victim.id {
			t.Fatalf("inode %d is unavailable because of %v; only %s is down:\n%v", u.Ino, u.Down, victim.id, st)
		}
		unavail[u.Ino] = true
	}
	if st.UnavailableFiles != len(st.Unavailable) || st.UnavailableFiles != vst.Files {
		t.Fatalf("status lists %d unavailable files, counts %d, and the dead data server holds %d:\n%v",
			len(st.Unavailable), st.UnavailableFiles, vst.Files, st)
	}
	// Which files have data on the victim: its directory says (an object
	// with blocks allocated). Status cannot say it per file: it lists a
	// file as soon as its stripe map names the data server, even when the
	// file is too small to have reached it.
	onVictim := map[string]bool{}
	for _, f := range files {
		ino := inos[f.name]
		var holders []string
		for _, n := range []*dsNode{ds1, ds2, ds3} {
			has, err := holdsData(n.dir, ino)
			if err != nil {
				t.Fatal(err)
			}
			if has {
				holders = append(holders, n.name)
			}
			if n == victim {
				onVictim[f.name] = has
			}
		}
		switch {
		case f.size == 0 && len(holders) != 0,
			f.size > 0 && f.size <= stripeUnit && len(holders) != 1,
			f.size > stripeUnit && len(holders) < 2:
			t.Fatalf("%s (%d bytes, inode %d) has data on %v", f.name, f.size, ino, holders)
		}
		// A file larger than a stripe unit has a stripe on every data
		// server that was active when it was written, the victim among
		// them.
		if f.size > stripeUnit && !onVictim[f.name] {
			t.Fatalf("%s (%d bytes, inode %d) has no data on %s; it has on %v", f.name, f.size, ino, victim.name, holders)
		}
		if onVictim[f.name] && !unavail[ino] {
			t.Fatalf("%s (inode %d) has data on the dead %s, but status does not list it as unavailable:\n%v", f.name, ino, victim.name, st)
		}
		if unavail[ino] && !onVictim[f.name] {
			t.Logf("note: status lists %s (inode %d, %d bytes) as not fully available, but none of its data is on %s (only on %v)",
				f.name, ino, f.size, victim.name, holders)
		}
	}
	var readable, failed, smallReadable int
	for _, f := range files {
		ino := inos[f.name]
		expectFail := onVictim[f.name]
		g, err := c.get(f)
		if err != nil {
			t.Fatal(err)
		}
		if g.err == nil {
			if g.size != f.size || g.sum != f.sum {
				t.Fatalf("with %s dead, %s (inode %d) read back as %d bytes sha256 %s; written: %d bytes sha256 %s",
					victim.name, f.name, ino, g.size, hex.EncodeToString(g.sum[:]), f.size, hex.EncodeToString(f.sum[:]))
			}
			if expectFail {
				t.Fatalf("%s (inode %d) has data on the dead %s, yet reading it succeeded (with the right bytes):\n%s", f.name, ino, victim.name, g.result)
			}
			readable++
			if f.size > 0 && f.size <= stripeUnit {
				smallReadable++
			}
			continue
		}
		if !expectFail {
			t.Fatalf("%s (inode %d, %d bytes) has no data on the dead %s, yet reading it failed:\n%s", f.name, ino, f.size, victim.name, g.result)
		}
		failed++
		var ee *exec.ExitError
		if !errors.As(g.err, &ee) {
			t.Fatalf("get %s did not end with a non-zero exit: %s", f.name, g.result)
		}
		if bound := dsDownAfter + failSlack; g.dur > bound {
			t.Fatalf("get %s took %v to fail (bound %v)", f.name, g.dur, bound)
		}
		if len(g.left) != 0 {
			t.Fatalf("failed get %s left %v behind", f.name, g.left)
		}
		msg := strings.TrimSpace(g.stderr)
		named := strings.Contains(msg, "input/output error") || strings.Contains(msg, victim.id)
		for _, a := range vst.Addrs {
			named = named || strings.Contains(msg, a)
		}
		if !named {
			t.Fatalf("get %s failed, but its message names neither an I/O error nor %s (%s %v): %q", f.name, victim.name, victim.id, vst.Addrs, msg)
		}
		t.Logf("get %s (%d bytes, %v after the kill) failed in %v: %s", f.name, f.size,
			time.Since(killedAt).Round(time.Millisecond), g.dur.Round(time.Millisecond), msg)
	}
	if smallReadable == 0 {
		t.Fatalf("no small file read back with %s dead:\n%v", victim.name, st)
	}
	t.Logf("with %s dead: %d files read back identical, %d failed as they should", victim.name, readable, failed)

	step("4: restart the killed data server")
	c.startDS(victim)
	st = c.waitUp(ds1, ds2, ds3)
	if st.UnavailableFiles != 0 {
		t.Fatalf("every data server is up, yet files are unavailable:\n%v", st)
	}
	c.verifyAll("step 4, after the restart")
	// Enough data for the drain to take a while under the writer and
	// reader.
	for i := range 4 {
		c.mustPut(fmt.Sprintf("s4-bulk-%d", i), 16*mib)
	}

	step("5: drain " + ds1.name + " while a writer and a reader run")
	drained := ds1
	old := c.allFiles()
	drainDone := make(chan struct{})
	writerDone := make(chan struct{})
	writing := make(chan struct{}) // closed once the writer wrote two files
	var wg sync.WaitGroup
	var writerErr, readerErr error
	var written, reads int
	wg.Add(2)
	go func() {
		// The writer: new 4 MiB files until the drain is over (at least
		// three), at most 20 of them or for 60 s.
		defer wg.Done()
		defer close(writerDone)
		defer func() {
			if written < 2 {
				close(writing)
			}
		}()
		deadline := time.Now().Add(60 * time.Second)
		for i := 0; i < 20 && time.Now().Before(deadline); i++ {
			select {
			case <-drainDone:
				if i >= 3 {
					return
				}
			default:
			}
			if _, err := c.put(fmt.Sprintf("s5-writer-%02d", i), 4*mib); err != nil {
				writerErr = err
				return
			}
			if written++; written == 2 {
				close(writing)
			}
		}
	}()
	go func() {
		// The reader: reads the older files back, one after another,
		// until the writer is done (at least one pass over them).
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-writerDone:
				if i >= len(old) {
					return
				}
			default:
			}
			if err := c.verify(old[i%len(old)]); err != nil {
				readerErr = err
				return
			}
			reads++
		}
	}()
	<-writing
	r := c.admin(180*time.Second, "drain", drained.id)
	close(drainDone)
	wg.Wait()
	if r.err != nil {
		t.Fatalf("drain failed: %s", r)
	}
	t.Logf("drain: %s", strings.TrimSpace(r.stdout))
	if writerErr != nil {
		t.Fatalf("writer during the drain: %v", writerErr)
	}
	if readerErr != nil {
		t.Fatalf("reader during the drain: %v", readerErr)
	}
	t.Logf("during the drain: %d files written, %d reads verified", written, reads)
	c.verifyAll("step 5, after the drain")
	st = c.status()
	if d := st.ds(drained.id); d == nil || d.State != "drained" || d.Files != 0 || d.Bytes != 0 {
		t.Fatalf("after the drain, %s is %+v, want state drained, no files:\n%v", drained.name, d, st)
	}
	if n, names, err := objectFiles(drained.dir); err != nil || n != 0 {
		t.Fatalf("after the drain, %s's directory holds %d objects (%v): %v", drained.name, n, err, names)
	}
	if r := c.admin(60*time.Second, "remove", drained.id); r.err != nil {
		t.Fatalf("remove failed: %s", r)
	}
	if err := drained.p.wait(30 * time.Second); err != nil {
		t.Fatalf("removed data server did not exit: %v", err)
	}
	if log := drained.p.log(); !strings.Contains(log, "was removed from the cluster") {
		t.Fatalf("removed %s exited (%v) without saying it was removed", drained.name, drained.p.err)
	}
	// The systemd units do not restart a data server that exits 3
	// (RestartPreventExitStatus=3 in dist/systemd).
	if ee, ok := drained.p.err.(*exec.ExitError); !ok || ee.ExitCode() != 3 {
		t.Fatalf("removed %s exited with %v, want exit status 3", drained.name, drained.p.err)
	}
	t.Logf("%s exited after its removal: %v", drained.name, drained.p.err)
	st = c.status()
	if d := st.ds(drained.id); d != nil && (d.State != "removed" || d.Up) {
		t.Fatalf("after remove, %s is %+v:\n%v", drained.name, d, st)
	}
	remaining := []*dsNode{ds2, ds3}
	c.waitUp(remaining...)

	step("6: SIGKILL the MDS, stop the data servers, restart all")
	c.mds.signal(syscall.SIGKILL)
	if err := c.mds.wait(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	for _, n := range remaining {
		n.p.signal(syscall.SIGTERM)
	}
	for _, n := range remaining {
		if err := n.p.wait(30 * time.Second); err != nil {
			t.Fatalf("SIGTERM: %v", err)
		}
		t.Logf("%s stopped: %v", n.name, n.p.err)
	}
	c.startMDS()
	for i := len(remaining) - 1; i >= 0; i-- {
		c.startDS(remaining[i])
		time.Sleep(300 * time.Millisecond)
	}
	st = c.waitUp(remaining...)
	if st.UnavailableFiles != 0 {
		t.Fatalf("after the restart, files are unavailable:\n%v", st)
	}
	c.verifyAll("step 6, after restarting everything")
	f := c.mustPut("s6-after-restart", 5*mib+3)
	if err := c.verify(f); err != nil {
		t.Fatal(err)
	}
}
