package server

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shoalfs/shoal/internal/nfs4"
)

// A leader that cannot vouch for its term answers NFS4ERR_DELAY from the
// first operation that is not SEQUENCE: SEQUENCE itself succeeds, since
// the Linux client parks a slot for 15 s on a SEQUENCE answered
// NFS4ERR_DELAY (and its session recovery waits for the slot).
func TestNotLeadingDelaysAfterSequence(t *testing.T) {
	var leading atomic.Bool
	leading.Store(true)
	ts := startServer(t, Config{Leading: func() error {
		if leading.Load() {
			return nil
		}
		return errors.New("term not vouched for")
	}})
	c := ts.client()
	ctx := testCtx(t)
	leading.Store(false)

	tests := []struct {
		name      string
		ops       []nfs4.NfsArgop4
		sessioned bool
		want      nfs4.Nfsstat4
		results   int // operations answered, SEQUENCE included
	}{
		{name: "SEQUENCE then an operation", sessioned: true, ops: opsOf(opPutRoot(), opGetattr(nfs4.FATTR4_TYPE)),
			want: nfs4.NFS4ERR_DELAY, results: 2},
		{name: "SEQUENCE alone (lease renewal)", sessioned: true, ops: nil,
			want: nfs4.NFS4_OK, results: 1},
		{name: "sessionless EXCHANGE_ID", ops: opsOf(nfs4.NfsArgop4{Argop: nfs4.OP_EXCHANGE_ID, OpexchangeId: &nfs4.EXCHANGEID4args{
			EiaClientowner:  nfs4.ClientOwner4{CoOwnerid: []byte("not-leading-probe")},
			EiaStateProtect: nfs4.StateProtect4A{SpaHow: nfs4.SP4_NONE},
		}}),
			want: nfs4.NFS4ERR_DELAY, results: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var res *nfs4.COMPOUND4res
			var err error
			if tt.sessioned {
				res, err = c.CompoundCtx(ctx, tt.ops...)
			} else {
				res, err = c.Sessionless(ctx, tt.ops...)
			}
			if err != nil {
				t.Fatal(err)
			}
			if res.Status != tt.want || len(res.Resarray) != tt.results {
				t.Fatalf("status %v after %d results, want %v after %d", res.Status, len(res.Resarray), tt.want, tt.results)
			}
			if sq := res.Resarray[0].Opsequence; tt.sessioned && (sq == nil || sq.SrStatus != nfs4.NFS4_OK) {
				t.Fatalf("SEQUENCE answered %+v, want NFS4_OK", sq)
			}
		})
	}
	// Leading again: the same session goes on.
	leading.Store(true)
	if res, err := c.CompoundCtx(ctx, opPutRoot(), opGetattr(nfs4.FATTR4_TYPE)); err != nil || res.Status != nfs4.NFS4_OK {
		t.Fatalf("after leading again: %v, %v", res, err)
	}
}

// Quiesce (a planned step-down) lets the running COMPOUNDs answer and
// drops every new one unanswered and unrun: the client sends it again on
// its next connection, to the next leader, which has not seen it.
func TestQuiesceDropsNewCompounds(t *testing.T) {
	ts := startServer(t, Config{})
	running := ts.client()
	late := ts.client()
	ctx := testCtx(t)

	// A COMPOUND that is running when the hand-over starts.
	entered, release := make(chan struct{}), make(chan struct{})
	var armed atomic.Bool
	armed.Store(true)
	hook := opHook(func(cp *compound, op nfs4.NfsOpnum4, _ context.Context) {
		if op == nfs4.OP_CREATE {
			if armed.CompareAndSwap(true, false) {
				close(entered)
				<-release
			}
		}
	})
	ts.srv.testHookBeforeOp.Store(&hook)
	type result struct {
		res *nfs4.COMPOUND4res
		err error
	}
	first := make(chan result, 1)
	go func() {
		res, err := running.CompoundCtx(ctx, opPutRoot(), opMkdir("made-before"))
		first <- result{res, err}
	}()
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the first COMPOUND never ran")
	}
	quiesced := make(chan error, 1)
	go func() { quiesced <- ts.srv.Quiesce(ctx) }()
	// Quiesce waits for the running one.
	for !ts.srv.quiescing.Load() {
		time.Sleep(time.Millisecond)
	}
	select {
	case err := <-quiesced:
		t.Fatalf("Quiesce returned with a COMPOUND running: %v", err)
	default:
	}

	// A new one gets no answer and is not run.
	lctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	_, err := late.CompoundCtx(lctx, opPutRoot(), opMkdir("made-after"))
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a COMPOUND sent while quiescing: %v, want no answer", err)
	}

	close(release)
	if r := <-first; r.err != nil || r.res.Status != nfs4.NFS4_OK {
		t.Fatalf("the running COMPOUND: %v, %v; want its reply", r.res, r.err)
	}
	if err := <-quiesced; err != nil {
		t.Fatalf("Quiesce: %v", err)
	}
	ts.srv.quiescing.Store(false) // look with a fresh client
	look := ts.client()
	for name, want := range map[string]nfs4.Nfsstat4{"made-before": nfs4.NFS4_OK, "made-after": nfs4.NFS4ERR_NOENT} {
		res, err := look.CompoundCtx(ctx, opPutRoot(), opLookup(name))
		if err != nil {
			t.Fatal(err)
		}
		if res.Status != want {
			t.Errorf("LOOKUP %s: %v, want %v", name, res.Status, want)
		}
	}
}
