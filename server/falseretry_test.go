package server

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/wiretest"
)

// TestSequenceFalseRetry sends a request, then another on the same slot and
// sequence id over the real server: an identical retransmission is answered
// from the reply cache, a different request (RFC 8881 §2.10.6.1.3.1, "false
// retry") with NFS4ERR_SEQ_FALSE_RETRY and is not executed.
func TestSequenceFalseRetry(t *testing.T) {
	ts := startServer(t, Config{})
	c := ts.client()
	ctx := testCtx(t)

	// A pattern whose first, middle and last bytes differ from each other.
	payload := make([]byte, 64<<10)
	for i := range payload {
		payload[i] = byte(i*31 + i>>8)
	}
	other := bytes.Clone(payload)
	other[0] ^= 0xff

	// fileEnv is a file of its own for each case.
	type fileEnv struct {
		name string
		fh   []byte
		sid  nfs4.Stateid4
	}
	sizeOf := func(t *testing.T, e fileEnv) uint64 {
		t.Helper()
		res := must(t)(c.Compound(opPutFH(e.fh), opGetattr(nfs4.FATTR4_SIZE)))
		return attrsOf(t, res)[nfs4.FATTR4_SIZE].(uint64)
	}
	tests := []struct {
		name  string
		first func(e fileEnv) []nfs4.NfsArgop4
		retry func(e fileEnv) []nfs4.NfsArgop4 // nil: same as first
		tag   string                           // of the retry
		// retrySeq rewrites the retry's SEQUENCE (as a client that
		// re-encodes a retransmission might).
		retrySeq func(a *nfs4.SEQUENCE4args)
		replay   bool
		check    func(t *testing.T, e fileEnv) // state after the retry
	}{
		{
			name:   "identical LOOKUP",
			first:  func(e fileEnv) []nfs4.NfsArgop4 { return opsOf(opPutRoot(), opLookup(e.name), opGetFH()) },
			replay: true,
		},
		{
			name:  "different op list",
			first: func(e fileEnv) []nfs4.NfsArgop4 { return opsOf(opPutRoot(), opLookup(e.name), opGetFH()) },
			retry: func(e fileEnv) []nfs4.NfsArgop4 {
				return opsOf(opPutRoot(), opLookup(e.name), opGetattr(nfs4.FATTR4_SIZE))
			},
		},
		{
			name:  "different LOOKUP name",
			first: func(e fileEnv) []nfs4.NfsArgop4 { return opsOf(opPutRoot(), opLookup(e.name), opGetFH()) },
			retry: func(e fileEnv) []nfs4.NfsArgop4 { return opsOf(opPutRoot(), opLookup(e.name+"x"), opGetFH()) },
		},
		{
			name:  "different tag",
			first: func(e fileEnv) []nfs4.NfsArgop4 { return opsOf(opPutRoot(), opLookup(e.name), opGetFH()) },
			tag:   "another",
		},
		{
			name:  "different CREATE name is not executed",
			first: func(e fileEnv) []nfs4.NfsArgop4 { return opsOf(opPutRoot(), opMkdir(e.name+".d1")) },
			retry: func(e fileEnv) []nfs4.NfsArgop4 { return opsOf(opPutRoot(), opMkdir(e.name+".d2")) },
			check: func(t *testing.T, e fileEnv) {
				want(t, nfs4.NFS4ERR_NOENT)(c.Compound(opPutRoot(), opLookup(e.name+".d2")))
			},
		},
		{
			// GETATTR(change) after the WRITE: a re-execution would show a
			// new change attribute, so equal reply bytes mean a replay.
			name: "identical WRITE",
			first: func(e fileEnv) []nfs4.NfsArgop4 {
				return opsOf(opPutFH(e.fh), opWrite(e.sid, 0, nfs4.UNSTABLE4, payload), opGetattr(nfs4.FATTR4_CHANGE))
			},
			replay: true,
		},
		{
			name: "WRITE with different offset",
			first: func(e fileEnv) []nfs4.NfsArgop4 {
				return opsOf(opPutFH(e.fh), opWrite(e.sid, 0, nfs4.UNSTABLE4, payload))
			},
			retry: func(e fileEnv) []nfs4.NfsArgop4 {
				return opsOf(opPutFH(e.fh), opWrite(e.sid, 1<<20, nfs4.UNSTABLE4, payload))
			},
			check: func(t *testing.T, e fileEnv) {
				if got := sizeOf(t, e); got != uint64(len(payload)) {
					t.Errorf("size %d after the false retry, want %d: the retry was executed", got, len(payload))
				}
			},
		},
		{
			name: "WRITE with different data",
			first: func(e fileEnv) []nfs4.NfsArgop4 {
				return opsOf(opPutFH(e.fh), opWrite(e.sid, 0, nfs4.UNSTABLE4, payload))
			},
			retry: func(e fileEnv) []nfs4.NfsArgop4 {
				return opsOf(opPutFH(e.fh), opWrite(e.sid, 0, nfs4.UNSTABLE4, other))
			},
			check: func(t *testing.T, e fileEnv) {
				res := must(t)(c.Compound(opPutFH(e.fh), opRead(e.sid, 0, 16)))
				if got := find(t, res, nfs4.OP_READ).Opread.Resok4.Data; !bytes.Equal(got, payload[:16]) {
					t.Errorf("data %x after the false retry, want %x", got, payload[:16])
				}
			},
		},
		{
			// sa_highest_slotid and sa_cachethis are not part of the
			// request's identity: a client may re-encode them.
			name:     "re-encoded SEQUENCE",
			first:    func(e fileEnv) []nfs4.NfsArgop4 { return opsOf(opPutRoot(), opLookup(e.name), opGetFH()) },
			retrySeq: func(a *nfs4.SEQUENCE4args) { a.SaHighestSlotid, a.SaCachethis = 3, false },
			replay:   true,
		},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var e fileEnv
			e.name = fmt.Sprintf("f%d", i)
			e.sid, e.fh = openFile(t, c, e.name, nfs4.OPEN4_SHARE_ACCESS_BOTH, 0, "o")

			first := tc.first(e)
			res, raw, seq, err := c.CompoundRaw(ctx, first...)
			must(t)(res, err)

			retry := first
			if tc.retry != nil {
				retry = tc.retry(e)
			}
			sq := wiretest.Seq(c.SessionID, 0, seq, true)
			if tc.retrySeq != nil {
				tc.retrySeq(sq.Opsequence)
			}
			args := &nfs4.COMPOUND4args{Tag: []byte(tc.tag), Minorversion: c.Minor, Argarray: append(opsOf(sq), retry...)}
			res2, raw2, err := c.Send(ctx, args)
			if err != nil {
				t.Fatal(err)
			}
			if tc.replay {
				if !bytes.Equal(raw, raw2) {
					t.Errorf("retransmission not answered from the reply cache:\n%s\n%s", summary(res), summary(res2))
				}
			} else {
				want(t, nfs4.NFS4ERR_SEQ_FALSE_RETRY)(res2, nil)
				if len(res2.Resarray) != 1 {
					t.Errorf("false retry answered with %s, want SEQUENCE alone", summary(res2))
				}
			}
			if tc.check != nil {
				tc.check(t, e)
			}
			// The slot moves on normally.
			must(t)(c.Compound(opPutRoot()))
		})
	}
}

func opsOf(o ...nfs4.NfsArgop4) []nfs4.NfsArgop4 { return o }
