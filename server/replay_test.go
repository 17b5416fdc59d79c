package server

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/wiretest"
	"github.com/shoalfs/shoal/meta"
	"github.com/shoalfs/shoal/meta/etcdtest"
)

// replayOp is a non-idempotent namespace request and what a second
// execution of it answers.
type replayOp struct {
	name string
	// setup prepares what the request needs, through c.
	setup func(t *testing.T, c *wiretest.Client)
	// req is the request as client c sends it.
	req func(c *wiretest.Client) []nfs4.NfsArgop4
	// again is the status of the request executed a second time.
	again nfs4.Nfsstat4
	// check, if set, checks the result of a request answered from a
	// record against the original's.
	check func(t *testing.T, orig, replayed *nfs4.COMPOUND4res)
}

func replayOps() []replayOp {
	sameFH := func(t *testing.T, orig, replayed *nfs4.COMPOUND4res) {
		t.Helper()
		if a, b := fhOf(t, orig), fhOf(t, replayed); !bytes.Equal(a, b) {
			t.Errorf("replayed reply names another object: %x, original %x", b, a)
		}
	}
	var fifo []byte
	return []replayOp{
		{name: "RENAME",
			setup: func(t *testing.T, c *wiretest.Client) { must(t)(c.Compound(opPutRoot(), opMkdir("tmp44"))) },
			req: func(*wiretest.Client) []nfs4.NfsArgop4 {
				return []nfs4.NfsArgop4{opPutRoot(), opSaveFH(), opPutRoot(), opRename("tmp44", "f44")}
			},
			again: nfs4.NFS4ERR_NOENT},
		{name: "REMOVE",
			setup: func(t *testing.T, c *wiretest.Client) { must(t)(c.Compound(opPutRoot(), opMkdir("gone"))) },
			req:   func(*wiretest.Client) []nfs4.NfsArgop4 { return []nfs4.NfsArgop4{opPutRoot(), opRemove("gone")} },
			again: nfs4.NFS4ERR_NOENT},
		{name: "CREATE",
			setup: func(*testing.T, *wiretest.Client) {},
			req: func(*wiretest.Client) []nfs4.NfsArgop4 {
				return []nfs4.NfsArgop4{opPutRoot(), opMkdir("new"), opGetFH()}
			},
			again: nfs4.NFS4ERR_EXIST, check: sameFH},
		{name: "LINK",
			setup: func(t *testing.T, c *wiretest.Client) {
				fifo = fhOf(t, must(t)(c.Compound(opPutRoot(), opCreate("fifo", nfs4.Createtype4{Type: nfs4.NF4FIFO}, nfs4.Fattr4{}), opGetFH())))
			},
			req: func(*wiretest.Client) []nfs4.NfsArgop4 {
				return []nfs4.NfsArgop4{opPutFH(fifo), opSaveFH(), opPutRoot(), opLink("hard")}
			},
			again: nfs4.NFS4ERR_EXIST},
		{name: "OPEN_GUARDED",
			setup: func(*testing.T, *wiretest.Client) {},
			req: func(c *wiretest.Client) []nfs4.NfsArgop4 {
				return []nfs4.NfsArgop4{opPutRoot(), opOpen(c.ClientID, openArgs{name: "guarded", owner: "o",
					access: nfs4.OPEN4_SHARE_ACCESS_BOTH, create: true, mode: nfs4.GUARDED4}), opGetFH()}
			},
			again: nfs4.NFS4ERR_EXIST, check: sameFH},
	}
}

// TestReplayAfterRestart: a namespace change carried out by one server
// instance whose reply the client never had (the instance stopped before
// the client's next request on the slot) is sent again by the same client
// owner after its recovery with the next instance, a real restart on the
// same database: it is answered success from the replay record, once.
// Everything that makes the request a new one gets the real answer: a
// different client owner, the same owner after the window, a reply that
// was confirmed (the slot was used again) before the restart, and a
// second copy in the same instance.
func TestReplayAfterRestart(t *testing.T) {
	runReplayScenarios(t, func(*testing.T) Config { return Config{Lease: 30 * time.Second} })
}

