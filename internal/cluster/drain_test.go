package cluster

import (
	"context"
	"testing"
	"time"
)

// TestDrainCancelResume interrupts a drain in the middle of a file's move
// and checks that nothing changed for that file, that the data server
// stays Draining (no new files), and that an MDS restart resumes the drain
// to the end with every byte intact.
func TestDrainCancelResume(t *testing.T) {
	w := newDDWorld(t)
	for _, n := range []string{"a", "b", "c"} {
		if err := w.join(n); err != nil {
			t.Fatal(err)
		}
	}
	ctx := t.Context()
	sizes := map[uint64]int{1: 3 << 20, 2: 5<<20 + 99, 3: 1 << 20}
	for n, size := range sizes {
		writeDD(t, w, w.file(n), size)
	}
	// The first move waits in Hold until the test lets it go.
	holding := make(chan struct{}, 1)
	release := make(chan struct{})
	w.admin.cfg.Hold = func(ctx context.Context, ino uint64) (func(), error) {
		select {
		case holding <- struct{}{}:
		default:
		}
		select {
		case <-release:
			return func() {}, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if _, err := w.admin.Admin(ctx, "drain", mustJSON(AdminRequest{DS: w.ids["b"]})); err != nil {
		t.Fatal(err)
	}
	<-holding
	if d, _ := w.reg.DataServer(w.ids["b"]); d.State != Draining {
		t.Fatalf("state %s during a drain, want draining", d.State)
	}
	if got := w.reg.Placement(); len(got) != 2 {
		t.Fatalf("placement during a drain %v: the draining data server still gets new files", got)
	}
	j, err := w.admin.Cancel()
	if err != nil {
		t.Fatal(err)
	}
	if !j.Cancelled || j.Moved != 0 || j.Running {
		t.Fatalf("cancelled job %+v", j)
	}
	if d, _ := w.reg.DataServer(w.ids["b"]); d.State != Draining {
		t.Fatalf("state %s after cancel, want draining (resumable)", d.State)
	}
	for n, size := range sizes {
		checkDD(t, w, w.file(n), size)
	}
	close(release)

	// A restarted MDS resumes it.
	w.stopMDS()
	w.startMDS()
	deadline := time.Now().Add(60 * time.Second)
	for {
		if d, _ := w.reg.DataServer(w.ids["b"]); d.State == Drained {
			break
		}
		if time.Now().After(deadline) {
			st, _ := w.admin.Status(ctx)
			t.Fatalf("drain not resumed to the end: %+v", st.Job)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for n, size := range sizes {
		ino := w.file(n)
		checkDD(t, w, ino, size)
		if m, _, _ := w.s.Map(ctx, ino); m.Holds(w.ids["b"]) {
			t.Errorf("file %d still maps to the drained data server: %+v", n, m)
		}
	}
}

func writeDD(t *testing.T, w *ddWorld, ino uint64, size int) {
	t.Helper()
	buf := make([]byte, size)
	for i := range buf {
		buf[i] = ddByte(ino, uint64(i))
	}
	f, _ := w.s.Open(ino, true)
	defer f.Close()
	if _, err := f.WriteAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	if err := w.s.Sync(ino); err != nil {
		t.Fatal(err)
	}
}

func checkDD(t *testing.T, w *ddWorld, ino uint64, size int) {
	t.Helper()
	f, _ := w.s.Open(ino, false)
	defer f.Close()
	buf := make([]byte, size)
	if n, err := f.ReadAt(buf, 0); n != size && err != nil {
		t.Fatalf("read ino %d: %d bytes, %v", ino, n, err)
	}
	for i := range buf {
		if buf[i] != ddByte(ino, uint64(i)) {
			t.Fatalf("ino %d: wrong byte at %d", ino, i)
		}
	}
}
