package client

// SetMaxBackground gives c's cache n background slots (write-backs and
// readaheads in flight at once) instead of maxBackground, so that tests can
// exercise concurrent write-backs of one file. Call it before any I/O.
func SetMaxBackground(c *Client, n int) {
	if c.cache != nil {
		c.cache.bg = make(chan struct{}, n)
	}
}