// TestReplayAfterRestartEtcd is TestReplayAfterRestart with the metadata
// in a real etcd: each restart is a new server on the same prefix, as an
// MDS takeover is.
func TestReplayAfterRestartEtcd(t *testing.T) {
	etcd := etcdtest.Start(t, 1, etcdtest.Options{NoFsync: true})
	n := 0
	runReplayScenarios(t, func(*testing.T) Config {
		n++
		return Config{Lease: 30 * time.Second, MetaURL: fmt.Sprintf("etcd://%s/replay%d", etcd.Endpoints[0], n)}
	})
}

// runReplayScenarios runs TestReplayAfterRestart's cases on servers
// configured by config (called once per case).
func runReplayScenarios(t *testing.T, config func(*testing.T) Config) {
	const owner = "replay-owner"
	scenarios := []struct {
		name string
		// beforeRestart runs after the request, on the same client.
		beforeRestart func(t *testing.T, c *wiretest.Client)
		noRestart     bool
		// window, if set, replaces the new instance's window.
		window time.Duration
		// stranger sends the request from another client owner first.
		stranger bool
		// answered: the resent request is answered from the record;
		// otherwise it gets the status of a second execution.
		answered bool
		// reclaiming: the client resends before its RECLAIM_COMPLETE.
		reclaiming bool
	}{
		{name: "Resent", answered: true},
		{name: "BeforeReclaimComplete", reclaiming: true, answered: true},
		{name: "OtherOwner", stranger: true, answered: true},
		{name: "OutsideWindow", window: time.Nanosecond},
		{name: "Confirmed", beforeRestart: func(t *testing.T, c *wiretest.Client) {
			must(t)(c.Compound(opPutRoot()))
		}},
		{name: "ConfirmedPiggybacked", beforeRestart: func(t *testing.T, c *wiretest.Client) {
			must(t)(c.Compound(opPutRoot()))
			must(t)(c.Compound(opPutRoot(), opMkdir("other")))
		}},
		{name: "SameInstance", noRestart: true},
	}
	for _, op := range replayOps() {
		for _, sc := range scenarios {
			t.Run(op.name+"/"+sc.name, func(t *testing.T) {
				if sc.reclaiming && op.name == "OPEN_GUARDED" {
					t.Skip("a new OPEN before RECLAIM_COMPLETE is refused (NFS4ERR_GRACE)")
				}
				ts := startServer(t, config(t))
				ctx := testCtx(t)
				c := ts.clientOwner(owner)
				op.setup(t, c)
				orig := must(t)(c.Compound(op.req(c)...))
				if sc.beforeRestart != nil {
					sc.beforeRestart(t, c)
				}
				if !sc.noRestart {
					ts.restart()
					if sc.window != 0 {
						ts.srv.replays.window.Store(int64(sc.window))
					}
					// The client recovers: a new client ID and session
					// under its owner, then RECLAIM_COMPLETE (nothing to
					// reclaim), which also ends the grace period.
					setup := wiretest.Setup
					if sc.reclaiming {
						setup = wiretest.SetupReclaiming
					}
					var err error
					if c, err = setup(ctx, ts.addr, []byte(owner)); err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { c.Close() })
				}
				if sc.stranger {
					s := ts.client()
					want(t, op.again)(s.Compound(op.req(s)...))
				}
				wantSt := op.again
				if sc.answered {
					wantSt = nfs4.NFS4_OK
				}
				res := want(t, wantSt)(c.Compound(op.req(c)...))
				answered := ts.srv.Stats().ReplaysAnswered
				if wantSt != nfs4.NFS4_OK {
					if answered != 0 {
						t.Errorf("%d requests answered from records", answered)
					}
					return
				}
				if answered != 1 {
					t.Errorf("ReplaysAnswered = %d, want 1", answered)
				}
				if op.check != nil {
					op.check(t, orig, res)
				}
				// The record is consumed: a third copy is a new request.
				want(t, op.again)(c.Compound(op.req(c)...))
			})
		}
	}
}

