package failover

import (
	"context"
	"fmt"
	"syscall"
	"time"
)

// Fault is how a trial takes the leader away.
type Fault string

const (
	Kill     Fault = "kill-9"   // kill -9, restarted 1 s later (as systemd would)
	Stop     Fault = "sigstop"  // SIGSTOP, continued once another MDS leads
	StepDown Fault = "stepdown" // shoal admin step-down
)

// Trial is what one failover cost, measured from the fault.
type Trial struct {
	Fault Fault `json:"fault"`
	// Detect is when another MDS led (its metrics say so and it listens).
	Detect time.Duration `json:"detect_ns"`
	// FirstMeta is when the workload's first metadata change (a small
	// file created, written, renamed) ended at the new leader.
	FirstMeta time.Duration `json:"first_meta_ns"`
	// IOResume is when the workload's next step of any kind (a big-file
	// chunk or a small file) ended once the new leader led; Pause is the
	// longest gap between steps from the fault on (data I/O to the data
	// servers can go on while no MDS leads).
	IOResume time.Duration `json:"io_resume_ns"`
	Pause    time.Duration `json:"pause_ns"`
	Term     uint64        `json:"-"`
}

// Inject takes the current leader away by f and returns the new leader and
// when the fault happened and when the new leader was seen.
func (w *World) Inject(f Fault) (old, next *MDS, at time.Time, detect time.Duration) {
	w.T.Helper()
	old = w.WaitLeader(nil, 30*time.Second)
	at = time.Now()
	switch f {
	case Kill:
		// Started again 1 s later, as systemd would. The new leader
		// cannot lead before that (the killed leader's lease lasts 3 s
		// unless its restart ends it), so waiting here costs the
		// measurement nothing and keeps the World single-goroutine.
		old.P.Signal(syscall.SIGKILL)
		time.Sleep(time.Second)
		_ = old.P.Wait(10 * time.Second)
		w.StartMDS(old)
	case Stop:
		old.P.Signal(syscall.SIGSTOP)
	case StepDown:
		if out, err := w.Admin("step-down"); err != nil {
			w.T.Fatalf("step-down: %v: %s", err, out)
		}
	}
	next = w.WaitLeader(old, 60*time.Second)
	detect = time.Since(at)
	if f == Stop {
		old.P.Signal(syscall.SIGCONT)
	}
	return old, next, at, detect
}

// Measure derives a trial's times from the workload's progress after at.
func Measure(f Fault, at time.Time, detect time.Duration, progress []time.Time, meta []time.Time) Trial {
	tr := Trial{Fault: f, Detect: detect, IOResume: -1, FirstMeta: -1}
	prev := at
	for _, p := range progress {
		if p.Before(at) {
			continue
		}
		if tr.IOResume < 0 && p.Sub(at) >= detect {
			tr.IOResume = p.Sub(at)
		}
		if g := p.Sub(prev); g > tr.Pause {
			tr.Pause = g
		}
		prev = p
	}
	for _, p := range meta {
		if p.Sub(at) >= detect {
			tr.FirstMeta = p.Sub(at)
			break
		}
	}
	return tr
}

func (t Trial) String() string {
	return fmt.Sprintf("%-9s detect %6.2fs  first metadata op %6.2fs  I/O resumed %6.2fs  longest pause %6.2fs",
		t.Fault, t.Detect.Seconds(), t.FirstMeta.Seconds(), t.IOResume.Seconds(), t.Pause.Seconds())
}

// ctxTimeout is a context for one phase of a test.
func ctxTimeout(d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), d)
}
