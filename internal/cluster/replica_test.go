package cluster

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"

	"github.com/shoalfs/shoal/internal/ctlproto"
	"github.com/shoalfs/shoal/internal/rpc"
	"github.com/shoalfs/shoal/internal/xdr"
	"github.com/shoalfs/shoal/meta"
	"github.com/shoalfs/shoal/pnfs"
	"github.com/shoalfs/shoal/store"
)

// replicaUnit is the stripe unit of the replica tests: small, so that a
// test crosses units (and checksum blocks) cheaply.
const replicaUnit = 64 << 10

// replicaCluster is a test cluster whose data servers serve their peers
// on listeners of their own, as a DS's NFS listener does in production
// (Agent.PeerHandler), and whose registry answers MAP and REPLICA_FAILED
// from a Striped placing new files with mirrors copies.
type replicaCluster struct {
	*testCluster
	s     *Striped
	nodes map[string]*replicaNode
}

// replicaNode is one data server of a replicaCluster.
type replicaNode struct {
	id   string
	addr string // advertised, where PeerHandler is served
	dir  string // of st
	a    *Agent
	st   *store.Local
	srv  *rpc.Server
	rs   *ReplicaStore
}

func newReplicaCluster(t *testing.T, n, mirrors int) *replicaCluster {
	t.Helper()
	rc := &replicaCluster{testCluster: newCluster(t, 0), nodes: map[string]*replicaNode{}}
	rc.s = rc.striped(replicaUnit)
	rc.s.SetDefaultMirrors(mirrors)
	rc.reg.SetMaps(rc.s)
	for i := range n {
		rc.add(fmt.Sprintf("ds%d", i))
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	if err := rc.reg.WaitFor(ctx, n); err != nil {
		t.Fatal(err)
	}
	return rc
}

// add starts a new data server id with a checksumming store.
func (rc *replicaCluster) add(id string) *replicaNode {
	rc.t.Helper()
	dir := rc.t.TempDir()
	st, err := store.NewLocal(dir, store.LocalOptions{Checksums: true})
	if err != nil {
		rc.t.Fatal(err)
	}
	return rc.start(&replicaNode{id: id, dir: dir, st: st, addr: "127.0.0.1:0"})
}

// start starts (or restarts) node's agent and peer listener on node.addr,
// with node's store.
func (rc *replicaCluster) start(node *replicaNode) *replicaNode {
	rc.t.Helper()
	ln, err := net.Listen("tcp", node.addr)
	if err != nil {
		rc.t.Fatal(err)
	}
	node.addr = ln.Addr().String()
	cfg := rc.agentConfig(node.id, node.st)
	cfg.Addrs = []string{node.addr}
	node.a = rc.startAgentWith(cfg, node.st)
	node.rs = NewReplicaStore(node.a, node.st)
	node.srv = &rpc.Server{Handler: node.a.PeerHandler(), Logger: discardLogger()}
	srv := node.srv
	go srv.Serve(ln)
	rc.t.Cleanup(func() { srv.Close() })
	rc.nodes[node.id] = node
	return node
}

// kill stops node's agent and peer listener; its store stays.
func (rc *replicaCluster) kill(node *replicaNode) {
	rc.t.Helper()
	node.srv.Close()
	node.a.Close()
}

// restart kills node and starts it again on the same address and store:
// a data server process restarting, with a new boot verifier.
func (rc *replicaCluster) restart(node *replicaNode) {
	rc.t.Helper()
	old := node.a.Verifier()
	rc.kill(node)
	rc.start(node)
	if node.a.Verifier() == old {
		rc.t.Fatal("the restarted agent kept its boot verifier")
	}
}

// place creates a file and places its data, returning its map.
func (rc *replicaCluster) place() (uint64, meta.StripeMap) {
	rc.t.Helper()
	ino := rc.newFile()
	m, err := rc.s.Place(context.Background(), ino)
	if err != nil {
		rc.t.Fatal(err)
	}
	return ino, m
}

// mdsMap is ino's map as the MDS has it now.
func (rc *replicaCluster) mdsMap(ino uint64) meta.StripeMap {
	rc.t.Helper()
	rc.s.forget(ino)
	return stripeMap(rc.t, rc.s, ino)
}

// writeThrough writes p at off of ino through node's ReplicaStore, as a
// client's WRITE to that data server does, and commits it if sync.
func writeThrough(t *testing.T, node *replicaNode, ino uint64, p []byte, off int64, sync bool) error {
	t.Helper()
	f, err := node.rs.Open(ino, true)
	if err != nil {
		return err
	}
	defer f.Close()
	if n, err := f.WriteAt(p, off); err != nil {
		return err
	} else if n != len(p) {
		t.Fatalf("WriteAt through %s: %d of %d bytes", node.id, n, len(p))
	}
	if sync {
		return f.Sync()
	}
	return nil
}

// localBytes reads [off, off+n) of ino from node's own store, zeros where
// it holds nothing.
func localBytes(t *testing.T, node *replicaNode, ino uint64, off int64, n int) []byte {
	t.Helper()
	buf := make([]byte, n)
	f, err := node.st.Open(ino, false)
	if errors.Is(err, fs.ErrNotExist) {
		return buf
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.ReadAt(buf, off); err != nil && !errors.Is(err, io.EOF) {
		t.Fatalf("local read of %s: %v", node.id, err)
	}
	return buf
}

// unitOff is the offset of the k-th unit of the file that maps to
// position p.
func unitOff(m meta.StripeMap, p, k int) int64 {
	n := len(m.DataServers)
	u := (p - int(m.First) + n) % n
	return int64(u+k*n) * replicaUnit
}

func TestReplicaWriteLandsOnEveryGoodMember(t *testing.T) {
	cases := []struct {
		name        string
		dataServers int
		mirrors     int
	}{
		{"one copy", 3, 1},
		{"two copies of three", 3, 2},
		{"three copies of three", 3, 3},
		{"two copies of four", 4, 2},
		{"three copies of two (capped)", 2, 3},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rc := newReplicaCluster(t, tc.dataServers, tc.mirrors)
			ino, m := rc.place()
			if want := min(tc.mirrors, tc.dataServers); m.Mirrors() != want {
				t.Fatalf("placed with %d copies, want %d", m.Mirrors(), want)
			}
			n := len(m.DataServers)
			// want[u] is unit u's content: two rounds of units, each
			// written whole through its position's first member...
			want := make([][]byte, 2*n)
			for u := range want {
				want[u] = pattern(replicaUnit, byte(u))
				p := m.Position(uint64(u) * replicaUnit)
				if err := writeThrough(t, rc.nodes[m.DataServers[p]], ino, want[u], int64(u)*replicaUnit, u%2 == 0); err != nil {
					t.Fatalf("unit %d through %s: %v", u, m.DataServers[p], err)
				}
			}
			// ...then, with copies, one write across two units through
			// a data server holding both.
			if m.Mirrors() > 1 {
				p0 := m.Position(0)
				p1 := m.Position(replicaUnit)
				var via string
				for _, id := range m.Members(p0) {
					if slices.Contains(m.Members(p1), id) {
						via = id
					}
				}
				if via == "" {
					t.Fatalf("no data server holds positions %d and %d: %+v", p0, p1, m)
				}
				span := pattern(replicaUnit, 99)
				if err := writeThrough(t, rc.nodes[via], ino, span, replicaUnit/2, true); err != nil {
					t.Fatalf("write across units 0 and 1 through %s: %v", via, err)
				}
				copy(want[0][replicaUnit/2:], span)
				copy(want[1], span[replicaUnit/2:])
			}
			for _, node := range rc.nodes {
				if err := node.rs.Sync(ino); err != nil {
					t.Fatalf("Sync on %s: %v", node.id, err)
				}
			}
			for u := range want {
				p := m.Position(uint64(u) * replicaUnit)
				for id, node := range rc.nodes {
					got := localBytes(t, node, ino, int64(u)*replicaUnit, replicaUnit)
					member := slices.Contains(m.Members(p), id)
					switch {
					case member && !bytes.Equal(got, want[u]):
						t.Errorf("unit %d (position %d): member %s does not hold it", u, p, id)
					case !member && !bytes.Equal(got, make([]byte, replicaUnit)):
						t.Errorf("unit %d (position %d): non-member %s holds data", u, p, id)
					}
				}
			}
			var fetches uint64
			for _, node := range rc.nodes {
				fetches += node.a.Stats().MapFetches
			}
			if fetches > uint64(len(rc.nodes)) {
				t.Errorf("%d MAP calls for one file over %d data servers: the cache does not hold", fetches, len(rc.nodes))
			}
			if m.Mirrors() == 1 {
				for id, node := range rc.nodes {
					if st := node.a.Stats(); st.ReplicaWriteOps != 0 || st.ReplicaCommitOps != 0 {
						t.Errorf("%s served replica calls for a file with one copy: %+v", id, st)
					}
				}
			}
		})
	}
}

