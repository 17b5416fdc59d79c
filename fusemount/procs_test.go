package fusemount

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
)

// TestReaderProcs: a mount with ReaderProcs raises GOMAXPROCS by go-fuse's
// reader count plus one, and serves creates, stats and removes from
// several goroutines at once as any mount does.
func TestReaderProcs(t *testing.T) {
	requireFUSE(t)
	before := runtime.GOMAXPROCS(0)
	t.Cleanup(func() { runtime.GOMAXPROCS(before) })
	cl := startClusterN(t, 2)
	mnt := mountCfg(t, Config{Addr: cl.MDS.Addr.String(), Access: AccessCached, ReaderProcs: true})
	want := before + min(max(before, 2), 16) + 1
	if got := runtime.GOMAXPROCS(0); got != want {
		t.Errorf("GOMAXPROCS %d after the mount, want %d (was %d)", got, want, before)
	}

	const workers, files = 4, 25
	data := bytes.Repeat([]byte("r"), 4096)
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			dir := filepath.Join(mnt, fmt.Sprintf("w%d", w))
			if err := os.Mkdir(dir, 0o755); err != nil {
				errs <- err
				return
			}
			for i := range files {
				p := filepath.Join(dir, fmt.Sprintf("f%d", i))
				if err := os.WriteFile(p, data, 0o644); err != nil {
					errs <- err
					return
				}
				if st, err := os.Stat(p); err != nil || st.Size() != int64(len(data)) {
					errs <- fmt.Errorf("%s: stat %v, %v", p, st, err)
					return
				}
				if err := os.Remove(p); err != nil {
					errs <- err
					return
				}
			}
			if ents, err := os.ReadDir(dir); err != nil || len(ents) != 0 {
				errs <- fmt.Errorf("%s after the removes: %d entries, %v", dir, len(ents), err)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
