package membership

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	mathrand "math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/shoalfs/shoal/client"
	"github.com/shoalfs/shoal/meta/etcdtest"
)

// TestCreateDurability is issue 13's durability check: while several
// writers create files through the Go client (each its own session), the
// MDS is killed with SIGKILL at a random moment; it restarts on the same
// directory, and every create the MDS answered must exist afterwards, and
// every file whose data COMMIT answered must read back with that data and
// size. A group commit, a write-ahead log or a metadata cache that
// replied before its change was written would lose some of them.
//
// What SIGKILL can and cannot show: the kernel keeps what a killed
// process wrote, so an engine that skips fsync survives this test (that
// takes a power cut). What it catches is a reply sent before the change
// left the MDS's memory: buffered in the process, queued for a later
// commit, or only in a cache.
//
// The bolt engine runs twice: in the default mode, and with --sync=false
// (knfsd's async: changes answered once written to the metadata log,
// synced within --commit-interval), where a SIGKILL must lose nothing
// either, since the kernel has what the log was given.
//
// Each engine runs SHOAL_DURABILITY_TRIALS trials (default 3, about 20 s
// each, most of it the restarted MDS's grace period), each bounded by a
// count of files and by time. With etcd, the etcd is a real
// one embedded in the test process (meta/etcdtest), which the SIGKILL of
// the MDS does not touch.
func TestCreateDurability(t *testing.T) {
	trials := 3
	if s := os.Getenv("SHOAL_DURABILITY_TRIALS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 1000 {
			t.Fatalf("SHOAL_DURABILITY_TRIALS=%q: want 1 to 1000", s)
		}
		trials = n
	}
	for _, tc := range []struct {
		name    string
		metaURL func(t *testing.T) string
		args    []string // more `shoal mds` flags
	}{
		{"bolt", func(*testing.T) string { return "" }, nil},
		{"bolt-async", func(*testing.T) string { return "" }, []string{"--sync=false"}},
		{"etcd", func(t *testing.T) string {
			e := etcdtest.Start(t, 1, etcdtest.Options{NoFsync: true})
			var b [6]byte
			rand.Read(b[:])
			return fmt.Sprintf("etcd://%s/durability-%x", e.Endpoints[0], b)
		}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t, tc.metaURL(t))
			// The grace period after a restart lasts a lease; a short one
			// keeps the reads of the check from waiting it out.
			c.mdsArgs = append([]string{"--lease", durabilityLease.String()}, tc.args...)
			c.startMDS()
			ds := c.addDS()
			c.waitUp(ds)
			rng := mathrand.New(mathrand.NewPCG(uint64(time.Now().UnixNano()), 13))
			var acked, during int
			for i := range trials {
				r := createTrial(t, c, ds, rng, i+1)
				acked += r.created
				if r.killDuring {
					during++
				}
			}
			t.Logf("%s: %d trials (%d with the kill during the creates), %d answered creates, none lost",
				tc.name, trials, during, acked)
			if during == 0 {
				t.Fatalf("no trial killed the MDS while creates were running: the test proved nothing")
			}
		})
	}
}

// durabilityWriters and the rest bound a trial: at most
// durabilityWriters × durabilityMaxFiles creates, the kill within
// durabilityKillWithin of the start, every client call within
// durabilityOpTimeout.
const (
	durabilityWriters    = 4
	durabilityMaxFiles   = 2000
	durabilityKillWithin = 1500 * time.Millisecond
	durabilityOpTimeout  = 4 * time.Second
	durabilityLease      = 10 * time.Second
)

// answered is what the MDS acknowledged for one file: its create, and (if
// data is not nil) the data, through COMMIT and CLOSE.
type answered struct {
	name string
	data []byte
}

type trialResult struct {
	created    int
	killDuring bool
}

