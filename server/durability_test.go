package server

import (
	"fmt"
	"testing"
	"time"

	"github.com/shoalfs/shoal/internal/nfs4"
)

// TestCompoundDurability checks the one-sync-per-COMPOUND rule
// (durability.go) on a real server and its bbolt engine: a COMPOUND that
// makes several metadata changes (OPEN with create, the write attributes
// a SETATTR persists, the SETATTR itself, CLOSE) costs one fdatasync of
// the metadata log, paid before the reply, on a sync export; on an async
// export it costs none before the reply, unless an operation promised
// stable storage (COMMIT, a FILE_SYNC WRITE). The commit interval is an
// hour, so the engine's timer never syncs during the test: every
// fdatasync counted is one a reply waited for.
func TestCompoundDurability(t *testing.T) {
	yes, no := true, false
	for _, tc := range []struct {
		name  string
		async bool  // the server's mode
		sync  *bool // the export's sync key
		// stable adds what promises stable storage: "commit" or
		// "file_sync" (the WRITE's stability).
		stable    string
		wantSyncs uint64
	}{
		{name: "sync server", wantSyncs: 1},
		{name: "sync server, async export", sync: &no, wantSyncs: 0},
		{name: "async server", async: true, wantSyncs: 0},
		{name: "async server, sync export", async: true, sync: &yes, wantSyncs: 1},
		{name: "async server, COMMIT", async: true, stable: "commit", wantSyncs: 1},
		{name: "async server, FILE_SYNC WRITE", async: true, stable: "file_sync", wantSyncs: 1},
		{name: "sync server, COMMIT", stable: "commit", wantSyncs: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := startServer(t, Config{
				Async: tc.async, CommitInterval: time.Hour,
				Exports: []*Export{{Path: "/", RootSquash: &noSquash, Sync: tc.sync}},
			})
			c := ts.client()
			// Warm up: the first changes of a fresh log file are synced
			// on their own (meta's walKV), and the client's record is.
			must(t)(c.Compound(opPutRoot(), opMkdir("warm")))

			for i := range 3 {
				before := ts.srv.Stats()
				current := nfs4.Stateid4{Seqid: 1} // RFC 8881 §16.2.3.1.2
				stable := nfs4.UNSTABLE4
				if tc.stable == "file_sync" {
					stable = nfs4.FILE_SYNC4
				}
				ops := []nfs4.NfsArgop4{
					opPutRoot(),
					opOpen(c.ClientID, openArgs{name: fmt.Sprintf("f%d", i), owner: "o", access: nfs4.OPEN4_SHARE_ACCESS_BOTH, create: true, mode: nfs4.UNCHECKED4}),
					opWrite(current, 0, stable, []byte("small file")),
					opSetattr(current, fattr(aMtime(time.Unix(1_700_000_000, 0)))),
				}
				if tc.stable == "commit" {
					ops = append(ops, opCommit())
				}
				ops = append(ops, opClose(current))
				must(t)(c.Compound(ops...))
				after := ts.srv.Stats()
				appends := after.Log.Appends - before.Log.Appends
				syncs := after.Log.Syncs - before.Log.Syncs
				if appends < 2 {
					t.Fatalf("the COMPOUND wrote %d log records: it must make several changes for the test to mean anything", appends)
				}
				if syncs != tc.wantSyncs {
					t.Fatalf("COMPOUND %d: %d fdatasyncs for %d log records, want %d", i, syncs, appends, tc.wantSyncs)
				}
				// What the reply said is durable when the client has it.
				if tc.wantSyncs > 0 && after.Log.Pending != 0 {
					t.Fatalf("reply received with %d log records not durable", after.Log.Pending)
				}
				if tc.wantSyncs == 0 && after.Log.Pending == 0 {
					t.Fatalf("async reply, yet nothing pending: %+v", after.Log)
				}
			}
		})
	}
}

// TestTruncateDurableOnAsync: on an async export, a SETATTR that cuts a
// file's data off is still answered only once its size is durable (the
// data goes first; a lost size would leave the old size over bytes that
// are gone), while one that grows the file is answered early.
func TestTruncateDurableOnAsync(t *testing.T) {
	ts := startServer(t, Config{Async: true, CommitInterval: time.Hour})
	c := ts.client()
	current := nfs4.Stateid4{Seqid: 1}
	res := must(t)(c.Compound(opPutRoot(),
		opOpen(c.ClientID, openArgs{name: "f", owner: "o", access: nfs4.OPEN4_SHARE_ACCESS_BOTH, create: true, mode: nfs4.UNCHECKED4}),
		opWrite(current, 0, nfs4.FILE_SYNC4, make([]byte, 8192)), opGetFH()))
	fh := find(t, res, nfs4.OP_GETFH).Opgetfh.Resok4.Object
	sid := find(t, res, nfs4.OP_OPEN).Opopen.Resok4.Stateid
	for _, tc := range []struct {
		name      string
		size      uint64
		wantSyncs uint64
	}{
		{"grow", 16384, 0},
		{"cut", 100, 1},
		{"grow again", 200, 0},
	} {
		before := ts.srv.Stats()
		must(t)(c.Compound(opPutFH(fh), opSetattr(sid, fattr(aSize(tc.size)))))
		if got := ts.srv.Stats().Log.Syncs - before.Log.Syncs; got != tc.wantSyncs {
			t.Fatalf("%s to %d: %d fdatasyncs before the reply, want %d", tc.name, tc.size, got, tc.wantSyncs)
		}
	}
}

// TestMixedExportsDurability: a COMPOUND is answered early only if every
// export it touches is async; one that also touches a sync export waits.
func TestMixedExportsDurability(t *testing.T) {
	no := false
	ts := startServer(t, Config{CommitInterval: time.Hour, Exports: []*Export{
		{Path: "/a", RootSquash: &noSquash, Sync: &no},
		{Path: "/b", RootSquash: &noSquash},
	}})
	c := ts.client()
	must(t)(c.Compound(opPutRoot(), opLookup("b"), opMkdir("warm")))
	for _, tc := range []struct {
		name      string
		ops       []nfs4.NfsArgop4
		wantSyncs uint64
	}{
		{"async export only", []nfs4.NfsArgop4{opPutRoot(), opLookup("a"), opMkdir("x")}, 0},
		{"sync export", []nfs4.NfsArgop4{opPutRoot(), opLookup("b"), opMkdir("y")}, 1},
		{"both", []nfs4.NfsArgop4{opPutRoot(), opLookup("a"), opMkdir("z"), opPutRoot(), opLookup("b"), opGetattr(nfs4.FATTR4_TYPE)}, 1},
	} {
		before := ts.srv.Stats()
		must(t)(c.Compound(tc.ops...))
		if got := ts.srv.Stats().Log.Syncs - before.Log.Syncs; got != tc.wantSyncs {
			t.Fatalf("%s: %d fdatasyncs before the reply, want %d", tc.name, got, tc.wantSyncs)
		}
	}
}
