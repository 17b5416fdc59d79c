// Package statuspage serves the metadata server's status page: the
// cluster at a glance, for a person with a browser.
//
// The page is plain HTML rendered on the server (html/template), so it
// reads the same with JavaScript off or through curl. A few lines of
// JavaScript then poll /status.json, the same snapshot as JSON, and
// update the tables in place, so an open page follows the cluster: a data
// server that dies turns red within a poll or two. Everything it needs
// (template, script, style sheet) is embedded in the binary; there is no
// build step and nothing is fetched from elsewhere.
//
// The package knows nothing of the cluster: a [Source] hands it a
// [Snapshot], and package wiring builds one from the MDS's registry,
// administration and NFS server. That keeps the page testable with a
// fake source and the MDS free of HTTP.
//
// Routes of [Handler]:
//
//	GET /             the page
//	GET /status.json  the snapshot as JSON (the page's script reads it; so can tools)
//	GET /static/...   the script and style sheet
package statuspage

import (
	"context"
	"time"
)

// Source produces snapshots of the cluster. Snapshot is called once per
// request, so a page left open calls it every poll interval: a source
// whose data is expensive to gather caches it.
type Source interface {
	Snapshot(ctx context.Context) (*Snapshot, error)
}

// Snapshot is the cluster as the page shows it. Its JSON form is
// /status.json.
type Snapshot struct {
	Time      time.Time `json:"time"` // when it was taken; ages on the page are relative to it
	ClusterID string    `json:"cluster_id"`
	MDS       string    `json:"mds"` // the MDS's address
	// Durability is how the MDS answers metadata changes: "sync", or
	// "async" with its commit interval, and the exports that differ
	// (server.Durability).
	Durability string `json:"durability"`
	// Warnings are parts of the snapshot that could not be gathered
	// (for example the stripe-map scan when the metadata engine fails);
	// the page shows them above everything else.
	Warnings    []string     `json:"warnings,omitempty"`
	DataServers []DataServer `json:"data_servers"`
	Clients     []Client     `json:"clients"`
	// LayoutIO is what clients reported of their I/O to the data
	// servers (LAYOUTSTATS, LAYOUTRETURN), by client and data server.
	LayoutIO []LayoutIO `json:"layout_io"`
	Files    Files      `json:"files"`
	Events   []Event    `json:"events"` // newest first
	// MDSNodes are the metadata servers in the election when the
	// metadata is on etcd (leader first); empty for a single MDS.
	MDSNodes []MDSNode `json:"mds_nodes"`
	// Etcd lists the etcd members holding the metadata, as the leader
	// sees them.
	Etcd []EtcdMember `json:"etcd"`
}

// MDSNode is one metadata server of the election.
type MDSNode struct {
	Node   string `json:"node"`
	Addr   string `json:"addr"`
	Leader bool   `json:"leader"`
	Term   uint64 `json:"term"`
	// LeaseLeft is the time left on its election lease, renewed every
	// third of the lease: how recently it was seen.
	LeaseLeft time.Duration `json:"lease_left"`
}

// EtcdMember is one etcd member.
type EtcdMember struct {
	Name      string   `json:"name"`
	Endpoints []string `json:"endpoints"`
	Healthy   bool     `json:"healthy"`
	Leader    bool     `json:"leader"`
	Error     string   `json:"error,omitempty"`
}

// DataServer is one data server's row.
type DataServer struct {
	ID    string   `json:"id"`
	Addrs []string `json:"addrs"`
	State string   `json:"state"` // active, draining, drained, removed
	Up    bool     `json:"up"`
	// Since is when Up last changed; LastBeat the last heartbeat.
	Since    time.Time `json:"since"`
	LastBeat time.Time `json:"last_beat"`
	// Capacity and Free are its space, as it last reported.
	Capacity uint64 `json:"capacity"`
	Free     uint64 `json:"free"`
	// Files and Bytes are what it holds of the cluster's files.
	Files int    `json:"files"`
	Bytes uint64 `json:"bytes"`
	// ReadRate and WriteRate are its throughput in bytes per second.
	ReadRate  float64 `json:"read_rate"`
	WriteRate float64 `json:"write_rate"`
}

