package xdr

// Mark returns the current logical length of the output, for BytesSince and
// Truncate.
func (e *Encoder) Mark() int { return e.Len() }

// BytesSince returns a copy of everything encoded after mark.
func (e *Encoder) BytesSince(mark int) []byte {
	out := make([]byte, 0, e.Len()-mark)
	skip := mark
	for _, b := range e.Buffers() {
		if skip >= len(b) {
			skip -= len(b)
			continue
		}
		out = append(out, b[skip:]...)
		skip = 0
	}
	return out
}

// Truncate discards everything encoded after mark.
func (e *Encoder) Truncate(mark int) {
	// Walk segments in order to find the physical cut point.
	logical, prev := 0, 0
	for i, x := range e.ext {
		seg := x.at - prev
		if logical+seg >= mark {
			e.buf = e.buf[:prev+(mark-logical)]
			e.ext = e.ext[:i]
			return
		}
		logical += seg
		if logical+len(x.b) > mark {
			// A spliced slice cannot be cut in the middle; drop it whole.
			e.buf = e.buf[:x.at]
			e.ext = e.ext[:i]
			return
		}
		logical += len(x.b)
		prev = x.at
	}
	e.buf = e.buf[:prev+(mark-logical)]
}
