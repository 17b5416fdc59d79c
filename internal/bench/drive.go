package bench

import (
	"context"
	"fmt"
	"io"
	"time"
)

// clientsRun is what one barrier-synchronised phase of client processes
// produced: their results, the wall time from "go" to the last result,
// the servers' CPU time by role over that window and how busy the whole
// machine was.
type clientsRun struct {
	Results []ClientResult
	Window  time.Duration
	// RoleCPU is nil when the servers' CPU could not be read.
	RoleCPU map[string]float64
	// Busy is the machine-wide CPU use in [0,1] over the window, -1 if
	// unknown.
	Busy float64
	// First and Last are the earliest start and latest end of the
	// clients' timed regions (Unix ns); ClientCPU the sum of their CPU
	// seconds, -1 if any is unknown.
	First, Last int64
	ClientCPU   float64
}

// span is the phase's duration as IOR computes it, earliest start to
// latest end.
func (r *clientsRun) span() float64 {
	return max(time.Duration(r.Last-r.First).Seconds(), 1e-9)
}

// runClients launches one client per spec, waits until every one is ready
// (the barrier), starts them together and collects their results. A client
// that reports an error fails the phase.
func runClients(ctx context.Context, launcher ClientLauncher, ep *ClusterEndpoint, specs []ClientSpec, timeout time.Duration, bar *progressBar) (*clientsRun, error) {
	ctx, cancel := context.WithTimeout(ctx, clientReadyTimeout+timeout)
	defer cancel()
	clients := make([]*clientConn, 0, len(specs))
	defer func() {
		for _, cc := range clients {
			cc.close()
		}
	}()
	for i, spec := range specs {
		h, err := launcher.Launch(ctx, spec)
		if err != nil {
			return nil, fmt.Errorf("launch client %d: %w", i, err)
		}
		clients = append(clients, newClientConn(h))
	}
	rctx, rcancel := context.WithTimeout(ctx, clientReadyTimeout)
	defer rcancel()
	for i, cc := range clients {
		m, err := cc.next(rctx)
		if err != nil {
			return nil, fmt.Errorf("client %d not ready: %w", i, err)
		}
		if m.Error != "" {
			return nil, fmt.Errorf("client %d: %s", i, m.Error)
		}
		if !m.Ready {
			return nil, fmt.Errorf("client %d: expected a ready message, got %+v", i, m)
		}
	}

	cpu0, ok0 := ep.cpuByRole()
	busy0, bok0 := machineCPU()
	t0 := time.Now()
	bar.phaseStart(t0)
	defer bar.phaseEnd()
	for i, cc := range clients {
		if _, err := io.WriteString(cc.h.In, "go\n"); err != nil {
			return nil, fmt.Errorf("start client %d: %w", i, err)
		}
	}
	out := &clientsRun{Results: make([]ClientResult, len(clients)), Busy: -1}
	for i, cc := range clients {
		m, err := cc.next(ctx)
		if err != nil {
			return nil, fmt.Errorf("client %d: %w", i, err)
		}
		if m.Result == nil {
			return nil, fmt.Errorf("client %d: no result: %+v", i, m)
		}
		if m.Result.Error != "" {
			return nil, fmt.Errorf("client %d: %s", i, m.Result.Error)
		}
		out.Results[i] = *m.Result
	}
	out.Window = time.Since(t0)
	cpu1, ok1 := ep.cpuByRole()
	busy1, bok1 := machineCPU()
	if ok0 && ok1 {
		out.RoleCPU = map[string]float64{}
		for role, c := range cpu1 {
			out.RoleCPU[role] = (c - cpu0[role]).Seconds()
		}
	}
	if bok0 && bok1 {
		out.Busy = busy1.since(busy0)
	}
	for i, res := range out.Results {
		if i == 0 || res.StartNS < out.First {
			out.First = res.StartNS
		}
		if i == 0 || res.EndNS > out.Last {
			out.Last = res.EndNS
		}
		if res.CPUSeconds < 0 || out.ClientCPU < 0 {
			out.ClientCPU = -1
		} else {
			out.ClientCPU += res.CPUSeconds
		}
	}
	// The clients have reported; wait for them to exit cleanly.
	for i, cc := range clients {
		if err := cc.close(); err != nil {
			return out, fmt.Errorf("client %d: %w", i, err)
		}
	}
	return out, nil
}