// TestReplicaPeerDown: a copy that cannot be reached is marked stale
// (REPLICA_FAILED) and the write or commit goes on without it.
func TestReplicaPeerDown(t *testing.T) {
	cases := []struct {
		name           string
		killAfterWrite bool // kill the peer between WRITE and COMMIT, not before WRITE
	}{
		{"before the write", false},
		{"between write and commit", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rc := newReplicaCluster(t, 3, 2)
			ino, m := rc.place()
			p := m.Position(0)
			writer, peer := rc.nodes[m.DataServers[p]], rc.nodes[m.Replicas[p][0]]
			data := pattern(replicaUnit, 1)
			if !tc.killAfterWrite {
				rc.kill(peer)
			}
			if err := writeThrough(t, writer, ino, data, 0, false); err != nil {
				t.Fatalf("write with a peer down: %v", err)
			}
			if tc.killAfterWrite {
				rc.kill(peer)
			}
			f, err := writer.rs.Open(ino, false)
			if err != nil {
				t.Fatal(err)
			}
			if err := f.Sync(); err != nil {
				t.Fatalf("commit with a peer down: %v", err)
			}
			f.Close()
			after := rc.mdsMap(ino)
			if !after.IsStale(peer.id) || after.IsStale(writer.id) {
				t.Fatalf("map after the failure: stale %q, want [%s]", after.Stale, peer.id)
			}
			if got := writer.a.Stats().ReplicaFailed; got != 1 {
				t.Fatalf("%d REPLICA_FAILED calls, want 1", got)
			}
			if !bytes.Equal(localBytes(t, writer, ino, 0, len(data)), data) {
				t.Fatal("the writer does not hold the data")
			}
			// Later writes skip the stale copy: no more REPLICA_FAILED,
			// no map change.
			for k := range 3 {
				if err := writeThrough(t, writer, ino, pattern(100, byte(k)), int64(k)*1000, true); err != nil {
					t.Fatalf("write %d after the failure: %v", k, err)
				}
			}
			if got := writer.a.Stats().ReplicaFailed; got != 1 {
				t.Fatalf("%d REPLICA_FAILED calls after more writes, want still 1", got)
			}
			if g := rc.mdsMap(ino).Gen; g != after.Gen {
				t.Fatalf("map changed again (generation %d, was %d)", g, after.Gen)
			}
		})
	}
}

// TestReplicaPeerRestartLosesWrites: a peer that restarted between a
// write and its commit answers the commit with a new verifier; Sync
// reports pnfs.ErrDataLost once the commit is done everywhere, once.
func TestReplicaPeerRestartLosesWrites(t *testing.T) {
	rc := newReplicaCluster(t, 3, 2)
	ino, m := rc.place()
	p := m.Position(0)
	writer, peer := rc.nodes[m.DataServers[p]], rc.nodes[m.Replicas[p][0]]
	if err := writeThrough(t, writer, ino, pattern(replicaUnit, 3), 0, false); err != nil {
		t.Fatal(err)
	}
	rc.restart(peer)
	err := writer.rs.Sync(ino)
	if !errors.Is(err, pnfs.ErrDataLost) {
		t.Fatalf("Sync after the peer restarted = %v, want pnfs.ErrDataLost", err)
	}
	if got := peer.a.Stats().ReplicaCommitOps; got != 1 {
		t.Fatalf("the restarted peer served %d commits, want 1", got)
	}
	if rc.mdsMap(ino).Degraded() {
		t.Fatalf("a restarted peer was marked stale: %+v", rc.mdsMap(ino))
	}
	// Clients resend; the resent writes go to the restarted peer and
	// commit cleanly.
	if err := writeThrough(t, writer, ino, pattern(replicaUnit, 4), 0, true); err != nil {
		t.Fatalf("resent write: %v", err)
	}
	if err := writer.rs.Sync(ino); err != nil {
		t.Fatalf("Sync after the resend: %v", err)
	}
	if !bytes.Equal(localBytes(t, peer, ino, 0, replicaUnit), pattern(replicaUnit, 4)) {
		t.Fatal("the restarted peer does not hold the resent data")
	}
}

func TestReplicaForgedMAC(t *testing.T) {
	rc := newReplicaCluster(t, 3, 3)
	ino, _ := rc.place()
	target := rc.nodes["ds1"]
	conn, err := rpc.Dial(context.Background(), "tcp", target.addr, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	data := pattern(1000, 5)
	key := testDataKey
	good := func(off uint64) [16]byte { return replicaWriteMAC(key, ino, 1, off, uint64(len(data)), false) }
	writes := []struct {
		name string
		mac  [16]byte
		off  uint64
		want ctlproto.CtlStatus
	}{
		{"no MAC", [16]byte{}, 0, ctlproto.CTL_ERR_AUTH},
		{"MAC of another offset", good(4096), 0, ctlproto.CTL_ERR_AUTH},
		{"MAC with another key", replicaWriteMAC([]byte("other key"), ino, 1, 0, uint64(len(data)), false), 0, ctlproto.CTL_ERR_AUTH},
		{"stable flipped", replicaWriteMAC(key, ino, 1, 0, uint64(len(data)), true), 0, ctlproto.CTL_ERR_AUTH},
		{"commit MAC on a write", replicaCommitMAC(key, ino, 1), 0, ctlproto.CTL_ERR_AUTH},
		{"good MAC", good(8192), 8192, ctlproto.CTL_OK},
	}
	for _, tc := range writes {
		t.Run("write/"+tc.name, func(t *testing.T) {
			var res ctlproto.CtlWriteRes
			err := call(context.Background(), conn, ctlproto.CTLPROC_REPLICA_WRITE, &ctlproto.CtlReplicaWriteArgs{
				Mac: tc.mac, Ino: ino, Gen: 1, Offset: tc.off, Data: data}, &res)
			if err != nil || res.Status != tc.want {
				t.Fatalf("REPLICA_WRITE = %v, %v; want %v", res.Status, err, tc.want)
			}
			got := localBytes(t, target, ino, int64(tc.off), len(data))
			if wrote := bytes.Equal(got, data); wrote != (tc.want == ctlproto.CTL_OK) {
				t.Fatalf("data written: %v, status %v", wrote, res.Status)
			}
		})
	}
	commits := []struct {
		name string
		mac  [16]byte
		want ctlproto.CtlStatus
	}{
		{"no MAC", [16]byte{}, ctlproto.CTL_ERR_AUTH},
		{"MAC of another file", replicaCommitMAC(key, ino+1, 1), ctlproto.CTL_ERR_AUTH},
		{"write MAC on a commit", good(0), ctlproto.CTL_ERR_AUTH},
		{"good MAC", replicaCommitMAC(key, ino, 1), ctlproto.CTL_OK},
	}
	for _, tc := range commits {
		t.Run("commit/"+tc.name, func(t *testing.T) {
			var res ctlproto.CtlCommitRes
			err := call(context.Background(), conn, ctlproto.CTLPROC_REPLICA_COMMIT,
				&ctlproto.CtlReplicaCommitArgs{Mac: tc.mac, Ino: ino, Gen: 1}, &res)
			if err != nil || res.Status != tc.want {
				t.Fatalf("REPLICA_COMMIT = %v, %v; want %v", res.Status, err, tc.want)
			}
			if tc.want == ctlproto.CTL_OK && *res.Verifier != target.a.Verifier() {
				t.Fatalf("verifier %x, want the agent's %x", *res.Verifier, target.a.Verifier())
			}
		})
	}
	// The peer listener serves nothing else of SHOAL_CONTROL: it is
	// the NFS port, open to clients.
	for _, proc := range []uint32{ctlproto.CTLPROC_OBJ_WRITE, ctlproto.CTLPROC_OBJ_REMOVE, ctlproto.CTLPROC_RETIRE, ctlproto.CTLPROC_MAP_CHANGED} {
		var res ctlproto.CtlStatusRes
		err := call(context.Background(), conn, proc, &ctlproto.CtlInoArgs{Ino: ino}, &res)
		var ae *rpc.AcceptError
		if !errors.As(err, &ae) {
			t.Errorf("proc %d on the peer listener: %v, want PROC_UNAVAIL", proc, err)
		}
	}
}

// TestReplicaNotMember: a data server refuses I/O on ranges it holds no
// current copy of.
func TestReplicaNotMember(t *testing.T) {
	rc := newReplicaCluster(t, 3, 2)
	ino, m := rc.place()
	outsider := rc.add("ds3") // joined after the file was placed
	// A position ds0 is no member of (with two copies of three, one).
	var foreign int
	for p := range m.DataServers {
		if !slices.Contains(m.Members(p), "ds0") {
			foreign = p
		}
	}
	// Data for every unit, and a stale member.
	for p := range m.DataServers {
		if err := writeThrough(t, rc.nodes[m.DataServers[p]], ino, pattern(replicaUnit, byte(p)), unitOff(m, p, 0), true); err != nil {
			t.Fatal(err)
		}
	}
	sp := m.Position(0)
	stale := rc.nodes[m.Replicas[sp][0]]
	if _, err := rc.s.markStale(context.Background(), ino, stale.id); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		node *replicaNode
		off  int64
		n    int
	}{
		{"member of another position", rc.nodes["ds0"], unitOff(m, foreign, 0), 100},
		{"across into another position", rc.nodes["ds0"], unitOff(m, foreign, 0) - 10, 100},
		{"no member at all", outsider, 0, 100},
		{"stale member", stale, unitOff(m, sp, 1), 100},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.off < 0 {
				tc.off += int64(len(m.DataServers)) * replicaUnit
			}
			f, err := tc.node.rs.Open(ino, false)
			if errors.Is(err, pnfs.ErrNotMember) {
				// Holding no object of the file, it cannot even open it.
				if tc.node != outsider {
					t.Fatalf("Open on %s: %v", tc.node.id, err)
				}
			} else if err != nil {
				t.Fatal(err)
			} else {
				defer f.Close()
				if _, err := f.ReadAt(make([]byte, tc.n), tc.off); !errors.Is(err, pnfs.ErrNotMember) {
					t.Fatalf("ReadAt on %s = %v, want pnfs.ErrNotMember", tc.node.id, err)
				}
			}
			before := localBytes(t, tc.node, ino, tc.off, tc.n)
			if err := writeThrough(t, tc.node, ino, pattern(tc.n, 77), tc.off, false); !errors.Is(err, pnfs.ErrNotMember) {
				t.Fatalf("write on %s = %v, want pnfs.ErrNotMember", tc.node.id, err)
			}
			if !bytes.Equal(localBytes(t, tc.node, ino, tc.off, tc.n), before) {
				t.Fatal("a refused write changed the local object")
			}
			if tc.node == outsider {
				if _, err := outsider.st.Open(ino, false); !errors.Is(err, fs.ErrNotExist) {
					t.Fatalf("a refused write left an object on a non-member: %v", err)
				}
			}
			// A peer refuses a replica write it is no member for.
			var res ctlproto.CtlWriteRes
			cur := rc.mdsMap(ino)
			data := pattern(tc.n, 78)
			conn, err := rpc.Dial(context.Background(), "tcp", tc.node.addr, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if err := call(context.Background(), conn, ctlproto.CTLPROC_REPLICA_WRITE, &ctlproto.CtlReplicaWriteArgs{
				Mac: replicaWriteMAC(testDataKey, ino, cur.Gen, uint64(tc.off), uint64(len(data)), false),
				Ino: ino, Gen: cur.Gen, Offset: uint64(tc.off), Data: data}, &res); err != nil {
				t.Fatal(err)
			}
			if res.Status != ctlproto.CTL_ERR_NOTMEMBER {
				t.Fatalf("REPLICA_WRITE to %s = %v, want CTL_ERR_NOTMEMBER", tc.node.id, res.Status)
			}
		})
	}
	// The good members read their units.
	cur := rc.mdsMap(ino)
	for p := range cur.DataServers {
		node := rc.nodes[cur.Good(p)[0]]
		f, err := node.rs.Open(ino, false)
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, replicaUnit)
		if _, err := f.ReadAt(buf, unitOff(m, p, 0)); err != nil || !bytes.Equal(buf, pattern(replicaUnit, byte(p))) {
			t.Fatalf("member %s reading position %d: %v, data equal %v", node.id, p, err, bytes.Equal(buf, pattern(replicaUnit, byte(p))))
		}
		f.Close()
	}
}

