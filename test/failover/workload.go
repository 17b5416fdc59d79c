package failover

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"sort"
	"sync"
	"syscall"
	"time"

	"github.com/shoalfs/shoal/client"
)

// Workload is the application that must not notice a failover: one big
// file written and synced then read back, a loop of small-file creates,
// writes, renames and removes, and a process holding a lock that another
// client keeps trying to take. Each part records what it was told
// succeeded; Check compares that with what the cluster holds afterwards.
type Workload struct {
	Addrs   string // every MDS address, comma-separated
	BigSize int    // bytes of the big file
	Dir     string // the workload's directory

	mu         sync.Mutex
	errs       []error
	bigSum     [32]byte
	files      map[string][]byte // small files that must exist, with their contents
	removed    map[string]bool   // small files that must not exist
	lockStolen bool
	progress   []time.Time // when each small-file step (or big-file chunk) ended
	meta       []time.Time // when each small-file step ended
}

// ErrFailed is wrapped by the errors the workload's applications saw.
var ErrFailed = errors.New("workload")

func (w *Workload) fail(err error) {
	w.mu.Lock()
	w.errs = append(w.errs, fmt.Errorf("%w: %w", ErrFailed, err))
	w.mu.Unlock()
}

func (w *Workload) tick() {
	w.mu.Lock()
	w.progress = append(w.progress, time.Now())
	w.mu.Unlock()
}

// Progress returns when each step of the workload ended, and when each
// small-file step (metadata changes) ended, in order.
func (w *Workload) Progress() (all, meta []time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	all = append([]time.Time(nil), w.progress...)
	sort.Slice(all, func(i, j int) bool { return all[i].Before(all[j]) })
	return all, append([]time.Time(nil), w.meta...)
}

// Errors returns what the applications saw fail.
func (w *Workload) Errors() []error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]error(nil), w.errs...)
}

// Dial makes a client of every MDS address.
func (w *Workload) Dial(ctx context.Context) (*client.Client, error) {
	dctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	return client.Dial(dctx, w.Addrs, client.Options{})
}

// Run runs the workload until stop is closed (the small-file loop and the
// lock holder) and the big file is written and read back; it returns when
// every part has ended.
func (w *Workload) Run(ctx context.Context, stop <-chan struct{}) {
	w.files, w.removed = map[string][]byte{}, map[string]bool{}
	c, err := w.Dial(ctx)
	if err != nil {
		w.fail(err)
		return
	}
	defer c.Close()
	if err := c.MkdirAll(ctx, w.Dir+"/small", 0o755); err != nil {
		w.fail(err)
		return
	}
	var wg sync.WaitGroup
	locked := make(chan struct{})
	thiefDone := make(chan struct{})
	wg.Add(3)
	go func() { defer wg.Done(); w.big(ctx, c) }()
	go func() { defer wg.Done(); w.small(ctx, c, stop) }()
	go func() { defer wg.Done(); w.lockHolder(ctx, c, stop, locked, thiefDone) }()
	select {
	case <-locked:
		wg.Add(1)
		go func() { defer wg.Done(); defer close(thiefDone); w.lockThief(ctx, stop) }()
	case <-ctx.Done():
		close(thiefDone)
	}
	wg.Wait()
}

