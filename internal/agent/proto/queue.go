package proto

import "sync"

// Queue is an unbounded FIFO whose Push never blocks. Protocol readers use
// it to hand frames to a per-stream goroutine without blocking on a slow
// consumer; flow control (Credit) bounds what a well-behaved peer puts in
// it. It is safe for concurrent use.
type Queue[T any] struct {
	mu     sync.Mutex
	items  []T
	closed bool
	wake   chan struct{}
}

// NewQueue returns an empty queue.
func NewQueue[T any]() *Queue[T] { return &Queue[T]{wake: make(chan struct{}, 1)} }

// Push appends v; after Close it drops v and returns false.
func (q *Queue[T]) Push(v T) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return false
	}
	q.items = append(q.items, v)
	select {
	case q.wake <- struct{}{}:
	default:
	}
	return true
}

// Pop waits for the next item. It returns false when the queue is closed
// and empty, or when done is closed.
func (q *Queue[T]) Pop(done <-chan struct{}) (T, bool) {
	for {
		q.mu.Lock()
		if len(q.items) > 0 {
			v := q.items[0]
			var zero T
			q.items[0] = zero
			q.items = q.items[1:]
			if len(q.items) == 0 {
				q.items = nil
			}
			q.mu.Unlock()
			return v, true
		}
		if q.closed {
			q.mu.Unlock()
			var zero T
			return zero, false
		}
		q.mu.Unlock()
		select {
		case <-q.wake:
		case <-done:
			var zero T
			return zero, false
		}
	}
}

// Close ends the queue: Pop drains what is left, then returns false. It may
// be repeated.
func (q *Queue[T]) Close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}
