package wiring

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shoalfs/shoal/internal/statuspage"
	"github.com/shoalfs/shoal/meta"
)

// snapshotUntil polls the MDS's status source until cond holds of a
// snapshot, and returns it.
func snapshotUntil(t *testing.T, c *Cluster, what string, cond func(*statuspage.Snapshot) bool) *statuspage.Snapshot {
	t.Helper()
	var s *statuspage.Snapshot
	waitFor(t, what, func() bool {
		var err error
		if s, err = c.MDS.StatusSource().Snapshot(ctxT(t)); err != nil {
			t.Fatal(err)
		}
		return cond(s)
	})
	return s
}

func hasEvent(s *statuspage.Snapshot, kind, subject, detail string) bool {
	return slices.ContainsFunc(s.Events, func(e statuspage.Event) bool {
		return e.Kind == kind && e.Subject == subject && strings.Contains(e.Detail, detail)
	})
}

// TestStatusSource follows a cluster through the status page's source: the
// data servers in service with what they hold, then one of them dying.
func TestStatusSource(t *testing.T) {
	c := startCluster(t, 3, 30*time.Second)
	s := snapshotUntil(t, c, "three data servers joined", func(s *statuspage.Snapshot) bool {
		return len(s.DataServers) == 3 && hasEvent(s, "mds started", c.MDS.Addr.String(), "")
	})
	if s.MDS != c.MDS.Addr.String() || s.ClusterID != fmt.Sprintf("%x", c.MDS.Registry.ClusterID()) || len(s.Warnings) != 0 {
		t.Errorf("snapshot %+v", s)
	}
	for i, d := range c.DS {
		ds := s.DataServers[i]
		if ds.ID != d.Agent.ID() || !ds.Up || ds.State != "active" || ds.Capacity == 0 || ds.Addrs[0] != d.Addr.String() {
			t.Errorf("data server %d: %+v", i, ds)
		}
		if !hasEvent(s, "ds joined", ds.ID, ds.Addrs[0]) {
			t.Errorf("no event of %s joining in %+v", ds.ID, s.Events)
		}
	}

	// A file over every data server (1 MiB stripe unit).
	nd, _, err := c.MDS.Server.Meta().Create(ctxT(t), meta.RootIno, "f", meta.CreateArgs{Type: meta.TypeRegular, Mode: 0o644}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	f, err := c.MDS.Striped.Open(uint64(nd.Ino), true)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	data := make([]byte, 3<<20)
	if _, err := f.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	// Bytes held come from the files' sizes, which a client's
	// LAYOUTCOMMIT would set.
	if _, err := c.MDS.Server.Meta().SetAttr(ctxT(t), nd.Ino, meta.SetAttr{Mask: meta.SetSize, Size: uint64(len(data))}, time.Now()); err != nil {
		t.Fatal(err)
	}
	snapshotUntil(t, c, "bytes held", func(s *statuspage.Snapshot) bool {
		var held uint64
		for _, d := range s.DataServers {
			held += d.Bytes
		}
		return held == uint64(len(data)) && s.Files.Placed == 1
	})

	// A data server dies: the page shows it down at once, and the file
	// unavailable.
	dead := c.DS[1].Agent.ID()
	if err := c.DS[1].Close(); err != nil {
		t.Fatal(err)
	}
	c.DS[1] = nil
	// The registry's state and its events reach the page by different
	// paths (a snapshot reads the state; subscribers hear the events after
	// it changed), so the wait is for both.
	s = snapshotUntil(t, c, "the data server down", func(s *statuspage.Snapshot) bool {
		return !s.DataServers[1].Up && s.Files.UnavailableCount == 1 && hasEvent(s, "ds left", dead, "")
	})
	if !hasEvent(s, "ds left", dead, "") || s.Events[0].Kind != "ds left" {
		t.Errorf("events %+v, want %s leaving first", s.Events, dead)
	}
	if u := s.Files.Unavailable; len(u) != 1 || u[0].Ino != uint64(nd.Ino) || !slices.Equal(u[0].Down, []string{dead}) {
		t.Errorf("unavailable files %+v", u)
	}
	if d := s.DataServers[1]; d.ReadRate != 0 || d.WriteRate != 0 {
		t.Errorf("a dead data server's throughput: %+v", d)
	}
}
