package membership

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/shoalfs/shoal/client"
)

// TestKillLoop is the "no committed byte lost" benchmark of issue 11: in
// each trial a writer appends 64 KiB records to a new file through the Go
// client and fsyncs after each one, while a randomly chosen data server is
// killed with SIGKILL at a random moment and restarted. Afterwards every
// record whose fsync returned success must read back intact from a fresh
// client. The cluster is `shoal mds --mirrors 2` with three data servers;
// between trials the test waits until healing has left no degraded stripe.
//
// It is a benchmark, not a CI test: it runs only with SHOAL_KILL_TRIALS=N
// (N >= 1; the issue asks for at least 100), e.g.
//
//	scripts/kill-loop.sh 100
//
// and prints a table and, with SHOAL_KILL_JSON=FILE, a JSON summary.
func TestKillLoop(t *testing.T) {
	trials, _ := strconv.Atoi(os.Getenv("SHOAL_KILL_TRIALS"))
	if trials < 1 {
		t.Skip("set SHOAL_KILL_TRIALS=N to run the kill loop (scripts/kill-loop.sh)")
	}
	c, ds := startMirrored(t, "--mirrors", "2", "--ds-down-after", "2s")

	type trial struct {
		N         int     `json:"trial"`
		Killed    string  `json:"killed"`
		KillAfter float64 `json:"kill_after_s"`
		Acked     int     `json:"acked_records"`
		// During is whether the kill landed while the writer was still
		// writing (it always should; a trial where it did not proves
		// nothing and is counted apart).
		During   bool   `json:"kill_during_writes"`
		Failed   int    `json:"failed_writes"`
		Lost     int    `json:"lost_records"`
		Err      string `json:"error,omitempty"`
		WriteErr string `json:"write_error,omitempty"`
	}
	var results []trial
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 11))
	const (
		recSize    = 64 << 10
		maxRecords = 2048 // 128 MiB per trial at most
		writeFor   = 3 * time.Second
	)
	start := time.Now()
	for i := range trials {
		tr := trial{N: i + 1}
		victim := ds[rng.IntN(len(ds))]
		tr.Killed = victim.name
		killAfter := time.Duration(rng.Int64N(int64(writeFor * 3 / 4)))
		tr.KillAfter = killAfter.Seconds()

		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		cl, err := client.Dial(ctx, c.mdsAddr, client.Options{})
		if err != nil {
			cancel()
			t.Fatalf("trial %d: dial: %v", tr.N, err)
		}
		name := fmt.Sprintf("/kill-%03d", tr.N)
		f, err := cl.Open(ctx, name, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
		if err != nil {
			cancel()
			cl.Close()
			t.Fatalf("trial %d: create: %v", tr.N, err)
		}
		var wg sync.WaitGroup
		var killedAt time.Time
		wg.Go(func() {
			time.Sleep(killAfter)
			victim.p.signal(syscall.SIGKILL)
			killedAt = time.Now()
			_ = victim.p.wait(10 * time.Second)
		})
		acked := 0
		deadline := time.Now().Add(writeFor)
		rec := make([]byte, recSize)
		for n := 0; n < maxRecords && time.Now().Before(deadline); n++ {
			fillRecord(rec, tr.N, n)
			if _, err := f.WriteAt(rec, int64(n)*recSize); err != nil {
				tr.Failed++
				tr.WriteErr = fmt.Sprintf("write of record %d: %v", n, err)
				break
			}
			if err := f.Sync(); err != nil {
				tr.Failed++
				tr.WriteErr = fmt.Sprintf("fsync of record %d: %v", n, err)
				break
			}
			acked = n + 1
		}
		tr.Acked = acked
		lastAck := time.Now()
		_ = f.Close()
		cl.Close()
		wg.Wait()
		tr.During = killedAt.Before(lastAck)
		c.startDS(victim)
		c.waitUp(ds...)

		// Read back from a fresh client.
		rcl, err := client.Dial(ctx, c.mdsAddr, client.Options{})
		if err != nil {
			cancel()
			t.Fatalf("trial %d: dial: %v", tr.N, err)
		}
		tr.Lost, err = checkRecords(ctx, rcl, name, acked, recSize, tr.N)
		if err != nil {
			tr.Err = err.Error()
		}
		// Bounded disk use: each trial's file goes once checked.
		if err := rcl.Remove(ctx, name); err != nil {
			t.Logf("trial %d: remove %s: %v", tr.N, name, err)
		}
		rcl.Close()
		cancel()
		results = append(results, tr)
		t.Logf("trial %3d: killed %s after %.2fs (during writes: %v), %d records acked, %d failed writes, %d lost %s",
			tr.N, tr.Killed, tr.KillAfter, tr.During, tr.Acked, tr.Failed, tr.Lost, tr.Err+tr.WriteErr)
		c.waitStatus("healed", 3*time.Minute, func(st *status) bool {
			return st.Replication.DegradedFiles == 0 && st.Replication.DegradedStripes == 0
		})
	}
	lost, acked, failed, during := 0, 0, 0, 0
	for _, r := range results {
		lost += r.Lost
		acked += r.Acked
		failed += r.Failed
		if r.During {
			during++
		}
	}
	summary := map[string]any{
		"trials": len(results), "kills": len(results), "kills_during_writes": during, "acked_records": acked, "failed_writes": failed,
		"lost_records": lost, "record_bytes": recSize, "seconds": time.Since(start).Seconds(), "runs": results,
	}
	fmt.Printf("\n%-8s %-6s %-20s %-14s %-14s %-12s\n", "trials", "kills", "kills during writes", "acked records", "failed writes", "lost records")
	fmt.Printf("%-8d %-6d %-20d %-14d %-14d %-12d\n", len(results), len(results), during, acked, failed, lost)
	if p := os.Getenv("SHOAL_KILL_JSON"); p != "" {
		b, _ := json.MarshalIndent(summary, "", "  ")
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Error(err)
		}
	}
	if lost > 0 {
		t.Errorf("%d records acknowledged by fsync were lost", lost)
	}
}

