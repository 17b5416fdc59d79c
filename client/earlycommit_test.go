package client_test

import (
	"os"
	"testing"
	"time"

	"github.com/shoalfs/shoal/client"
)

// TestEarlyCommitOverlapsWrites: a write that takes a File past half of
// Policy.UnstableLimit starts a commit of what the File holds and goes on
// without waiting for it. The MDS's answers are held back once the File
// holds half its limit, so the commit round that the next write starts
// cannot end (its LAYOUTCOMMIT gets no answer): that write must still
// return, through the layout it already holds. A write that would take
// the File past the limit waits for the commit, and once the answers are
// let through everything is committed and reads back.
func TestEarlyCommitOverlapsWrites(t *testing.T) {
	const (
		limit = 1 << 20
		chunk = 256 << 10
	)
	cl := startCluster(t, 2)
	addr := cl.MDS.Addr.String()
	proxy := newCBProxy(t, addr)
	c := dialer(proxy.ln.Addr().String(), client.Options{Policy: client.Policy{UnstableLimit: limit}})(t)
	defer c.Close()
	f, err := c.Open(t.Context(), "/early", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	want := make([]byte, 4*chunk)
	pattern(want, 0)
	write := func(i int) error {
		_, err := f.WriteAt(want[i*chunk:(i+1)*chunk], int64(i*chunk))
		return err
	}
	// Half the limit: no commit yet.
	for i := range 2 {
		if err := write(i); err != nil {
			t.Fatal(err)
		}
	}
	if st := c.Stats(); st.EarlyCommits != 0 || client.HeldBytes(f) != limit/2 {
		t.Fatalf("after writing half the limit: %d early commits, %d bytes held", st.EarlyCommits, client.HeldBytes(f))
	}
	if st := c.Stats(); st.DSWriteBytes < limit/2 {
		t.Fatalf("the writes did not go to the data servers: %+v", st)
	}
	before := cl.MDS.Server.Stats().Ops["LAYOUTCOMMIT"]
	proxy.holdAll()
	released := false
	defer func() {
		if !released {
			proxy.release()
		}
	}()
	// Past half: the commit starts, and this write does not wait for it
	// (if it did, it would wait for the held LAYOUTCOMMIT answer).
	done := make(chan error, 1)
	go func() { done <- write(2) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute):
		t.Fatal("a write past half the limit waited for the commit it started")
	}
	if n := c.Stats().EarlyCommits; n != 1 {
		t.Errorf("%d early commits after the write past half the limit, want 1", n)
	}
	waitFor(t, "the early commit's LAYOUTCOMMIT at the MDS", func() bool {
		return cl.MDS.Server.Stats().Ops["LAYOUTCOMMIT"] > before
	})
	// Past the limit: waits for the commit, which ends once the MDS's
	// answers go through.
	go func() { done <- write(3) }()
	proxy.release()
	released = true
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if n := client.HeldBytes(f); n != 0 {
		t.Errorf("the File still keeps %d bytes after Sync", n)
	}
	readBack(t, addr, "/early", want)
}

