package cluster

import (
	"fmt"
	"testing"

	"github.com/shoalfs/shoal/store"
	"github.com/shoalfs/shoal/store/storetest"
)

// restartStore restarts node as a data server process restarting: its
// agent and peer listener stop, its store is closed and opened again on
// the same directory (with checksums, as add made it), and both start
// again.
func (rc *replicaCluster) restartStore(t *testing.T, node *replicaNode) {
	t.Helper()
	rc.kill(node)
	if err := node.st.Close(); err != nil {
		t.Fatalf("close the store of %s: %v", node.id, err)
	}
	st, err := store.NewLocal(node.dir, store.LocalOptions{Checksums: true})
	if err != nil {
		t.Fatalf("reopen the store of %s: %v", node.id, err)
	}
	node.st = st
	rc.start(node)
}

// TestStripedConformance runs the backend conformance suite on Striped
// over a registry and real agents on loopback, each subtest with a
// Striped of its own (so nothing is cached from another subtest), over
// three data servers with one copy and with two copies of each stripe
// unit. The stripe unit is 64 KiB, so the suite's ranges cross units.
// Reopening restarts every data server on its directory and starts a new
// Striped.
func TestStripedConformance(t *testing.T) {
	for _, mirrors := range []int{1, 2} {
		t.Run(fmt.Sprintf("Mirrors%d", mirrors), func(t *testing.T) {
			rc := newReplicaCluster(t, 3, mirrors)
			newStriped := func() *Striped {
				s := NewStriped(rc.reg, rc.meta, replicaUnit)
				s.SetDefaultMirrors(mirrors)
				return s
			}
			storetest.Run(t, func(t *testing.T) storetest.Target {
				return storetest.Target{
					Backend: newStriped(),
					NewFile: func(t *testing.T) uint64 { return newFile(t, rc.meta) },
					Reopen: func(t *testing.T) store.Backend {
						for i := range 3 {
							rc.restartStore(t, rc.nodes[fmt.Sprintf("ds%d", i)])
						}
						return newStriped()
					},
				}
			})
		})
	}
}