// fillRecord fills rec with record n of trial tr: a header (trial, record
// number) and pseudo-random bytes derived from it, ending in a SHA-256 of
// the rest.
func fillRecord(rec []byte, tr, n int) {
	binary.BigEndian.PutUint64(rec[0:], uint64(tr))
	binary.BigEndian.PutUint64(rec[8:], uint64(n))
	r := rand.New(rand.NewPCG(uint64(tr), uint64(n)))
	body := rec[16 : len(rec)-32]
	for i := 0; i+8 <= len(body); i += 8 {
		binary.LittleEndian.PutUint64(body[i:], r.Uint64())
	}
	sum := sha256.Sum256(rec[:len(rec)-32])
	copy(rec[len(rec)-32:], sum[:])
}

// checkRecords reads name and counts the acknowledged records that do not
// read back exactly.
func checkRecords(ctx context.Context, cl *client.Client, name string, acked, recSize, tr int) (int, error) {
	f, err := cl.Open(ctx, name, os.O_RDONLY, 0)
	if err != nil {
		return acked, err
	}
	defer f.Close()
	want := make([]byte, recSize)
	got := make([]byte, recSize)
	lost := 0
	var firstErr error
	for n := range acked {
		fillRecord(want, tr, n)
		if _, err := f.ReadAt(got, int64(n)*int64(recSize)); err != nil && err != io.EOF {
			lost++
			if firstErr == nil {
				firstErr = fmt.Errorf("record %d: %w", n, err)
			}
			continue
		}
		if string(got) != string(want) {
			lost++
			if firstErr == nil {
				firstErr = fmt.Errorf("record %d differs", n)
			}
		}
	}
	return lost, firstErr
}
