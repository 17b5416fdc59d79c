package membership

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/shoalfs/shoal/client"
	"github.com/shoalfs/shoal/fusemount"
)

// TestReplication is issue 11's failure story through Shoal's own clients,
// with real processes: `shoal mds --mirrors 2` and three `shoal ds`.
//
//  1. A 64 MiB file is written 1 MiB at a time; after 16 MiB one data
//     server is killed with SIGKILL and the writer goes on. Every write,
//     the final fsync and the close succeed.
//  2. The file reads back identical through a fresh client (a new
//     connection, or a new mount).
//  3. `shoal admin status` reports degraded stripes, then healing puts
//     both copies of every stripe on the two survivors.
//  4. A second data server is killed: the file still reads back
//     identical, through the method under test and through `shoal get`.
//
// It runs once through the Go client library and once through a FUSE
// mount (`shoal mount`).
func TestReplication(t *testing.T) {
	for _, method := range []string{"client", "fuse"} {
		t.Run(method, func(t *testing.T) {
			if method == "fuse" {
				if _, err := os.Stat("/dev/fuse"); err != nil {
					t.Skip("no /dev/fuse")
				}
			}
			testReplication(t, method)
		})
	}
}

const (
	replSize     = 64 << 20
	replChunk    = 1 << 20
	replKillAt   = 16 // chunks written before the first kill
	replDownWait = 2 * time.Second
)

// replAccess is how the test writes and reads a file: through the Go
// client or through a FUSE mount.
type replAccess interface {
	create(name string) (io.WriteCloser, func() error, error) // writer, fsync
	open(name string) (io.ReadCloser, error)
	fresh() error // drop every cached state: a new connection or mount
	close()
}

type clientAccess struct {
	addr string
	cl   *client.Client
}

func (a *clientAccess) fresh() error {
	if a.cl != nil {
		a.cl.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := client.Dial(ctx, a.addr, client.Options{})
	a.cl = cl
	return err
}

func (a *clientAccess) create(name string) (io.WriteCloser, func() error, error) {
	f, err := a.cl.Open(context.Background(), "/"+name, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, nil, err
	}
	return f, f.Sync, nil
}

func (a *clientAccess) open(name string) (io.ReadCloser, error) {
	return a.cl.Open(context.Background(), "/"+name, os.O_RDONLY, 0)
}

func (a *clientAccess) close() {
	if a.cl != nil {
		a.cl.Close()
	}
}

type fuseAccess struct {
	c   *cluster
	dir string
	p   *proc
}

func (a *fuseAccess) fresh() error {
	a.unmount()
	a.p = a.c.start("mount", "mount", "nfs://"+a.c.mdsAddr+"/", a.dir)
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if ok, err := fusemount.Mounted(a.dir); err != nil {
			return err
		} else if ok {
			return nil
		}
		if a.p.exited() {
			return fmt.Errorf("shoal mount exited: %s", a.p.log())
		}
		time.Sleep(50 * time.Millisecond)
	}
	return errors.New("shoal mount: not mounted after 30 s")
}

func (a *fuseAccess) unmount() {
	if a.p == nil {
		return
	}
	a.p.signal(syscall.SIGTERM)
	if err := a.p.wait(30 * time.Second); err != nil {
		a.p.signal(syscall.SIGKILL)
		_ = a.p.wait(10 * time.Second)
	}
	if ok, _ := fusemount.Mounted(a.dir); ok {
		_ = fusemount.Unmount(a.dir, true)
	}
	a.p = nil
}

func (a *fuseAccess) create(name string) (io.WriteCloser, func() error, error) {
	f, err := os.OpenFile(filepath.Join(a.dir, name), os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, nil, err
	}
	return f, f.Sync, nil
}

func (a *fuseAccess) open(name string) (io.ReadCloser, error) {
	return os.Open(filepath.Join(a.dir, name))
}

func (a *fuseAccess) close() { a.unmount() }

// readSum reads name through acc and returns its size and sha256.
func readSum(acc replAccess, name string) (int64, [32]byte, error) {
	var sum [32]byte
	r, err := acc.open(name)
	if err != nil {
		return 0, sum, err
	}
	defer r.Close()
	h := sha256.New()
	n, err := io.Copy(h, r)
	h.Sum(sum[:0])
	return n, sum, err
}

