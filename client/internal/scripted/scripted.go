// Package scripted is a small NFSv4.1 server whose answers a test script
// steers, for the client's contract tests (client/testdata/*.txt).
//
// Why it exists: the client's recovery paths (a session the server lost,
// a client ID that expired, NFS4ERR_DELAY and misordered slots, layout
// stateids whose seqids arrive out of order, recalls racing LAYOUTGET)
// answer to what a server says at one precise moment. Shoal's own server
// says those things only under races or failures that tests cannot
// stage deterministically, and a test that reaches them through it
// proves the pair consistent, not the client right by RFC 8881. This
// server speaks real ONC RPC over real TCP (internal/rpc, internal/xdr,
// internal/nfs4), keeps a tiny but honest model of the state a client
// sees (client IDs, sessions and slots, opens, one layout stateid per
// file, a grace period after Restart), records every COMPOUND it gets,
// and lets a script override the answer to the next occurrence of an
// operation (Rule), hold a reply back until the script releases it, and
// send CB_LAYOUTRECALL.
//
// It is test-only: it lives under client/internal and only the client's
// tests import it. It implements what the client sends in those tests
// and answers NFS4ERR_NOTSUPP to anything else.
//
// Determinism: the model assigns client IDs, session IDs and stateids
// from counters and renders them by name (c1, s2, open1/3, layout1/2), so
// a script's expected output does not depend on timing or randomness. The
// server never sleeps; a held reply waits for Release, not for a clock.
package scripted

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/rpc"
	"github.com/shoalfs/shoal/internal/xdr"
)

// Rule overrides the server's answer to the next COMPOUND that carries Op.
// A rule is used up after Times matches (default 1).
type Rule struct {
	Op nfs4.NfsOpnum4
	// Status, if not NFS4_OK, fails the operation with it (for SEQUENCE:
	// the whole request, without touching the slot, as RFC 8881 §2.10.6.1
	// has it for errors of SEQUENCE).
	Status nfs4.Nfsstat4
	// Flags are SEQUENCE's sr_status_flags.
	Flags uint32
	// Seqid, if not zero, is the seqid the layout stateid of a LAYOUTGET
	// reply gets (the server's layout state moves to it).
	Seqid uint32
	// Deleg makes OPEN grant a read delegation.
	Deleg bool
	// Codes are TEST_STATEID's per-stateid answers.
	Codes []nfs4.Nfsstat4
	// Hold keeps the reply back until Release: the request is processed
	// (its effect on the model happens in arrival order), the reply is
	// not sent.
	Hold bool
	// FH, if set, restricts the rule to operations on the file of that
	// name (the current filehandle's; a data file: "NAME#mM").
	FH    string
	Times int
}

// Server is a scripted NFSv4.1 server on a loopback TCP listener.
type Server struct {
	ln  net.Listener
	srv *rpc.Server

	mu      sync.Mutex
	changed chan struct{} // closed and replaced on every new trace entry or held reply
	rules   []*Rule
	trace   []string
	held    []*heldReply

	// The model.
	epoch      int // bumped by Restart
	nextClient int
	nextSess   int
	nextOther  map[byte]int
	clients    map[uint64]*client
	owners     map[string]uint64 // co_ownerid -> confirmed or unconfirmed client
	sessions   map[nfs4.Sessionid4]*session
	files      map[string]*file // by name; the root is ""
	byFH       map[string]*file
	names      map[[12]byte]string // stateid other -> name for traces
	grace      bool                // after Restart, until the client's RECLAIM_COMPLETE
	slots      int                 // fore channel slots of new sessions
	backConn   *rpc.Conn           // the last connection a session's back channel was bound to
	backSess   *session
	cbSeq      uint32
	flexDS     []string // SetFlex: the data servers of flexfiles mirrors
	flexFlags  uint32   // ... and the layouts' ffl_flags
	flexLoose  bool     // ... and whether the data servers are loosely coupled
}

type client struct {
	id        uint64
	name      string
	verifier  nfs4.Verifier4
	confirmed bool
	csSeq     uint32
	reclaimed bool // RECLAIM_COMPLETE done
}

type session struct {
	id     nfs4.Sessionid4
	name   string
	cl     *client
	slots  []slotState
	cbProg uint32
}

type slotState struct {
	seq   uint32
	reply []byte // the last reply on the slot, for replays
}

