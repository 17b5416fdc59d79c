package failover

import (
	"syscall"
	"testing"
	"time"
)

// TestEtcdMemberKilled: kill -9 of one of the 3 etcd members (each in
// turn, the raft leader among them) costs the application nothing.
func TestEtcdMemberKilled(t *testing.T) {
	w := newCluster(t)
	underWorkload(t, w, "/etcd-kill", 16<<20, func() {
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
	var lost, back time.Time
	_, meta, _ := underWorkload(t, w, "/etcd-quorum", 16<<20, func() {
		for _, i := range []int{1, 2} {
			w.Etcd[i].P.Signal(syscall.SIGKILL)
			_ = w.Etcd[i].P.Wait(10 * time.Second)
		}
		time.Sleep(time.Second) // steps already past etcd finish
		lost = time.Now()
		time.Sleep(6 * time.Second)
		back = time.Now()
		for _, i := range []int{1, 2} {
			w.RestartEtcd(i)
		}
		w.WaitEtcd(60 * time.Second)
		w.WaitLeader(nil, 60*time.Second)
	})
	for _, p := range meta {
		if p.After(lost) && p.Before(back) {
			t.Errorf("a metadata change completed at %v, without an etcd quorum", p.Sub(lost))
		}
	}
}