// TestReplicaMapCache: the agent's cached map is dropped by MAP_CHANGED
// and by registering again, and the next write follows the new map.
func TestReplicaMapCache(t *testing.T) {
	cases := []struct {
		name   string
		change func(rc *replicaCluster, ino uint64, writer, peer *replicaNode)
	}{
		{"MAP_CHANGED", func(rc *replicaCluster, ino uint64, _, peer *replicaNode) {
			// The MDS marks the peer stale (replaceMap: MAP_CHANGED).
			if _, err := rc.s.markStale(context.Background(), ino, peer.id); err != nil {
				rc.t.Fatal(err)
			}
		}},
		{"registering again", func(rc *replicaCluster, ino uint64, writer, peer *replicaNode) {
			// The map changes while the writer is away from the MDS, so
			// its MAP_CHANGED is lost; the writer registers again.
			conn := agentConn(writer.a)
			regs := writer.a.Stats().Registrations
			cur := rc.mdsMap(ino)
			nm := cur.Clone()
			nm.Stale = append(nm.Stale, peer.id)
			conn.Close()
			if _, err := rc.s.maps.ReplaceStripeMap(context.Background(), meta.Ino(ino), cur.Gen, nm); err != nil {
				rc.t.Fatal(err)
			}
			rc.s.forget(ino)
			eventually(rc.t.(*testing.T), "the writer to register again", func() bool {
				return writer.a.Stats().Registrations > regs && agentConn(writer.a) != nil
			})
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rc := newReplicaCluster(t, 3, 2)
			ino, m := rc.place()
			p := m.Position(0)
			writer, peer := rc.nodes[m.DataServers[p]], rc.nodes[m.Replicas[p][0]]
			if err := writeThrough(t, writer, ino, pattern(1000, 1), 0, true); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(localBytes(t, peer, ino, 0, 1000), pattern(1000, 1)) {
				t.Fatal("the peer did not get the first write")
			}
			fetches := writer.a.Stats().MapFetches
			if err := writeThrough(t, writer, ino, pattern(1000, 2), 0, true); err != nil {
				t.Fatal(err)
			}
			if got := writer.a.Stats().MapFetches; got != fetches {
				t.Fatalf("a second write fetched the map again (%d MAP calls, was %d)", got, fetches)
			}
			tc.change(rc, ino, writer, peer)
			if err := writeThrough(t, writer, ino, pattern(1000, 3), 0, true); err != nil {
				t.Fatal(err)
			}
			if got := writer.a.Stats().MapFetches; got != fetches+1 {
				t.Fatalf("%d MAP calls after the change, want %d", got, fetches+1)
			}
			if !bytes.Equal(localBytes(t, peer, ino, 0, 1000), pattern(1000, 2)) {
				t.Fatal("the write after the change reached the stale peer")
			}
			if !bytes.Equal(localBytes(t, writer, ino, 0, 1000), pattern(1000, 3)) {
				t.Fatal("the writer does not hold its write")
			}
			if got := writer.a.Stats().ReplicaFailed; got != 0 {
				t.Fatalf("%d REPLICA_FAILED: the writer used the old map", got)
			}
		})
	}
}

