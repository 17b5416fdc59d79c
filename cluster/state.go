package cluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
)

// stateVersion is the format version of the registry's state file.
const stateVersion = 1

// registryState is the registry's persistent state: which DS ID holds
// which stripe index, and which DSes were drained. Liveness is not kept:
// after a restart every DS is out of service until it registers again.
type registryState struct {
	Version     int           `json:"version"`
	DataServers []memberState `json:"dataServers"`
}

type memberState struct {
	ID      string `json:"id"`
	Index   int    `json:"index"`
	Drained bool   `json:"drained,omitempty"`
}

// load reads the state file, if any, into the (not yet started) registry.
func (r *Registry) load() error {
	b, err := os.ReadFile(r.stateFile)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("cluster: registry state: %w", err)
	}
	var st registryState
	if err := json.Unmarshal(b, &st); err != nil {
		return fmt.Errorf("cluster: registry state %s: %w", r.stateFile, err)
	}
	if st.Version != stateVersion {
		return fmt.Errorf("cluster: registry state %s: unknown version %d", r.stateFile, st.Version)
	}
	limit := maxIndex
	if r.cfg.Width > 0 {
		limit = min(r.cfg.Width, maxIndex)
	}
	for _, ms := range st.DataServers {
		if ms.ID == "" || len(ms.ID) > 255 || ms.Index < 0 || ms.Index >= limit {
			return fmt.Errorf("cluster: registry state %s: bad entry %+v (stripe width limit %d)", r.stateFile, ms, limit)
		}
		if r.byID[ms.ID] != nil || (ms.Index < len(r.byIndex) && r.byIndex[ms.Index] != nil) {
			return fmt.Errorf("cluster: registry state %s: duplicate entry %+v", r.stateFile, ms)
		}
		for len(r.byIndex) <= ms.Index {
			r.byIndex = append(r.byIndex, nil)
		}
		m := &member{ds: DataServer{ID: ms.ID, Index: ms.Index}, drained: ms.Drained}
		r.byIndex[ms.Index] = m
		r.byID[ms.ID] = m
	}
	return nil
}

// saveLocked writes the state file atomically and durably; a no-op without
// one.
func (r *Registry) saveLocked() error {
	if r.stateFile == "" {
		return nil
	}
	st := registryState{Version: stateVersion}
	for _, m := range r.byID {
		st.DataServers = append(st.DataServers, memberState{ID: m.ds.ID, Index: m.ds.Index, Drained: m.drained})
	}
	slices.SortFunc(st.DataServers, func(a, b memberState) int { return a.Index - b.Index })
	b, err := json.MarshalIndent(&st, "", "\t")
	if err != nil {
		return err
	}
	dir := filepath.Dir(r.stateFile)
	tmp, err := os.CreateTemp(dir, filepath.Base(r.stateFile)+".tmp*")
	if err != nil {
		return fmt.Errorf("cluster: registry state: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		tmp.Close()
		return fmt.Errorf("cluster: registry state: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("cluster: registry state: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("cluster: registry state: %w", err)
	}
	if err := os.Rename(tmp.Name(), r.stateFile); err != nil {
		return fmt.Errorf("cluster: registry state: %w", err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("cluster: registry state: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("cluster: registry state: %w", err)
	}
	return nil
}
