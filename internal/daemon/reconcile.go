package daemon

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	v1 "github.com/k7-dev/k7/api/v1"
	"github.com/k7-dev/k7/internal/engine"
	"github.com/k7-dev/k7/internal/errdefs"
	"github.com/k7-dev/k7/internal/store"
)

// watch waits for a's transport to end and then checks the sandbox: a dead
// sandbox is recorded as such, a live one gets a new connection.
func (d *Daemon) watch(sb *sandbox, a Agent) {
	defer d.wg.Done()
	select {
	case <-d.ctx.Done():
		return
	case <-a.Done():
	}
	if !sb.dropAgent(a) {
		return // replaced or closed on purpose
	}
	_ = a.Close()
	d.sbLog(sb.id).Info("agent connection closed; checking sandbox")
	if err := sb.acquire(d.ctx); err != nil {
		return
	}
	defer sb.release()
	d.check(sb, "agent connection lost")
}

// reconcileLoop compares records with the engines every ReconcileInterval
// until the daemon closes.
func (d *Daemon) reconcileLoop() {
	defer d.wg.Done()
	t := time.NewTicker(d.cfg.ReconcileInterval)
	defer t.Stop()
	for {
		select {
		case <-d.ctx.Done():
			return
		case <-t.C:
		}
		recs, err := d.store.ListSandboxes()
		if err != nil {
			d.log.Warn("reconcile: listing sandboxes", "err", err)
			continue
		}
		for _, r := range recs {
			if r.State != v1.StateRunning && r.State != v1.StatePaused {
				continue
			}
			sb := d.entry(r.ID)
			if !sb.tryAcquire() {
				continue // busy: an operation is in progress, look next time
			}
			d.check(sb, "")
			sb.release()
		}
	}
}

// check compares sb's record with the engine and fixes the record; a
// running sandbox without an agent connection is reconnected. The caller
// holds sb's lock.
func (d *Daemon) check(sb *sandbox, why string) {
	log := d.sbLog(sb.id)
	rec, err := d.store.GetSandbox(sb.id)
	if err != nil || (rec.State != v1.StateRunning && rec.State != v1.StatePaused) {
		return
	}
	eng, err := d.engine(rec.Engine)
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(d.ctx, 10*time.Second)
	defer cancel()
	st, err := eng.Status(ctx, rec.ID)
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		st = engine.Status{State: engine.StateDead, Reason: "the engine lost the sandbox"}
	case err != nil:
		log.Warn("reconcile: engine status", "err", err)
		return
	}
	switch st.State {
	case engine.StateRunning, engine.StatePaused:
		if s := st.State.String(); s != rec.State {
			log.Info("state changed outside the daemon", "from", rec.State, "to", s)
			rec.State = s
			if err := d.store.UpdateSandbox(rec); err != nil {
				log.Warn("reconcile: saving state", "err", err)
			}
		}
		if st.State == engine.StateRunning && sb.getAgent() == nil {
			a, err := d.connect(ctx, eng, rec.ID)
			if err != nil {
				log.Warn("reconnecting agent", "err", err)
				return
			}
			log.Info("agent reconnected")
			d.attach(sb, a)
		}
	case engine.StateDead, engine.StateStopped:
		d.markGone(sb, rec, st.State.String(), firstNonEmpty(st.Reason, why, "sandbox "+st.State.String()))
	}
}

func (d *Daemon) markGone(sb *sandbox, rec *store.Sandbox, state, reason string) {
	sb.setAgent(nil)
	rec.State, rec.Reason = state, reason
	if err := d.store.UpdateSandbox(rec); err != nil {
		d.sbLog(rec.ID).Warn("recording state", "err", err)
		return
	}
	d.sbLog(rec.ID).Warn("sandbox is "+state, "reason", reason)
}

func firstNonEmpty(s ...string) string {
	for _, x := range s {
		if x != "" {
			return x
		}
	}
	return ""
}