// createTrial runs one trial: writers create files until the MDS dies,
// the MDS and the data server restart, and every answered create is
// checked.
func createTrial(t *testing.T, c *cluster, ds *dsNode, rng *mathrand.Rand, n int) trialResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := fmt.Sprintf("/durability-%02d", n)
	setup, err := client.Dial(ctx, c.mdsAddr, client.Options{})
	if err != nil {
		t.Fatalf("trial %d: dial: %v", n, err)
	}
	if err := setup.Mkdir(ctx, dir, 0o755); err != nil {
		setup.Close()
		t.Fatalf("trial %d: mkdir %s: %v", n, dir, err)
	}
	setup.Close()

	clients := make([]*client.Client, durabilityWriters)
	for i := range clients {
		if clients[i], err = client.Dial(ctx, c.mdsAddr, client.Options{}); err != nil {
			t.Fatalf("trial %d: dial writer %d: %v", n, i, err)
		}
	}
	// Sizes come from the trial's RNG before the writers start, so the
	// goroutines share nothing but the record of answers.
	sizes := make([][]int, durabilityWriters)
	for w := range sizes {
		sizes[w] = make([]int, durabilityMaxFiles)
		for i := range sizes[w] {
			// A third empty (a bare create), the rest up to 8 KiB.
			if rng.IntN(3) != 0 {
				sizes[w][i] = 1 + rng.IntN(8<<10)
			}
		}
	}
	killAfter := 100*time.Millisecond + time.Duration(rng.Int64N(int64(durabilityKillWithin)))

	var (
		mu      sync.Mutex
		acks    []answered
		lastAck time.Time
		stopped []string
	)
	record := func(a answered) {
		mu.Lock()
		acks = append(acks, a)
		lastAck = time.Now()
		mu.Unlock()
	}
	var wg sync.WaitGroup
	start := time.Now()
	for w, cl := range clients {
		wg.Go(func() {
			err := writeUntilError(ctx, cl, dir, w, sizes[w], record)
			mu.Lock()
			stopped = append(stopped, fmt.Sprintf("writer %d: %v", w, err))
			mu.Unlock()
		})
	}
	time.Sleep(killAfter)
	c.mds.signal(syscall.SIGKILL)
	killedAt := time.Now()
	if err := c.mds.wait(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for _, cl := range clients {
		cl.Close()
	}
	// Each file is recorded once for its create and once more if its
	// data was committed.
	res := trialResult{}
	withData := 0
	for _, a := range acks {
		if a.data != nil {
			withData++
		} else {
			res.created++
		}
	}
	// The kill landed during the creates if the writers had not made
	// them all.
	res.killDuring = res.created < durabilityWriters*durabilityMaxFiles
	t.Logf("trial %d: SIGKILL after %v, %d creates answered (%d with data committed), last answer %v before the kill (negative: after it); writers stopped: %v",
		n, killedAt.Sub(start).Round(time.Millisecond), res.created, withData, killedAt.Sub(lastAck).Round(time.Millisecond), stopped)

	// Restart as an operator would after a crash: the data server is
	// stopped cleanly and comes back after the MDS.
	ds.p.signal(syscall.SIGTERM)
	if err := ds.p.wait(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	c.startMDS()
	c.startDS(ds)
	c.waitUp(ds)

	check, err := client.Dial(ctx, c.mdsAddr, client.Options{})
	if err != nil {
		t.Fatalf("trial %d: dial after restart: %v", n, err)
	}
	defer check.Close()
	var lost []string
	for _, a := range acks {
		if err := checkAnswered(ctx, check, a); err != nil {
			lost = append(lost, err.Error())
		}
	}
	if len(lost) > 0 {
		t.Fatalf("trial %d: %d of %d answers (creates and commits) lost or wrong after the MDS restart, e.g.:\n%s",
			n, len(lost), len(acks), strings.Join(lost[:min(len(lost), 10)], "\n"))
	}
	return res
}

// writeUntilError creates files dir/wW-I of the given sizes, one at a time,
// until one fails (the MDS died) or all are made. A create is recorded as
// soon as OPEN answered; a file's data once COMMIT answered (RFC 8881: the
// data and the size it implies are then stable). A File whose call failed
// is not closed: its state goes with the client.
func writeUntilError(ctx context.Context, cl *client.Client, dir string, w int, sizes []int, record func(answered)) error {
	for i, size := range sizes {
		name := fmt.Sprintf("%s/w%d-%04d", dir, w, i)
		err := func() error {
			octx, cancel := context.WithTimeout(ctx, durabilityOpTimeout)
			defer cancel()
			f, err := cl.Open(octx, name, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
			if err != nil {
				return fmt.Errorf("create %s: %w", name, err)
			}
			record(answered{name: name})
			if size > 0 {
				data := fileData(name, size)
				if _, err := f.WriteAtContext(octx, data, 0); err != nil {
					return fmt.Errorf("write %s: %w", name, err)
				}
				if err := f.SyncContext(octx); err != nil {
					return fmt.Errorf("commit %s: %w", name, err)
				}
				record(answered{name: name, data: data})
			}
			return closeBounded(f, durabilityOpTimeout)
		}()
		if err != nil {
			return err
		}
	}
	return errors.New("all files created before the kill")
}

// closeBounded closes f, giving up after d: File.Close has no context and
// keeps retrying a dead server for minutes. A close given up on ends when
// its client is closed.
func closeBounded(f *client.File, d time.Duration) error {
	done := make(chan error, 1)
	go func() { done <- f.Close() }()
	select {
	case err := <-done:
		return err
	case <-time.After(d):
		return fmt.Errorf("close %s: no answer within %v", f.Name(), d)
	}
}

// fileData is the content of a file: bytes derived from its name, so a
// file that holds another file's bytes is caught.
func fileData(name string, size int) []byte {
	var seed [32]byte
	copy(seed[:], name)
	b := make([]byte, size)
	mathrand.NewChaCha8(seed).Read(b)
	return b
}

// checkAnswered checks that a survived the restart: it exists and, if its
// data was committed, holds exactly that data.
func checkAnswered(ctx context.Context, cl *client.Client, a answered) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	attr, err := cl.Stat(ctx, a.name)
	if err != nil {
		return fmt.Errorf("%s: answered create missing: %w", a.name, err)
	}
	if a.data == nil {
		return nil
	}
	if attr.Size != uint64(len(a.data)) {
		return fmt.Errorf("%s: size %d after restart, %d committed", a.name, attr.Size, len(a.data))
	}
	f, err := cl.Open(ctx, a.name, os.O_RDONLY, 0)
	if err != nil {
		return fmt.Errorf("%s: open: %w", a.name, err)
	}
	defer f.Close()
	got := make([]byte, len(a.data))
	n, err := f.ReadAtContext(ctx, got, 0)
	if err != nil && !(errors.Is(err, io.EOF) && n == len(got)) {
		return fmt.Errorf("%s: read: %w", a.name, err)
	}
	if !bytes.Equal(got[:n], a.data) {
		return fmt.Errorf("%s: data differs from what was committed (%d bytes read)", a.name, n)
	}
	return nil
}
