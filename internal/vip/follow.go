package vip

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// follow keeps a reader of etcd state current: it calls read, which
// fetches the state and returns the revision it read at, then watches key
// (a prefix if prefix) from the next revision and calls read again after
// every batch of events, and every timeout in any case. Watching from the
// revision read closes the gap in
// which a change between the read and the watch would be missed. A watch
// that fails (etcd unreachable, the member lost its quorum, compaction) is
// started over after a pause, with a fresh read.
func follow(ctx context.Context, cli *clientv3.Client, log *slog.Logger, key string, prefix bool, timeout time.Duration, read func(context.Context) (int64, error)) {
	const minPause, maxPause = 100 * time.Millisecond, 2 * time.Second
	pause := minPause
	// Each read is bounded, so that an unreachable etcd shows in the log
	// rather than as a read that waits for the connection forever.
	bounded := func() (int64, error) {
		rctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		return read(rctx)
	}
	for ctx.Err() == nil {
		rev, err := bounded()
		if err != nil {
			if ctx.Err() == nil {
				log.Warn("vip: read etcd", "key", key, "err", err)
			}
			sleep(ctx, pause)
			pause = min(2*pause, maxPause)
			continue
		}
		opts := []clientv3.OpOption{clientv3.WithRev(rev + 1)}
		if prefix {
			opts = append(opts, clientv3.WithPrefix())
		}
		// WithRequireLeader: a member cut off from its quorum ends the
		// watch instead of keeping it open and silent.
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		wch := cli.Watch(wctx, key, opts...)
		// A read every timeout as well, in case the watch is stuck
		// without failing: the state is then never older than that.
		tick := time.NewTicker(timeout)
	watch:
		for {
			select {
			case wresp, ok := <-wch:
				if !ok {
					break watch
				}
				if err := wresp.Err(); err != nil {
					log.Warn("vip: watch etcd", "key", key, "err", err)
					break watch
				}
				pause = minPause
			case <-tick.C:
			}
			if _, err := bounded(); err != nil && ctx.Err() == nil {
				log.Warn("vip: read etcd", "key", key, "err", err)
				break watch
			}
		}
		tick.Stop()
		cancel()
		sleep(ctx, pause)
		pause = min(2*pause, maxPause)
	}
}

var errBadLeader = errors.New("election value is not {\"node\":...}")

// Leader is the value a Shoal MDS campaigns with in the election: which
// node leads, where it serves, and its term. The supervisor only looks at
// Node.
type Leader struct {
	Node string `json:"node"`
	Addr string `json:"addr"`
	Term uint64 `json:"term"`
	// Serving, when present, says whether the leader already listens: an
	// MDS campaigns with false and proclaims true once its listener is
	// up, so the address does not move to a host that would answer the
	// clients' first packets with a reset (the Linux client then waits 3
	// s before it tries again). Absent means serving.
	Serving *bool `json:"serving,omitempty"`
}

// serving reports whether the leader named by l wants the address now.
func (l Leader) serving() bool { return l.Serving == nil || *l.Serving }

// readLeader returns the current leader under the election prefix: the
// value of its key with the lowest create revision, which is the rule
// concurrency.Election uses. ok is false when nobody campaigns. A value
// that is not a Leader is returned as ok with an empty Leader and an error
// wrapping errBadLeader, since someone does lead, only not in a form this
// supervisor can name.
//
// It is read this way rather than through Election.Observe because
// Observe reports only new leaders: when the leader's key goes and nobody
// else campaigns, it says nothing, and the supervisor would keep the
// address for a leader that no longer exists.
func readLeader(ctx context.Context, cli *clientv3.Client, electionPrefix string) (l Leader, ok bool, rev int64, err error) {
	resp, err := cli.Get(ctx, electionPrefix, clientv3.WithFirstCreate()...)
	if err != nil {
		return Leader{}, false, 0, fmt.Errorf("read election %s: %w", electionPrefix, err)
	}
	if len(resp.Kvs) == 0 {
		return Leader{}, false, resp.Header.Revision, nil
	}
	kv := resp.Kvs[0]
	if err := json.Unmarshal(kv.Value, &l); err != nil {
		return Leader{}, true, resp.Header.Revision, fmt.Errorf("%w: key %s: value %q: %v", errBadLeader, kv.Key, kv.Value, err)
	}
	return l, true, resp.Header.Revision, nil
}
