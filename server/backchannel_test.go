package server

import (
	"bytes"
	"testing"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/server/internal/state"
)

// TestCallbacks drives the backchannel: CB_NULL after CREATE_SESSION, then
// CB_COMPOUNDs with CB_SEQUENCE + CB_RECALL and CB_LAYOUTRECALL, checking
// what the client received and that CB_SEQUENCE ids advance.
func TestCallbacks(t *testing.T) {
	for _, minor := range []uint32{1, 2} {
		t.Run(map[uint32]string{1: "v4.1", 2: "v4.2"}[minor], func(t *testing.T) {
			ts := startServer(t, Config{})
			c := ts.dial()
			c.Minor = minor
			ctx := testCtx(t)
			if _, err := c.ExchangeID(ctx, []byte("cb-owner"), nfs4.Verifier4{7}); err != nil {
				t.Fatal(err)
			}
			if _, err := c.CreateSession(ctx, true); err != nil {
				t.Fatal(err)
			}
			if err := c.WaitCallback(ctx, nfs4.CB_NULL); err != nil {
				t.Fatalf("no CB_NULL after CREATE_SESSION: %v", err)
			}
			id := state.SessionID(c.SessionID)
			fh := ts.srv.fh.encode(ts.srv.rootFH())
			sid := nfs4.Stateid4{Seqid: 3, Other: [12]byte{1, 2, 3}}
			for round := uint32(1); round <= 2; round++ {
				st, err := ts.srv.recall(ctx, id, sid, fh, round == 2)
				if err != nil || st != nfs4.NFS4_OK {
					t.Fatalf("round %d: recall = %v, %v", round, st, err)
				}
				got := c.CBCompounds()
				if len(got) != int(round) {
					t.Fatalf("round %d: client saw %d CB_COMPOUNDs", round, len(got))
				}
				cb := got[round-1]
				if cb.Minorversion != minor || len(cb.Argarray) != 2 {
					t.Fatalf("CB_COMPOUND minor %d with %d ops, want minor %d with 2", cb.Minorversion, len(cb.Argarray), minor)
				}
				seq, rec := cb.Argarray[0].Opcbsequence, cb.Argarray[1].Opcbrecall
				if seq == nil || rec == nil {
					t.Fatalf("ops %v, %v: want CB_SEQUENCE, CB_RECALL", cb.Argarray[0].Argop, cb.Argarray[1].Argop)
				}
				if seq.CsaSessionid != c.SessionID || seq.CsaSequenceid != round {
					t.Errorf("CB_SEQUENCE session %x seqid %d, want %x seqid %d", seq.CsaSessionid, seq.CsaSequenceid, c.SessionID, round)
				}
				if !bytes.Equal(rec.Fh, fh) || rec.Stateid != sid || rec.Truncate != (round == 2) {
					t.Errorf("CB_RECALL %+v does not carry the recalled file and stateid", rec)
				}
			}
		})
	}
}
