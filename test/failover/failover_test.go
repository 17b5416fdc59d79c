package failover

import (
	"context"
	"testing"
	"time"
)

// newCluster starts 3 etcd members, 2 MDS nodes and 3 data servers with
// two copies of every stripe unit.
func newCluster(t testing.TB) *World {
	w := NewWorld(t, shoalBin)
	w.StartEtcd(3)
	w.AddMDS()
	w.WaitLeader(nil, 30*time.Second)
	w.WaitSecret(10 * time.Second)
	w.AddMDS()
	for range 3 {
		w.AddDS()
	}
	w.WaitDataServers(3, 60*time.Second)
	return w
}

// underWorkload runs the workload in dir, calls fault once it is under
// way (some small files and some of the big file done), waits for five
// more metadata changes after the time fault returns, and checks every
// byte and metadata change the workload was told succeeded. It returns
// the workload's progress and when fault returned.
func underWorkload(t testing.TB, w *World, dir string, bigSize int, fault func()) (all, meta []time.Time, after time.Time) {
	wl := &Workload{Addrs: w.MDSAddrs(), BigSize: bigSize, Dir: dir}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { defer close(done); wl.Run(ctx, stop) }()
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		all, meta := wl.Progress()
		if len(meta) >= 5 && len(all)-len(meta) >= 2 {
			break
		}
		if time.Now().After(deadline) || len(wl.Errors()) > 0 {
			close(stop)
			<-done
			t.Fatalf("workload not under way within 60 s: %v", wl.Errors())
		}
	}
	fault()
	after = time.Now()
	for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		_, meta := wl.Progress()
		n := 0
		for _, p := range meta {
			if p.After(after) {
				n++
			}
		}
		if n >= 5 || len(wl.Errors()) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("no metadata progress within 90 s of the fault")
			break
		}
	}
	close(stop)
	<-done
	for _, err := range wl.Errors() {
		t.Error(err)
	}
	if err := wl.Check(ctx); err != nil {
		t.Error(err)
	}
	all, meta = wl.Progress()
	return all, meta, after
}

// runTrial takes the leader away by f under the workload and measures
// what it cost.
func runTrial(t testing.TB, w *World, f Fault, bigSize int, dir string) Trial {
	var at time.Time
	var detect time.Duration
	all, meta, _ := underWorkload(t, w, dir, bigSize, func() { _, _, at, detect = w.Inject(f) })
	return Measure(f, at, detect, all, meta)
}

// TestShoalClientRidesThrough: Shoal's client, given every MDS address,
// rides through a kill -9 of the leader, a SIGSTOP of it and a planned
// step-down: the application sees no error, and every byte and metadata
// change it was told succeeded is there, and the lock it holds is never
// granted to another client.
func TestShoalClientRidesThrough(t *testing.T) {
	for _, f := range []Fault{Kill, Stop, StepDown} {
		t.Run(string(f), func(t *testing.T) {
			w := newCluster(t)
			tr := runTrial(t, w, f, 32<<20, "/"+string(f))
			t.Log(tr)
		})
	}
}