// startMirrored starts `shoal mds` with mdsArgs and three data servers,
// waits until they are in service, and kills them all (SIGKILL, by PID)
// when the test ends.
func startMirrored(t *testing.T, mdsArgs ...string) (*cluster, []*dsNode) {
	t.Helper()
	c := newCluster(t, "")
	c.mdsArgs = mdsArgs
	c.startMDS()
	t.Cleanup(func() {
		for _, n := range c.ds {
			if n.p != nil {
				n.p.signal(syscall.SIGKILL)
				_ = n.p.wait(10 * time.Second)
			}
		}
		c.mds.signal(syscall.SIGKILL)
		_ = c.mds.wait(10 * time.Second)
	})
	ds := []*dsNode{c.addDS(), c.addDS(), c.addDS()}
	c.waitUp(ds...)
	return c, ds
}

func testReplication(t *testing.T, method string) {
	c, ds := startMirrored(t, "--mirrors", "2", "--ds-down-after", replDownWait.String())

	var acc replAccess
	switch method {
	case "client":
		acc = &clientAccess{addr: c.mdsAddr}
	case "fuse":
		dir := filepath.Join(c.work, "mnt")
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		acc = &fuseAccess{c: c, dir: dir}
	}
	if err := acc.fresh(); err != nil {
		t.Fatal(err)
	}
	defer acc.close()

	kill := func(n *dsNode) {
		t.Helper()
		n.p.signal(syscall.SIGKILL)
		if err := n.p.wait(10 * time.Second); err != nil {
			t.Fatal(err)
		}
		c.waitStatus(n.name+" out of service", 30*time.Second, func(st *status) bool {
			d := st.ds(n.id)
			return d != nil && !d.Up
		})
	}

	// 1. Write, killing ds3 after 16 MiB.
	data := make([]byte, replSize)
	if _, err := rand.Read(data); err != nil {
		t.Fatal(err)
	}
	want := sha256.Sum256(data)
	const name = "replicated"
	w, fsync, err := acc.create(name)
	if err != nil {
		t.Fatal(err)
	}
	var (
		watchMu     sync.Mutex
		maxDegraded int
	)
	stopWatch := make(chan struct{})
	watchDone := make(chan struct{})
	for i := 0; i < replSize/replChunk; i++ {
		if i == replKillAt {
			// The first 16 MiB are on the data servers (a cached FUSE
			// mount would otherwise place the file only at its first
			// flush, after the kill, over the two survivors), so the
			// file's stripe map names the server about to die.
			if err := fsync(); err != nil {
				t.Fatalf("fsync before the kill: %v", err)
			}
			kill(ds[2])
			t.Logf("killed %s (%s) after %d MiB", ds[2].name, ds[2].id, i)
			go func() {
				defer close(watchDone)
				for {
					if st, err := c.statusErr(); err == nil {
						watchMu.Lock()
						maxDegraded = max(maxDegraded, st.Replication.DegradedStripes)
						watchMu.Unlock()
					}
					select {
					case <-stopWatch:
						return
					case <-time.After(100 * time.Millisecond):
					}
				}
			}()
		}
		if _, err := w.Write(data[i*replChunk : (i+1)*replChunk]); err != nil {
			t.Fatalf("write of MiB %d after the kill: %v", i, err)
		}
	}
	if err := fsync(); err != nil {
		t.Fatalf("fsync after the kill: %v", err)
	}
	if err := w.Close(); err != nil {
		t.Fatalf("close after the kill: %v", err)
	}

	// 2. Read back from a fresh client.
	check := func(when string) {
		t.Helper()
		if err := acc.fresh(); err != nil {
			t.Fatalf("%s: %v", when, err)
		}
		n, got, err := readSum(acc, name)
		if err != nil || n != replSize || got != want {
			t.Fatalf("%s: read %d bytes (err %v), sha256 %x; want %d bytes, %x", when, n, err, got[:8], replSize, want[:8])
		}
		t.Logf("%s: %d bytes read back identical", when, n)
	}
	check("after the first kill")

	// 3. Degraded, then healed onto the two survivors.
	st := c.waitStatus("healed onto the two survivors", 3*time.Minute, func(st *status) bool {
		if st.Replication.DegradedStripes != 0 || st.Replication.DegradedFiles != 0 {
			return false
		}
		for _, n := range ds[:2] {
			if d := st.ds(n.id); d == nil || d.Bytes != replSize {
				return false
			}
		}
		return true
	})
	close(stopWatch)
	<-watchDone
	watchMu.Lock()
	seen := maxDegraded
	watchMu.Unlock()
	if seen == 0 {
		t.Errorf("shoal admin status never reported a degraded stripe after the kill")
	}
	t.Logf("degraded stripes reported after the kill: up to %d; healed:\n%s", seen, st)
	check("after healing")

	// 4. A second data server dies; one copy of everything is left.
	kill(ds[1])
	t.Logf("killed %s (%s)", ds[1].name, ds[1].id)
	check("after the second kill")
	g, err := c.get(&file{name: name, size: replSize, sum: want})
	if err != nil || g.err != nil || g.sum != want {
		t.Fatalf("shoal get after the second kill: %v %v", err, g.result)
	}
}