// TestReplayRecordsRetired: the records of requests whose replies the
// client confirmed by using the slot again are deleted, while the
// record of a slot's last request stays; a clean stop deletes the
// retired ones it still held.
func TestReplayRecordsRetired(t *testing.T) {
	ts := startServer(t, Config{Lease: 30 * time.Second})
	c := ts.client()
	for _, name := range []string{"a", "b", "c"} {
		must(t)(c.Compound(opPutRoot(), opMkdir(name)))
	}
	ts.stop()
	// Reopen the database alone and look.
	cfg := ts.cfg
	cfg.Exports = cloneExports(ts.cfg.Exports)
	m, err := openMeta(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	recs, err := m.ListReplays(context.Background(), nil, 100)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 || recs[0].Op != uint32(nfs4.OP_CREATE) {
		t.Fatalf("records after three CREATEs on one slot: %+v, want only the last", recs)
	}
	nd, err := m.Lookup(context.Background(), meta.RootIno, "c")
	if err != nil || nd.Ino != recs[0].Ino {
		t.Fatalf("the record names inode %d, \"c\" is %d (%v)", recs[0].Ino, nd.Ino, err)
	}
}

// BenchmarkNamespaceChange measures a CREATE (mkdir) and a REMOVE of it
// through the server, serially over loopback, each its own COMPOUND: with
// the server's own metadata engine (bbolt behind its write-ahead log,
// synced), and the same without syncing, where the CPU cost of the
// change shows. Run it on a checkout without replay records to compare.
func BenchmarkNamespaceChange(b *testing.B) {
	for _, sync := range []bool{true, false} {
		b.Run(fmt.Sprintf("sync=%v", sync), func(b *testing.B) {
			cfg := Config{Dir: b.TempDir()}
			if !sync {
				m, err := meta.OpenBolt(filepath.Join(cfg.Dir, "meta.db"), meta.BoltOptions{WAL: true, GroupCommit: true, NoSync: true})
				if err != nil {
					b.Fatal(err)
				}
				cfg.Meta = m
			}
			ts := startServer(b, cfg)
			c, err := wiretest.Setup(testCtx(b), ts.addr, []byte("bench"))
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			root := nfs4.NfsArgop4{Argop: nfs4.OP_PUTROOTFH}
			i := 0
			for b.Loop() {
				i++
				name := []byte("d" + strconv.Itoa(i))
				for _, op := range []nfs4.NfsArgop4{
					{Argop: nfs4.OP_CREATE, Opcreate: &nfs4.CREATE4args{Objtype: nfs4.Createtype4{Type: nfs4.NF4DIR}, Objname: name}},
					{Argop: nfs4.OP_REMOVE, Opremove: &nfs4.REMOVE4args{Target: name}},
				} {
					res, err := c.Compound(root, op)
					if err == nil {
						err = wiretest.Check(res)
					}
					if err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}

// TestReplayRecordsRetiredAtQuiesce: a leader stepping down drops the
// requests that arrive while it quiesces, but one that is the next on its
// slot proves the reply of the slot's previous request arrived, and
// Quiesce deletes the records so retired before the hand-over: the next
// leader must not answer a new request identical to an old one from them.
func TestReplayRecordsRetiredAtQuiesce(t *testing.T) {
	ts := startServer(t, Config{Lease: 30 * time.Second})
	ctx := testCtx(t)
	c := ts.client()
	for _, name := range []string{"a", "b", "c"} {
		must(t)(c.Compound(opPutRoot(), opMkdir(name)))
	}
	records := func() int {
		t.Helper()
		recs, err := ts.srv.meta.ListReplays(ctx, nil, 100)
		if err != nil {
			t.Fatal(err)
		}
		return len(recs)
	}
	if n := records(); n < 1 {
		t.Fatalf("%d replay records after three CREATEs, want the last one's at least", n)
	}
	ts.srv.quiescing.Store(true)
	lctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err := c.CompoundCtx(lctx, opPutRoot(), opLookup("c"))
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a COMPOUND sent while quiescing: %v, want no answer", err)
	}
	if err := ts.srv.Quiesce(ctx); err != nil {
		t.Fatal(err)
	}
	if n := records(); n != 0 {
		t.Fatalf("%d replay records after the slot's next request and Quiesce, want 0", n)
	}
}
