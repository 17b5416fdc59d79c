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

// plainFS is a Local on a file system that can neither seek to data and
// holes, nor reserve or punch space, nor copy inside itself: every File
// method a backend may refuse is refused with store.ErrNotSupported, and
// the backend is no store.Copier. The suite must skip those parts and
// pass the rest.
type plainFS struct{ store.Backend }

func (b plainFS) Open(ino uint64, create bool) (store.File, error) {
	f, err := b.Backend.Open(ino, create)
	if err != nil {
		return nil, err
	}
	return plainFile{f}, nil
}

type plainFile struct{ store.File }

func (plainFile) Allocate(off, length int64) error          { return store.ErrNotSupported }
func (plainFile) PunchHole(off, length int64) error         { return store.ErrNotSupported }
func (plainFile) Seek(off int64, whence int) (int64, error) { return 0, store.ErrNotSupported }

func TestConformanceWithoutCapabilities(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Target {
		l, err := store.NewLocal(t.TempDir(), store.LocalOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return storetest.Target{Backend: plainFS{l}}
	})
}
