package state

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// ClientID is the 64-bit NFSv4.1 client ID: boot epoch in the high 32
// bits, a per-boot counter in the low 32 bits.
type ClientID uint64

// Epoch returns the boot epoch the client ID was issued in.
func (c ClientID) Epoch() uint32 { return uint32(c >> 32) }

// FileID is the server's stable identity of a file (its inode number).
// Share reservations and byte-range locks are tracked per FileID.
type FileID uint64

// PurgeReason says why a client's state was discarded.
type PurgeReason int

const (
	// PurgeExpired: the lease ran out (Sweep).
	PurgeExpired PurgeReason = iota + 1
	// PurgeRebooted: a new incarnation of the client (new verifier)
	// confirmed its client ID.
	PurgeRebooted
	// PurgeDestroyed: DESTROY_CLIENTID, or a client-owner collision with a
	// stateless record.
	PurgeDestroyed
)

func (r PurgeReason) String() string {
	switch r {
	case PurgeExpired:
		return "expired"
	case PurgeRebooted:
		return "rebooted"
	case PurgeDestroyed:
		return "destroyed"
	}
	return fmt.Sprintf("PurgeReason(%d)", int(r))
}

// PurgeInfo describes a client whose state was discarded, for the
// Config.OnPurge hook.
type PurgeInfo struct {
	ClientID ClientID
	Reason   PurgeReason
	// Files that had opens or locks of the client; the server may want to
	// wake waiters or recall layouts on them.
	Files []FileID
	// Sessions of the client, destroyed with it; the server drops what it
	// keeps per session (callback parameters, pinned back channel
	// connections). Sorted.
	Sessions []SessionID
}

