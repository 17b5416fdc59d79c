package cluster

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/shoalfs/shoal/store"
	"github.com/shoalfs/shoal/store/storetest"
)

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
