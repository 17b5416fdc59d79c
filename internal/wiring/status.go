package wiring

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/shoalfs/shoal/internal/cluster"
	"github.com/shoalfs/shoal/internal/statuspage"
	"github.com/shoalfs/shoal/server"
)

// statusMaxAge is how old the part of a status page snapshot that scans
// every stripe map (files held, unavailable and degraded files) may be. A
// page polls every two seconds; the scan costs a pass over the metadata,
// so it is shared by the polls within statusMaxAge, and taken again at
// once when a data server joins, leaves or changes state. Everything else
// (service, heartbeats, throughput, clients, events) is live.
const statusMaxAge = 5 * time.Second

// statusSource is the MDS's statuspage.Source.
type statusSource struct {
	m      *MDS
	events *statuspage.EventLog

	mu   sync.Mutex // held while scanning, so concurrent polls share one scan
	scan *cluster.Status
	at   time.Time
	gen  uint64 // the registry's generation the scan saw
}

var _ statuspage.Source = (*statusSource)(nil)

// StatusSource returns what the MDS's status page shows
// (statuspage.Handler serves it).
func (m *MDS) StatusSource() statuspage.Source { return m.status }

// newStatusSource starts recording m's events: the server's (recalls,
// fencing, purged clients) through the hook StartMDS installs, the
// registry's (data servers joining, leaving, changing state) here.
func newStatusSource(m *MDS, events *statuspage.EventLog) *statusSource {
	m.Registry.Subscribe(func(ev cluster.Event) { events.Add(registryEvent(ev)) })
	return &statusSource{m: m, events: events}
}

func (s *statusSource) Snapshot(ctx context.Context) (*statuspage.Snapshot, error) {
	snap := &statuspage.Snapshot{
		Time:        time.Now(),
		ClusterID:   fmt.Sprintf("%x", s.m.Registry.ClusterID()),
		MDS:         s.m.Addr.String(),
		Durability:  s.m.Server.Durability().String(),
		DataServers: []statuspage.DataServer{},
		Clients:     []statuspage.Client{},
		Events:      s.events.Events(),
		MDSNodes:    []statuspage.MDSNode{},
		Etcd:        []statuspage.EtcdMember{},
	}
	if e := s.m.elec; e != nil {
		if ha, err := e.HAStatus(ctx); err != nil {
			snap.Warnings = append(snap.Warnings, fmt.Sprintf("the MDS election is unknown: %v", err))
		} else {
			for _, n := range ha.Nodes {
				snap.MDSNodes = append(snap.MDSNodes, statuspage.MDSNode{Node: n.Node, Addr: n.Addr, Leader: n.Leader, Term: n.Term, LeaseLeft: n.LeaseLeft})
			}
			for _, m := range ha.Etcd {
				snap.Etcd = append(snap.Etcd, statuspage.EtcdMember{Name: m.Name, Endpoints: m.Endpoints, Healthy: m.Healthy, Leader: m.Leader, Error: m.Error})
			}
		}
	}
	scan, err := s.scanned(ctx)
	if err != nil {
		// The live parts are worth showing all the more.
		snap.Warnings = append(snap.Warnings, fmt.Sprintf("files and bytes held are unknown: %v", err))
		scan = &cluster.Status{}
	}
	held := map[string]cluster.DSStatus{}
	for _, d := range scan.DataServers {
		held[d.ID] = d
	}
	for _, d := range s.m.Registry.DataServers() {
		h := held[d.ID]
		snap.DataServers = append(snap.DataServers, statuspage.DataServer{
			ID: d.ID, Addrs: d.Addrs, State: string(d.State), Up: d.Up, Since: d.Since, LastBeat: d.LastBeat,
			Capacity: d.Capacity, Free: d.Free, Files: h.Files, Bytes: h.Bytes, ReadRate: d.ReadRate, WriteRate: d.WriteRate,
		})
	}
	for _, c := range s.m.Server.Clients() {
		snap.Clients = append(snap.Clients, statuspage.Client{
			ID: clientID(c.ID), Owner: printable(c.Owner), Principal: c.Principal, Addrs: c.Addrs, Confirmed: c.Confirmed,
			Sessions: c.Sessions, LeaseExpires: c.LeaseExpires, Opens: c.Opens, Layouts: c.Layouts, Recalling: c.Recalling,
			Fenced: c.Fenced,
		})
	}
	snap.LayoutIO = []statuspage.LayoutIO{}
	for _, l := range s.m.Server.LayoutStats() {
		snap.LayoutIO = append(snap.LayoutIO, statuspage.LayoutIO{
			Client: clientID(l.Client), DS: l.DS, Read: ioStat(l.Read), Write: ioStat(l.Write), Updated: l.Updated,
		})
	}
	rep := scan.Replication
	snap.Files = statuspage.Files{
		Placed: scan.Files, Replicated: rep.Files, Degraded: rep.DegradedFiles, Unhealable: rep.UnhealableFiles,
		StaleCopies: rep.StaleCopies, UnavailableCount: scan.UnavailableFiles, Unavailable: []statuspage.UnavailableFile{},
	}
	for _, f := range scan.Unavailable {
		snap.Files.Unavailable = append(snap.Files.Unavailable, statuspage.UnavailableFile{Ino: f.Ino, Down: f.Down})
	}
	return snap, nil
}