// TestScrub flips one byte of one copy of a file on a data server's disk.
// Scrub must report that stripe and repair it; reads return the good data
// before and after, and the copy on disk is restored. A second file has a
// byte flipped and is read first: the read must return the good data (the
// data server's block checksum refuses the bad block) and the copy must end
// up repaired, by the read path's healing or by the scrub.
func TestScrub(t *testing.T) {
	c, ds := startMirrored(t, "--mirrors", "2")

	const at = 123457 // inside the first 64 KiB checksum block's neighbour
	files := []*file{c.mustPut("scrub-first", 1<<20), c.mustPut("read-first", 1<<20)}
	inos := c.inodes(files)
	// flip changes one byte of the first copy of f found on disk and
	// returns the object's path and the original byte.
	flip := func(f *file) (string, byte) {
		t.Helper()
		ino := inos[f.name]
		for _, n := range ds {
			p := filepath.Join(n.dir, "data", fmt.Sprintf("%02x", ino&0xff), strconv.FormatUint(ino, 10))
			if ok, err := holdsData(n.dir, ino); err != nil || !ok {
				continue
			}
			fh, err := os.OpenFile(p, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer fh.Close()
			b := make([]byte, 1)
			if _, err := fh.ReadAt(b, at); err != nil {
				t.Fatal(err)
			}
			if _, err := fh.WriteAt([]byte{b[0] ^ 0x20}, at); err != nil {
				t.Fatal(err)
			}
			t.Logf("flipped byte %d of %s's copy of %s (%s)", at, n.name, f.name, p)
			return p, b[0]
		}
		t.Fatalf("no data server holds data of %s", f.name)
		return "", 0
	}
	restored := func(p string, want byte) bool {
		fh, err := os.Open(p)
		if err != nil {
			return false
		}
		defer fh.Close()
		b := make([]byte, 1)
		_, err = fh.ReadAt(b, at)
		return err == nil && b[0] == want
	}
	verify := func(f *file, when string) {
		t.Helper()
		if err := c.verify(f); err != nil {
			t.Fatalf("%s: %v", when, err)
		}
	}

	// Scrub first.
	p, orig := flip(files[0])
	r := c.admin(5*time.Minute, "scrub", "--wait", "--json")
	if r.err != nil {
		t.Fatal(r)
	}
	var job struct {
		Bad      int `json:"bad"`
		Repaired int `json:"repaired"`
		Findings []struct {
			Ino      uint64 `json:"ino"`
			Offset   uint64 `json:"offset"`
			Problem  string `json:"problem"`
			Repaired bool   `json:"repaired"`
		} `json:"findings"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &job); err != nil {
		t.Fatalf("scrub --json: %v\n%s", err, r)
	}
	found := false
	for _, fd := range job.Findings {
		if fd.Ino == inos[files[0].name] && fd.Offset <= at && at < fd.Offset+1<<20 {
			found = true
			if !fd.Repaired || fd.Problem != "corrupt" {
				t.Errorf("scrub found the flipped byte but: %+v", fd)
			}
		}
	}
	if !found {
		t.Fatalf("scrub did not report the flipped copy of %s (ino %d): %s", files[0].name, inos[files[0].name], r.stdout)
	}
	if !restored(p, orig) {
		t.Errorf("the flipped byte is still wrong on disk after the scrub repaired it")
	}
	verify(files[0], "after scrub")
	t.Logf("scrub: %d bad, %d repaired", job.Bad, job.Repaired)

	// Read first.
	p, orig = flip(files[1])
	verify(files[1], "read with a flipped copy")
	if r := c.admin(5*time.Minute, "scrub", "--wait", "--json"); r.err != nil {
		t.Fatal(r)
	}
	c.waitStatus("no degraded file", time.Minute, func(st *status) bool {
		return st.Replication.DegradedFiles == 0
	})
	deadline := time.Now().Add(time.Minute)
	for !restored(p, orig) {
		if time.Now().After(deadline) {
			t.Fatalf("the copy read around was not repaired within a minute")
		}
		time.Sleep(200 * time.Millisecond)
	}
	verify(files[1], "after repair")
}
