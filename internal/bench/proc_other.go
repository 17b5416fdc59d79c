//go:build !linux

package bench

import (
	"context"
	"errors"
	"syscall"
	"time"

	"github.com/shoalfs/shoal/client"
)

func childProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}

// dialIn dials from this process's namespace: network namespaces are
// Linux only.
func dialIn(ctx context.Context, ns, addr string, opts client.Options) (*client.Client, error) {
	if ns != "" {
		return nil, errors.New("network namespaces need Linux")
	}
	return client.Dial(ctx, addr, opts)
}

// syncLatency is measured on Linux only.
func syncLatency(string) time.Duration { return 0 }