// scanned returns the stripe-map scan (Admin.Status), taking it again if
// it is older than statusMaxAge or the data servers changed since.
func (s *statusSource) scanned(ctx context.Context) (*cluster.Status, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	gen := s.m.Registry.Generation()
	if s.scan != nil && gen == s.gen && time.Since(s.at) < statusMaxAge {
		return s.scan, nil
	}
	st, err := s.m.Admin.Status(ctx)
	if err != nil {
		return nil, err
	}
	s.scan, s.at, s.gen = st, time.Now(), gen
	return st, nil
}

// ioStat is the page's form of one direction of a client's reported I/O.
func ioStat(io server.LayoutIO) statuspage.IOStat {
	return statuspage.IOStat{Bytes: io.Bytes, Ops: io.Ops, Latency: io.Latency, Busy: io.Busy, NotDelivered: io.NotDelivered}
}

// clientID prints an NFS client ID as the page and its events do.
func clientID(id uint64) string { return fmt.Sprintf("%016x", id) }

// printable shows a client owner (opaque bytes; the Linux client puts
// "Linux NFSv4.2 HOSTNAME" there) as text if it is text, else in hex.
func printable(b []byte) string {
	s := string(b)
	if strings.IndexFunc(s, func(r rune) bool { return r == unicode.ReplacementChar || !unicode.IsPrint(r) }) >= 0 {
		return fmt.Sprintf("%x", b)
	}
	return s
}

// registryEvent describes a data server's change for the event log.
func registryEvent(ev cluster.Event) statuspage.Event {
	e := statuspage.Event{Subject: ev.DS.ID}
	switch ev.Kind {
	case cluster.Joined:
		e.Kind = "ds joined"
		e.Detail = strings.Join(ev.DS.Addrs, ", ")
	case cluster.Left:
		e.Kind = "ds left"
		e.Detail = "out of service: its connection closed or its heartbeats stopped"
	case cluster.Changed:
		e.Kind = "ds state"
		e.Detail = "now " + string(ev.DS.State)
	default:
		e.Kind = ev.Kind.String()
	}
	return e
}

// serverEvent describes a server's event for the event log.
func serverEvent(ev server.Event) statuspage.Event {
	e := statuspage.Event{Time: ev.Time, Kind: string(ev.Kind), Subject: clientID(ev.ClientID)}
	switch ev.Kind {
	case server.EventLayoutRecall:
		if ev.Ino == 0 {
			e.Detail = "all layouts: the data servers changed"
		} else {
			e.Detail = fmt.Sprintf("inode %d", ev.Ino)
		}
	case server.EventFence:
		e.Detail = "did not return recalled layouts within a lease: data servers refuse its I/O"
	case server.EventUnfence:
		e.Detail = "took a new layout: data servers serve it again"
	case server.EventClientPurged:
		e.Detail = "state discarded: " + ev.Reason
	}
	return e
}
