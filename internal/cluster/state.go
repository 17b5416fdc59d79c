package cluster

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
)

// stateVersion is the format version of the registry's record. Version 1
// (stripe indexes) predates per-file stripe maps and is not read.
const stateVersion = 2

// registryState is the registry's persistent record. Liveness is not kept:
// after a restart every DS is out of service until it registers again.
type registryState struct {
	Version     int           `json:"version"`
	ClusterID   string        `json:"cluster_id"`
	DataServers []memberState `json:"data_servers"`
}

type memberState struct {
	ID    string   `json:"id"`
	Addrs []string `json:"addrs,omitempty"`
	State State    `json:"state"`
}

// memStore is the StateStore of a registry without one.
type memStore struct{ rec []byte }

func (s *memStore) Load(context.Context) ([]byte, error)   { return s.rec, nil }
func (s *memStore) Save(_ context.Context, b []byte) error { s.rec = b; return nil }

// load reads the record, if any, into the (not yet started) registry.
func (r *Registry) load(ctx context.Context) error {
	if r.cfg.Store == nil {
		r.cfg.Store = &memStore{}
	}
	b, err := r.cfg.Store.Load(ctx)
	if err != nil {
		return fmt.Errorf("cluster: registry record: %w", err)
	}
	if b == nil {
		return nil
	}
	var st registryState
	if err := json.Unmarshal(b, &st); err != nil {
		return fmt.Errorf("cluster: registry record: %w", err)
	}
	if st.Version != stateVersion {
		return fmt.Errorf("cluster: registry record: version %d, this MDS reads %d", st.Version, stateVersion)
	}
	id, err := hex.DecodeString(st.ClusterID)
	if err != nil || len(id) != 16 {
		return fmt.Errorf("cluster: registry record: bad cluster id %q", st.ClusterID)
	}
	r.clusterID = id
	for _, ms := range st.DataServers {
		switch ms.State {
		case Active, Draining, Drained, Removed:
		default:
			return fmt.Errorf("cluster: registry record: data server %q in unknown state %q", ms.ID, ms.State)
		}
		if ms.ID == "" || len(ms.ID) > 255 || r.byID[ms.ID] != nil {
			return fmt.Errorf("cluster: registry record: bad or repeated data server %q", ms.ID)
		}
		m := &member{ds: DataServer{ID: ms.ID, Addrs: ms.Addrs, State: ms.State, Since: r.started}}
		r.byID[ms.ID] = m
		r.ordered = append(r.ordered, m)
	}
	return nil
}

// saveLocked writes the record durably.
func (r *Registry) saveLocked(ctx context.Context) error {
	st := registryState{Version: stateVersion, ClusterID: hex.EncodeToString(r.clusterID)}
	for _, m := range r.ordered {
		st.DataServers = append(st.DataServers, memberState{ID: m.ds.ID, Addrs: slices.Clone(m.ds.Addrs), State: m.ds.State})
	}
	b, err := json.Marshal(&st)
	if err != nil {
		return err
	}
	if err := r.cfg.Store.Save(ctx, b); err != nil {
		return fmt.Errorf("cluster: registry record: %w", err)
	}
	return nil
}