// objectPath is where store.Local keeps ino under dir.
func objectPath(dir string, ino uint64) string {
	return filepath.Join(dir, "data", fmt.Sprintf("%02x", ino&0xff), strconv.FormatUint(ino, 10))
}

// flipByte inverts one byte of a file behind the store's back.
func flipByte(t *testing.T, path string, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0xff
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

// TestReplicaCorruptCopy: a block failing its checksum is pnfs.ErrNotMember to
// the data server's NFS server (the client goes through the MDS) and
// CTL_ERR_CORRUPT to the MDS (OBJ_READ, OBJ_SUM), never data.
func TestReplicaCorruptCopy(t *testing.T) {
	rc := newReplicaCluster(t, 3, 2)
	ino, m := rc.place()
	p := m.Position(0)
	node := rc.nodes[m.DataServers[p]]
	if err := writeThrough(t, node, ino, pattern(replicaUnit, 9), 0, true); err != nil {
		t.Fatal(err)
	}
	flipByte(t, objectPath(node.dir, ino), 100)
	f, err := node.rs.Open(ino, false)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	_, err = f.ReadAt(make([]byte, 1000), 0)
	if !errors.Is(err, pnfs.ErrNotMember) || !errors.Is(err, store.ErrCorrupt) {
		t.Fatalf("ReadAt of a corrupt block = %v, want pnfs.ErrNotMember and store.ErrCorrupt", err)
	}
	conn, err := rc.reg.conn(node.id)
	if err != nil {
		t.Fatal(err)
	}
	var rres ctlproto.CtlReadRes
	if err := call(context.Background(), conn, ctlproto.CTLPROC_OBJ_READ, &ctlproto.CtlReadArgs{Ino: ino, Count: 1000}, &rres); err != nil || rres.Status != ctlproto.CTL_ERR_CORRUPT {
		t.Fatalf("OBJ_READ of a corrupt block = %v, %v; want CTL_ERR_CORRUPT", rres.Status, err)
	}
	var sres ctlproto.CtlSumRes
	if err := call(context.Background(), conn, ctlproto.CTLPROC_OBJ_SUM, &ctlproto.CtlSumArgs{Ino: ino, Length: replicaUnit}, &sres); err != nil || sres.Status != ctlproto.CTL_ERR_CORRUPT {
		t.Fatalf("OBJ_SUM of a corrupt block = %v, %v; want CTL_ERR_CORRUPT", sres.Status, err)
	}
	// The other copy is fine.
	other := rc.nodes[m.Replicas[p][0]]
	g, err := other.rs.Open(ino, false)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	buf := make([]byte, replicaUnit)
	if _, err := g.ReadAt(buf, 0); err != nil || !bytes.Equal(buf, pattern(replicaUnit, 9)) {
		t.Fatalf("the good copy: %v", err)
	}
}

func TestObjSum(t *testing.T) {
	rc := newReplicaCluster(t, 1, 1)
	node := rc.nodes["ds0"]
	ino, _ := rc.place()
	data := pattern(3*replicaUnit+100, 4)
	if err := writeThrough(t, node, ino, data, 0, true); err != nil {
		t.Fatal(err)
	}
	size := uint64(len(data))
	zeros := func(n int) []byte { return make([]byte, n) }
	sum := func(parts ...[]byte) [32]byte { return sha256.Sum256(bytes.Join(parts, nil)) }
	cases := []struct {
		name     string
		ino      uint64
		off, n   uint64
		want     ctlproto.CtlStatus
		sum      [32]byte
		wantSize uint64
	}{
		{"first unit", ino, 0, replicaUnit, ctlproto.CTL_OK, sum(data[:replicaUnit]), size},
		{"unaligned middle", ino, 1000, 100000, ctlproto.CTL_OK, sum(data[1000:101000]), size},
		{"across the end", ino, size - 50, 1000, ctlproto.CTL_OK, sum(data[size-50:], zeros(950)), size},
		{"past the end", ino, 1 << 30, 4096, ctlproto.CTL_OK, sum(zeros(4096)), size},
		{"empty range", ino, 0, 0, ctlproto.CTL_OK, sum(), size},
		{"largest range", ino, 0, maxSum, ctlproto.CTL_OK, sum(data, zeros(maxSum-len(data))), size},
		{"no object", ino + 1000, 0, 4096, ctlproto.CTL_OK, sum(zeros(4096)), 0},
		{"range too long", ino, 0, maxSum + 1, ctlproto.CTL_ERR_INVAL, [32]byte{}, 0},
		{"range overflows", ino, 1<<64 - 10, 100, ctlproto.CTL_ERR_INVAL, [32]byte{}, 0},
		{"range past 2^63", ino, 1<<63 - 10, 100, ctlproto.CTL_ERR_INVAL, [32]byte{}, 0},
	}
	conn, err := rc.reg.conn(node.id)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var res ctlproto.CtlSumRes
			if err := call(context.Background(), conn, ctlproto.CTLPROC_OBJ_SUM,
				&ctlproto.CtlSumArgs{Ino: tc.ino, Offset: tc.off, Length: tc.n}, &res); err != nil {
				t.Fatal(err)
			}
			if res.Status != tc.want {
				t.Fatalf("status %v, want %v", res.Status, tc.want)
			}
			if tc.want == ctlproto.CTL_OK && (res.Ok.Sha256 != tc.sum || res.Ok.Size != tc.wantSize) {
				t.Fatalf("sum %x size %d, want %x size %d", res.Ok.Sha256, res.Ok.Size, tc.sum, tc.wantSize)
			}
		})
	}
}

