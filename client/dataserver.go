package client

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/shoalfs/shoal/client/layout"
	"github.com/shoalfs/shoal/internal/nfs3"
	"github.com/shoalfs/shoal/internal/nfs4"
)

// Sessions with pNFS data servers: one endpoint per data server (keyed by
// its addresses), dialled on first use, bounded in requests in flight
// (MaxPerDS), and left alone for a while after a failure so that its I/O
// goes through the metadata server meanwhile.

// errDSDown reports a data server skipped because it failed recently.
var errDSDown = errors.New("nfs: data server marked down after a failure")

// dsDown is errDSDown with the failure it follows.
type dsDown struct {
	ago   time.Duration
	cause error
}

func (e *dsDown) Error() string {
	when := "just now"
	if ago := e.ago.Round(time.Millisecond); ago > 0 {
		when = ago.String() + " ago"
	}
	return fmt.Sprintf("failed %s, not retried yet: %v", when, e.cause)
}

func (e *dsDown) Is(target error) bool { return target == errDSDown }

// errDSVersion reports a data server that speaks an NFS version this
// client has no data path for (NFSv3: flexfiles' loosely coupled data
// servers). It is the client's limit, not the data server's failure, so
// it is never reported to the metadata server.
var errDSVersion = errors.New("nfs: data server speaks an NFS version this client does not (NFSv3)")

// dataServer is one data server as one identity sees it, shared by all
// files: one session, and a bound on the requests in flight to it. A
// flexfiles layout may ask for another NFSv4 minor version than the
// metadata server's, or a synthetic AUTH_SYS identity (loose coupling):
// each such combination is its own dataServer, with its own session.
type dataServer struct {
	p     *pnfsClient
	key   string
	addrs []string
	minor uint32          // NFSv4 minor version; 0: the metadata server's
	auth  *layout.AuthSys // nil: the Client's own credential
	v3    bool            // NFSv3: no session; I/O over c3 (dataserver_v3.go)
	sem   chan struct{}

	mu        sync.Mutex // serializes dials
	cl        *endpoint
	c3        *nfs3.Client // NFSv3 data servers
	failures  int          // consecutive failures; 0 after a success
	downUntil time.Time    // no dial before this
	failedAt  time.Time    // the last failure
	lastErr   error        // ... and its error
}

// server returns the dataServer of copy c of an extent.
func (p *pnfsClient) server(c *layout.Copy) *dataServer {
	key := strings.Join(c.Addrs, ",")
	var minor uint32
	switch c.Version {
	case 4:
		minor = c.Minor
		key += fmt.Sprintf(" v4.%d", minor)
	case 3:
		key += " v3"
	}
	if c.Auth != nil {
		key += fmt.Sprintf(" as %d:%d", c.Auth.UID, c.Auth.GID)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	d := p.servers[key]
	if d == nil {
		d = &dataServer{p: p, key: key, addrs: c.Addrs, minor: minor, auth: c.Auth, v3: c.Version == 3,
			sem: make(chan struct{}, p.c.opts.MaxPerDS)}
		p.servers[key] = d
	}
	return d
}

// client returns the session with the data server, dialling it if needed.
func (d *dataServer) client(ctx context.Context) (*endpoint, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cl != nil {
		return d.cl, nil
	}
	if d.v3 {
		return nil, errDSVersion
	}
	if now := time.Now(); now.Before(d.downUntil) {
		return nil, &dsDown{ago: now.Sub(d.failedAt), cause: d.lastErr}
	}
	var err error
	for _, a := range d.addrs {
		dctx, cancel := context.WithTimeout(ctx, dsDialTimeout)
		var cl *endpoint
		cl, err = d.p.c.dialDS(dctx, a, d.minor, d.auth)
		cancel()
		if err == nil {
			d.cl = cl
			return cl, nil
		}
		if ctx.Err() != nil {
			return nil, err // the caller gave up: says nothing of the data server
		}
	}
	d.markDownLocked(err)
	return nil, err
}

func (d *dataServer) markDownLocked(err error) {
	d.failures++
	back := min(dsDownMin<<min(d.failures-1, 10), dsDownMax)
	d.failedAt, d.lastErr = time.Now(), err
	d.downUntil = d.failedAt.Add(back)
}

// probe checks that the data server answers: a SEQUENCE on its session,
// dialling it if needed, within dsDialTimeout. A failure counts as one of
// the data server's.
func (d *dataServer) probe(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, dsDialTimeout)
	defer cancel()
	if d.v3 {
		c, err := d.v3client(ctx)
		if err != nil {
			return err
		}
		return d.v3done(c, ctx, c.Null(ctx))
	}
	cl, err := d.client(ctx)
	if err != nil {
		return err
	}
	_, err = cl.callRetry(ctx, 0, func() []nfs4.NfsArgop4 { return nil })
	var se *StatusError
	if err != nil && !errors.As(err, &se) {
		d.fail(cl, err)
		return err
	}
	return nil // it answered
}

