package cluster

import (
	"encoding/json"
	"fmt"
)

// Sweeper is the MDS's sweep of data objects no file owns (server/sweep.go:
// objects left on data servers by creates a crash of the MDS took back),
// which `shoal admin sweep` runs on demand.
type Sweeper interface {
	// StartSweep starts a sweep in the background unless one runs; it
	// reports whether it started one.
	StartSweep() bool
	// SweepState reports whether a sweep runs and the last that ended.
	SweepState() SweepState
}

// SweepState is the answer of the sweep and sweep-status admin commands.
type SweepState struct {
	// Started is true when this request started the sweep.
	Started bool `json:"started,omitempty"`
	Running bool `json:"running"`
	// Last is the report of the last sweep that ended (the server's
	// SweepReport), if any.
	Last json.RawMessage `json:"last,omitempty"`
}

// sweep answers the sweep (start) and sweep-status commands.
func (a *Admin) sweep(start bool) (*SweepState, error) {
	if a.cfg.Sweep == nil {
		return nil, fmt.Errorf("cluster: this MDS cannot sweep data objects: %w", errInval)
	}
	started := false
	if start {
		started = a.cfg.Sweep.StartSweep()
		if started {
			a.log.Info("cluster: sweep of data objects no file owns started on request")
		}
	}
	st := a.cfg.Sweep.SweepState()
	st.Started = started
	return &st, nil
}