// Config configures a Manager. Zero values get defaults.
type Config struct {
	// Epoch must differ on every server boot (the caller persists and
	// increments it). 0 derives one from the clock's Unix seconds.
	Epoch uint32
	// LeaseTime is the lease period and the grace period length.
	// Default 90s.
	LeaseTime time.Duration
	// Clock defaults to SystemClock.
	Clock Clock
	// Store persists confirmed clients. nil disables persistence (and so
	// grace after restart).
	Store ClientStore
	// ForeLimits and BackLimits cap the channel attributes negotiated by
	// CREATE_SESSION. Zero fields get DefaultForeLimits/DefaultBackLimits.
	ForeLimits, BackLimits ChannelAttrs
	// OnPurge is called, without Manager locks held, after a client's
	// state has been discarded.
	OnPurge func(PurgeInfo)
	// OnRevokeLayout is called, without Manager locks held, for each client
	// whose layouts were revoked because it did not answer a recall within
	// the lease; the server fences it at the data servers.
	OnRevokeLayout func(ClientID)
	// OnRevokeDeleg is called, without Manager locks held, for each
	// delegation revoked because its recall was not answered within the
	// lease.
	OnRevokeDeleg func(DelegHolder)
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// DefaultForeLimits are the fore channel maxima used when Config leaves
// them zero.
var DefaultForeLimits = ChannelAttrs{
	MaxRequestSize:        1<<20 + 4096,
	MaxResponseSize:       1<<20 + 4096,
	MaxResponseSizeCached: 64 << 10,
	MaxOperations:         64,
	MaxRequests:           64,
}

// DefaultBackLimits are the back channel maxima used when Config leaves
// them zero.
var DefaultBackLimits = ChannelAttrs{
	MaxRequestSize:        16 << 10,
	MaxResponseSize:       16 << 10,
	MaxResponseSizeCached: 0,
	MaxOperations:         8,
	MaxRequests:           1,
}

// Manager owns all NFSv4.1 server state. It is safe for concurrent use.
type Manager struct {
	epoch         uint32
	lease         time.Duration
	clock         Clock
	store         ClientStore
	fore          ChannelAttrs
	back          ChannelAttrs
	onPurge       func(PurgeInfo)
	onRevoke      func(ClientID)
	onRevokeDeleg func(DelegHolder)
	log           *slog.Logger
	salt          [3]byte

	// mu guards everything below and the state reachable from it, except
	// slot tables (Session.mu) and lease timestamps (atomic).
	mu         sync.RWMutex
	nextClient uint32
	nextState  uint32
	nextSess   uint32
	clients    map[ClientID]*client
	owners     map[string]*ownerEntry
	sessions   map[SessionID]*Session
	states     map[[12]byte]stateRef
	files      map[FileID]*fileState
	expired    expiredSet
	layouts    map[FileID]map[*layoutState]struct{}
	layoutIDs  map[[12]byte]*layoutState
	// layoutsGone are closed when the last layout of their file goes
	// (LayoutsGone).
	layoutsGone map[FileID]chan struct{}
	delegs      map[FileID]map[*delegState]struct{} // live delegations by file
	delegIDs    map[[12]byte]*delegState            // live and revoked ones
	recent      map[recentKey]time.Time             // last recall per client and file
	// breakSeq numbers the starts of conflicting operations
	// (BreakDelegations); lastBreak is the last one per file, kept for
	// breakMemory. See DelegArgs.Since.
	breakSeq  atomic.Uint64 // written under mu, read without it
	lastBreak map[FileID]breakMark
	// breakPruneAt is the size at which lastBreak is next pruned.
	breakPruneAt int
	holds        map[FileID]map[ClientID]int // operations under way that hold back grants

	// Grace period after restart (RFC 8881 section 8.4.2).
	grace        bool
	graceEnd     time.Time
	reclaim      map[string]*reclaimEntry // owner ID -> pre-restart record
	pruneRecords bool                     // records of non-returning clients still stored
}

type ownerEntry struct {
	confirmed   *client
	unconfirmed *client
}

type reclaimEntry struct {
	rec  clientRecord
	done bool // RECLAIM_COMPLETE received from its new incarnation
}

// NewManager builds a Manager, loading persisted client records from
// cfg.Store. If any exist, the Manager starts in the grace period, which
// lasts one lease time or until every previous client has sent
// RECLAIM_COMPLETE.
func NewManager(ctx context.Context, cfg Config) (*Manager, error) {
	m := &Manager{
		epoch:         cfg.Epoch,
		lease:         cfg.LeaseTime,
		clock:         cfg.Clock,
		store:         cfg.Store,
		fore:          fillLimits(cfg.ForeLimits, DefaultForeLimits),
		back:          fillLimits(cfg.BackLimits, DefaultBackLimits),
		onPurge:       cfg.OnPurge,
		onRevoke:      cfg.OnRevokeLayout,
		onRevokeDeleg: cfg.OnRevokeDeleg,
		log:           cfg.Logger,
		clients:       make(map[ClientID]*client),
		owners:        make(map[string]*ownerEntry),
		sessions:      make(map[SessionID]*Session),
		states:        make(map[[12]byte]stateRef),
		files:         make(map[FileID]*fileState),
		reclaim:       make(map[string]*reclaimEntry),
	}
	if m.clock == nil {
		m.clock = SystemClock{}
	}
	if m.lease <= 0 {
		m.lease = 90 * time.Second
	}
	if m.log == nil {
		m.log = slog.Default()
	}
	if m.epoch == 0 {
		m.epoch = uint32(m.clock.Now().Unix())
	}
	if _, err := rand.Read(m.salt[:]); err != nil {
		return nil, fmt.Errorf("state: random salt: %w", err)
	}
	if m.store != nil {
		err := m.store.Clients(ctx, func(key, rec []byte) error {
			r, err := unmarshalClientRecord(rec)
			if err != nil {
				m.log.Warn("nfs4 state: skipping unreadable client record", "key", fmt.Sprintf("%x", key), "err", err)
				return nil
			}
			m.reclaim[string(r.Owner)] = &reclaimEntry{rec: r}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("state: loading client records: %w", err)
		}
	}
	if len(m.reclaim) > 0 {
		m.grace = true
		m.graceEnd = m.clock.Now().Add(m.lease)
		m.pruneRecords = true
		m.log.Info("nfs4 state: grace period started", "clients", len(m.reclaim), "until", m.graceEnd, "epoch", m.epoch)
	}
	return m, nil
}

func fillLimits(c, def ChannelAttrs) ChannelAttrs {
	if c.MaxRequestSize == 0 {
		c.MaxRequestSize = def.MaxRequestSize
	}
	if c.MaxResponseSize == 0 {
		c.MaxResponseSize = def.MaxResponseSize
	}
	if c.MaxResponseSizeCached == 0 {
		c.MaxResponseSizeCached = def.MaxResponseSizeCached
	}
	if c.MaxOperations == 0 {
		c.MaxOperations = def.MaxOperations
	}
	if c.MaxRequests == 0 {
		c.MaxRequests = def.MaxRequests
	}
	return c
}

// Epoch returns the boot epoch of this Manager.
func (m *Manager) Epoch() uint32 { return m.epoch }

// LeaseTime returns the lease period (the fattr4 lease_time value).
func (m *Manager) LeaseTime() time.Duration { return m.lease }

// newStateid mints a fresh stateid of type t with seqid 1. Caller holds mu.
func (m *Manager) newStateid(t StateType) Stateid {
	m.nextState++
	var s Stateid
	s.Seqid = 1
	binary.BigEndian.PutUint32(s.Other[0:4], m.epoch)
	s.Other[4] = byte(t)
	copy(s.Other[5:8], m.salt[:])
	binary.BigEndian.PutUint32(s.Other[8:12], m.nextState)
	return s
}

// expiredSet remembers a bounded number of stateids revoked by lease
// expiry so that later use yields pnfs.ErrExpired rather than pnfs.ErrBadStateid.
type expiredSet struct {
	ring []([12]byte)
	next int
	set  map[[12]byte]struct{}
}

const expiredSetSize = 1024

func (e *expiredSet) add(o [12]byte) {
	if e.set == nil {
		e.set = make(map[[12]byte]struct{})
		e.ring = make([][12]byte, 0, expiredSetSize)
	}
	if len(e.ring) < expiredSetSize {
		e.ring = append(e.ring, o)
	} else {
		delete(e.set, e.ring[e.next])
		e.ring[e.next] = o
		e.next = (e.next + 1) % expiredSetSize
	}
	e.set[o] = struct{}{}
}

func (e *expiredSet) has(o [12]byte) bool {
	_, ok := e.set[o]
	return ok
}
