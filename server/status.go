package server

import (
	"fmt"
	"net"
	"slices"
	"time"
)

// EventKind names something that happened to a client's state that an
// operator wants to see (the MDS's status page lists recent events).
type EventKind string

// Event kinds.
const (
	// EventLayoutRecall: a CB_LAYOUTRECALL went to a client, for one file
	// (Event.Ino) or for all its layouts (Ino 0: a data server joined or
	// left). A recall that is not answered is sent again every second.
	EventLayoutRecall EventKind = "layout recall"
	// EventFence: the client did not return recalled layouts within a
	// lease; they were revoked and the data servers refuse its I/O.
	EventFence EventKind = "fence"
	// EventUnfence: a fenced client got a new layout; the data servers
	// serve it again.
	EventUnfence EventKind = "unfence"
	// EventClientPurged: the client's state was discarded (Event.Reason:
	// its lease expired, it rebooted, or it destroyed its client ID).
	EventClientPurged EventKind = "client purged"
	// EventDelegRecall: a CB_RECALL of the client's delegation of a file
	// (Event.Ino) went out, because another client's operation conflicts
	// with it; resent every second while the operation is retried.
	EventDelegRecall EventKind = "delegation recall"
	// EventDelegRevoke: the client did not return a recalled delegation
	// within a lease; it was revoked.
	EventDelegRevoke EventKind = "delegation revoke"
)

// Event is one entry of the server's recent history, reported through
// Config.OnEvent.
type Event struct {
	Time     time.Time
	Kind     EventKind
	ClientID uint64
	Ino      uint64 // the file of a layout or delegation recall; 0 for all of them
	Reason   string // why a client was purged
}

// event reports e through Config.OnEvent, if set.
func (s *Server) event(e Event) {
	if s.cfg.OnEvent == nil {
		return
	}
	e.Time = time.Now()
	s.cfg.OnEvent(e)
}

// ClientInfo describes one NFS client of the server (Server.Clients).
type ClientInfo struct {
	ID uint64
	// Owner is the client's co_ownerid (the Linux client puts its host
	// name there); Principal is its credential at EXCHANGE_ID.
	Owner     []byte
	Principal string
	// Addrs are the remote addresses of the connections bound to its
	// sessions.
	Addrs     []string
	Confirmed bool
	// LeaseExpires is when its state goes unless it renews the lease.
	LeaseExpires time.Time
	Sessions     []string // session IDs, in hex
	// Opens counts its open files, Layouts the files it holds a layout
	// of, Recalling those being recalled from it.
	Opens, Layouts, Recalling int
	// Fenced is set while the data servers refuse its I/O (its layouts
	// were revoked; a metadata server only).
	Fenced bool
}

// Clients returns the server's clients by ID.
func (s *Server) Clients() []ClientInfo {
	infos := s.st.m.Clients()
	fenced := s.pnfs.fencedClients()
	out := make([]ClientInfo, 0, len(infos))
	for _, ci := range infos {
		c := ClientInfo{
			ID: uint64(ci.ID), Owner: ci.Owner, Principal: ci.Principal, Confirmed: ci.Confirmed,
			LeaseExpires: ci.LeaseExpires, Opens: ci.Opens, Layouts: ci.Layouts, Recalling: ci.Recalling,
			Fenced: fenced[ci.ID],
		}
		for _, si := range ci.Sessions {
			c.Sessions = append(c.Sessions, fmt.Sprintf("%x", si.ID[:]))
			for _, conn := range si.Conns {
				// The server binds its *rpc.Conn; anything with an
				// address will do.
				if rc, ok := conn.(interface{ RemoteAddr() net.Addr }); ok {
					if a := rc.RemoteAddr().String(); !slices.Contains(c.Addrs, a) {
						c.Addrs = append(c.Addrs, a)
					}
				}
			}
		}
		slices.Sort(c.Addrs)
		out = append(out, c)
	}
	return out
}
