package server

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/shoalfs/shoal/internal/faultfs"
	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/meta"
)

func isWALFile(name string) bool { return strings.Contains(name, "-wal") }

// TestFailedLogSyncAnswersIO runs a server whose metadata log lives on a
// disk whose fdatasyncs fail (faultfs: a failing disk, or a lost network
// volume). No COMPOUND that depends on the log may then be answered
// NFS4_OK: a failed fdatasync means nobody knows what the log holds (the
// kernel may have dropped its dirty pages), so the server can vouch
// neither for a change nor for what it would read back, and answers
// NFS4ERR_IO until it is restarted on a good disk.
//   - sync mode: the first change after the failure gets NFS4ERR_IO, and
//     so do later changes and reads;
//   - async mode: changes are answered before their fdatasync, so the
//     failure is found by the commit interval's timer; from then on every
//     change gets NFS4ERR_IO (never NFS4ERR_SERVERFAULT or a hang).
func TestFailedLogSyncAnswersIO(t *testing.T) {
	t.Run("sync", func(t *testing.T) {
		ffs := faultfs.ForTest(t)
		ts := startServer(t, Config{Dir: ffs.Dir, CommitInterval: time.Hour,
			Exports: []*Export{{Path: "/", RootSquash: &noSquash}}})
		c := ts.client()
		must(t)(c.Compound(opPutRoot(), opMkdir("before")))
		ffs.FailSyncs(isWALFile)
		for _, tc := range []struct {
			name string
			ops  []nfs4.NfsArgop4
		}{
			{"change", []nfs4.NfsArgop4{opPutRoot(), opMkdir("after")}},
			{"later change", []nfs4.NfsArgop4{opPutRoot(), opMkdir("later")}},
			{"read", []nfs4.NfsArgop4{opPutRoot(), opLookup("before"), opGetattr(nfs4.FATTR4_TYPE)}},
		} {
			res, err := c.Compound(tc.ops...)
			if err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			if res.Status != nfs4.NFS4ERR_IO {
				t.Fatalf("%s: status %v after the metadata log failed, want NFS4ERR_IO", tc.name, res.Status)
			}
		}
		if ffs.Syncs(isWALFile) == 0 {
			t.Fatal("no fdatasync of the metadata log reached the disk: the test did not exercise the failure")
		}
		closeFailed(t, ts)
	})
	t.Run("async", func(t *testing.T) {
		ffs := faultfs.ForTest(t)
		ts := startServer(t, Config{Dir: ffs.Dir, Async: true, CommitInterval: 20 * time.Millisecond,
			Exports: []*Export{{Path: "/", RootSquash: &noSquash}}})
		c := ts.client()
		must(t)(c.Compound(opPutRoot(), opMkdir("before")))
		ffs.FailSyncs(isWALFile)
		// Each change below is answered once written; the timer's next
		// fdatasync fails and stops the engine. Bounded: 200 changes,
		// 20 ms apart, against a 20-ms commit interval.
		for i := range 200 {
			res, err := c.Compound(opPutRoot(), opMkdir(fmt.Sprintf("after%d", i)))
			if err != nil {
				t.Fatal(err)
			}
			if res.Status == nfs4.NFS4_OK {
				time.Sleep(20 * time.Millisecond)
				continue
			}
			if res.Status != nfs4.NFS4ERR_IO {
				t.Fatalf("change %d: status %v after the metadata log failed, want NFS4ERR_IO", i, res.Status)
			}
			if ffs.Syncs(isWALFile) == 0 {
				t.Fatal("no fdatasync of the metadata log reached the disk")
			}
			closeFailed(t, ts)
			return
		}
		t.Fatal("200 changes over 4 s were answered NFS4_OK although every fdatasync of the log failed")
	})
}

// closeFailed stops a server whose metadata log failed: Close must say
// so (an operator's restart script sees it).
func closeFailed(t *testing.T, ts *testServer) {
	t.Helper()
	err := ts.srv.Close()
	<-ts.done
	ts.srv = nil
	if !errors.Is(err, meta.ErrStoreFailed) {
		t.Fatalf("Close after the metadata log failed: %v, want meta.ErrStoreFailed", err)
	}
}
