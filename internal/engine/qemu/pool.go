package qemu

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// forkPool keeps idle QEMU processes for Restore: started with the shape
// of a recent capture (RAM size, vCPUs, root disk, NIC) in -preconfig state, so
// that a restore skips QEMU's start-up (dynamic loading, device setup)
// and only adds the RAM backend, finishes machine init and loads the
// device state. Idle processes run no guest code and cost about 40 MB
// each. A process for a capture with a NIC holds its tap in a netns of its
// own until a restore moves it into the child's (see attachTap). Safe for
// concurrent use.
type forkPool struct {
	size int // idle processes per shape; 0 disables the pool

	mu     sync.Mutex
	idle   []*poolEntry
	closed bool
}

// refillDelay is how long a refill waits after a restore: the new child's
// first commands are slow under TCG (cold translation cache) and should
// not compete with a QEMU start-up on a small host.
const refillDelay = 500 * time.Millisecond

type poolEntry struct {
	st     *vmState
	shape  string
	exited <-chan struct{}
}

func shapeOf(st *vmState) string {
	mac := ""
	if st.Net != nil {
		mac = st.Net.MAC
	}
	return fmt.Sprintf("%d/%d/%s/%s", st.MemoryBytes, st.CPUs, st.Disk, mac)
}

func (e *Engine) poolRoot() string { return filepath.Join(e.cfg.Root, "pool") }

// poolTake returns an idle process of st's shape, or nil.
func (e *Engine) poolTake(st *vmState) *poolEntry {
	p := e.pool
	p.mu.Lock()
	defer p.mu.Unlock()
	shape := shapeOf(st)
	for i, en := range p.idle {
		if en.shape != shape {
			continue
		}
		p.idle = append(p.idle[:i:i], p.idle[i+1:]...)
		if !alive(en.st) {
			go e.poolDiscard(en)
			return nil
		}
		return en
	}
	return nil
}

// poolRefill starts idle processes of st's shape, after a pause that lets
// the restore that asked for them finish first, up to the pool size; it
// stops idle processes of other shapes beyond that size.
func (e *Engine) poolRefill(st *vmState) {
	if e.pool.size == 0 {
		return
	}
	shape := *st
	time.AfterFunc(refillDelay, func() {
		p := e.pool
		p.mu.Lock()
		n := 0
		var evict []*poolEntry
		var keep []*poolEntry
		for _, en := range p.idle {
			switch {
			case en.shape == shapeOf(&shape):
				n++
				keep = append(keep, en)
			case len(p.idle)-len(evict) > p.size:
				evict = append(evict, en)
			default:
				keep = append(keep, en)
			}
		}
		p.idle = keep
		closed := p.closed
		p.mu.Unlock()
		for _, en := range evict {
			e.poolDiscard(en)
		}
		for ; n < p.size && !closed; n++ {
			en, err := e.poolSpawn(&shape)
			if err != nil {
				e.log.Warn("starting a fork-pool QEMU", "err", err)
				return
			}
			p.mu.Lock()
			if p.closed {
				p.mu.Unlock()
				e.poolDiscard(en)
				return
			}
			p.idle = append(p.idle, en)
			p.mu.Unlock()
		}
	})
}

func (e *Engine) poolSpawn(shape *vmState) (*poolEntry, error) {
	if err := os.MkdirAll(e.poolRoot(), 0o755); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(e.poolRoot(), "p")
	if err != nil {
		return nil, err
	}
	st := &vmState{ID: "pool", MemoryBytes: shape.MemoryBytes, CPUs: shape.CPUs, Disk: shape.Disk,
		Net: shape.Net, SockDir: dir, Incoming: "pool", poolDir: dir}
	exited, err := e.launch(st)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	b, _ := json.Marshal(st)
	_ = os.WriteFile(filepath.Join(dir, stateFile), b, 0o644)
	en := &poolEntry{st: st, shape: shapeOf(shape), exited: exited}
	// Ready once the monitor answers: QEMU opened its files (console, log)
	// before, so the dir may be renamed from then on.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	q, err := e.dialMonitor(ctx, st, exited)
	if err != nil {
		e.poolDiscard(en)
		return nil, err
	}
	_ = q.Close()
	return en, nil
}

func (e *Engine) poolDiscard(en *poolEntry) {
	e.kill(context.Background(), en.st)
	_ = os.RemoveAll(en.st.poolDir)
}

// claim turns a pool process into sandbox st: its dir (sockets and logs
// included; QEMU keeps them open) is renamed to the sandbox's, and the RAM
// backend is added before machine init completes.
func (e *Engine) claim(ctx context.Context, q *qmp, st *vmState) error {
	mem := map[string]any{"qom-type": "memory-backend-ram", "id": "mem", "size": st.MemoryBytes}
	if st.Frozen != "" {
		mem = map[string]any{"qom-type": "memory-backend-file", "id": "mem", "size": st.MemoryBytes,
			"mem-path": st.Frozen, "share": false}
	}
	if _, err := q.Execute(ctx, "object-add", mem); err != nil {
		return err
	}
	if _, err := q.Execute(ctx, "qom-set", map[string]any{"path": "/machine", "property": "memory-backend", "value": "mem"}); err != nil {
		return err
	}
	_, err := q.Execute(ctx, "x-exit-preconfig", nil)
	return err
}

// Close stops the fork pool's idle processes and closes the kept QMP
// connections. Sandboxes keep running. The Engine must not be used for
// Restore after.
func (e *Engine) Close() error {
	e.mons.closeAll()
	p := e.pool
	p.mu.Lock()
	idle := p.idle
	p.idle, p.closed = nil, true
	p.mu.Unlock()
	for _, en := range idle {
		e.poolDiscard(en)
	}
	return nil
}

// cleanStalePool stops pool processes left by an earlier Engine on Root
// (a daemon that did not Close).
func (e *Engine) cleanStalePool() {
	dirs, _ := filepath.Glob(filepath.Join(e.poolRoot(), "p*"))
	for _, d := range dirs {
		var st vmState
		if b, err := os.ReadFile(filepath.Join(d, stateFile)); err == nil && json.Unmarshal(b, &st) == nil {
			st.SockDir = d
			e.kill(context.Background(), &st)
		}
		_ = os.RemoveAll(d)
	}
}
