package gvisor

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/k7-dev/k7/internal/engine"
	"github.com/k7-dev/k7/internal/errdefs"
)

// versionFile in a capture dir holds the Version of the engine that wrote it.
const versionFile = "engine-version"

// Checkpoint captures a running sandbox into req.Dir as "runsc checkpoint
// --leave-running" does (see control.go). The source is paused for about the
// duration of the call (reported as SourcePause). Blocking reads in the
// guest return early (EINTR) during a checkpoint.
func (e *Engine) Checkpoint(ctx context.Context, req *engine.CheckpointRequest) (*engine.CheckpointResult, error) {
	if err := checkID(req.ID); err != nil {
		return nil, err
	}
	if !e.exists(req.ID) {
		return nil, fmt.Errorf("checkpointing sandbox %q: %w", req.ID, errdefs.ErrNotFound)
	}
	if req.Dir == "" {
		return nil, fmt.Errorf("checkpointing sandbox %q: no capture dir: %w", req.ID, errdefs.ErrInvalidArgument)
	}
	if err := os.MkdirAll(req.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("checkpointing sandbox %q: %w", req.ID, err)
	}
	start := time.Now()
	if err := e.checkpoint(ctx, e.cid(req.ID), req.Dir); err != nil {
		return nil, fmt.Errorf("checkpointing sandbox %q: %w", req.ID, err)
	}
	pause := time.Since(start)
	if err := os.WriteFile(filepath.Join(req.Dir, versionFile), []byte(e.version+"\n"), 0o600); err != nil {
		return nil, fmt.Errorf("checkpointing sandbox %q: %w", req.ID, err)
	}
	size, err := dirSize(req.Dir)
	if err != nil {
		return nil, fmt.Errorf("checkpointing sandbox %q: %w", req.ID, err)
	}
	e.log.Info("sandbox checkpointed", "sandbox", req.ID, "took", pause, "bytes", size)
	return &engine.CheckpointResult{SourcePause: pause, SizeBytes: size, EngineVersion: e.version}, nil
}

func dirSize(dir string) (int64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			fi, err := d.Info()
			if err != nil {
				return err
			}
			n += fi.Size()
		}
		return nil
	})
	return n, err
}

// Restore starts a new sandbox from a capture made by Checkpoint. The
// sandbox process is made by "runsc create" with the child's own FIFOs as
// stdio (the restored init inherits the stdio of the command that starts
// the sandbox process), or taken from the pool of pre-created containers
// for the same rootfs and resources (only without req.Netns: a child with a
// network restores into its own namespace, which must hold the capture's
// address), or the one Precreate made for req.ID when its rootfs, resources
// and namespace match; then "runsc restore --detach". The
// source need not exist any more; req.Rootfs must be the source's image
// rootfs. A capture of another engine version is refused with
// errdefs.ErrFailedPrecondition. On error nothing is left behind.
//
// The child keeps the source's host name and environment (they are part of
// the capture): the daemon sets the host name through the agent.
// Processes started by "runsc exec" are not carried (runsc kills them);
// the agent's children are.
func (e *Engine) Restore(ctx context.Context, req *engine.RestoreRequest) (err error) {
	if err := e.checkCreate(&req.CreateRequest); err != nil {
		return err
	}
	if err := e.checkCapture(req.From); err != nil {
		return fmt.Errorf("restoring sandbox %q: %w", req.ID, err)
	}
	id, dir := req.ID, e.dir(req.ID)
	log := e.log.With("sandbox", id)
	start := time.Now()
	var cu cleanup
	defer func() {
		if err != nil {
			cu.clean(ctx)
			err = fmt.Errorf("restoring sandbox %q: %w", id, err)
		}
	}()
	// A container that Precreate made for this ID, if it matches; else a
	// pool container. A pool container's network namespace is fixed when
	// it is created, and every child needs its own: children with a
	// network skip the pool.
	cid, pre := "", false
	if ent, ok := e.takePrecreated(id); ok {
		switch {
		case ent.key != (poolKey{rootfs: req.Rootfs, res: req.Resources}) || ent.netns != req.Netns:
			log.Info("discarding a pre-created container that does not match the restore")
			e.destroy(ctx, log, id, dir)
		case !pidAlive(ent.pid):
			log.Warn("discarding a dead pre-created container")
			e.destroy(ctx, log, id, dir)
		default:
			cid, pre = id, true
			cu.add(func(ctx context.Context) { e.destroy(ctx, log, id, dir) })
			log.Debug("using the container pre-created for the sandbox")
		}
	}
	if cid == "" && req.Netns == "" {
		key := poolKey{rootfs: req.Rootfs, res: req.Resources}
		defer e.refill(key)
		if cid, err = e.claim(key, id); err != nil {
			return err
		}
	}
	switch {
	case pre:
	case cid != "":
		cu.add(func(ctx context.Context) { e.destroy(ctx, log, cid, dir) })
		log.Debug("using a pre-created container", "container", cid)
	default:
		// No container made in advance: one "runsc restore" creates and
		// restores it (one runsc process instead of two), and the new init
		// takes that command's stdio, the sandbox's FIFOs.
		stdio, err := e.prepare(dir, &req.CreateRequest, &cu)
		if err != nil {
			return err
		}
		defer stdio.close()
		cu.add(func(ctx context.Context) { e.destroy(ctx, log, id, dir) })
		if err := step(log, "runsc restore (create)", func() error {
			return e.runscStdio(ctx, dir, stdio, "restore", "--detach", "--image-path", req.From, "--bundle", dir, id)
		}); err != nil {
			return err
		}
		cu.release()
		log.Info("sandbox restored", "from", req.From, "container", id, "took", time.Since(start))
		return nil
	}
	if err := step(log, "runsc restore", func() error {
		_, err := e.runsc(ctx, dir, "restore", "--detach", "--image-path", req.From, "--bundle", dir, cid)
		return err
	}); err != nil {
		return err
	}
	cu.release()
	log.Info("sandbox restored", "from", req.From, "container", cid, "took", time.Since(start))
	return nil
}

// checkCapture refuses captures of another engine version.
func (e *Engine) checkCapture(dir string) error {
	b, err := os.ReadFile(filepath.Join(dir, versionFile))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("capture %q has no %s: %w", dir, versionFile, errdefs.ErrFailedPrecondition)
		}
		return fmt.Errorf("reading capture version: %w", err)
	}
	if v := strings.TrimSpace(string(b)); v != e.version {
		return fmt.Errorf("capture %q was made by engine version %q, this is %q: %w", dir, v, e.version, errdefs.ErrFailedPrecondition)
	}
	return nil
}
