package metatest

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/shoalfs/shoal/meta"
)

// testReadCoherence: reads never go back in time. While a writer grows a
// file's size and links and unlinks a name, readers calling GetAttr and
// Lookup never see a size smaller than one they saw before, nor one
// smaller than the last SetAttr that had returned when their read began;
// and a Lookup that begins after Create (Remove) returned finds (misses)
// the name. Engines that cache reads (bbolt) must keep the cache coherent
// with every update.
func testReadCoherence(t *testing.T, v *env) {
	f := v.create(meta.RootIno, "f", meta.TypeRegular)
	d := v.create(meta.RootIno, "d", meta.TypeDirectory)
	const rounds = 300
	var (
		done    atomic.Bool
		applied atomic.Uint64 // the last size whose SetAttr returned
		// phase is odd while the writer creates or removes the name;
		// even, the name exists if phase%4 == 2.
		phase atomic.Uint64
		wg    sync.WaitGroup
		errs  = make(chan error, 16)
	)
	fail := func(err error) {
		select {
		case errs <- err:
		default:
		}
	}
	for r := range 3 {
		wg.Go(func() {
			var seen uint64
			for !done.Load() {
				floor := applied.Load()
				a, err := v.e.GetAttr(v.ctx, f.Ino)
				if err != nil {
					fail(err)
					return
				}
				if a.Size < seen || a.Size < floor {
					fail(fmt.Errorf("reader %d: size %d after seeing %d, with %d applied before the read", r, a.Size, seen, floor))
					return
				}
				seen = a.Size
				p := phase.Load()
				_, err = v.e.Lookup(v.ctx, d.Ino, "n")
				if p%2 == 1 || phase.Load() != p {
					continue // the writer was at work meanwhile
				}
				switch {
				case p%4 == 2 && err != nil:
					fail(fmt.Errorf("reader %d: lookup after create: %v", r, err))
					return
				case p%4 == 0 && !errors.Is(err, meta.ErrNotFound):
					fail(fmt.Errorf("reader %d: lookup after remove: %v", r, err))
					return
				}
			}
		})
	}
	for i := uint64(1); i <= rounds; i++ {
		if _, err := v.e.SetAttr(v.ctx, f.Ino, meta.SetAttr{Mask: meta.SetSize, Size: i}, v.tick()); err != nil {
			t.Fatal(err)
		}
		applied.Store(i)
		phase.Add(1)
		var err error
		if i%2 == 1 {
			_, _, err = v.e.Create(v.ctx, d.Ino, "n", meta.CreateArgs{Type: meta.TypeRegular, Mode: 0o644}, v.tick())
		} else {
			_, _, err = v.e.Remove(v.ctx, d.Ino, "n", v.tick())
		}
		if err != nil {
			t.Fatal(err)
		}
		phase.Add(1)
	}
	done.Store(true)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
