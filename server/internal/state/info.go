package state

import (
	"bytes"
	"cmp"
	"slices"
	"time"
)

// ClientInfo describes one client record as it is now, for status pages
// and tools. It is a copy: nothing in it changes with the Manager.
type ClientInfo struct {
	ID ClientID
	// Owner is the client's co_ownerid; Principal the credential it
	// presented at EXCHANGE_ID.
	Owner     []byte
	Principal string
	// Confirmed is false between EXCHANGE_ID and the first CREATE_SESSION.
	Confirmed bool
	// LeaseExpires is when the client's state is purged unless it renews
	// its lease (any SEQUENCE) before.
	LeaseExpires time.Time
	Sessions     []SessionInfo // by ID
	// Opens counts open stateids, LockOwners lock-owners, Layouts the
	// files it holds a layout of and Recalling those being recalled.
	Opens, LockOwners, Layouts, Recalling int
}

// SessionInfo describes one session of a client.
type SessionInfo struct {
	ID SessionID
	// Conns are the transport connections bound to the session, as the
	// server passed them to BindConnToSession and CreateSession.
	Conns []any
}

// Clients returns every client record, confirmed or not, by ID.
func (m *Manager) Clients() []ClientInfo {
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := make([]ClientInfo, 0, len(m.clients))
	for _, c := range m.clients {
		ci := ClientInfo{
			ID:           c.id,
			Owner:        bytes.Clone(c.owner),
			Principal:    c.principal,
			Confirmed:    c.confirmed,
			LeaseExpires: time.Unix(0, c.lastRenew.Load()).Add(m.lease),
			Opens:        len(c.opens),
			LockOwners:   len(c.lockOwners),
			Layouts:      len(c.layouts),
		}
		for _, l := range c.layouts {
			if l.recalling {
				ci.Recalling++
			}
		}
		for _, s := range c.sessions {
			// Manager.mu before Session.mu, the documented order.
			s.mu.Lock()
			conns := slices.Clone(s.connOrder)
			s.mu.Unlock()
			ci.Sessions = append(ci.Sessions, SessionInfo{ID: s.id, Conns: conns})
		}
		slices.SortFunc(ci.Sessions, func(a, b SessionInfo) int { return bytes.Compare(a.ID[:], b.ID[:]) })
		out = append(out, ci)
	}
	slices.SortFunc(out, func(a, b ClientInfo) int { return cmp.Compare(a.ID, b.ID) })
	return out
}
