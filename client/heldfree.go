package client

import (
	"sync"
	"time"
)

// heldFree keeps the buffers of held copies (unstable.go) for reuse, so a
// streaming write copies into memory that is already mapped and warm.
// Through sync.Pool alone the buffers went back to the garbage collector
// at its cycles, and a mount that streams large files spent more on
// faulting in and zeroing fresh pages for the copies than on the copies
// themselves (issue 27). The list holds at most heldFreeMax bytes, the
// memory one File may keep at its peak (DefaultUnstableLimit), and is
// emptied once no buffer has been taken or returned for heldFreeIdle, so
// an idle client does not keep it. Beyond the bound buffers go to the
// sync.Pools as before.
var heldFree heldFreeList

const (
	heldFreeMax  = DefaultUnstableLimit
	heldFreeIdle = 10 * time.Second
)

type heldFreeList struct {
	mu    sync.Mutex
	bufs  [heldMaxShift - heldMinShift + 1][]*heldBuf // by size class
	bytes int64                                       // capacity of the buffers listed
	used  bool                                        // taken from or returned to since the last trim check
	armed bool                                        // a trim check is scheduled
}

// get returns a listed buffer of size class c, or nil.
func (l *heldFreeList) get(c int) *heldBuf {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.bufs[c]
	if len(s) == 0 {
		return nil
	}
	hb := s[len(s)-1]
	s[len(s)-1] = nil
	l.bufs[c] = s[:len(s)-1]
	l.bytes -= int64(cap(hb.b))
	l.used = true
	return hb
}

// put lists hb, a buffer of size class c, unless the list is full; it
// reports whether it did.
func (l *heldFreeList) put(hb *heldBuf, c int) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.bytes+int64(cap(hb.b)) > heldFreeMax {
		return false
	}
	l.bufs[c] = append(l.bufs[c], hb)
	l.bytes += int64(cap(hb.b))
	l.used = true
	if !l.armed {
		l.armed = true
		time.AfterFunc(heldFreeIdle, l.trim)
	}
	return true
}

// trim empties the list if it went unused since the last check, and
// otherwise checks again later.
func (l *heldFreeList) trim() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.used {
		l.used = false
		time.AfterFunc(heldFreeIdle, l.trim)
		return
	}
	l.armed = false
	for c := range l.bufs {
		clear(l.bufs[c])
		l.bufs[c] = nil
	}
	l.bytes = 0
}
