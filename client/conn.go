package client

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/shoalfs/shoal/internal/nfs4"
	"github.com/shoalfs/shoal/internal/rpc"
)

// Connections of the session layer (session.go): dialing one of a
// server's addresses, reconnecting and rebinding a broken connection to
// the session, and the watchdog that leaves a server which stopped
// answering for another of its addresses.

// answerTimeout bounds Dial's first call, the NULL procedure: every NFS
// server answers it at once, without touching its disks.
const answerTimeout = 3 * time.Second

// failoverDialTimeout bounds the connection to each address of a list of
// several (or DialTimeout, if shorter): an address that does not even
// refuse the connection must not hold up the next one for long.
const failoverDialTimeout = 5 * time.Second

// dialAny connects to one of the server's addresses: the first, in turn
// from the one that answered last, that accepts a connection and, with
// ping, answers the NULL procedure (see ping). With several addresses the
// answer matters: a metadata server that was paused, and has lost its
// leadership meanwhile, may still accept connections and not answer. ctx
// bounds the whole; each address gets DialTimeout for the connection
// (failoverDialTimeout with several) and answerTimeout for the NULL call.
// The error of a list names every address's failure.
func (c *endpoint) dialAny(ctx context.Context, ping bool) (*rpc.Conn, error) {
	n := len(c.addrs)
	perAddr := c.opts.DialTimeout
	if n > 1 {
		perAddr = min(perAddr, failoverDialTimeout)
	}
	start := int(c.good.Load())
	errs := make([]error, 0, n)
	for i := range n {
		k := (start + i) % n
		addr := c.addrs[k]
		actx, cancel := context.WithTimeout(ctx, perAddr)
		conn, err := c.dialAddr(actx, addr)
		cancel()
		if err == nil && ping {
			if err = c.ping(ctx, conn, addr); err != nil {
				conn.Close()
			}
		}
		if err == nil {
			if k != start {
				c.log.Info("connected to another address of the server", "addr", addr)
			}
			c.good.Store(int32(k))
			return conn, nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
		c.log.Debug("address did not answer", "addr", addr, "err", err)
	}
	if n == 1 {
		return nil, errs[0]
	}
	return nil, fmt.Errorf("nfs: no address of %s answered: %w", strings.Join(c.addrs, ","), errors.Join(errs...))
}

// ping calls the NULL procedure on a new connection to addr to tell an
// address where something else listens (a web server, a port that accepts
// and says nothing) from an NFS server, in at most answerTimeout (or
// DialTimeout, if shorter) rather than the DialTimeout the session calls
// would wait. ctx is the caller's. The error wraps ErrNotNFS.
func (c *endpoint) ping(ctx context.Context, conn *rpc.Conn, addr string) error {
	limit := min(answerTimeout, c.opts.DialTimeout)
	pctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	_, err := conn.Call(pctx, nfs4.NFS4_PROGRAM, nfs4.NFS_V4, nfs4.NFSPROC4_NULL, c.cred, nil)
	var ae *rpc.AcceptError
	var re *rpc.RejectError
	var why string
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		// The caller's deadline or cancellation, not the server's fault.
		return fmt.Errorf("nfs: %s: %w", addr, err)
	case errors.As(err, &ae) && (ae.Stat == rpc.ProgUnavail || ae.Stat == rpc.ProgMismatch):
		why = fmt.Sprintf("an RPC server without NFSv4: %s", ae.Stat)
	case errors.As(err, &ae), errors.As(err, &re):
		// An RPC server that knows NFSv4 but not this call, or not
		// these credentials: the session calls will say what is wrong.
		return nil
	case errors.Is(err, context.DeadlineExceeded):
		why = fmt.Sprintf("no answer to the NULL procedure within %s", limit)
	case errors.Is(err, rpc.ErrRecordTooLarge), errors.Is(err, rpc.ErrBadReply):
		why = "it sent something that is not an RPC reply"
	case errors.Is(err, rpc.ErrConnClosed):
		why = "it closed the connection"
	default:
		why = err.Error()
	}
	return fmt.Errorf("nfs: %s %w (%s)", addr, ErrNotNFS, why)
}

