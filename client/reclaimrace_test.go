package client_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/shoalfs/shoal/client"
	"github.com/shoalfs/shoal/internal/wiring"
	"github.com/shoalfs/shoal/meta/etcdtest"
	"github.com/shoalfs/shoal/server"
)

// failoverPair starts a metadata server on embedded etcd and returns its
// address, a free address for its successor, and takeover, which stops
// the first and starts a second on that address over the same etcd
// prefix (a new server instance: every stateid of the first is stale).
func failoverPair(t *testing.T) (first, second string, takeover func()) {
	t.Helper()
	etcd := etcdtest.Start(t, 1, etcdtest.Options{NoFsync: true})
	metaURL := "etcd://" + etcd.Endpoints[0] + "/reclaimrace"
	dir := t.TempDir()
	noSquash := false
	start := func(name, listen string) *wiring.MDS {
		t.Helper()
		m, err := wiring.StartMDS(wiring.MDSConfig{
			Listen: listen, Dir: filepath.Join(dir, name), MetaURL: metaURL,
			JoinSecretFile: filepath.Join(dir, wiring.JoinSecretName),
			Exports:        []*server.Export{{Path: "/", RootSquash: &noSquash}},
			Lease:          5 * time.Second, Logger: quietLogger(),
		})
		if err != nil {
			t.Fatalf("start %s on %s: %v", name, listen, err)
		}
		return m
	}
	mds := start("mds1", "127.0.0.1:0")
	t.Cleanup(func() { mds.Close() })
	second = freeAddr(t)
	return mds.Addr.String(), second, func() {
		mds.Close()
		mds = start("mds2", second)
	}
}

// TestOpenMissedByRecovery: a File whose open a recovery did not reclaim
// (its OPEN was answered by the replaced server instance after the
// recovery had collected the Files to reclaim, as happened under a
// SIGSTOP of the leading MDS) holds a stateid the new instance refuses
// with NFS4ERR_STALE_STATEID. The application must not see that: the
// File's reads and writes reopen it and go on, and Close succeeds.
func TestOpenMissedByRecovery(t *testing.T) {
	first, second, takeover := failoverPair(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	c := dialOpts(t, first+","+second, client.Options{DialTimeout: 10 * time.Second, Logger: quietLogger()})
	// Another File of the Client, which the recovery reclaims: the
	// failover must be seen and recovered from before the missed one's
	// I/O, as in the race.
	other, err := c.Open(ctx, "/other", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	for _, tc := range []struct {
		name   string
		create bool
		io     func(f *client.File) error
		want   string // the file's contents afterwards
	}{
		{"write after an exclusive create", true, func(f *client.File) error {
			_, err := f.Write([]byte("written after the failover"))
			return err
		}, "written after the failover"},
		{"read", false, func(f *client.File) error {
			b := make([]byte, 5)
			if _, err := f.ReadAt(b, 0); err != nil {
				return err
			}
			if string(b) != "hello" {
				return fmt.Errorf("read %q, want %q", b, "hello")
			}
			return nil
		}, "hello"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := "/" + filepath.Base(t.Name())
			flag := os.O_RDONLY
			if tc.create {
				flag = os.O_CREATE | os.O_EXCL | os.O_WRONLY
			} else {
				writeAll(t, ctx, c, path, []byte(tc.want))
			}
			f, err := c.Open(ctx, path, flag, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			restore := client.HideFromRecovery(c, f)
			recoveries := c.Stats().Recoveries
			takeover()
			if _, err := other.WriteAt([]byte("x"), 0); err != nil {
				t.Fatalf("write through a reclaimed File after the failover: %v", err)
			}
			if st := c.Stats(); st.Recoveries == recoveries {
				t.Fatalf("no recovery after the failover: %+v", st)
			}
			restore()
			if err := tc.io(f); err != nil {
				t.Errorf("I/O through the File the recovery missed: %v", err)
			}
			if err := f.Close(); err != nil {
				t.Errorf("close: %v", err)
			}
			g, err := c.Open(ctx, path, os.O_RDONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			checkRead(t, g, []byte(tc.want))
		})
	}
}

// lateProxy returns a loopback address where nothing listens until
// start is called; from then on it forwards connections to target. A
// client given the address alone cannot reach target before start.
func lateProxy(t *testing.T, target string) (addr string, start func()) {
	t.Helper()
	addr = freeAddr(t)
	var (
		mu    sync.Mutex
		conns []net.Conn
		wg    sync.WaitGroup
	)
	t.Cleanup(func() {
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return addr, func() {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("proxy on %s: %v", addr, err)
		}
		t.Cleanup(func() { ln.Close() })
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				in, err := ln.Accept()
				if err != nil {
					return
				}
				out, err := net.Dial("tcp", target)
				if err != nil {
					in.Close()
					continue
				}
				mu.Lock()
				conns = append(conns, in, out)
				mu.Unlock()
				wg.Add(2)
				go func() { defer wg.Done(); io.Copy(out, in); out.Close() }()
				go func() { defer wg.Done(); io.Copy(in, out); in.Close() }()
			}
		}()
	}
}

// TestLockLostAfterGrace: a client that comes back to the new metadata
// server only after its grace period (another client was served
// meanwhile) cannot reclaim its lock, which another client may then
// take. Its holder must be told: the File's I/O, Unlock and Close fail
// with ErrLockLost, rather than the lock being taken again behind its
// back, or the lock silently missing.
func TestLockLostAfterGrace(t *testing.T) {
	first, second, takeover := failoverPair(t)
	late, reachable := lateProxy(t, second)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	c := dialOpts(t, first+","+late, client.Options{DialTimeout: 10 * time.Second, Logger: quietLogger()})
	f, err := c.Open(ctx, "/locked", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Lock(ctx, 0, 10, true, false); err != nil {
		t.Fatal(err)
	}
	takeover()
	// The grace period waits for c, which cannot reach the new server,
	// for a lease; a non-reclaim LOCK is refused (NFS4ERR_GRACE, which
	// the client retries) until it ends, and then granted.
	o := dialOpts(t, second, client.Options{Logger: quietLogger()})
	of, err := o.Open(ctx, "/locked", os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer of.Close()
	if err := of.Lock(ctx, 0, 10, true, false); err != nil {
		t.Fatalf("another client's lock after the grace period: %v", err)
	}
	reachable()
	// Any call finds the new server and recovers there, too late to
	// reclaim.
	if _, err := c.Stat(ctx, "/"); err != nil {
		t.Fatalf("stat after the failover: %v", err)
	}
	if _, err := f.WriteAt([]byte("mine"), 0); !errors.Is(err, client.ErrLockLost) {
		t.Errorf("write by the holder of a lock lost in the failover: %v, want ErrLockLost", err)
	}
	if err := f.Unlock(ctx, 0, 10); !errors.Is(err, client.ErrLockLost) {
		t.Errorf("unlock of a lock lost in the failover: %v, want ErrLockLost", err)
	}
	// Reported once: the File is usable again, without the lock.
	if _, err := f.WriteAt([]byte("mine"), 0); err != nil {
		t.Errorf("write after the loss was reported: %v", err)
	}
	if err := f.Lock(ctx, 0, 10, true, false); !errors.Is(err, syscall.EAGAIN) {
		t.Errorf("lock held by the other client: %v, want EAGAIN", err)
	}
	if err := of.Unlock(ctx, 0, 10); err != nil {
		t.Fatal(err)
	}
	if err := f.Lock(ctx, 0, 10, true, false); err != nil {
		t.Errorf("lock after the other client's unlock: %v", err)
	}
	if err := f.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
}