// TestReplicaConcurrentWrites: clients writing different units of one
// file through different data servers at once, with commits in between.
func TestReplicaConcurrentWrites(t *testing.T) {
	rc := newReplicaCluster(t, 3, 2)
	ino, m := rc.place()
	const units = 12
	var wg sync.WaitGroup
	errs := make(chan error, units)
	for u := range units {
		wg.Go(func() {
			p := m.Position(uint64(u) * replicaUnit)
			node := rc.nodes[m.DataServers[p]]
			for round := range 3 {
				if err := writeThrough(t, node, ino, pattern(replicaUnit, byte(u*3+round)), int64(u)*replicaUnit, round%2 == 1); err != nil {
					errs <- fmt.Errorf("unit %d round %d: %w", u, round, err)
					return
				}
			}
			if err := node.rs.Sync(ino); err != nil {
				errs <- fmt.Errorf("unit %d sync: %w", u, err)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for u := range units {
		p := m.Position(uint64(u) * replicaUnit)
		for _, id := range m.Members(p) {
			if !bytes.Equal(localBytes(t, rc.nodes[id], ino, int64(u)*replicaUnit, replicaUnit), pattern(replicaUnit, byte(u*3+2))) {
				t.Errorf("unit %d: %s does not hold the last write", u, id)
			}
		}
	}
}

// FuzzPeerHandler feeds arbitrary arguments to the peer procedures: the
// handler decodes them with the generated XDR decoders and checks the MAC
// before anything else, and must never panic.
func FuzzPeerHandler(f *testing.F) {
	good := &ctlproto.CtlReplicaWriteArgs{Ino: 7, Gen: 1, Offset: 4096, Data: []byte("hello")}
	good.Mac = replicaWriteMAC(testDataKey, 7, 1, 4096, 5, false)
	f.Add(uint32(ctlproto.CTLPROC_REPLICA_WRITE), encodeXDR(good))
	commit := &ctlproto.CtlReplicaCommitArgs{Ino: 7, Gen: 1, Mac: replicaCommitMAC(testDataKey, 7, 1)}
	f.Add(uint32(ctlproto.CTLPROC_REPLICA_COMMIT), encodeXDR(commit))
	f.Add(uint32(ctlproto.CTLPROC_REPLICA_WRITE), []byte{})
	f.Add(uint32(ctlproto.CTLPROC_OBJ_WRITE), []byte{0, 0, 0, 1})
	st, err := store.NewLocal(f.TempDir(), store.LocalOptions{})
	if err != nil {
		f.Fatal(err)
	}
	defer st.Close()
	// A bare agent with the cluster's key and no MDS: a call with a good
	// MAC gets as far as asking for the map, which fails.
	a := newBareAgent(AgentConfig{ID: "ds0", Store: st})
	a.dataKey = testDataKey
	defer a.cancel()
	h := a.PeerHandler()
	f.Fuzz(func(t *testing.T, proc uint32, args []byte) {
		c := &rpc.Call{Prog: ctlproto.SHOAL_CONTROL, Vers: ctlproto.SHOAL_CONTROL_V1, Proc: proc, Args: args}
		h.ServeRPC(context.Background(), c, xdr.NewEncoder(64))
	})
}

// encodeXDR returns v's XDR encoding.
func encodeXDR(v xdr.Marshaler) []byte {
	e := xdr.NewEncoder(64)
	v.EncodeXDR(e)
	return e.Bytes()
}
