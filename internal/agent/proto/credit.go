package proto

import "sync"

// Credit is a stream sender's flow-control window: the bytes it may still
// send before the receiver credits them back. It is safe for concurrent use.
type Credit struct {
	mu     sync.Mutex
	n      int
	closed bool
	wake   chan struct{} // holds a token when n > 0 or closed
}

// NewCredit returns a window holding n bytes of credit.
func NewCredit(n int) *Credit {
	c := &Credit{n: n, wake: make(chan struct{}, 1)}
	if n > 0 {
		c.wake <- struct{}{}
	}
	return c
}

// Take waits until credit is available and takes up to max bytes of it. It
// returns false when the window was closed or done was closed first.
func (c *Credit) Take(done <-chan struct{}, max int) (int, bool) {
	for {
		c.mu.Lock()
		if c.closed {
			c.signal() // wake the next waiter too
			c.mu.Unlock()
			return 0, false
		}
		if c.n > 0 {
			n := min(max, c.n)
			c.n -= n
			if c.n > 0 {
				c.signal()
			}
			c.mu.Unlock()
			return n, true
		}
		c.mu.Unlock()
		select {
		case <-c.wake:
		case <-done:
			return 0, false
		}
	}
}

// Add returns n bytes of credit.
func (c *Credit) Add(n int) {
	if n <= 0 {
		return
	}
	c.mu.Lock()
	c.n += n
	c.signal()
	c.mu.Unlock()
}

// Close wakes every waiter; later Takes return false. It may be repeated.
func (c *Credit) Close() {
	c.mu.Lock()
	c.closed = true
	c.signal()
	c.mu.Unlock()
}

func (c *Credit) signal() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}
