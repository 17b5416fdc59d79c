//go:build linux

package store_test

import (
	"testing"

	"github.com/shoalfs/shoal/store"
	"github.com/shoalfs/shoal/store/storetest"
)

// TestConformance runs the backend conformance suite on Local, with and
// without checksums; reopening opens a new Local on the same directory,
// as a restarted data server does.
func TestConformance(t *testing.T) {
	for _, c := range []struct {
		name string
		opts store.LocalOptions
	}{
		{"Plain", store.LocalOptions{}},
		{"Checksums", store.LocalOptions{Checksums: true}},
		{"SmallCache", store.LocalOptions{MaxOpen: 1, Checksums: true}},
	} {
		t.Run(c.name, func(t *testing.T) {
			storetest.Run(t, func(t *testing.T) storetest.Target {
				dir := t.TempDir()
				open := func(t *testing.T) *store.Local {
					l, err := store.NewLocal(dir, c.opts)
					if err != nil {
						t.Fatal(err)
					}
					return l
				}
				l := open(t)
				return storetest.Target{
					Backend: l,
					Reopen: func(t *testing.T) store.Backend {
						if err := l.Close(); err != nil {
							t.Fatalf("close: %v", err)
						}
						l = open(t)
						return l
					},
				}
			})
		})
	}
}
