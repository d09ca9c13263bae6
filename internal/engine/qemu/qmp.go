package qemu

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"sync"
	"time"
)

// qmp is a minimal QEMU Machine Protocol client over a unix socket. QEMU's
// monitor serves one client at a time (monitor.go keeps one per sandbox).
// Not safe for concurrent commands.
type qmp struct {
	conn net.Conn
	r    *bufio.Reader

	mu     sync.Mutex
	events []qmpEvent
}

type qmpEvent struct {
	Event string          `json:"event"`
	Data  json.RawMessage `json:"data"`
}

type qmpReply struct {
	Return json.RawMessage `json:"return"`
	Error  *struct {
		Class string `json:"class"`
		Desc  string `json:"desc"`
	} `json:"error"`
	Event string          `json:"event"`
	Data  json.RawMessage `json:"data"`
	QMP   json.RawMessage `json:"QMP"`
}

// qmpGreetTimeout bounds the wait for QEMU's greeting: QEMU greets a new
// client at once unless another client holds its monitor, and then says
// nothing until that one leaves.
const qmpGreetTimeout = 5 * time.Second

// dialQMP connects to sock, reads the greeting and negotiates capabilities.
func dialQMP(ctx context.Context, sock string) (*qmp, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", sock)
	if err != nil {
		return nil, fmt.Errorf("dialing QMP: %w", err)
	}
	q := &qmp{conn: conn, r: bufio.NewReader(conn)}
	gctx, cancel := context.WithTimeout(ctx, qmpGreetTimeout)
	defer cancel()
	if _, err := q.read(gctx); err != nil {
		_ = conn.Close()
		if ctx.Err() == nil && gctx.Err() != nil {
			return nil, fmt.Errorf("QEMU's monitor did not greet within %v (another client holds it)", qmpGreetTimeout)
		}
		return nil, fmt.Errorf("reading QMP greeting: %w", err)
	}
	if _, err := q.Execute(ctx, "qmp_capabilities", nil); err != nil {
		_ = conn.Close()
		return nil, err
	}
	return q, nil
}

func (q *qmp) Close() error { return q.conn.Close() }

// dropEvents forgets the events received so far.
func (q *qmp) dropEvents() {
	q.mu.Lock()
	q.events = nil
	q.mu.Unlock()
}

func (q *qmp) read(ctx context.Context) (*qmpReply, error) {
	if dl, ok := ctx.Deadline(); ok {
		_ = q.conn.SetReadDeadline(dl)
	} else {
		_ = q.conn.SetReadDeadline(time.Time{})
	}
	stop := context.AfterFunc(ctx, func() { _ = q.conn.SetReadDeadline(time.Unix(1, 0)) })
	defer stop()
	line, err := q.r.ReadBytes('\n')
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	var r qmpReply
	if err := json.Unmarshal(line, &r); err != nil {
		return nil, fmt.Errorf("decoding QMP message %q: %w", line, err)
	}
	return &r, nil
}

// Execute runs one command and returns its "return" value. Events read
// meanwhile are kept for WaitEvent.
func (q *qmp) Execute(ctx context.Context, cmd string, args any) (json.RawMessage, error) {
	msg := map[string]any{"execute": cmd}
	if args != nil {
		msg["arguments"] = args
	}
	b, _ := json.Marshal(msg)
	if _, err := q.conn.Write(append(b, '\n')); err != nil {
		return nil, fmt.Errorf("QMP %s: %w", cmd, err)
	}
	for {
		r, err := q.read(ctx)
		if err != nil {
			return nil, fmt.Errorf("QMP %s: %w", cmd, err)
		}
		if r.Event != "" {
			q.mu.Lock()
			q.events = append(q.events, qmpEvent{r.Event, r.Data})
			q.mu.Unlock()
			continue
		}
		if r.Error != nil {
			return nil, fmt.Errorf("QMP %s: %s: %s", cmd, r.Error.Class, r.Error.Desc)
		}
		return r.Return, nil
	}
}

// WaitEvent returns the first event (already received or arriving before
// ctx ends) for which match returns true.
func (q *qmp) WaitEvent(ctx context.Context, match func(qmpEvent) bool) (qmpEvent, error) {
	q.mu.Lock()
	for i, e := range q.events {
		if match(e) {
			q.events = append(q.events[:i:i], q.events[i+1:]...)
			q.mu.Unlock()
			return e, nil
		}
	}
	q.events = nil
	q.mu.Unlock()
	for {
		r, err := q.read(ctx)
		if err != nil {
			return qmpEvent{}, err
		}
		if r.Event != "" && match(qmpEvent{r.Event, r.Data}) {
			return qmpEvent{r.Event, r.Data}, nil
		}
	}
}
