package bench

import (
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// progressBar draws one status line on a terminal while a long run goes:
// which measurement of how many, what it is, and how long its phase has
// run (against the stonewall, if any). It draws only when its writer is a
// terminal, so logs and CI output get the plain progress lines alone. A
// nil *progressBar does nothing.
type progressBar struct {
	w     io.Writer
	total int
	limit time.Duration

	mu    sync.Mutex
	done  int
	label string
	stop  chan struct{}
	wg    sync.WaitGroup
}

// newProgressBar returns a bar for total measurements on w, or nil when w
// is not a terminal.
func newProgressBar(w io.Writer, total int, limit time.Duration) *progressBar {
	f, ok := w.(*os.File)
	if !ok || total <= 0 {
		return nil
	}
	st, err := f.Stat()
	if err != nil || st.Mode()&os.ModeCharDevice == 0 {
		return nil
	}
	return &progressBar{w: w, total: total, limit: limit}
}

// next names the measurement about to run.
func (b *progressBar) next(label string) {
	if b == nil {
		return
	}
	b.mu.Lock()
	b.label = label
	b.mu.Unlock()
}

// phaseStart starts redrawing the line every half second until phaseEnd.
func (b *progressBar) phaseStart(t0 time.Time) {
	if b == nil {
		return
	}
	b.stop = make(chan struct{})
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		tick := time.NewTicker(500 * time.Millisecond)
		defer tick.Stop()
		for {
			b.draw(time.Since(t0))
			select {
			case <-b.stop:
				return
			case <-tick.C:
			}
		}
	}()
}

// phaseEnd stops redrawing, clears the line and counts the measurement.
func (b *progressBar) phaseEnd() {
	if b == nil || b.stop == nil {
		return
	}
	close(b.stop)
	b.wg.Wait()
	b.stop = nil
	b.mu.Lock()
	b.done++
	b.mu.Unlock()
	fmt.Fprint(b.w, "\r\033[K")
}

func (b *progressBar) draw(el time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	const width = 24
	filled := width * b.done / b.total
	bar := make([]byte, width)
	for i := range bar {
		bar[i] = '.'
		if i < filled {
			bar[i] = '#'
		}
	}
	limit := ""
	if b.limit > 0 {
		limit = fmt.Sprintf(" of %v", b.limit)
	}
	fmt.Fprintf(b.w, "\r\033[K[%s] %d/%d %s %.1fs%s", bar, b.done+1, b.total, b.label, el.Seconds(), limit)
}
