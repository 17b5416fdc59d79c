package rpc

import (
	"bytes"
	"errors"
	"io"
	"testing"

	"github.com/shoalfs/shoal/internal/xdr"
)

func FuzzRecordReader(f *testing.F) {
	rec := rawCall(1, 2, testProg, 1, 0, OpaqueAuth{}, OpaqueAuth{}, []byte("args"))
	f.Add(fragment(rec))
	f.Add(fragment(rec, 3, 0, 9))
	f.Add(append(fragment(rec), fragment(rec, 1)...))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{0x7f, 0xff, 0xff, 0xff, 0, 0})
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 0, 0x80, 0, 0, 0})
	f.Add(fragment(rec)[:10])
	const max = 4096
	f.Fuzz(func(t *testing.T, stream []byte) {
		rr := recordReader{r: bytes.NewReader(stream), max: max}
		total := 0
		for range len(stream)/4 + 2 { // every record consumes at least a mark
			r, rb, err := rr.next()
			if err != nil {
				if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, ErrRecordTooLarge) {
					t.Fatalf("unexpected error %v", err)
				}
				return
			}
			// A record never exceeds the limit nor the input it came
			// from, and its buffer was not over-allocated.
			total += len(r)
			if len(r) > max || total > len(stream) || cap(r) > 2*max {
				t.Fatalf("record of %d bytes (cap %d), %d total from %d input", len(r), cap(r), total, len(stream))
			}
			rb.release()
		}
		t.Fatal("reader did not terminate")
	})
}

func FuzzCallHeader(f *testing.F) {
	sys := AuthSysCred(AuthSysParams{Stamp: 7, Machine: "host", UID: 1, GID: 2, GIDs: []uint32{3, 4}})
	f.Add(rawCall(1, 2, testProg, 1, 0, OpaqueAuth{}, OpaqueAuth{}, nil))
	f.Add(rawCall(2, 2, 100003, 4, 1, sys, OpaqueAuth{}, []byte{0, 0, 0, 1}))
	f.Add(rawCall(3, 3, 100003, 4, 1, sys, OpaqueAuth{}, nil))
	f.Add(rawCall(4, 2, 100003, 4, 1, OpaqueAuth{Flavor: 6, Body: []byte{1}}, OpaqueAuth{}, nil))
	f.Add(rawCall(5, 2, 100003, 4, 1, OpaqueAuth{Flavor: AuthSys, Body: authSysRaw(17)}, OpaqueAuth{}, nil))
	f.Add(rawCall(6, 2, 100003, 4, 1, OpaqueAuth{Flavor: AuthSys, Body: make([]byte, 401)}, OpaqueAuth{}, nil))
	f.Add([]byte{0, 0, 0, 1})
	f.Add([]byte{0, 0})
	f.Fuzz(func(t *testing.T, rec []byte) {
		call, err := parseCall(rec)
		if err != nil {
			var ce *callError
			if !errors.As(err, &ce) {
				t.Fatalf("error %v is not a *callError", err)
			}
			if ce.Fault == faultDrop {
				if len(rec) >= 4 {
					t.Fatalf("dropped a record with an xid: %v", err)
				}
				return
			}
			// The fault reply must parse back as a failure for the
			// same xid.
			e := xdr.NewEncoder(64)
			encodeFault(e, ce)
			_, rerr := parseReply(e.Bytes()[4:])
			var ae *AcceptError
			var re *RejectError
			switch {
			case errors.As(rerr, &ae):
				if ae.XID != ce.XID || ae.Stat != GarbageArgs {
					t.Fatalf("fault reply %+v for %v", ae, err)
				}
			case errors.As(rerr, &re):
				if re.XID != ce.XID {
					t.Fatalf("fault reply %+v for %v", re, err)
				}
			default:
				t.Fatalf("fault reply parsed as %v", rerr)
			}
			return
		}
		// A successful parse survives a round trip through the encoder
		// (pad bytes, which the decoder does not check, aside).
		if call.Verf.Flavor != AuthNone {
			t.Fatalf("accepted verifier flavor %d", call.Verf.Flavor)
		}
		if call.Cred.Flavor != AuthNone && call.Cred.Flavor != AuthSys {
			t.Fatalf("accepted credential flavor %d", call.Cred.Flavor)
		}
		if (call.Cred.Flavor == AuthSys) != (call.Sys != nil) {
			t.Fatalf("Sys = %v for flavor %d", call.Sys, call.Cred.Flavor)
		}
		if call.Sys != nil && (len(call.Sys.GIDs) > maxGIDs || len(call.Sys.Machine) > maxMachine) {
			t.Fatalf("AUTH_SYS bounds not enforced: %+v", call.Sys)
		}
		if !bytes.HasSuffix(rec, call.Args) {
			t.Fatal("Args is not the tail of the record")
		}
		e := xdr.NewEncoder(64)
		encodeCallHeader(e, call.XID, call.Prog, call.Vers, call.Proc, call.Cred)
		e.Append(call.Args)
		again, err := parseCall(e.Bytes()[4:])
		if err != nil {
			t.Fatalf("re-encoded call does not parse: %v", err)
		}
		if again.XID != call.XID || again.Prog != call.Prog || again.Vers != call.Vers || again.Proc != call.Proc ||
			!bytes.Equal(again.Args, call.Args) || !bytes.Equal(again.Cred.Body, call.Cred.Body) {
			t.Fatalf("round trip mismatch: %+v vs %+v", again, call)
		}
		if call.Sys != nil {
			var p AuthSysParams
			if err := xdr.Unmarshal(xdr.Marshal(call.Sys), &p); err != nil || p.Machine != call.Sys.Machine ||
				p.UID != call.Sys.UID || p.GID != call.Sys.GID || p.Stamp != call.Sys.Stamp || len(p.GIDs) != len(call.Sys.GIDs) {
				t.Fatalf("AUTH_SYS round trip: %+v vs %+v (%v)", p, call.Sys, err)
			}
		}
	})
}
