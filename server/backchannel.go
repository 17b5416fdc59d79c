package server

import (
	"context"
	"errors"
	"fmt"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/rpc"
	"github.com/shoalfs/shoal/internal/xdr"
	"github.com/shoalfs/shoal/server/internal/state"
)

// ErrNoBackchannel reports that a session has no connection bound for
// callbacks.
var ErrNoBackchannel = errors.New("server: session has no back channel")

// callback sends a CB_COMPOUND of CB_SEQUENCE followed by ops on the
// session's back channel and returns the results of ops (CB_SEQUENCE's
// result stripped). Callbacks must run outside of the fore-channel request
// that triggers them (see internal/rpc's doc on backchannel deadlock).
func (s *Server) callback(ctx context.Context, id state.SessionID, ops ...nfs4.NfsCbArgop4) ([]nfs4.NfsCbResop4, error) {
	sess, err := s.st.m.Session(id)
	if err != nil {
		return nil, err
	}
	conn, _ := sess.BackChannel().(*rpc.Conn)
	if conn == nil {
		return nil, ErrNoBackchannel
	}
	slot, seq, err := sess.BeginCallback()
	if err != nil {
		return nil, err
	}
	defer sess.EndCallback(slot)
	s.st.mu.Lock()
	minor, ok := s.st.cbMinor[id]
	s.st.mu.Unlock()
	if !ok {
		minor = 1
	}
	args := nfs4.CBCOMPOUND4args{
		Minorversion: minor,
		Argarray: append([]nfs4.NfsCbArgop4{{
			Argop: nfs4.OP_CB_SEQUENCE,
			Opcbsequence: &nfs4.CBSEQUENCE4args{
				CsaSessionid:  nfs4.Sessionid4(id),
				CsaSequenceid: seq,
				CsaSlotid:     slot,
			},
		}}, ops...),
	}
	s.st.mu.Lock()
	cred := s.st.cbCred[id]
	s.st.mu.Unlock()
	body, err := conn.Call(ctx, sess.CBProgram(), nfs4.NFS_CB, nfs4.CB_COMPOUND, cred, &args)
	if err != nil {
		return nil, fmt.Errorf("CB_COMPOUND: %w", err)
	}
	// The back channel answers: the client may get delegations again
	// if a callback had failed (deleg.go).
	sess.SetCallbackFailed(false)
	var res nfs4.CBCOMPOUND4res
	if err := xdr.Unmarshal(body, &res); err != nil {
		return nil, fmt.Errorf("CB_COMPOUND reply: %w", err)
	}
	if len(res.Resarray) == 0 {
		return nil, fmt.Errorf("CB_COMPOUND: %s", res.Status)
	}
	if sr := res.Resarray[0].Opcbsequence; sr == nil || sr.CsrStatus != nfs4.NFS4_OK {
		return nil, fmt.Errorf("CB_SEQUENCE: %s", res.Status)
	}
	return res.Resarray[1:], nil
}

// Recall sends CB_RECALL for a delegation stateid on file fh to the
// session's client and returns the client's status.
func (s *Server) recall(ctx context.Context, id state.SessionID, sid nfs4.Stateid4, fh []byte, truncate bool) (nfs4.Nfsstat4, error) {
	res, err := s.callback(ctx, id, nfs4.NfsCbArgop4{
		Argop:      nfs4.OP_CB_RECALL,
		Opcbrecall: &nfs4.CBRECALL4args{Stateid: sid, Truncate: truncate, Fh: fh},
	})
	if err != nil {
		return 0, err
	}
	if len(res) != 1 || res[0].Opcbrecall == nil {
		return 0, fmt.Errorf("CB_RECALL: malformed result")
	}
	return res[0].Opcbrecall.Status, nil
}