type file struct {
	name   string
	fh     []byte
	dir    bool
	size   uint64
	fileid uint64
	opens  map[string]*nfs4.Stateid4 // by open owner
	locks  map[string]*nfs4.Stateid4 // by lock owner
	layout *nfs4.Stateid4            // the client's layout state of the file, if any
	data   []byte                    // what was written (flexfiles.go)
}

type heldReply struct {
	op      nfs4.NfsOpnum4
	release chan struct{}
}

// Start listens on 127.0.0.1 and serves until Close.
func Start() (*Server, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("scripted: listen: %w", err)
	}
	s := &Server{ln: ln, changed: make(chan struct{}), slots: 1}
	s.reset()
	root := &file{name: "", fh: []byte("fh:/"), dir: true, fileid: 1}
	s.files = map[string]*file{"": root}
	s.byFH = map[string]*file{string(root.fh): root}
	s.srv = &rpc.Server{Handler: rpc.HandlerFunc(s.serve), IdleTimeout: -1, Logger: slog.New(slog.DiscardHandler)}
	go s.srv.Serve(ln)
	return s, nil
}

// reset forgets all client state (Start, Restart).
func (s *Server) reset() {
	s.epoch++
	s.clients = map[uint64]*client{}
	s.owners = map[string]uint64{}
	s.sessions = map[nfs4.Sessionid4]*session{}
	s.nextOther = map[byte]int{}
	s.names = map[[12]byte]string{}
	s.backConn, s.backSess = nil, nil
	for _, f := range s.files {
		f.opens, f.locks, f.layout = nil, nil, nil
	}
}

// Addr is the server's address.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Close stops the server, releasing every held reply.
func (s *Server) Close() error {
	s.mu.Lock()
	for _, h := range s.held {
		close(h.release)
	}
	s.held = nil
	s.mu.Unlock()
	return s.srv.Close()
}

// AddFile creates a regular file in the root directory.
func (s *Server) AddFile(name string, size uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := &file{name: name, fh: []byte("fh:/" + name), size: size, fileid: uint64(len(s.files) + 1)}
	s.files[name] = f
	s.byFH[string(f.fh)] = f
}

// SetSlots sets the number of fore channel slots new sessions get
// (default 1: every request of the client waits for the one before, so
// that requests its background work sends go in a deterministic order).
func (s *Server) SetSlots(n int) {
	s.mu.Lock()
	s.slots = max(n, 1)
	s.mu.Unlock()
}

// AddRule queues r.
func (s *Server) AddRule(r Rule) {
	if r.Times <= 0 {
		r.Times = 1
	}
	s.mu.Lock()
	s.rules = append(s.rules, &r)
	s.mu.Unlock()
}

// PendingRules describes the rules not used up yet.
func (s *Server) PendingRules() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, r := range s.rules {
		fh := ""
		if r.FH != "" {
			fh = " fh=" + r.FH
		}
		out = append(out, fmt.Sprintf("%s%s x%d", opName(r.Op), fh, r.Times))
	}
	return out
}

// Restart makes the server forget its clients, sessions and state, as a
// restart would, and start a grace period for reclaims.
func (s *Server) Restart() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reset()
	s.grace = true
}

// Expire makes the server forget its clients and their state, as when
// their lease expired and the server purged them, without a grace period:
// reclaims get NFS4ERR_NO_GRACE.
func (s *Server) Expire() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reset()
	s.grace = false
}

// Trace returns the trace entries from index from on, and the next index.
func (s *Server) Trace(from int) ([]string, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if from > len(s.trace) {
		from = len(s.trace)
	}
	return append([]string(nil), s.trace[from:]...), len(s.trace)
}

// WaitTrace waits until an entry after index from contains substr, or
// ctx ends.
func (s *Server) WaitTrace(ctx context.Context, from int, substr string) error {
	for {
		s.mu.Lock()
		for _, e := range s.trace[min(from, len(s.trace)):] {
			if strings.Contains(e, substr) {
				s.mu.Unlock()
				return nil
			}
		}
		ch := s.changed
		s.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("scripted: no %q in the trace: %w", substr, ctx.Err())
		}
	}
}

// WaitHeld waits until a reply to a COMPOUND carrying op is held.
func (s *Server) WaitHeld(ctx context.Context, op nfs4.NfsOpnum4) error {
	for {
		s.mu.Lock()
		for _, h := range s.held {
			if h.op == op {
				s.mu.Unlock()
				return nil
			}
		}
		ch := s.changed
		s.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("scripted: no held %s reply: %w", opName(op), ctx.Err())
		}
	}
}

