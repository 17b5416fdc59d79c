package state

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"sync"
)

// SessionID is the 16-byte sessionid4.
type SessionID [16]byte

func (s SessionID) String() string { return fmt.Sprintf("%x", s[:]) }

// ChannelAttrs is channel_attrs4 without the RDMA IRD list.
type ChannelAttrs struct {
	HeaderPadSize         uint32
	MaxRequestSize        uint32
	MaxResponseSize       uint32
	MaxResponseSizeCached uint32
	MaxOperations         uint32
	MaxRequests           uint32 // number of slots
}

// negotiate returns the attributes the server grants for a request,
// bounded by limits: every maximum is min(requested, limit) and the slot
// count is at least one.
func negotiate(req, limit ChannelAttrs) ChannelAttrs {
	return ChannelAttrs{
		HeaderPadSize:         0,
		MaxRequestSize:        min(req.MaxRequestSize, limit.MaxRequestSize),
		MaxResponseSize:       min(req.MaxResponseSize, limit.MaxResponseSize),
		MaxResponseSizeCached: min(req.MaxResponseSizeCached, limit.MaxResponseSizeCached),
		MaxOperations:         min(req.MaxOperations, limit.MaxOperations),
		MaxRequests:           max(1, min(req.MaxRequests, limit.MaxRequests)),
	}
}

// ChannelDir says which channels a connection serves (channel_dir_from_server4).
type ChannelDir uint32

const (
	ChannelFore ChannelDir = 1
	ChannelBack ChannelDir = 2
	ChannelBoth ChannelDir = 3
)

// CreateSessionArgs are the inputs of CREATE_SESSION that matter to state.
type CreateSessionArgs struct {
	ClientID  ClientID
	Sequence  uint32 // csa_sequence
	Principal string // must equal the EXCHANGE_ID principal
	Fore      ChannelAttrs
	Back      ChannelAttrs
	CBProgram uint32
	// ConnBackChan is CREATE_SESSION4_FLAG_CONN_BACK_CHAN: Conn also
	// serves the back channel.
	ConnBackChan bool
	// Conn is the caller's handle for the connection the request arrived
	// on (compared with ==); nil binds nothing.
	Conn any
}

// CreateSessionResult is the CREATE_SESSION reply. A replayed request gets
// the same value back.
type CreateSessionResult struct {
	SessionID    SessionID
	Sequence     uint32
	ConnBackChan bool
	Fore, Back   ChannelAttrs
}

// CreateSession implements CREATE_SESSION. csa_sequence is checked against
// the client's CREATE_SESSION slot: equal to the last successful value
// returns the cached result (replay), one more creates a session, anything
// else is ErrSeqMisordered. The first successful CREATE_SESSION confirms
// the client ID (persisting it, and purging a previous incarnation of the
// same owner). Failed attempts do not advance the slot.
//
// Only that first, confirming CREATE_SESSION must come from the principal
// that sent EXCHANGE_ID (ErrClidInUse otherwise). Once the client ID is
// confirmed, any principal may create sessions for it: RFC 8881 §18.36.4
// checks the principal in phase 3, client ID confirmation, and "If this
// would be the first session for the client ID, the CREATE_SESSION
// operation serves to confirm the client ID. Otherwise, the client ID
// confirmation phase is skipped and only the session creation phase
// occurs." (pynfs CSESS10; Linux nfsd likewise checks the principal of a
// confirmed client only under SP4_MACH_CRED, which Shoal does not offer.)
// The check comes before the sequence check, so that a CREATE_SESSION from
// another principal cannot use up the csa_sequence the real client needs.
func (m *Manager) CreateSession(ctx context.Context, a CreateSessionArgs) (CreateSessionResult, error) {
	now := m.clock.Now()
	var purged []PurgeInfo
	m.mu.Lock()
	res, err := m.createSessionLocked(ctx, a, &purged)
	if err == nil {
		if c := m.clients[a.ClientID]; c != nil {
			c.renew(now)
		}
	}
	m.mu.Unlock()
	m.notify(purged)
	return res, err
}

