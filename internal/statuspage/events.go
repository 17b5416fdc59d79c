package statuspage

import (
	"slices"
	"sync"
	"time"
)

// DefaultEvents is how many events an EventLog keeps by default.
const DefaultEvents = 100

// mergeWindow is how far back an event merges with an identical one.
// Some events repeat by design (an unanswered layout recall is sent again
// every second); merged, they take one line with a count instead of
// pushing everything else out of the log.
const mergeWindow = 30 * time.Second

// EventLog keeps the most recent events, for Snapshot.Events. It is safe
// for concurrent use, and Add never blocks for long: it is called from
// the servers' own goroutines.
type EventLog struct {
	mu     sync.Mutex
	max    int
	events []Event // oldest first
	now    func() time.Time
}

// NewEventLog returns a log that keeps the last max events (DefaultEvents
// if max <= 0).
func NewEventLog(max int) *EventLog {
	if max <= 0 {
		max = DefaultEvents
	}
	return &EventLog{max: max, now: time.Now}
}

// Add records e; a zero Time is now. An event of the same kind, subject
// and detail as one less than mergeWindow older is merged with it: the
// older one moves up, its count grows and its time becomes e's.
func (l *EventLog) Add(e Event) {
	if e.Time.IsZero() {
		e.Time = l.now()
	}
	e.Count = max(e.Count, 1)
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := len(l.events) - 1; i >= 0 && e.Time.Sub(l.events[i].Time) < mergeWindow; i-- {
		if o := l.events[i]; o.Kind == e.Kind && o.Subject == e.Subject && o.Detail == e.Detail {
			e.Count += o.Count
			l.events = slices.Delete(l.events, i, i+1)
			break
		}
	}
	l.events = append(l.events, e)
	if over := len(l.events) - l.max; over > 0 {
		l.events = slices.Delete(l.events, 0, over)
	}
}

// Events returns the events kept, newest first.
func (l *EventLog) Events() []Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := slices.Clone(l.events)
	slices.Reverse(out)
	return out
}