func (c *endpoint) dialAddr(ctx context.Context, addr string) (*rpc.Conn, error) {
	cb := c.callbacks
	if cb == nil {
		cb = rpc.HandlerFunc(serveNoCallbacks)
	}
	cfg := rpc.ConnConfig{MaxRecord: maxRecord, Logger: c.log}
	if c.opts.Dial != nil {
		nc, err := c.opts.Dial(ctx, "tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("rpc: %w", err)
		}
		return rpc.NewConn(nc, cb, cfg), nil
	}
	return rpc.Dial(ctx, "tcp", addr, cb, rpc.WithConfig(cfg))
}

// addr is the address that answered last, for messages.
func (c *endpoint) addr() string { return c.addrs[c.good.Load()] }

// reconnect replaces a broken connection: it redials (with backoff, for a
// server that is restarting) and binds the new connection to the session.
// If the server no longer knows the session, the session is recovered.
// Callers that raced on the same broken connection share one reconnect.
func (c *endpoint) reconnect(broken *rpc.Conn) error {
	c.recMu.Lock()
	defer c.recMu.Unlock()
	c.mu.Lock()
	if c.conn != broken || c.closed {
		closed := c.closed
		c.mu.Unlock()
		if closed {
			return ErrClosed
		}
		return nil
	}
	sess := c.sess
	c.mu.Unlock()

	ctx, cancel := context.WithTimeout(c.ctx, reconnectBudget)
	defer cancel()
	// With several addresses, each gets bounded time (dialAny) and must
	// answer: the address that answered last may be a metadata server
	// that was paused and lost its leadership, accepting connections
	// without answering, or answering NULL and nothing else.
	failover := len(c.addrs) > 1
	delay := 50 * time.Millisecond
	for {
		conn, err := c.dialAny(ctx, failover)
		if err == nil {
			c.sstats.reconnects.Add(1)
			c.log.Info("reconnected", "addr", c.addr(), "local", conn.LocalAddr().String())
			var lost bool
			if lost, err = c.bind(ctx, conn, sess, failover); err == nil {
				c.mu.Lock()
				if c.closed {
					conn.Close() // Close ran meanwhile and will not see this one
				} else {
					c.conn = conn
				}
				c.mu.Unlock()
				if lost {
					// Another server instance (a restart, or a
					// failover to another metadata server).
					return c.recoverLocked(ctx, sess)
				}
				return nil
			}
			conn.Close()
			if !failover {
				return err
			}
			// Answered, then not: the next attempt starts with the next
			// address.
			c.good.Store(int32((int(c.good.Load()) + 1) % len(c.addrs)))
		}
		c.log.Debug("redial failed", "err", err)
		if werr := sleep(ctx, delay); werr != nil {
			return fmt.Errorf("nfs: reconnecting to %s: %w", strings.Join(c.addrs, ","), err)
		}
		delay = min(2*delay, 2*time.Second)
	}
}

// Watchdog bounds (see watchdog).
const (
	// silenceProbe is how long COMPOUNDs may wait with no reply at all
	// before the watchdog asks the server for a NULL reply.
	silenceProbe = 10 * time.Second
	// watchdogTick is how often the watchdog looks.
	watchdogTick = 2 * time.Second
)

// watchdog runs while the endpoint lives, for a server with several
// addresses (a metadata server with standbys). A server that was paused,
// and lost its leadership meanwhile, keeps the connection open and
// answers nothing, so no call would ever fail over. When COMPOUNDs have
// waited silenceProbe with no reply coming, the watchdog sends NULL on the
// connection, which any live server answers at once however busy its
// COMPOUNDs keep it; if no answer comes within answerTimeout the
// connection is closed, and the calls waiting on it reconnect (to
// whichever address answers) and replay, as after any connection loss.
func (c *endpoint) watchdog() {
	defer c.wg.Done()
	t := time.NewTicker(watchdogTick)
	defer t.Stop()
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-t.C:
		}
		if c.waiting.Load() == 0 || time.Since(time.Unix(0, c.lastReply.Load())) < silenceProbe {
			continue
		}
		conn, _, err := c.current()
		if err != nil {
			return
		}
		if !c.silent(conn) {
			c.lastReply.Store(time.Now().UnixNano()) // alive: look again after silenceProbe
			continue
		}
		c.log.Warn("server stopped answering; leaving it for another address", "addr", c.addr(),
			"waiting", c.waiting.Load(), "silent", time.Since(time.Unix(0, c.lastReply.Load())).Round(time.Second))
		conn.Close()
	}
}

