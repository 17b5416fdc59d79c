package rpc

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"syscall"
	"time"
)

// Server accepts connections and serves RPC calls on them. Its exported
// fields must be set before Serve is called and not changed afterwards.
type Server struct {
	Handler Handler
	// MaxRecord is the largest record accepted; a larger one closes the
	// connection. Default DefaultMaxRecord.
	MaxRecord int
	// MaxInFlight bounds the calls served concurrently per connection.
	// Default DefaultMaxInFlight.
	MaxInFlight int
	// IdleTimeout closes connections idle this long. A connection with
	// calls in flight or pinned with Conn.Pin is not idle. Zero means
	// DefaultIdleTimeout, negative means never.
	IdleTimeout time.Duration
	// WriteTimeout bounds each reply write; zero or negative: no bound.
	WriteTimeout time.Duration
	Logger       *slog.Logger
	// ConnState, if set, is called with StateNew before a connection is
	// first read and with StateClosed once it is closed and all its
	// handlers have returned.
	ConnState func(*Conn, ConnState)

	mu        sync.Mutex
	closed    bool
	listeners map[net.Listener]struct{}
	conns     map[*Conn]struct{}
	wg        sync.WaitGroup // live connections
}

// Serve accepts connections on ln until Close is called, then returns
// ErrServerClosed. Any other accept failure is returned as is (wrapped),
// except transient ones such as running out of file descriptors, which are
// retried with backoff.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		ln.Close()
		return ErrServerClosed
	}
	if s.listeners == nil {
		s.listeners = make(map[net.Listener]struct{})
	}
	s.listeners[ln] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.listeners, ln)
		s.mu.Unlock()
	}()

	var backoff time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			if s.isClosed() {
				return ErrServerClosed
			}
			if transientAcceptError(err) {
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				s.logger().Warn("rpc: accept failed; retrying", "err", err, "backoff", backoff)
				time.Sleep(backoff)
				continue
			}
			return fmt.Errorf("rpc: accept on %s: %w", ln.Addr(), err)
		}
		backoff = 0
		s.startConn(nc)
	}
}

func transientAcceptError(err error) bool {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return true
	}
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) ||
		errors.Is(err, syscall.ECONNABORTED) || errors.Is(err, syscall.ENOBUFS) ||
		errors.Is(err, syscall.ENOMEM)
}

func (s *Server) logger() *slog.Logger {
	if s.Logger != nil {
		return s.Logger
	}
	return slog.New(slog.DiscardHandler)
}

func (s *Server) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

func (s *Server) startConn(nc net.Conn) {
	idle := s.IdleTimeout
	if idle == 0 {
		idle = DefaultIdleTimeout
	}
	c := newConn(nc, s.Handler, ConnConfig{
		MaxRecord:    s.MaxRecord,
		MaxInFlight:  s.MaxInFlight,
		IdleTimeout:  idle,
		WriteTimeout: s.WriteTimeout,
		Logger:       s.Logger,
	})
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		nc.Close()
		return
	}
	if s.conns == nil {
		s.conns = make(map[*Conn]struct{})
	}
	s.conns[c] = struct{}{}
	s.wg.Add(1)
	s.mu.Unlock()

	c.onFinish = func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		if s.ConnState != nil {
			s.ConnState(c, StateClosed)
		}
		s.wg.Done()
	}
	if s.ConnState != nil {
		s.ConnState(c, StateNew)
	}
	c.start()
}

// Close stops all listeners, closes every connection (cancelling handler
// contexts and failing outgoing calls) and waits until all handlers have
// returned. Handlers that ignore their context delay Close.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	lns := make([]net.Listener, 0, len(s.listeners))
	for ln := range s.listeners {
		lns = append(lns, ln)
	}
	conns := make([]*Conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()

	var err error
	for _, ln := range lns {
		if cerr := ln.Close(); cerr != nil && !errors.Is(cerr, net.ErrClosed) && err == nil {
			err = fmt.Errorf("rpc: close listener: %w", cerr)
		}
	}
	for _, c := range conns {
		c.closeWith(ErrServerClosed)
	}
	s.wg.Wait()
	return err
}