func (m *Manager) createSessionLocked(ctx context.Context, a CreateSessionArgs, purged *[]PurgeInfo) (CreateSessionResult, error) {
	c, err := m.lookupClient(a.ClientID)
	if err != nil {
		return CreateSessionResult{}, err
	}
	if !c.confirmed && c.principal != a.Principal {
		return CreateSessionResult{}, ErrClidInUse
	}
	switch a.Sequence {
	case c.csSeq:
		if c.csReply == nil {
			return CreateSessionResult{}, ErrSeqMisordered
		}
		return *c.csReply, nil
	case c.csSeq + 1:
	default:
		return CreateSessionResult{}, ErrSeqMisordered
	}
	if !c.confirmed {
		if err := m.confirmLocked(ctx, c, purged); err != nil {
			return CreateSessionResult{}, err
		}
	}
	s := &Session{
		client:    c,
		clientID:  c.id,
		fore:      negotiate(a.Fore, m.fore),
		back:      negotiate(a.Back, m.back),
		cbProgram: a.CBProgram,
		conns:     make(map[any]ChannelDir),
	}
	m.nextSess++
	binary.BigEndian.PutUint64(s.id[0:8], uint64(c.id))
	binary.BigEndian.PutUint32(s.id[8:12], m.nextSess)
	if _, err := rand.Read(s.id[12:16]); err != nil {
		return CreateSessionResult{}, fmt.Errorf("%w: session id: %v", ErrServerFault, err)
	}
	s.slots = make([]slotState, s.fore.MaxRequests)
	s.target = s.fore.MaxRequests - 1
	s.cbSlots = make([]bool, s.back.MaxRequests)
	if a.Conn != nil {
		dir := ChannelFore
		if a.ConnBackChan {
			dir = ChannelBoth
		}
		s.bindLocked(a.Conn, dir)
	}
	m.sessions[s.id] = s
	c.sessions[s.id] = s
	res := CreateSessionResult{
		SessionID:    s.id,
		Sequence:     a.Sequence,
		ConnBackChan: a.ConnBackChan && a.Conn != nil,
		Fore:         s.fore,
		Back:         s.back,
	}
	c.csSeq = a.Sequence
	c.csReply = &res
	return res, nil
}

// DestroySession implements DESTROY_SESSION.
func (m *Manager) DestroySession(id SessionID) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.sessions[id]
	if s == nil {
		return ErrBadSession
	}
	delete(m.sessions, id)
	delete(s.client.sessions, id)
	s.kill()
	return nil
}

// Session returns a live session.
func (m *Manager) Session(id SessionID) (*Session, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	s := m.sessions[id]
	if s == nil {
		return nil, ErrBadSession
	}
	return s, nil
}

// BindConnToSession implements BIND_CONN_TO_SESSION. dir is the direction
// the server grants: callers map CDFC4_FORE to ChannelFore, CDFC4_BACK to
// ChannelBack and both *_OR_BOTH values to ChannelBoth. Rebinding a
// connection replaces its direction.
func (m *Manager) BindConnToSession(id SessionID, conn any, dir ChannelDir) (ChannelDir, error) {
	if conn == nil || dir < ChannelFore || dir > ChannelBoth {
		return 0, ErrInval
	}
	s, err := m.Session(id)
	if err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dead {
		return 0, ErrBadSession
	}
	s.bindLocked(conn, dir)
	return dir, nil
}

// ConnClosed unbinds a connection from every session; call it when the
// transport closes.
func (m *Manager) ConnClosed(conn any) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	for _, s := range m.sessions {
		s.mu.Lock()
		s.unbindLocked(conn)
		s.mu.Unlock()
	}
}

// Session is one NFSv4.1 session: its fore channel slot table with the
// reply cache, and its back channel. Methods are safe for concurrent use.
type Session struct {
	id       SessionID
	clientID ClientID
	client   *client // guarded by Manager.mu
	fore     ChannelAttrs
	back     ChannelAttrs

	mu         sync.Mutex
	dead       bool
	cbProgram  uint32
	slots      []slotState
	clientHigh uint32 // highest slot ID the client reported using
	target     uint32 // target_highest_slotid
	conns      map[any]ChannelDir
	connOrder  []any // binding order, for a stable BackChannel choice
	cbSeq      uint32
	cbSlots    []bool // back channel slots in use
	cbFailed   bool   // a callback failed on the bound back channel
}

type slotState struct {
	seq    uint32
	inUse  bool
	cached bool
	reply  []byte
	hash   uint64
}

// ID returns the session ID.
func (s *Session) ID() SessionID { return s.id }

// ClientID returns the owning client.
func (s *Session) ClientID() ClientID { return s.clientID }

// ForeAttrs returns the negotiated fore channel attributes.
func (s *Session) ForeAttrs() ChannelAttrs { return s.fore }

// BackAttrs returns the negotiated back channel attributes.
func (s *Session) BackAttrs() ChannelAttrs { return s.back }

// CBProgram returns the callback RPC program number.
func (s *Session) CBProgram() uint32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cbProgram
}

// SetCBProgram changes the callback program (BACKCHANNEL_CTL).
func (s *Session) SetCBProgram(prog uint32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cbProgram = prog
}

// SetTargetHighestSlot sets the target_highest_slotid reported by
// SEQUENCE, clamped to the slot table; use it to ask the client to use
// fewer slots.
func (s *Session) SetTargetHighestSlot(n uint32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.target = min(n, uint32(len(s.slots))-1)
}

// BackChannel returns a connection bound for the back channel, preferring
// the earliest bound, or nil if there is none.
func (s *Session) BackChannel() any {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.connOrder {
		if s.conns[c]&ChannelBack != 0 {
			return c
		}
	}
	return nil
}

// SetCallbackFailed records whether the last callback on the session's
// back channel failed in transport; a client none of whose sessions can
// be called back gets no delegations.
func (s *Session) SetCallbackFailed(failed bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cbFailed = failed
}

// callbackUp reports whether a connection is bound to the back channel
// and no callback has failed on it since.
func (s *Session) callbackUp() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.dead && !s.cbFailed && s.hasBackLocked()
}

// Conns returns the connections bound to the session and their directions.
func (s *Session) Conns() map[any]ChannelDir {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[any]ChannelDir, len(s.conns))
	for c, d := range s.conns {
		out[c] = d
	}
	return out
}

// BeginCallback reserves a back channel slot for a callback and returns
// the slot ID and the CB_SEQUENCE sequence ID to send. ErrDelay means all
// back channel slots are busy. Pair with EndCallback.
func (s *Session) BeginCallback() (slotID, seqID uint32, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dead {
		return 0, 0, ErrBadSession
	}
	for i, busy := range s.cbSlots {
		if !busy {
			s.cbSlots[i] = true
			s.cbSeq++
			return uint32(i), s.cbSeq, nil
		}
	}
	return 0, 0, ErrDelay
}

// EndCallback releases a back channel slot.
func (s *Session) EndCallback(slotID uint32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if int(slotID) < len(s.cbSlots) {
		s.cbSlots[slotID] = false
	}
}

func (s *Session) bindLocked(conn any, dir ChannelDir) {
	if _, ok := s.conns[conn]; !ok {
		s.connOrder = append(s.connOrder, conn)
	}
	s.conns[conn] = dir
	if dir&ChannelBack != 0 {
		s.cbFailed = false // a new back channel connection: try it
	}
}

func (s *Session) unbindLocked(conn any) {
	if _, ok := s.conns[conn]; !ok {
		return
	}
	delete(s.conns, conn)
	for i, c := range s.connOrder {
		if c == conn {
			s.connOrder = append(s.connOrder[:i], s.connOrder[i+1:]...)
			break
		}
	}
}

// kill marks the session destroyed and drops its reply cache.
func (s *Session) kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.dead = true
	s.slots = nil
	clear(s.conns)
	s.connOrder = nil
}

// SequenceArgs are the SEQUENCE arguments.
type SequenceArgs struct {
	SessionID     SessionID
	SequenceID    uint32
	SlotID        uint32
	HighestSlotID uint32
	// RequestHash optionally fingerprints the request (for example a hash
	// of the COMPOUND arguments). When both the cached and the retried
	// request carry a non-zero hash and they differ, the retry is
	// ErrSeqFalseRetry.
	RequestHash uint64
	// Conn, if non-nil, is the connection the request arrived on. An
	// unbound connection is bound to the fore channel, as RFC 8881
	// section 2.10.3.1 requires for clients without state protection.
	Conn any
}

// SequenceResult tells the dispatcher what to do with the COMPOUND.
type SequenceResult struct {
	// Slot is set for a new request: run the COMPOUND, then call
	// Slot.Complete with the encoded reply.
	Slot *Slot
	// Replay is set for a retry: send these bytes as the whole reply
	// (they must not be modified). Slot is nil then.
	Replay []byte

	ClientID            ClientID
	HighestSlotID       uint32
	TargetHighestSlotID uint32
	// CBPathDown reports that no connection is bound for the back
	// channel (SEQ4_STATUS_CB_PATH_DOWN_SESSION).
	CBPathDown bool
	// DelegRevoked reports that the client has revoked delegations it
	// has not freed yet (SEQ4_STATUS_RECALLABLE_STATE_REVOKED).
	DelegRevoked bool
}

