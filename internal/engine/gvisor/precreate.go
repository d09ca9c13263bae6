package gvisor

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/k7-dev/k7/internal/engine"
)

var _ engine.Precreator = (*Engine)(nil)

// precreated are the sandboxes made by Precreate and not yet restored:
// their container ("runsc create") exists under the sandbox's own ID and
// dir. Unlike the fork pool (pool.go), a precreated container can have a
// network namespace, since it belongs to one sandbox ID from the start.
// The set is in memory: after a restart, a precreated sandbox is an
// ordinary engine sandbox without a record (the daemon deletes it).
type precreated struct {
	mu   sync.Mutex
	sbxs map[string]precreatedEntry
}

type precreatedEntry struct {
	key   poolKey
	netns string
	pid   int // the sandbox process, to skip a dead container
}

// Precreate runs "runsc create" for sandbox req.ID with its bundle and
// FIFOs, exactly as Restore would first, so that a later Restore of req.ID
// only runs "runsc restore". The caller deletes a sandbox it never
// restores with Delete. Safe for concurrent use on different IDs.
func (e *Engine) Precreate(ctx context.Context, req *engine.CreateRequest) (err error) {
	if err := e.checkCreate(req); err != nil {
		return err
	}
	id, dir := req.ID, e.dir(req.ID)
	log := e.log.With("sandbox", id)
	start := time.Now()
	var cu cleanup
	defer func() {
		if err != nil {
			cu.clean(ctx)
			err = fmt.Errorf("pre-creating sandbox %q: %w", id, err)
		}
	}()
	stdio, err := e.prepare(dir, req, &cu)
	if err != nil {
		return err
	}
	defer stdio.close()
	if err := step(log, "runsc create", func() error {
		cu.add(func(ctx context.Context) { e.destroy(ctx, log, id, dir) })
		return e.runscStdio(ctx, dir, stdio, "create", "--bundle", dir, id)
	}); err != nil {
		return err
	}
	pid, err := e.createdPID(ctx, id)
	if err != nil {
		return err
	}
	e.pre.mu.Lock()
	e.pre.sbxs[id] = precreatedEntry{key: poolKey{rootfs: req.Rootfs, res: req.Resources}, netns: req.Netns, pid: pid}
	e.pre.mu.Unlock()
	cu.release()
	log.Debug("sandbox pre-created", "took", time.Since(start))
	return nil
}

// takePrecreated forgets and returns the precreated container of id.
func (e *Engine) takePrecreated(id string) (precreatedEntry, bool) {
	e.pre.mu.Lock()
	defer e.pre.mu.Unlock()
	ent, ok := e.pre.sbxs[id]
	delete(e.pre.sbxs, id)
	return ent, ok
}