func (w *Workload) big(ctx context.Context, c *client.Client) {
	path := w.Dir + "/big"
	f, err := c.Open(ctx, path, os.O_CREATE|os.O_RDWR|os.O_TRUNC, 0o644)
	if err != nil {
		w.fail(fmt.Errorf("open %s: %w", path, err))
		return
	}
	h := sha256.New()
	rng := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, 1<<20)
	for off := 0; off < w.BigSize; off += len(buf) {
		n := min(len(buf), w.BigSize-off)
		for i := 0; i < n; i += 8 {
			v := rng.Uint64()
			for j := 0; j < 8 && i+j < n; j++ {
				buf[i+j] = byte(v >> (8 * j))
			}
		}
		if _, err := f.WriteAtContext(ctx, buf[:n], int64(off)); err != nil {
			w.fail(fmt.Errorf("write %s at %d: %w", path, off, err))
			f.Close()
			return
		}
		h.Write(buf[:n])
		w.tick()
	}
	if err := f.SyncContext(ctx); err != nil {
		w.fail(fmt.Errorf("fsync %s: %w", path, err))
	}
	if err := f.Close(); err != nil {
		w.fail(fmt.Errorf("close %s: %w", path, err))
		return
	}
	w.mu.Lock()
	copy(w.bigSum[:], h.Sum(nil))
	w.mu.Unlock()
	// Read it back through a fresh open.
	rf, err := c.Open(ctx, path, os.O_RDONLY, 0)
	if err != nil {
		w.fail(fmt.Errorf("open %s: %w", path, err))
		return
	}
	got, err := io.ReadAll(rf)
	rf.Close()
	if err != nil {
		w.fail(fmt.Errorf("read %s: %w", path, err))
		return
	}
	if sha256.Sum256(got) != w.bigSum {
		w.fail(fmt.Errorf("%s read back with another sha256 than written: %s; %s", path, w.diff(got), w.bigDiff(ctx, c, path)))
	}
	w.tick()
}

// bigDiff reads the big file again and says where it differs from what
// was written (the same generator), for the failure message.
func (w *Workload) bigDiff(ctx context.Context, c *client.Client, path string) string {
	f, err := c.Open(ctx, path, os.O_RDONLY, 0)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	got, err := io.ReadAll(f)
	return fmt.Sprintf("a second read: %v: %s", err, w.diff(got))
}

// diff says where got differs from the big file's contents.
func (w *Workload) diff(got []byte) string {
	want := make([]byte, w.BigSize)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < len(want); i += 8 {
		v := rng.Uint64()
		for j := 0; j < 8 && i+j < len(want); j++ {
			want[i+j] = byte(v >> (8 * j))
		}
	}
	first := -1
	diff := 0
	for i := 0; i < min(len(got), len(want)); i++ {
		if got[i] != want[i] {
			if first < 0 {
				first = i
			}
			diff++
		}
	}
	last := -1
	for i := min(len(got), len(want)) - 1; i >= 0; i-- {
		if got[i] != want[i] {
			last = i
			break
		}
	}
	zero := first >= 0 && got[first] == 0
	return fmt.Sprintf("%d bytes (want %d), %d differ, first at %d (zero: %v), last at %d", len(got), len(want), diff, first, zero, last)
}

