package server

import (
	"fmt"
	"slices"
	"testing"

	"github.com/shoalfs/shoal/internal/nfs4"
)

// TestDSOpTable pins the data server's operations to RFC 8881 §13.6. A
// client sends a data server only the "data-server housekeeping
// operations" (BACKCHANNEL_CTL, BIND_CONN_TO_SESSION, CREATE_SESSION,
// DESTROY_CLIENTID, DESTROY_SESSION, EXCHANGE_ID, SECINFO_NO_NAME,
// SET_SSV, SEQUENCE) and the "data-server I/O operations" (COMMIT, READ,
// WRITE, PUTFH); a server that is only a data server answers anything
// else NFS4ERR_NOTSUPP. Shoal's data server also answers RECLAIM_COMPLETE
// and READ_PLUS, which clients send it (optable.go says why), and, like
// the MDS, implements no SET_SSV. The list is written out here, not
// taken from dsOps; every operation number goes over the wire to a real
// data server, in both minor versions.
func TestDSOpTable(t *testing.T) {
	rfc := []nfs4.NfsOpnum4{
		nfs4.OP_BACKCHANNEL_CTL, nfs4.OP_BIND_CONN_TO_SESSION, nfs4.OP_CREATE_SESSION,
		nfs4.OP_DESTROY_CLIENTID, nfs4.OP_DESTROY_SESSION, nfs4.OP_EXCHANGE_ID,
		nfs4.OP_SECINFO_NO_NAME, nfs4.OP_SET_SSV, nfs4.OP_SEQUENCE,
		nfs4.OP_COMMIT, nfs4.OP_READ, nfs4.OP_WRITE, nfs4.OP_PUTFH,
	}
	beyond := []nfs4.NfsOpnum4{nfs4.OP_RECLAIM_COMPLETE, nfs4.OP_READ_PLUS}
	unimplemented := []nfs4.NfsOpnum4{nfs4.OP_SET_SSV}
	serves := func(op nfs4.NfsOpnum4) bool {
		return (slices.Contains(rfc, op) || slices.Contains(beyond, op)) && !slices.Contains(unimplemented, op)
	}

	// The table: exactly those operations have handlers (SEQUENCE is
	// the dispatcher's), and each keeps the session rule it has on the
	// MDS.
	for op := nfs4.OP_ACCESS; op <= nfs4.OP_REMOVEXATTR; op++ {
		d, declared := dsOps[op]
		has := d.run != nil || d.session == sequenceOp
		if has != serves(op) {
			t.Errorf("dsOps: %v served %v, want %v", op, has, serves(op))
		}
		if declared && d.session != mdsOps[op].session {
			t.Errorf("dsOps: %v session rule %d, %d on the MDS", op, d.session, mdsOps[op].session)
		}
	}

	// The wire: each operation number after SEQUENCE, with zero-valued
	// arguments where those decode (the dispatcher decodes before it
	// refuses: NFS4ERR_BADXDR would hide the verdict).
	args := map[nfs4.NfsOpnum4]nfs4.NfsArgop4{
		nfs4.OP_WANT_DELEGATION: {Argop: nfs4.OP_WANT_DELEGATION,
			OpwantDelegation: &nfs4.WANTDELEGATION4args{WdaClaim: nfs4.DelegClaim4{DcClaim: nfs4.CLAIM_FH}}},
		nfs4.OP_COPY_NOTIFY: {Argop: nfs4.OP_COPY_NOTIFY,
			OpoffloadNotify: &nfs4.COPYNOTIFY4args{CnaDestinationServer: nfs4.Netloc4{NlType: nfs4.NL4_NAME}}},
	}
	mds := startServer(t, Config{})
	c := startDataServer(t, mds, "dsoptable")
	for _, minor := range []uint32{1, 2} {
		c.Minor = minor
		for op := nfs4.OP_ACCESS; op <= nfs4.OP_REMOVEXATTR+1; op++ {
			if op == nfs4.OP_SEQUENCE {
				continue // a second SEQUENCE is NFS4ERR_SEQUENCE_POS anywhere
			}
			t.Run(fmt.Sprintf("4.%d/%v", minor, op), func(t *testing.T) {
				a, ok := args[op]
				if !ok {
					a = nfs4.NfsArgop4{Argop: op}
				}
				res, err := c.Compound(a)
				if err != nil {
					t.Fatal(err)
				}
				if n := len(res.Resarray); n != 2 || opStatus(&res.Resarray[0]) != nfs4.NFS4_OK {
					t.Fatalf("reply %s", summary(res))
				}
				r := &res.Resarray[1]
				st := opStatus(r)
				m, defined := opMinor(op)
				switch {
				case !defined || minor < m:
					if r.Resop != nfs4.OP_ILLEGAL || st != nfs4.NFS4ERR_OP_ILLEGAL {
						t.Errorf("%v %v, want OP_ILLEGAL", r.Resop, statName(st))
					}
				case serves(op):
					if r.Resop != op || st == nfs4.NFS4ERR_NOTSUPP || st == nfs4.NFS4ERR_OP_ILLEGAL {
						t.Errorf("%v %v, want the handler's answer", r.Resop, statName(st))
					}
				default:
					if r.Resop != op || st != nfs4.NFS4ERR_NOTSUPP {
						t.Errorf("%v %v, want NOTSUPP", r.Resop, statName(st))
					}
				}
			})
		}
	}
}