// Release sends the oldest held reply to a COMPOUND carrying op.
func (s *Server) Release(op nfs4.NfsOpnum4) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, h := range s.held {
		if h.op == op {
			s.held = append(s.held[:i], s.held[i+1:]...)
			close(h.release)
			return nil
		}
	}
	return fmt.Errorf("scripted: no held %s reply", opName(op))
}

func (s *Server) notifyLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

func (s *Server) logLocked(line string) {
	s.trace = append(s.trace, line)
	s.notifyLocked()
}

// takeRule returns the first rule for op on the file named cur, using it
// up.
func (s *Server) takeRule(op nfs4.NfsOpnum4, cur string) *Rule {
	for i, r := range s.rules {
		if r.Op == op && (r.FH == "" || r.FH == cur) {
			r.Times--
			if r.Times <= 0 {
				s.rules = append(s.rules[:i], s.rules[i+1:]...)
			}
			return r
		}
	}
	return nil
}

// newStateid makes a stateid of kind ('o'pen, 'l'ayout, 'd'elegation, loc'k')
// named kind+counter in traces.
func (s *Server) newStateid(kind byte) *nfs4.Stateid4 {
	s.nextOther[kind]++
	n := s.nextOther[kind]
	var sid nfs4.Stateid4
	sid.Seqid = 1
	sid.Other[0] = kind
	binary.BigEndian.PutUint32(sid.Other[4:8], uint32(n))
	binary.BigEndian.PutUint32(sid.Other[8:12], uint32(s.epoch))
	s.names[sid.Other] = map[byte]string{'o': "open", 'l': "layout", 'd': "deleg", 'k': "lock"}[kind] + strconv.Itoa(n)
	return &sid
}

func (s *Server) sidName(sid nfs4.Stateid4) string {
	if sid.Other == ([12]byte{}) {
		return fmt.Sprintf("anon/%d", sid.Seqid)
	}
	n, ok := s.names[sid.Other]
	if kind, known := map[byte]string{'o': "open", 'l': "layout", 'd': "deleg", 'k': "lock"}[sid.Other[0]]; !ok && known {
		// Another scripted server's (the MDS's, seen by a data server).
		n = fmt.Sprintf("%s%d", kind, binary.BigEndian.Uint32(sid.Other[4:8]))
	} else if !ok {
		n = fmt.Sprintf("unknown%x", sid.Other[:])
	}
	return fmt.Sprintf("%s/%d", n, sid.Seqid)
}

// CallbackRecall sends CB_LAYOUTRECALL of the client's layout of the
// file name, moving the layout stateid's seqid on first (RFC 8881
// §12.5.5.2.1: a recall is a change of the layout state), and returns a
// description of the client's answer.
func (s *Server) CallbackRecall(ctx context.Context, name string) (string, error) {
	s.mu.Lock()
	f := s.files[name]
	conn, sess := s.backConn, s.backSess
	if f == nil || f.layout == nil || conn == nil {
		s.mu.Unlock()
		return "", fmt.Errorf("scripted: no layout of %q or no back channel", name)
	}
	f.layout.Seqid++
	sid := *f.layout
	s.cbSeq++
	args := nfs4.CBCOMPOUND4args{Minorversion: 1, Argarray: []nfs4.NfsCbArgop4{
		{Argop: nfs4.OP_CB_SEQUENCE, Opcbsequence: &nfs4.CBSEQUENCE4args{CsaSessionid: sess.id, CsaSequenceid: s.cbSeq}},
		{Argop: nfs4.OP_CB_LAYOUTRECALL, Opcblayoutrecall: &nfs4.CBLAYOUTRECALL4args{
			CloraType: nfs4.LAYOUT4_NFSV4_1_FILES, CloraIomode: nfs4.LAYOUTIOMODE4_ANY, CloraChanged: true,
			CloraRecall: nfs4.Layoutrecall4{LorRecalltype: nfs4.LAYOUTRECALL4_FILE, LorLayout: &nfs4.LayoutrecallFile4{
				LorFh: f.fh, LorOffset: 0, LorLength: nfs4.NFS4_UINT64_MAX, LorStateid: sid,
			}},
		}},
	}}
	desc := "CB_LAYOUTRECALL " + name + " " + s.sidName(sid)
	prog := sess.cbProg
	s.mu.Unlock()
	raw, err := conn.Call(ctx, prog, nfs4.NFS_CB, nfs4.CB_COMPOUND, rpc.OpaqueAuth{}, &args)
	if err != nil {
		return "", fmt.Errorf("scripted: CB_COMPOUND: %w", err)
	}
	var res nfs4.CBCOMPOUND4res
	if err := xdr.Unmarshal(raw, &res); err != nil {
		return "", fmt.Errorf("scripted: decoding CB_COMPOUND reply: %w", err)
	}
	st := res.Status
	if n := len(res.Resarray); n == 2 && res.Resarray[1].Opcblayoutrecall != nil {
		st = res.Resarray[1].Opcblayoutrecall.ClorrStatus
	}
	return desc + " -> " + st.String(), nil
}

