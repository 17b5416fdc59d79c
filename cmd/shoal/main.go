// Command shoal is the single binary of the Shoal parallel NFS system: the
// NFSv4.1/4.2 server, and a command-line client for nfs:// URLs.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	stopWithGoRun()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// The first SIGINT or SIGTERM starts a clean shutdown; restoring the
	// default action then lets a second one end a shutdown that hangs.
	go func() {
		<-ctx.Done()
		stop()
	}()
	root := newRootCmd()
	if err := root.ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "shoal:", describe(err))
		var ee *exitError
		if errors.As(err, &ee) {
			os.Exit(ee.code)
		}
		os.Exit(1)
	}
}

// exitError carries a specific exit status out of a command.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }
