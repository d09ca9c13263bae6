package gvisor

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/k7-dev/k7/internal/engine"
	"github.com/k7-dev/k7/internal/errdefs"
)

// The fork pool: containers made by "runsc create" ahead of time, for the
// rootfs and resources of a recent Restore, so that the next Restore of that
// kind only runs "runsc restore" (measured: create ≈ 170 ms, restore ≈
// 140 ms). A pool container lives in Root/pool/<cid>/ with its own bundle
// and FIFOs; Restore renames that dir to the sandbox's dir and records the
// container ID in it (containerFile). The pool is in memory: New removes the
// pool containers of an earlier process, Close those of this one.

const poolPrefix = "pool-"

func isPoolID(id string) bool { return strings.HasPrefix(id, poolPrefix) }

type poolKey struct {
	rootfs string
	res    engine.Resources
}

type poolEntry struct {
	cid string
	pid int // the sandbox process, to skip dead entries
}

type pool struct {
	mu      sync.Mutex
	free    map[poolKey][]poolEntry
	filling map[poolKey]int
	closed  bool
	wg      sync.WaitGroup
}

func (e *Engine) poolDir(cid string) string { return filepath.Join(e.cfg.Root, "pool", cid) }

// claim takes a pre-created container for key and moves its dir to the
// dir of sandbox id. It returns "" when the pool has none.
func (e *Engine) claim(key poolKey, id string) (string, error) {
	if e.cfg.ForkPool <= 0 {
		return "", nil
	}
	for {
		e.pool.mu.Lock()
		list := e.pool.free[key]
		if len(list) == 0 {
			e.pool.mu.Unlock()
			return "", nil
		}
		ent := list[len(list)-1]
		e.pool.free[key] = list[:len(list)-1]
		e.pool.mu.Unlock()
		if !pidAlive(ent.pid) {
			e.log.Warn("dropping a dead pool container", "container", ent.cid)
			e.destroy(context.Background(), e.log, ent.cid, e.poolDir(ent.cid))
			continue
		}
		dir := e.dir(id)
		if err := unix.Renameat2(unix.AT_FDCWD, e.poolDir(ent.cid), unix.AT_FDCWD, dir, unix.RENAME_NOREPLACE); err != nil {
			e.destroy(context.Background(), e.log, ent.cid, e.poolDir(ent.cid))
			if errors.Is(err, unix.EEXIST) {
				return "", fmt.Errorf("sandbox dir exists: %w", errdefs.ErrAlreadyExists)
			}
			return "", fmt.Errorf("claiming pool container: %w", err)
		}
		if err := os.WriteFile(filepath.Join(dir, containerFile), []byte(ent.cid+"\n"), 0o600); err != nil {
			e.destroy(context.Background(), e.log, ent.cid, dir)
			return "", fmt.Errorf("claiming pool container: %w", err)
		}
		return ent.cid, nil
	}
}

// poolRefillDelay lets a restored child start before the pool's "runsc
// create" competes with it for the CPUs.
const poolRefillDelay = 500 * time.Millisecond

// refill schedules pre-creating containers for key in the background, up
// to Config.ForkPool, after poolRefillDelay.
func (e *Engine) refill(key poolKey) {
	p := &e.pool
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || e.cfg.ForkPool <= 0 {
		return
	}
	p.wg.Add(1)
	time.AfterFunc(poolRefillDelay, func() {
		defer p.wg.Done()
		e.refillNow(key)
	})
}

func (e *Engine) refillNow(key poolKey) {
	p := &e.pool
	p.mu.Lock()
	need := e.cfg.ForkPool - len(p.free[key]) - p.filling[key]
	if p.closed || need <= 0 {
		p.mu.Unlock()
		return
	}
	p.filling[key] += need
	p.wg.Add(need)
	p.mu.Unlock()
	for range need {
		go func() {
			defer p.wg.Done()
			ent, err := e.precreate(key)
			p.mu.Lock()
			p.filling[key]--
			keep := err == nil && !p.closed
			if keep {
				p.free[key] = append(p.free[key], ent)
			}
			p.mu.Unlock()
			if err != nil {
				e.log.Warn("pre-creating a pool container", "err", err)
			} else if !keep {
				e.destroy(context.Background(), e.log, ent.cid, e.poolDir(ent.cid))
			}
		}()
	}
}

// precreate makes one pool container with "runsc create".
func (e *Engine) precreate(key poolKey) (ent poolEntry, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var b [8]byte
	rand.Read(b[:])
	cid := poolPrefix + hex.EncodeToString(b[:])
	dir := e.poolDir(cid)
	log := e.log.With("container", cid)
	var cu cleanup
	defer func() {
		if err != nil {
			cu.clean(ctx)
		}
	}()
	req := &engine.CreateRequest{ID: cid, Hostname: "k7-pool", Rootfs: key.rootfs, Resources: key.res}
	stdio, err := e.prepare(dir, req, &cu)
	if err != nil {
		return ent, err
	}
	defer stdio.close()
	if err := step(log, "runsc create", func() error {
		cu.add(func(ctx context.Context) { e.destroy(ctx, log, cid, dir) })
		return e.runscStdio(ctx, dir, stdio, "create", "--bundle", dir, cid)
	}); err != nil {
		return ent, err
	}
	pid, err := e.createdPID(ctx, cid)
	if err != nil {
		return ent, err
	}
	return poolEntry{cid: cid, pid: pid}, nil
}

// waitPool waits until the pool for key is full (benchmarks).
func (e *Engine) waitPool(key poolKey) {
	for {
		e.pool.mu.Lock()
		n := len(e.pool.free[key])
		e.pool.mu.Unlock()
		if n >= e.cfg.ForkPool {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// clearStalePool removes pool containers left by an earlier process.
func (e *Engine) clearStalePool(ctx context.Context) {
	ents, _ := os.ReadDir(filepath.Join(e.cfg.Root, "pool"))
	for _, d := range ents {
		e.destroy(ctx, e.log, d.Name(), e.poolDir(d.Name()))
	}
	out, err := e.runsc(ctx, "", "list", "-quiet")
	if err != nil {
		return
	}
	for _, cid := range strings.Fields(string(out)) {
		if isPoolID(cid) {
			if _, err := os.Stat(e.poolDir(cid)); err == nil {
				continue
			}
			// A pool container without a dir that no sandbox claimed.
			claimed := false
			sbx, _ := os.ReadDir(e.sbxRoot)
			for _, s := range sbx {
				if e.cid(s.Name()) == cid {
					claimed = true
				}
			}
			if !claimed {
				e.destroy(ctx, e.log, cid, e.poolDir(cid))
			}
		}
	}
}

// Close removes the fork pool's containers and stops refilling the pool.
// When no container is left, it also removes the engine's parent cgroups
// and unmounts the empty network namespace runsc pins under its root
// (runsc makes a new one when needed), so that Root can be removed.
// Sandboxes keep running. Call it once, when the engine is no longer used.
func (e *Engine) Close() error {
	p := &e.pool
	p.mu.Lock()
	p.closed = true
	var ents []poolEntry
	for _, l := range p.free {
		ents = append(ents, l...)
	}
	p.free = map[poolKey][]poolEntry{}
	p.mu.Unlock()
	p.wg.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, ent := range ents {
		e.destroy(ctx, e.log, ent.cid, e.poolDir(ent.cid))
	}
	if out, err := e.runsc(ctx, "", "list", "-quiet"); err != nil || len(strings.TrimSpace(string(out))) > 0 {
		return nil
	}
	for _, c := range cgroupControllers {
		_ = unix.Rmdir(filepath.Join("/sys/fs/cgroup", c, e.cgParent))
	}
	_ = unix.Rmdir(filepath.Join("/sys/fs/cgroup", e.cgParent))
	// Concurrent runsc commands may have stacked several mounts.
	for unix.Unmount(filepath.Join(e.runscRoot, "null-netns"), unix.MNT_DETACH) == nil {
	}
	return nil
}
