package cluster

import (
	"bytes"
	"context"
	"errors"
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

// TestReplicaStoreConformance runs the backend conformance suite on a
// data server's ReplicaStore, with two copies of every stripe unit on two
// data servers, so that the data server under test holds every range of
// every file and replicates each write to its peer. Files are placed
// before the suite uses them: a data server holds data only for files
// whose maps name it. Reopening restarts the data server under test.
func TestReplicaStoreConformance(t *testing.T) {
	rc := newReplicaCluster(t, 2, 2)
	node := rc.nodes["ds0"]
	storetest.Run(t, func(t *testing.T) storetest.Target {
		return storetest.Target{
			Backend: node.rs,
			NewFile: func(t *testing.T) uint64 {
				ino := newFile(t, rc.meta)
				if _, err := rc.s.Place(context.Background(), ino); err != nil {
					t.Fatalf("place %d: %v", ino, err)
				}
				return ino
			},
			Reopen: func(t *testing.T) store.Backend {
				rc.restartStore(t, node)
				return node.rs
			},
		}
	})
}

// TestReplicaClosedHandleWritesNothing: a write through a closed handle
// fails with store.ErrClosed on every copy, not just on the data server
// it was sent to. The suite sees only the data server under test; this
// looks at its peer too.
func TestReplicaClosedHandleWritesNothing(t *testing.T) {
	rc := newReplicaCluster(t, 2, 2)
	ino, _ := rc.place()
	node, peer := rc.nodes["ds0"], rc.nodes["ds1"]
	if err := writeThrough(t, node, ino, pattern(4096, 1), 0, true); err != nil {
		t.Fatal(err)
	}
	f, err := node.rs.Open(ino, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(pattern(4096, 2), 0); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("write through a closed handle: %v, want store.ErrClosed", err)
	}
	for _, n := range []*replicaNode{node, peer} {
		if got := localBytes(t, n, ino, 0, 4096); !bytes.Equal(got, pattern(4096, 1)) {
			t.Errorf("%s: the write through a closed handle changed its copy", n.id)
		}
	}
}