// downErr returns, while the data server is left alone after a failure,
// that failure (errDSDown); nil otherwise.
func (d *dataServer) downErr() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if now := time.Now(); d.cl == nil && d.lastErr != nil && now.Before(d.downUntil) {
		return &dsDown{ago: now.Sub(d.failedAt), cause: d.lastErr}
	}
	return nil
}

// fail drops the session cl after a transport failure (err) and keeps
// the data server out of use for a while.
func (d *dataServer) fail(cl *endpoint, err error) {
	d.mu.Lock()
	if d.cl != cl {
		d.mu.Unlock()
		return
	}
	d.cl = nil
	d.markDownLocked(err)
	d.mu.Unlock()
	if !d.p.goBG(func() { cl.close(nil) }) {
		cl.close(nil)
	}
}

func (d *dataServer) succeeded() {
	d.mu.Lock()
	d.failures = 0
	d.mu.Unlock()
}

func (d *dataServer) acquire(ctx context.Context) error {
	select {
	case d.sem <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (d *dataServer) release() { <-d.sem }

// call runs one COMPOUND on a data server. A transport failure drops the
// session and keeps the data server out of use for a while.
func (ds *dataServer) call(ctx context.Context, f *File, build func(cl *endpoint) []nfs4.NfsArgop4) (*endpoint, []nfs4.NfsResop4, error) {
	cl, res, _, err := ds.callRelease(ctx, f, build)
	return cl, res, err
}

// callRelease is dataServer.call that also returns, on success, the function that
// releases the reply's buffer (see Client.callRelease).
func (ds *dataServer) callRelease(ctx context.Context, f *File, build func(cl *endpoint) []nfs4.NfsArgop4) (*endpoint, []nfs4.NfsResop4, func(), error) {
	if err := ds.acquire(ctx); err != nil {
		return nil, nil, nil, err
	}
	defer ds.release()
	cl, err := ds.client(ctx)
	if err != nil {
		return nil, nil, nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, dsCallTimeout)
	defer cancel()
	res, release, err := cl.callIORelease(cctx, f.c.ioBudget(), func() []nfs4.NfsArgop4 { return build(cl) })
	var se *StatusError
	switch {
	case err == nil:
		ds.succeeded()
	case errors.As(err, &se), ctx.Err() != nil:
	default:
		ds.fail(cl, err) // connection refused or reset, timeout, session lost
	}
	return cl, res, release, err
}

// read reads b from copy e on the data server.
func (ds *dataServer) read(ctx context.Context, f *File, e *layout.Copy, b []byte) error {
	if ds.v3 {
		return ds.readV3(ctx, f, e, b)
	}
	for n := 0; n < len(b); {
		var want uint32
		_, res, release, err := ds.callRelease(ctx, f, func(cl *endpoint) []nfs4.NfsArgop4 {
			want = min(uint32(len(b)-n), cl.maxRead)
			if e.RSize > 0 {
				want = min(want, e.RSize)
			}
			sid := copyStateid(f, e)
			return []nfs4.NfsArgop4{putfh(e.FH), {Argop: nfs4.OP_READ, Opread: &nfs4.READ4args{
				Stateid: sid, Offset: e.DSOff + uint64(n), Count: want,
			}}}
		})
		if err != nil {
			return err
		}
		ok := res[1].Opread.Resok4
		got := copy(b[n:], ok.Data)
		eof := ok.Eof
		release() // the data is copied out; nothing else aliases the reply
		f.c.stats.dsReadBytes.Add(uint64(got))
		n += got
		if eof || got == 0 {
			// Below the file size, what the data server does not have is
			// a hole.
			clear(b[n:])
			return nil
		}
	}
	return nil
}

// copyStateid is the stateid for I/O on copy e: the one the layout gives
// for its data server (flexfiles), else the open's or lock's.
func copyStateid(f *File, e *layout.Copy) nfs4.Stateid4 {
	if e.Stateid != nil {
		return *e.Stateid
	}
	sid, _ := f.ioStateid()
	return sid
}