func readSum(ctx context.Context, c *client.Client, path string) ([32]byte, error) {
	f, err := c.Open(ctx, path, os.O_RDONLY, 0)
	if err != nil {
		return [32]byte{}, fmt.Errorf("open %s: %w", path, err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return [32]byte{}, fmt.Errorf("read %s: %w", path, err)
	}
	var s [32]byte
	copy(s[:], h.Sum(nil))
	return s, nil
}

// small creates, writes, renames and removes small files: every step is a
// metadata change the MDS must keep once acknowledged.
func (w *Workload) small(ctx context.Context, c *client.Client, stop <-chan struct{}) {
	for i := 0; i < 100000; i++ {
		select {
		case <-stop:
			return
		default:
		}
		tmp := fmt.Sprintf("%s/small/tmp%05d", w.Dir, i)
		final := fmt.Sprintf("%s/small/f%05d", w.Dir, i)
		data := bytes.Repeat([]byte(fmt.Sprintf("%05d;", i)), 100+i%50)
		f, err := c.Open(ctx, tmp, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o644)
		if err != nil {
			w.fail(fmt.Errorf("create %s: %w", tmp, err))
			return
		}
		if _, err := f.Write(data); err != nil {
			w.fail(fmt.Errorf("write %s: %w", tmp, err))
			f.Close()
			return
		}
		if err := f.Close(); err != nil {
			w.fail(fmt.Errorf("close %s: %w", tmp, err))
			return
		}
		if err := c.Rename(ctx, tmp, final); err != nil {
			w.fail(fmt.Errorf("rename %s: %w", tmp, err))
			return
		}
		w.mu.Lock()
		w.files[final] = data
		w.mu.Unlock()
		if i%3 == 2 {
			victim := fmt.Sprintf("%s/small/f%05d", w.Dir, i-1)
			// This loop alone touches its files: a REMOVE that finds
			// nothing was carried out by an MDS that died before
			// answering (no reply cache survives a failover).
			if err := c.Remove(ctx, victim); err != nil && !errors.Is(err, fs.ErrNotExist) {
				w.fail(fmt.Errorf("remove %s: %w", victim, err))
				return
			}
			w.mu.Lock()
			delete(w.files, victim)
			w.removed[victim] = true
			w.mu.Unlock()
		}
		w.mu.Lock()
		w.meta = append(w.meta, time.Now())
		w.mu.Unlock()
		w.tick()
	}
}

// lockHolder takes a write lock on a file and holds it until stop and
// the thief has given up (thiefDone).
func (w *Workload) lockHolder(ctx context.Context, c *client.Client, stop <-chan struct{}, locked chan<- struct{}, thiefDone <-chan struct{}) {
	path := w.Dir + "/lockfile"
	f, err := c.Open(ctx, path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		w.fail(fmt.Errorf("open %s: %w", path, err))
		close(locked)
		return
	}
	defer f.Close()
	if err := f.Lock(ctx, 0, 1, true, true); err != nil {
		w.fail(fmt.Errorf("lock %s: %w", path, err))
		close(locked)
		return
	}
	close(locked)
	<-stop
	// The thief's last LOCK must have its answer before the lock is
	// given up: one held up by the failover (waiting out the new
	// leader's grace period) would otherwise be granted by this unlock
	// and count as a theft.
	select {
	case <-thiefDone:
	case <-ctx.Done():
	}
	if err := f.Unlock(ctx, 0, 1); err != nil {
		w.fail(fmt.Errorf("unlock %s (held through the failover): %w", path, err))
	}
}

// lockThief is another client trying, now and then, to take the lock the
// holder has: it must never get it.
func (w *Workload) lockThief(ctx context.Context, stop <-chan struct{}) {
	c, err := w.Dial(ctx)
	if err != nil {
		w.fail(err)
		return
	}
	defer c.Close()
	path := w.Dir + "/lockfile"
	f, err := c.Open(ctx, path, os.O_RDWR, 0)
	if err != nil {
		w.fail(fmt.Errorf("thief: open %s: %w", path, err))
		return
	}
	defer f.Close()
	t := time.NewTicker(300 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		err := f.Lock(ctx, 0, 1, true, false)
		switch {
		case err == nil:
			w.mu.Lock()
			w.lockStolen = true
			w.mu.Unlock()
			w.fail(errors.New("another client was granted the lock its holder never released"))
			f.Unlock(ctx, 0, 1)
			return
		case errors.Is(err, syscall.EAGAIN):
		default:
			// A failover in progress may refuse for a while (grace:
			// a non-reclaim LOCK waits); that is not a grant.
		}
	}
}

// Check compares what the workload was told succeeded with what the
// cluster holds now, through a fresh client.
func (w *Workload) Check(ctx context.Context) error {
	c, err := w.Dial(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	var errs []error
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.bigSum != ([32]byte{}) {
		sum, err := readSum(ctx, c, w.Dir+"/big")
		if err != nil {
			errs = append(errs, err)
		} else if sum != w.bigSum {
			errs = append(errs, errors.New("the big file's sha256 differs from what was written"))
		}
	}
	ents, err := c.ReadDir(ctx, w.Dir+"/small")
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	have := map[string]bool{}
	for _, e := range ents {
		have[w.Dir+"/small/"+e.Name] = true
	}
	for name, data := range w.files {
		if !have[name] {
			errs = append(errs, fmt.Errorf("%s was created and renamed (acknowledged) but is missing", name))
			continue
		}
		f, err := c.Open(ctx, name, os.O_RDONLY, 0)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		got, err := io.ReadAll(f)
		f.Close()
		if err != nil || !bytes.Equal(got, data) {
			errs = append(errs, fmt.Errorf("%s holds %d bytes, not the %d written (%v)", name, len(got), len(data), err))
		}
	}
	for name := range w.removed {
		if have[name] {
			errs = append(errs, fmt.Errorf("%s was removed (acknowledged) but is there", name))
		}
	}
	if w.lockStolen {
		errs = append(errs, errors.New("the lock was granted to another client while held"))
	}
	return errors.Join(errs...)
}