// Rendering of requests and results for the trace.

func opName(op nfs4.NfsOpnum4) string { return strings.TrimPrefix(op.String(), "OP_") }

// OpByName parses an operation name with or without its OP_ prefix.
func OpByName(name string) (nfs4.NfsOpnum4, bool) {
	name = "OP_" + strings.TrimPrefix(strings.ToUpper(name), "OP_")
	for op := nfs4.NfsOpnum4(3); op <= 80; op++ {
		if op.String() == name {
			return op, true
		}
	}
	if name == "OP_ILLEGAL" {
		return nfs4.OP_ILLEGAL, true
	}
	return 0, false
}

// StatusByName parses an nfsstat4 name (NFS4_OK, NFS4ERR_...).
func StatusByName(name string) (nfs4.Nfsstat4, bool) {
	if name == "NFS4_OK" || name == "OK" {
		return nfs4.NFS4_OK, true
	}
	// nfsstat4 values are the errno-like 1..99 and 10001 on.
	for v := nfs4.Nfsstat4(1); v < 10200; v++ {
		if v.String() == name {
			return v, true
		}
		if v == 99 {
			v = 10000
		}
	}
	return 0, false
}

// SeqFlagByName parses a SEQ4_STATUS_ flag name with or without prefix.
func SeqFlagByName(name string) (uint32, bool) {
	f, ok := map[string]uint32{
		"CB_PATH_DOWN": nfs4.SEQ4_STATUS_CB_PATH_DOWN, "EXPIRED_ALL_STATE_REVOKED": nfs4.SEQ4_STATUS_EXPIRED_ALL_STATE_REVOKED,
		"EXPIRED_SOME_STATE_REVOKED": nfs4.SEQ4_STATUS_EXPIRED_SOME_STATE_REVOKED, "ADMIN_STATE_REVOKED": nfs4.SEQ4_STATUS_ADMIN_STATE_REVOKED,
		"RECALLABLE_STATE_REVOKED": nfs4.SEQ4_STATUS_RECALLABLE_STATE_REVOKED, "LEASE_MOVED": nfs4.SEQ4_STATUS_LEASE_MOVED,
		"RESTART_RECLAIM_NEEDED": nfs4.SEQ4_STATUS_RESTART_RECLAIM_NEEDED, "CB_PATH_DOWN_SESSION": nfs4.SEQ4_STATUS_CB_PATH_DOWN_SESSION,
		"BACKCHANNEL_FAULT": nfs4.SEQ4_STATUS_BACKCHANNEL_FAULT,
	}[strings.TrimPrefix(name, "SEQ4_STATUS_")]
	return f, ok
}

func (s *Server) sessName(id nfs4.Sessionid4) string {
	if se := s.sessions[id]; se != nil {
		return se.name
	}
	// A session of an earlier epoch, or never issued.
	if id[0] == 's' {
		return fmt.Sprintf("s%d", binary.BigEndian.Uint32(id[4:8]))
	}
	return fmt.Sprintf("%x", id[:])
}

