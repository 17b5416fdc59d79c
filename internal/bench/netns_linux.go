package bench

import (
	"context"
	"fmt"
	"path/filepath"
	"runtime"

	"golang.org/x/sys/unix"

	"github.com/shoalfs/shoal/client"
)

// dialIn dials a client from inside the named network namespace: the
// calling goroutine's thread enters it for the dial only, and the socket
// keeps the namespace for its whole life. The harness uses it for its
// own (directory-making) client on a testbed, whose addresses exist only
// inside the testbed's namespaces. A reconnect would dial from the host's
// namespace and fail, which for these few short calls is acceptable.
func dialIn(ctx context.Context, ns, addr string, opts client.Options) (*client.Client, error) {
	if ns == "" {
		return client.Dial(ctx, addr, opts)
	}
	type result struct {
		c   *client.Client
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{err: fmt.Errorf("open current netns: %w", err)}
			return
		}
		defer unix.Close(orig)
		target, err := unix.Open(filepath.Join("/run/netns", ns), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{err: fmt.Errorf("open netns %s: %w", ns, err)}
			return
		}
		defer unix.Close(target)
		if err := unix.Setns(target, unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			ch <- result{err: fmt.Errorf("enter netns %s: %w", ns, err)}
			return
		}
		c, derr := client.Dial(ctx, addr, opts)
		if err := unix.Setns(orig, unix.CLONE_NEWNET); err != nil {
			// The thread stays locked and is discarded when this
			// goroutine ends.
			if c != nil {
				c.Close()
			}
			ch <- result{err: fmt.Errorf("leave netns %s: %w", ns, err)}
			return
		}
		runtime.UnlockOSThread()
		ch <- result{c, derr}
	}()
	r := <-ch
	return r.c, r.err
}