// recover reconciles the store with the engines after a start: running
// sandboxes are reconnected, lost ones marked dead, interrupted creates
// undone and engine sandboxes without a record (orphans) deleted.
func (d *Daemon) recover(ctx context.Context) {
	recs, err := d.store.ListSandboxes()
	if err != nil {
		d.log.Error("recover: listing sandboxes", "err", err)
		return
	}
	known := map[string]bool{}
	for i := range recs {
		rec := &recs[i]
		known[rec.ID] = true
		log := d.sbLog(rec.ID)
		eng, err := d.engine(rec.Engine)
		if err != nil {
			log.Warn("recover: engine unavailable; record left as is", "engine", rec.Engine, "err", err)
			continue
		}
		sb := d.entry(rec.ID)
		octx, cancel := context.WithTimeout(ctx, 30*time.Second)
		switch rec.State {
		case v1.StateCreating:
			log.Info("recover: removing sandbox whose create was interrupted")
			if err := eng.Delete(octx, rec.ID); err != nil {
				log.Warn("recover: deleting", "err", err)
			}
			_ = d.store.DeleteSandbox(rec.ID, false)
			d.forget(rec.ID)
		case v1.StateRunning, v1.StatePaused:
			st, err := eng.Status(octx, rec.ID)
			switch {
			case errors.Is(err, errdefs.ErrNotFound) || (err == nil && (st.State == engine.StateDead || st.State == engine.StateUnknown)):
				d.markGone(sb, rec, v1.StateDead, "lost during daemon restart")
			case err != nil:
				log.Warn("recover: engine status", "err", err)
			case st.State == engine.StateStopped:
				d.markGone(sb, rec, v1.StateStopped, firstNonEmpty(st.Reason, "init exited while the daemon was down"))
			default:
				if s := st.State.String(); s != rec.State {
					rec.State = s
					if err := d.store.UpdateSandbox(rec); err != nil {
						log.Warn("recover: saving state", "err", err)
					}
				}
				if st.State == engine.StateRunning {
					a, err := d.connect(octx, eng, rec.ID)
					if err != nil {
						log.Warn("recover: reconnecting agent (will retry)", "err", err)
					} else {
						d.attach(sb, a)
						log.Info("recover: sandbox reconnected")
					}
				}
			}
		}
		cancel()
	}
	for name, eng := range d.engines {
		ids, err := eng.List(ctx)
		if err != nil {
			d.log.Warn("recover: listing engine sandboxes", "engine", name, "err", err)
			continue
		}
		for _, id := range ids {
			if known[id] {
				continue
			}
			d.sbLog(id).Info("recover: deleting orphan engine sandbox", "engine", name)
			octx, cancel := context.WithTimeout(ctx, 30*time.Second)
			if err := eng.Delete(octx, id); err != nil {
				d.sbLog(id).Warn("recover: deleting orphan", "err", err)
			}
			cancel()
		}
	}
}

// CleanupAll deletes every sandbox this daemon owns through the engines,
// then everything else under the state dir except the lock. The daemon
// must be closed afterwards.
func (d *Daemon) CleanupAll(ctx context.Context) error {
	d.closeSpares()
	var errs []error
	for _, in := range d.info {
		// An engine that cannot run cannot delete its sandboxes (or its
		// pool's) either: removing their files would orphan them.
		root := engineRoot(d.cfg.StateDir, in.Name)
		if !in.Available && (hasEntries(filepath.Join(root, "sandboxes")) || hasEntries(filepath.Join(root, "pool"))) {
			errs = append(errs, fmt.Errorf("engine %s is unavailable (%s): its sandboxes under %s cannot be deleted; fix that and run the cleanup again", in.Name, in.Reason, root))
		}
	}
	for name, eng := range d.engines {
		ids, err := eng.List(ctx)
		if err != nil {
			errs = append(errs, fmt.Errorf("listing %s sandboxes: %w", name, err))
			continue
		}
		for _, id := range ids {
			if err := eng.Delete(ctx, id); err != nil {
				errs = append(errs, fmt.Errorf("deleting sandbox %s: %w", id, err))
			} else {
				d.sbLog(id).Info("cleanup: sandbox deleted", "engine", name)
			}
		}
		if ds, ok := eng.(engine.Destroyer); ok && len(errs) == 0 {
			if err := ds.Destroy(ctx); err != nil {
				errs = append(errs, fmt.Errorf("destroying engine %s: %w", name, err))
			}
			delete(d.engines, name)
		}
	}
	if nets := d.openedNetworks(); nets != nil && len(errs) == 0 {
		if err := nets.RemoveAll(ctx); err != nil {
			errs = append(errs, fmt.Errorf("removing sandbox networks: %w", err))
		}
		d.netMu.Lock()
		d.net = nil
		d.netMu.Unlock()
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	// Stop background work and close the files before removing them.
	d.cancel()
	d.wg.Wait()
	_ = d.store.Close()
	d.store = nil
	ents, err := os.ReadDir(d.cfg.StateDir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if e.Name() == "k7d.lock" {
			continue
		}
		if err := os.RemoveAll(filepath.Join(d.cfg.StateDir, e.Name())); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// dirExists reports whether path is a directory.
func dirExists(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.IsDir()
}

// hasEntries reports whether dir is a directory with something in it.
func hasEntries(dir string) bool {
	ents, err := os.ReadDir(dir)
	return err == nil && len(ents) > 0
}