func (s *Server) renderArg(op *nfs4.NfsArgop4) string {
	n := opName(op.Argop)
	switch op.Argop {
	case nfs4.OP_SEQUENCE:
		a := op.Opsequence
		return fmt.Sprintf("SEQUENCE %s slot=%d seq=%d", s.sessName(a.SaSessionid), a.SaSlotid, a.SaSequenceid)
	case nfs4.OP_CREATE_SESSION:
		return fmt.Sprintf("CREATE_SESSION %s", s.clientName(uint64(op.OpcreateSession.CsaClientid)))
	case nfs4.OP_DESTROY_SESSION:
		return "DESTROY_SESSION " + s.sessName(op.OpdestroySession.DsaSessionid)
	case nfs4.OP_BIND_CONN_TO_SESSION:
		a := op.OpbindConnToSession
		return fmt.Sprintf("BIND_CONN_TO_SESSION %s dir=%s", s.sessName(a.BctsaSessid),
			strings.TrimPrefix(a.BctsaDir.String(), "CDFC4_"))
	case nfs4.OP_LOOKUP:
		return "LOOKUP " + string(op.Oplookup.Objname)
	case nfs4.OP_PUTFH:
		if f := s.byFH[string(op.Opputfh.Object)]; f != nil {
			return "PUTFH /" + f.name
		}
		if name, ok := strings.CutPrefix(string(op.Opputfh.Object), "fh:/"); ok && strings.Contains(name, "#m") {
			return "PUTFH /" + name // a data file, made by this PUTFH
		}
		return "PUTFH ?"
	case nfs4.OP_OPEN:
		a := op.Opopen
		c := strings.TrimPrefix(a.Claim.Claim.String(), "CLAIM_")
		if a.Claim.File != nil {
			c += " " + string(*a.Claim.File)
		}
		return fmt.Sprintf("OPEN %s access=%s", c, accessName(a.ShareAccess))
	case nfs4.OP_CLOSE:
		return "CLOSE " + s.sidName(op.Opclose.OpenStateid)
	case nfs4.OP_LAYOUTGET:
		a := op.Oplayoutget
		return fmt.Sprintf("LAYOUTGET %s iomode=%s", s.sidName(a.LogaStateid), iomodeName(a.LogaIomode))
	case nfs4.OP_LAYOUTRETURN:
		a := op.Oplayoutreturn
		if lr := a.LoraLayoutreturn.LrLayout; lr != nil {
			return "LAYOUTRETURN " + s.sidName(lr.LrfStateid) + renderReturnBody(lr.LrfBody)
		}
		return "LAYOUTRETURN " + a.LoraLayoutreturn.LrReturntype.String()
	case nfs4.OP_LAYOUTCOMMIT:
		return "LAYOUTCOMMIT " + s.sidName(op.Oplayoutcommit.LocaStateid)
	case nfs4.OP_LAYOUTERROR:
		a := op.Oplayouterror
		return fmt.Sprintf("LAYOUTERROR %s %d+%d %s", s.sidName(a.LeaStateid), a.LeaOffset, a.LeaLength, renderDevErrors(a.LeaErrors))
	case nfs4.OP_WRITE:
		a := op.Opwrite
		return fmt.Sprintf("WRITE %s %d+%d", s.sidName(a.Stateid), a.Offset, len(a.Data))
	case nfs4.OP_READ:
		a := op.Opread
		return fmt.Sprintf("READ %s %d+%d", s.sidName(a.Stateid), a.Offset, a.Count)
	case nfs4.OP_LOCK:
		a := op.Oplock
		d := ""
		if a.Reclaim {
			d = " reclaim"
		}
		if a.Locker.NewLockOwner && a.Locker.OpenOwner != nil {
			return "LOCK new " + s.sidName(a.Locker.OpenOwner.OpenStateid) + d
		}
		if a.Locker.LockOwner != nil {
			return "LOCK " + s.sidName(a.Locker.LockOwner.LockStateid) + d
		}
		return "LOCK ?"
	case nfs4.OP_LOCKU:
		return "LOCKU " + s.sidName(op.Oplocku.LockStateid)
	case nfs4.OP_TEST_STATEID:
		var ns []string
		for _, sid := range op.OptestStateid.TsStateids {
			ns = append(ns, s.sidName(sid))
		}
		return "TEST_STATEID " + strings.Join(ns, ",")
	case nfs4.OP_FREE_STATEID:
		return "FREE_STATEID " + s.sidName(op.OpfreeStateid.FsaStateid)
	case nfs4.OP_DELEGRETURN:
		return "DELEGRETURN " + s.sidName(op.Opdelegreturn.DelegStateid)
	}
	return n
}

func (s *Server) clientName(id uint64) string {
	if c := s.clients[id]; c != nil {
		return c.name
	}
	return fmt.Sprintf("c?%d", id)
}

func accessName(a uint32) string {
	switch a & nfs4.OPEN4_SHARE_ACCESS_BOTH {
	case nfs4.OPEN4_SHARE_ACCESS_READ:
		return "r"
	case nfs4.OPEN4_SHARE_ACCESS_WRITE:
		return "w"
	}
	return "rw"
}

func iomodeName(m nfs4.Layoutiomode4) string {
	return strings.ToLower(strings.TrimPrefix(m.String(), "LAYOUTIOMODE4_"))
}
