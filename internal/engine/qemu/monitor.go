package qemu

import (
	"context"
	"fmt"
	"sync"

	"github.com/k7-dev/k7/internal/errdefs"
)

// QEMU's monitor serves one QMP client at a time. The engine keeps one
// connection open per running sandbox and reuses it for every operation, so
// that a pause or a status query costs one command, not a dial, a greeting
// and a capabilities negotiation as well. A connection that fails an
// operation is closed and the next operation dials again; kill closes it
// before it asks QEMU to quit. A restarted daemon starts with none.

// monitorConn is the kept QMP connection of one sandbox; mu serializes
// the operations on it.
type monitorConn struct {
	mu    sync.Mutex
	q     *qmp
	pid   int
	start uint64 // QEMU's start time: a reused PID is another process
}

type monitors struct {
	mu sync.Mutex
	m  map[string]*monitorConn
}

func (ms *monitors) get(id string) *monitorConn {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if ms.m == nil {
		ms.m = map[string]*monitorConn{}
	}
	c := ms.m[id]
	if c == nil {
		c = &monitorConn{}
		ms.m[id] = c
	}
	return c
}

// keep makes q, open on st's QEMU, the kept connection of st.ID unless one
// is kept already, and reports whether it did.
func (ms *monitors) keep(st *vmState, q *qmp) bool {
	c := ms.get(st.ID)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.q != nil {
		return false
	}
	c.q, c.pid, c.start = q, st.PID, st.StartTime
	return true
}

// drop closes and forgets id's connection, waiting for an operation on it.
func (ms *monitors) drop(id string) {
	ms.mu.Lock()
	c := ms.m[id]
	delete(ms.m, id)
	ms.mu.Unlock()
	if c != nil {
		c.mu.Lock()
		c.close()
		c.mu.Unlock()
	}
}

// closeAll closes every kept connection (the sandboxes keep running).
func (ms *monitors) closeAll() {
	ms.mu.Lock()
	ids := make([]string, 0, len(ms.m))
	for id := range ms.m {
		ids = append(ids, id)
	}
	ms.mu.Unlock()
	for _, id := range ids {
		ms.drop(id)
	}
}

func (c *monitorConn) close() {
	if c.q != nil {
		_ = c.q.Close()
		c.q = nil
	}
}

// monitor runs fn with the QMP connection of running sandbox id.
func (e *Engine) monitor(ctx context.Context, id string, fn func(*qmp, *vmState) error) error {
	st, err := e.state(id)
	if err != nil {
		return err
	}
	if !alive(st) {
		return fmt.Errorf("sandbox %q: QEMU is not running: %w", id, errdefs.ErrFailedPrecondition)
	}
	c := e.mons.get(id)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.q != nil && (c.pid != st.PID || c.start != st.StartTime) {
		c.close()
	}
	if c.q == nil {
		q, err := dialQMP(ctx, st.qmpSock())
		if err != nil {
			return err
		}
		c.q, c.pid, c.start = q, st.PID, st.StartTime
	}
	c.q.dropEvents() // those of earlier operations
	if err := fn(c.q, st); err != nil {
		c.close()
		return err
	}
	return nil
}