// TestEarlyCommitDataServerLoss: the commits a File starts in the
// background while a data server holding its data is gone (a copy of
// every stripe is kept on another data server) vouch for nothing that
// data server took; what they cannot vouch for is written again through
// the MDS, and Sync succeeds with every byte readable.
func TestEarlyCommitDataServerLoss(t *testing.T) {
	const (
		limit = 1 << 20
		chunk = 128 << 10
		size  = 4 << 20
	)
	mc := startMirroredCluster(t, 3, 2)
	addr := mc.mds.Addr.String()
	c := dialer(addr, client.Options{Policy: client.Policy{UnstableLimit: limit}})(t)
	defer c.Close()
	f, err := c.Open(t.Context(), "/early-lost", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	want := make([]byte, size)
	pattern(want, 3)
	// Under half the limit: held, not committed.
	for off := 0; off < limit/2; off += chunk {
		if _, err := f.WriteAt(want[off:off+chunk], int64(off)); err != nil {
			t.Fatal(err)
		}
	}
	written, _ := mc.holders(t, f, 0)
	before := c.Stats()
	mc.stop(t, written)
	for off := limit / 2; off < size; off += chunk {
		if _, err := f.WriteAt(want[off:off+chunk], int64(off)); err != nil {
			t.Fatalf("write at %d after data server %d stopped: %v", off, written, err)
		}
	}
	if err := f.Sync(); err != nil {
		t.Fatalf("Sync after data server %d stopped: %v", written, err)
	}
	st := c.Stats()
	t.Logf("stopped data server %d; client %+v", written, st)
	if st.EarlyCommits == before.EarlyCommits {
		t.Errorf("no early commit while writing %d MiB at a %d MiB limit", size>>20, limit>>20)
	}
	if resent := st.ResentBytes - before.ResentBytes; resent < limit/2 {
		t.Errorf("%d bytes written again through the MDS, want at least the %d the stopped data server took UNSTABLE", resent, limit/2)
	}
	readBack(t, addr, "/early-lost", want)
}

// TestBackgroundRoundsDeferLayoutCommit: the commit rounds a streaming
// write starts to bound its copies send LAYOUTCOMMIT at most once per
// layoutCommitEvery (the first round always does), while the COMMITs
// still let the File drop its copies; Sync sends the one left out, so the
// size and data are there for another client. A recall in between
// commits the layout's writes with its LAYOUTCOMMIT before the return.
func TestBackgroundRoundsDeferLayoutCommit(t *testing.T) {
	const (
		limit = 1 << 20
		chunk = 256 << 10
		size  = 16 << 20
	)
	for _, tc := range []struct {
		name   string
		every  time.Duration
		recall bool
	}{
		{"every round", -1, false},
		{"deferred", time.Hour, false},
		{"deferred, then a recall", time.Hour, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer client.SetLayoutCommitEvery(tc.every)()
			cl := startCluster(t, 2)
			addr := cl.MDS.Addr.String()
			c := dialer(addr, client.Options{Policy: client.Policy{UnstableLimit: limit}})(t)
			defer c.Close()
			f, err := c.Open(t.Context(), "/defer", os.O_CREATE|os.O_RDWR, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			want := make([]byte, size)
			pattern(want, 0)
			before := cl.MDS.Server.Stats().Ops["LAYOUTCOMMIT"]
			for off := 0; off < size; off += chunk {
				if _, err := f.WriteAt(want[off:off+chunk], int64(off)); err != nil {
					t.Fatal(err)
				}
			}
			st := c.Stats()
			// The last round may still run: wait for it, as Sync does first.
			client.WaitCommit(t.Context(), f)
			during := cl.MDS.Server.Stats().Ops["LAYOUTCOMMIT"] - before
			t.Logf("%d background rounds, %d LAYOUTCOMMITs, %d bytes held", st.EarlyCommits, during, client.HeldBytes(f))
			if st.EarlyCommits < size/limit {
				t.Fatalf("%d background rounds for %d MiB at a %d MiB limit, want at least %d", st.EarlyCommits, size>>20, limit>>20, size/limit)
			}
			if st.DSWriteBytes < size {
				t.Fatalf("the writes did not go to the data servers: %+v", st)
			}
			switch {
			case tc.every < 0 && during < st.EarlyCommits/2:
				t.Errorf("%d LAYOUTCOMMITs in %d rounds that may each send one", during, st.EarlyCommits)
			case tc.every > 0 && during != 1:
				t.Errorf("%d LAYOUTCOMMITs in %d rounds, want 1 (the first)", during, st.EarlyCommits)
			}
			if h := client.HeldBytes(f); h > limit {
				t.Errorf("%d bytes held after the writes, over the %d limit: the rounds did not drop the copies", h, limit)
			}
			// One more round after the last write: when it leaves the
			// LAYOUTCOMMIT out, the Sync that follows must still send it,
			// although nothing was written in between.
			client.BackgroundCommit(t.Context(), f)
			if tc.every > 0 && cl.MDS.Server.Stats().Ops["LAYOUTCOMMIT"]-before != 1 {
				t.Errorf("a background round right after another sent a LAYOUTCOMMIT")
			}
			if tc.recall {
				a, err := f.Stat(t.Context())
				if err != nil {
					t.Fatal(err)
				}
				returns := c.Stats().LayoutReturns
				cl.MDS.Server.RecallLayouts(a.Fileid)
				waitFor(t, "the layout's return", func() bool { return c.Stats().LayoutReturns > returns })
			}
			if err := f.Sync(); err != nil {
				t.Fatal(err)
			}
			if tc.every > 0 {
				if n := cl.MDS.Server.Stats().Ops["LAYOUTCOMMIT"] - before; n != 2 {
					t.Errorf("%d LAYOUTCOMMITs after Sync, want 2 (the first round's and the one left to Sync or the return)", n)
				}
			}
			if st := c.Stats(); st.ResentBytes != 0 {
				t.Errorf("%d bytes written again through the MDS", st.ResentBytes)
			}
			readBack(t, addr, "/defer", want)
		})
	}
}
