package clienttest

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shoalfs/shoal/client"
)

// dropProxy forwards TCP between a client and a server and, when armed,
// swallows the next RPC reply from the server and cuts the connection. The
// server has then executed the request but the client never heard back:
// exactly the case the session reply cache exists for.
type dropProxy struct {
	ln      net.Listener
	target  string
	armed   atomic.Bool
	dropped atomic.Int64

	mu    sync.Mutex
	conns []net.Conn
	wg    sync.WaitGroup
}

func newDropProxy(t *testing.T, target string) *dropProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &dropProxy{ln: ln, target: target}
	p.wg.Add(1)
	go p.acceptLoop()
	t.Cleanup(p.close)
	return p
}

func (p *dropProxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conns == nil {
		return false
	}
	p.conns = append(p.conns, cs...)
	return true
}

func (p *dropProxy) acceptLoop() {
	defer p.wg.Done()
	p.mu.Lock()
	p.conns = []net.Conn{}
	p.mu.Unlock()
	for {
		cc, err := p.ln.Accept()
		if err != nil {
			return
		}
		sc, err := net.DialTimeout("tcp", p.target, 10*time.Second)
		if err != nil {
			cc.Close()
			continue
		}
		if !p.track(cc, sc) {
			cc.Close()
			sc.Close()
			return
		}
		p.wg.Add(2)
		go func() {
			defer p.wg.Done()
			_, _ = io.Copy(sc, cc)
			sc.Close()
			cc.Close()
		}()
		go func() {
			defer p.wg.Done()
			defer cc.Close()
			defer sc.Close()
			for {
				rec, err := readRecord(sc)
				if err != nil {
					return
				}
				if p.armed.CompareAndSwap(true, false) {
					p.dropped.Add(1)
					return
				}
				if _, err := cc.Write(rec); err != nil {
					return
				}
			}
		}()
	}
}

// readRecord reads one record-marked RPC message, marks included.
func readRecord(r io.Reader) ([]byte, error) {
	var out []byte
	for {
		var mark [4]byte
		if _, err := io.ReadFull(r, mark[:]); err != nil {
			return nil, err
		}
		v := binary.BigEndian.Uint32(mark[:])
		n := int(v & 0x7fffffff)
		if n > 64<<20 {
			return nil, errors.New("record too large")
		}
		frag := make([]byte, 4+n)
		copy(frag, mark[:])
		if _, err := io.ReadFull(r, frag[4:]); err != nil {
			return nil, err
		}
		out = append(out, frag...)
		if v&0x80000000 != 0 {
			return out, nil
		}
	}
}

func (p *dropProxy) close() {
	p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
	p.wg.Wait()
}

// RunReplay checks exactly-once execution across a lost reply: for each
// non-idempotent operation, the server executes it, the reply is lost with
// the connection, and the client must reconnect, replay the request with
// the same slot and sequence id, and get the original reply from the
// server's reply cache. Executing the request again would fail (EEXIST,
// ENOENT), so success proves the replay was answered from the cache.
func RunReplay(t *testing.T, addr string, opts client.Options) {
	p := newDropProxy(t, addr)
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	defer cancel()
	c, err := client.Dial(ctx, p.ln.Addr().String(), opts)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	e := &env{c: c, ctx: ctx, dir: "/clienttest-replay-" + time.Now().Format("150405.000000000")}
	if err := c.Mkdir(ctx, e.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	defer c.RemoveAll(context.Background(), e.dir)
	var f *client.File
	steps := []struct {
		name string
		fn   func() error
	}{
		{"mkdir", func() error { return c.Mkdir(ctx, e.path("d"), 0o755) }},
		{"rename", func() error { return c.Rename(ctx, e.path("d"), e.path("e")) }},
		{"remove", func() error { return c.Remove(ctx, e.path("e")) }},
		{"exclusive-create", func() (err error) {
			f, err = c.Open(ctx, e.path("f"), os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o644)
			return err
		}},
		{"link", func() error { return c.Link(ctx, e.path("f"), e.path("g")) }},
		{"symlink", func() error { return c.Symlink(ctx, "f", e.path("s")) }},
		{"lock", func() error { return f.Lock(ctx, 0, 10, true, false) }},
		{"unlock", func() error { return f.Unlock(ctx, 0, 10) }},
		{"close", func() error { return f.Close() }},
	}
	for i, s := range steps {
		p.armed.Store(true)
		if err := s.fn(); err != nil {
			t.Fatalf("%s with its reply lost: %v", s.name, err)
		}
		if p.armed.Load() || p.dropped.Load() != int64(i+1) {
			t.Fatalf("%s: the proxy did not drop its reply", s.name)
		}
	}
	if st := c.Stats(); st.Reconnects < uint64(len(steps)) {
		t.Fatalf("stats %+v: want at least %d reconnects", st, len(steps))
	}
}
