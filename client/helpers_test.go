package client_test

import (
	"context"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/shoalfs/shoal/client"
	"github.com/shoalfs/shoal/client/clienttest"
)

// dialer returns a clienttest.Dialer for the server at addr.
func dialer(addr string, opts client.Options) clienttest.Dialer {
	return func(t *testing.T) *client.Client {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		c, err := client.Dial(ctx, addr, opts)
		if err != nil {
			t.Fatalf("dial %s: %v", addr, err)
		}
		return c
	}
}

// quietLogger discards the servers' logs unless SHOAL_TEST_LOG is set.
func quietLogger() *slog.Logger {
	if os.Getenv("SHOAL_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}
