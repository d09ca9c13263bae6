package qemu

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/k7-dev/k7/internal/engine"
	"github.com/k7-dev/k7/internal/testutil"
)

func poolIdle(e *Engine) int {
	e.pool.mu.Lock()
	defer e.pool.mu.Unlock()
	return len(e.pool.idle)
}

func waitPool(t *testing.T, e *Engine, n int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for poolIdle(e) != n {
		if time.Now().After(deadline) {
			t.Fatalf("fork pool has %d idle processes, want %d", poolIdle(e), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestForkPool(t *testing.T) {
	requireQEMU(t)
	rootfs := filepath.Join(testRoot, "rootfs")
	rootfsOnce.Do(func() { busyboxRootfs(t, rootfs) })
	root := filepath.Join(testRoot, "pool-engine")
	e, err := New(Config{Root: root, AgentPath: testutil.Binary(t, "k7-agent"), ForkPool: 1, Accel: os.Getenv("K7_QEMU_ACCEL")})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	create(t, e, "ps", rootfs)
	run(t, connect(t, e, "ps"), "sh", "-c", "echo pooled > /tmp/m")
	capDir := t.TempDir()
	if _, err := e.Checkpoint(ctx, &engine.CheckpointRequest{ID: "ps", Dir: capDir}); err != nil {
		t.Fatal(err)
	}
	for i, id := range []string{"pk0", "pk1", "pk2"} {
		if i > 0 {
			waitPool(t, e, 1) // refilled after the previous restore
		}
		t0 := time.Now()
		if err := e.Restore(ctx, &engine.RestoreRequest{CreateRequest: engine.CreateRequest{ID: id}, From: capDir}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.Delete(context.Background(), id) })
		out, _ := run(t, connect(t, e, id), "cat", "/tmp/m")
		t.Logf("%s (pooled %v): answered after %v", id, i > 0, time.Since(t0))
		if out != "pooled\n" {
			t.Errorf("%s: marker %q", id, out)
		}
	}
	// A deleted pooled child leaves nothing.
	st, _ := e.readState("pk1")
	if err := e.Delete(ctx, "pk1"); err != nil {
		t.Fatal(err)
	}
	assertNothingLeft(t, e, st)

	// A new engine on the same root stops what the old one left idle.
	// (Claimed pool processes keep the pool path in their command line:
	// check the idle one by PID.)
	waitPool(t, e, 1)
	e.pool.mu.Lock()
	idle := e.pool.idle[0].st
	e.pool.mu.Unlock()
	e2, err := New(e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if alive(idle) {
		t.Errorf("idle pool QEMU %d still runs after a new engine started", idle.PID)
	}
	_ = e2.Close()
	_ = e.Close()
	if m, _ := filepath.Glob(filepath.Join(e.poolRoot(), "*")); len(m) > 0 {
		t.Errorf("pool dirs left: %v", m)
	}
}