// Client is one NFS client of the MDS.
type Client struct {
	ID        string   `json:"id"`    // the client ID, as events name it
	Owner     string   `json:"owner"` // its co_ownerid, printable
	Principal string   `json:"principal"`
	Addrs     []string `json:"addrs"`
	Confirmed bool     `json:"confirmed"`
	Sessions  []string `json:"sessions"`
	// LeaseExpires is when its state goes unless it renews its lease.
	LeaseExpires time.Time `json:"lease_expires"`
	Opens        int       `json:"opens"`
	Layouts      int       `json:"layouts"`   // files it holds a layout of
	Recalling    int       `json:"recalling"` // of those, layouts being recalled
	Fenced       bool      `json:"fenced"`    // data servers refuse its I/O
}

// LayoutIO is what one client reported of its I/O to one data server
// through layouts, since the MDS started.
type LayoutIO struct {
	Client string `json:"client"` // the client ID, as Client.ID
	DS     string `json:"ds"`
	Read   IOStat `json:"read"`
	Write  IOStat `json:"write"`
	// Updated is when its last report came.
	Updated time.Time `json:"updated"`
}

// IOStat is one direction of a LayoutIO. Latency and Busy come from
// flexfiles clients only (ff_layoutupdate4): zero from files-layout
// clients.
type IOStat struct {
	Bytes uint64 `json:"bytes"`
	Ops   uint64 `json:"ops"`
	// Latency is the mean completion time of the operations the client
	// saw complete; Busy the time it had I/O outstanding.
	Latency      time.Duration `json:"latency"`
	Busy         time.Duration `json:"busy"`
	NotDelivered uint64        `json:"not_delivered"`
}

// Files summarizes the files' availability and replication.
type Files struct {
	Placed     int `json:"placed"`     // files with data on data servers
	Replicated int `json:"replicated"` // kept in more than one copy
	// Degraded files have a stale copy or a lost member; Unhealable ones
	// have a stripe with no good copy in service.
	Degraded    int `json:"degraded"`
	Unhealable  int `json:"unhealable"`
	StaleCopies int `json:"stale_copies"`
	// UnavailableCount counts the files with a stripe that has no good
	// copy in service: their I/O fails or waits. Unavailable lists the
	// first of them.
	UnavailableCount int               `json:"unavailable_count"`
	Unavailable      []UnavailableFile `json:"unavailable"`
}

// UnavailableFile is a file that cannot be read or written in full now.
type UnavailableFile struct {
	Ino  uint64   `json:"ino"`
	Down []string `json:"down"` // the data servers out of service it waits for
}

// Event is one line of the recent history.
type Event struct {
	Time    time.Time `json:"time"`
	Kind    string    `json:"kind"`    // "ds joined", "fence", ...
	Subject string    `json:"subject"` // what it happened to: a data server, a client
	Detail  string    `json:"detail"`
	// Count is how many identical events were merged into this one (see
	// EventLog); Time is the latest.
	Count int `json:"count"`
}

// Summary is the line of totals at the top of the page.
type Summary struct {
	DataServers, Up     int
	Capacity, Free      uint64
	ReadRate, WriteRate float64
	Clients, Layouts    int
}

// Summary adds up the snapshot's data servers and clients. Only data
// servers in service count towards capacity and throughput: a down one's
// numbers are its last report.
func (s *Snapshot) Summary() Summary {
	var sum Summary
	for _, d := range s.DataServers {
		if d.State == "removed" {
			continue
		}
		sum.DataServers++
		if !d.Up {
			continue
		}
		sum.Up++
		sum.Capacity += d.Capacity
		sum.Free += d.Free
		sum.ReadRate += d.ReadRate
		sum.WriteRate += d.WriteRate
	}
	for _, c := range s.Clients {
		sum.Clients++
		sum.Layouts += c.Layouts
	}
	return sum
}
