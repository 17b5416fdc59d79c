package cluster

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/shoalfs/shoal/pnfs"
)

// TestMapWithoutMDS: a data server whose MDS is gone (killed, stepping
// down, failing over) cannot fetch a stripe map; the error wraps
// pnfs.ErrMDSUnreachable, which sends the client to the MDS, as well as
// pnfs.ErrUnavailable, which the data servers' peer calls go by. Before, it was
// pnfs.ErrUnavailable alone: NFS4ERR_DELAY, which stalled the Linux client's
// mirrored writes for 15 s after every MDS failover (test/kernel
// shoal-failover).
func TestMapWithoutMDS(t *testing.T) {
	rec := metaRecord{newMeta(t)}
	first := startFailoverMDS(t, listen(t), rec, 1, true, time.Hour)
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	tc := &testCluster{t: t}
	a, err := StartAgent(ctx, AgentConfig{
		MDS: []string{first.addr, refusedAddr(t)},
		ID:  "ds0", Addrs: []string{"127.0.0.1:2049"}, Store: tc.newStore(), JoinSecret: testSecret,
		Logger: discardLogger(), registerTimeout: 500 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	first.reg.Close()
	eventually(t, "the agent to notice the MDS is gone", func() bool { return agentConn(a) == nil })

	for _, tt := range []struct {
		name string
		call func() error
	}{
		{"MAP", func() error { _, err := a.Map(ctx, 7); return err }},
		{"REPLICA_FAILED", func() error { _, err := a.replicaFailed(ctx, 7, 1, "ds1"); return err }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			// pnfs.ErrMDSUnreachable, not merely pnfs.ErrUnavailable: the data
			// server sends the client to the MDS rather than into DELAY.
			if !errors.Is(err, pnfs.ErrMDSUnreachable) {
				t.Errorf("%s without an MDS = %v, want pnfs.ErrMDSUnreachable", tt.name, err)
			}
		})
	}
}
