package vip

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// leaseState is a snapshot of the supervisor's etcd lease.
type leaseState struct {
	id clientv3.LeaseID // 0: none (not granted yet, or lost)
	// deadline is the local safe deadline: the time the last successful
	// grant or keepalive was sent, plus the TTL etcd answered with. etcd
	// starts the TTL when the request arrives, which is after it was
	// sent, so the lease cannot expire in etcd before this instant (up to
	// the drift of two clocks over one TTL, which the margin covers).
	deadline time.Time
}

// keeper grants the supervisor's lease and renews it with one keepalive
// request at a time, timing each one. clientv3's KeepAlive stream is not
// used because it does not say when the request behind a response was
// sent, which is the whole point here.
type keeper struct {
	cli     *clientv3.Client
	ttl     time.Duration
	every   time.Duration // renewal period
	retry   time.Duration // pause after a failed request
	log     *slog.Logger
	m       *metrics
	changed func() // called after every change of the state

	mu sync.Mutex
	st leaseState
}

func (k *keeper) get() leaseState {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.st
}

func (k *keeper) set(st leaseState) {
	k.mu.Lock()
	k.st = st
	k.mu.Unlock()
	k.changed()
}

// run keeps a lease until ctx ends; it does not revoke it (revoke does).
func (k *keeper) run(ctx context.Context) {
	for ctx.Err() == nil {
		st := k.get()
		if st.id == 0 {
			sent := time.Now()
			rctx, cancel := context.WithTimeout(ctx, k.every)
			resp, err := k.cli.Grant(rctx, int64(k.ttl/time.Second))
			cancel()
			if err != nil {
				k.m.renewErrors.Inc()
				k.log.Warn("vip: grant etcd lease", "err", err)
				sleep(ctx, k.retry)
				continue
			}
			k.log.Debug("vip: etcd lease granted", "lease", int64(resp.ID), "ttl", resp.TTL)
			k.set(leaseState{id: resp.ID, deadline: sent.Add(time.Duration(resp.TTL) * time.Second)})
			sleep(ctx, time.Until(sent.Add(k.every)))
			continue
		}
		sent := time.Now()
		rctx, cancel := context.WithTimeout(ctx, k.every)
		resp, err := k.cli.KeepAliveOnce(rctx, st.id)
		cancel()
		switch {
		case errors.Is(err, rpctypes.ErrLeaseNotFound):
			// Expired in etcd (after a partition longer than the TTL)
			// or revoked by hand: the claim key went with it.
			k.log.Warn("vip: etcd lease lost", "lease", int64(st.id))
			k.set(leaseState{})
		case err != nil:
			if ctx.Err() != nil {
				return
			}
			k.m.renewErrors.Inc()
			k.log.Warn("vip: renew etcd lease", "lease", int64(st.id), "err", err,
				"deadline_in", time.Until(st.deadline).Round(time.Millisecond))
			sleep(ctx, k.retry)
		default:
			k.set(leaseState{id: st.id, deadline: sent.Add(time.Duration(resp.TTL) * time.Second)})
			// Renewals are spaced from one send to the next, so that a
			// slow answer does not push the next renewal closer to the
			// deadline.
			sleep(ctx, time.Until(sent.Add(k.every)))
		}
	}
}

// revoke gives the lease back, so that the claim key goes at once rather
// than when the TTL runs out.
func (k *keeper) revoke(ctx context.Context) {
	st := k.get()
	if st.id == 0 {
		return
	}
	if _, err := k.cli.Revoke(ctx, st.id); err != nil {
		k.log.Warn("vip: revoke etcd lease", "lease", int64(st.id), "err", err)
	}
}

// sleep waits for d or the end of ctx.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