// silent reports whether conn's server leaves a NULL call unanswered for
// answerTimeout. Any answer, an error included, means it is alive; a
// connection that is closed already is left to its callers.
func (c *endpoint) silent(conn *rpc.Conn) bool {
	ctx, cancel := context.WithTimeout(c.ctx, answerTimeout)
	defer cancel()
	_, err := conn.Call(ctx, nfs4.NFS4_PROGRAM, nfs4.NFS_V4, nfs4.NFSPROC4_NULL, c.cred, nil)
	return errors.Is(err, context.DeadlineExceeded) && c.ctx.Err() == nil
}

// reconnectBudget bounds one reconnect, dials and recovery together.
const reconnectBudget = 3 * time.Minute

// bind binds a new connection to sess with BIND_CONN_TO_SESSION. lost
// reports that the server does not know the session (it is another server
// instance), which the caller recovers from on conn. With bounded set (the
// Client has several addresses) the call gets DialTimeout, so a server
// that stopped answering is left for another address.
func (c *endpoint) bind(ctx context.Context, conn *rpc.Conn, sess *session, bounded bool) (lost bool, _ error) {
	if bounded {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.opts.DialTimeout)
		defer cancel()
	}
	_, err := c.plain(ctx, conn, []nfs4.NfsArgop4{{Argop: nfs4.OP_BIND_CONN_TO_SESSION,
		OpbindConnToSession: &nfs4.BINDCONNTOSESSION4args{BctsaSessid: sess.id, BctsaDir: nfs4.CDFC4_FORE_OR_BOTH}}})
	var se *StatusError
	if errors.As(err, &se) && (se.status() == nfs4.NFS4ERR_BADSESSION || se.status() == nfs4.NFS4ERR_DEADSESSION ||
		se.status() == nfs4.NFS4ERR_STALE_CLIENTID) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("nfs: BIND_CONN_TO_SESSION: %w", err)
	}
	return false, nil
}

// SplitAddrs splits a server address list, as [Dial] takes it, into
// "host:port" addresses: elements are separated by commas, and one
// without a port takes the port of the next element that has one, so
// "a,b:2049,c:2050" is a:2049, b:2049 and c:2050. An IPv6 address is
// written in brackets, with or without a port ("[::1],[fe80::1]:2049").
// Every address must end up with a port from 1 to 65535.
func SplitAddrs(list string) ([]string, error) {
	parts := strings.Split(list, ",")
	out := make([]string, len(parts))
	port := ""
	for i := len(parts) - 1; i >= 0; i-- {
		p := strings.TrimSpace(parts[i])
		if p == "" {
			return nil, fmt.Errorf("nfs: server address list %q has an empty element", list)
		}
		host, pt, err := net.SplitHostPort(p)
		if err != nil {
			// No port (or not a host:port at all): a host name, an
			// IPv4 address or a bracketed IPv6 one.
			host = p
			if strings.HasPrefix(p, "[") && strings.HasSuffix(p, "]") {
				host = p[1 : len(p)-1]
			}
			if host == "" || strings.ContainsAny(host, "[]") || (strings.Contains(host, ":") && net.ParseIP(host) == nil) {
				return nil, fmt.Errorf("nfs: %q in server address list %q is not host[:port]", p, list)
			}
			if port == "" {
				return nil, fmt.Errorf("nfs: %q in server address list %q has no port, and no address after it has one", p, list)
			}
			pt = port
		} else if n, err := strconv.Atoi(pt); err != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("nfs: port %q of %q is not a number from 1 to 65535", pt, p)
		}
		port = pt
		out[i] = net.JoinHostPort(host, pt)
	}
	return out, nil
}