// Sequence implements SEQUENCE (RFC 8881 section 2.10.6.1). For the slot
// named in a:
//
//   - seqid == slot seqid + 1: a new request; the slot is held until
//     Slot.Complete.
//   - seqid == slot seqid: a retry; the cached reply is returned, or
//     ErrDelay if the original is still running, ErrRetryUncachedRep if it
//     was not cached, ErrSeqFalseRetry if the request differs.
//   - anything else: ErrSeqMisordered.
//
// Both new requests and retries renew the client's lease.
func (m *Manager) Sequence(a SequenceArgs) (SequenceResult, error) {
	m.mu.RLock()
	s := m.sessions[a.SessionID]
	var c *client
	if s != nil {
		c = s.client
	}
	m.mu.RUnlock()
	if s == nil {
		return SequenceResult{}, ErrBadSession
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dead {
		return SequenceResult{}, ErrBadSession
	}
	if a.SlotID >= uint32(len(s.slots)) {
		return SequenceResult{}, ErrBadSlot
	}
	sl := &s.slots[a.SlotID]
	res := SequenceResult{
		ClientID:            s.clientID,
		HighestSlotID:       uint32(len(s.slots)) - 1,
		TargetHighestSlotID: s.target,
	}
	switch a.SequenceID {
	case sl.seq:
		switch {
		case sl.inUse:
			return SequenceResult{}, ErrDelay
		case a.SequenceID == 0:
			// Slot never used: seqid 0 is not a retry of anything.
			return SequenceResult{}, ErrSeqMisordered
		case !sl.cached:
			return SequenceResult{}, ErrRetryUncachedRep
		case a.RequestHash != 0 && sl.hash != 0 && a.RequestHash != sl.hash:
			return SequenceResult{}, ErrSeqFalseRetry
		}
		res.Replay = sl.reply
	case sl.seq + 1:
		if sl.inUse {
			return SequenceResult{}, ErrSeqMisordered
		}
		sl.seq = a.SequenceID
		sl.inUse = true
		sl.cached = false
		sl.reply = nil
		sl.hash = a.RequestHash
		res.Slot = &Slot{s: s, id: a.SlotID, seq: a.SequenceID}
	default:
		return SequenceResult{}, ErrSeqMisordered
	}
	if a.Conn != nil {
		if _, ok := s.conns[a.Conn]; !ok {
			s.bindLocked(a.Conn, ChannelFore)
		}
	}
	s.clientHigh = min(a.HighestSlotID, uint32(len(s.slots))-1)
	res.CBPathDown = !s.hasBackLocked()
	res.DelegRevoked = c.revokedDelegs.Load() > 0
	c.renew(m.clock.Now())
	return res, nil
}

// NextOnSlot reports whether a request with seqid on the session's slot
// would be the slot's next one (not a retransmission): the client sends it
// only once it has the reply of the slot's previous request. It changes
// nothing; a server that will not run the request uses it to learn that
// much.
func (m *Manager) NextOnSlot(id SessionID, slot, seqid uint32) bool {
	m.mu.RLock()
	s := m.sessions[id]
	m.mu.RUnlock()
	if s == nil {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dead || slot >= uint32(len(s.slots)) {
		return false
	}
	sl := &s.slots[slot]
	return !sl.inUse && seqid == sl.seq+1
}

func (s *Session) hasBackLocked() bool {
	for _, d := range s.conns {
		if d&ChannelBack != 0 {
			return true
		}
	}
	return false
}

// Slot is a fore channel slot held by one in-progress request.
type Slot struct {
	s   *Session
	id  uint32
	seq uint32
}

// ID returns the slot ID.
func (sl *Slot) ID() uint32 { return sl.id }

// SequenceID returns the sequence ID of the request holding the slot.
func (sl *Slot) SequenceID() uint32 { return sl.seq }

// MaxCached returns ca_maxresponsesize_cached: the largest reply Complete
// will cache. The dispatcher uses it to return NFS4ERR_REP_TOO_BIG_TO_CACHE
// itself for sa_cachethis requests whose reply would not fit.
func (sl *Slot) MaxCached() uint32 { return sl.s.fore.MaxResponseSizeCached }

// Complete releases the slot once the reply is encoded. With cacheThis it
// keeps a copy of reply for retries; replies larger than MaxCached are not
// kept and ErrRepTooBigToCache is returned (the slot is released anyway,
// and a retry gets ErrRetryUncachedRep). Completing a slot of a destroyed
// session, or twice, is a no-op. The cache holds at most one reply per slot.
func (sl *Slot) Complete(reply []byte, cacheThis bool) error {
	s := sl.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dead || int(sl.id) >= len(s.slots) {
		return nil
	}
	st := &s.slots[sl.id]
	if !st.inUse || st.seq != sl.seq {
		return nil
	}
	st.inUse = false
	if !cacheThis {
		return nil
	}
	if uint64(len(reply)) > uint64(s.fore.MaxResponseSizeCached) {
		return ErrRepTooBigToCache
	}
	st.reply = bytes.Clone(reply)
	if st.reply == nil {
		st.reply = []byte{}
	}
	st.cached = true
	return nil
}
