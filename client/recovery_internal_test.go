package client

import (
	"testing"
	"time"
)

// TestCallDuringRecovery: a call made while another goroutine replaces the
// session (the old session's slots are already dead, the new one is not
// there yet) waits for the new session and succeeds. It used to resend on
// the dead session at once, five times, and fail with "session replaced".
func TestCallDuringRecovery(t *testing.T) {
	c, ctx := dialTestServer(t)

	for _, delay := range []time.Duration{0, 50 * time.Millisecond, 300 * time.Millisecond} {
		t.Run(delay.String(), func(t *testing.T) {
			_, lost, err := c.current()
			if err != nil {
				t.Fatal(err)
			}
			// A recovery as recoverLocked does it, slowed down between
			// killing the old slots and creating the new session.
			c.recMu.Lock()
			lost.slots.kill()
			done := make(chan error, 1)
			go func() {
				defer c.recMu.Unlock()
				time.Sleep(delay)
				done <- c.newSession(ctx, lost)
			}()
			if _, err := c.Stat(ctx, "/"); err != nil {
				t.Errorf("Stat during a session recovery: %v", err)
			}
			if err := <-done; err != nil {
				t.Fatalf("new session: %v", err)
			}
			if _, now, _ := c.current(); now == lost {
				t.Fatal("the session was not replaced")
			}
		})
	}
}
