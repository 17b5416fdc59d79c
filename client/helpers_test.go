package client_test

import (
	"context"
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
