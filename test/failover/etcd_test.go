package failover

import (
	"context"
	"syscall"
	"testing"
	"time"
)

// runUnder runs the workload and calls fault once it is under way; it
// fails the test on any application error or lost change.
func runUnder(t *testing.T, w *World, dir string, fault func(progress func() int)) {
	wl := &Workload{Addrs: w.MDSAddrs(), BigSize: 16 << 20, Dir: dir}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { defer close(done); wl.Run(ctx, stop) }()
	metaSteps := func() int { _, m := wl.Progress(); return len(m) }
	for deadline := time.Now().Add(60 * time.Second); metaSteps() < 5; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) || len(wl.Errors()) > 0 {
			close(stop)
			<-done
			t.Fatalf("workload not under way: %v", wl.Errors())
		}
	}
	fault(metaSteps)
	n := metaSteps()
	for deadline := time.Now().Add(90 * time.Second); metaSteps() < n+5; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) || len(wl.Errors()) > 0 {
			t.Errorf("no progress after the fault: %v", wl.Errors())
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
}

// TestEtcdMemberKilled: kill -9 of one of the 3 etcd members (each in
// turn, the raft leader among them) costs the application nothing.
func TestEtcdMemberKilled(t *testing.T) {
	w := newCluster(t)
	runUnder(t, w, "/etcd-kill", func(func() int) {
		for i := range w.Etcd {
			e := w.Etcd[i]
			e.P.Signal(syscall.SIGKILL)
			_ = e.P.Wait(10 * time.Second)
			time.Sleep(2 * time.Second)
			w.RestartEtcd(i)
			w.WaitEtcd(30 * time.Second)
		}
	})
}

// TestEtcdQuorumLost: with 2 of the 3 etcd members gone, the metadata
// cannot change; the MDS answers no request wrongly (its clients wait:
// NFS4ERR_DELAY, or no leader to connect to) and the cluster resumes by
// itself when the members come back, without an application error.
func TestEtcdQuorumLost(t *testing.T) {
	w := newCluster(t)
	runUnder(t, w, "/etcd-quorum", func(progress func() int) {
		for _, i := range []int{1, 2} {
			w.Etcd[i].P.Signal(syscall.SIGKILL)
			_ = w.Etcd[i].P.Wait(10 * time.Second)
		}
		time.Sleep(time.Second) // steps already past etcd finish
		before := progress()
		time.Sleep(6 * time.Second)
		if moved := progress() - before; moved > 0 {
			t.Errorf("%d metadata changes completed without an etcd quorum", moved)
		}
		for _, i := range []int{1, 2} {
			w.RestartEtcd(i)
		}
		w.WaitEtcd(60 * time.Second)
		w.WaitLeader(nil, 60*time.Second)
	})
}
