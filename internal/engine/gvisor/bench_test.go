package gvisor

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/k7-dev/k7/internal/agent/client"
	"github.com/k7-dev/k7/internal/engine"
	"github.com/k7-dev/k7/internal/engine/enginetest"
)

// Benchmarks of the engine's operations against real runsc. Run with
//
//	go test ./internal/engine/gvisor -run '^$' -bench . -benchtime 5x

func benchEngine(b *testing.B) (*Engine, string) {
	b.Helper()
	e := newTestEngine(b)
	return e, enginetest.BusyboxRootfs(b)
}

func connectTB(tb testing.TB, ctx context.Context, e *Engine, id string) *client.Client {
	tb.Helper()
	rw, err := e.Connect(ctx, id)
	if err != nil {
		tb.Fatal(err)
	}
	c := client.New(rw)
	if _, err := c.Handshake(ctx); err != nil {
		tb.Fatal(err)
	}
	return c
}

func execTrue(tb testing.TB, ctx context.Context, c *client.Client) {
	tb.Helper()
	p, err := c.Exec(ctx, &client.ExecRequest{Args: []string{"true"}}, client.Stdio{})
	if err != nil {
		tb.Fatal(err)
	}
	if st, err := p.Wait(ctx); err != nil || st.Code != 0 {
		tb.Fatalf("true: %+v, %v", st, err)
	}
}

// BenchmarkCreate: Create → Connect → Handshake → first exec answered.
func BenchmarkCreate(b *testing.B) {
	e, rootfs := benchEngine(b)
	ctx := context.Background()
	for b.Loop() {
		id := enginetest.NewID()
		if err := e.Create(ctx, &engine.CreateRequest{ID: id, Rootfs: rootfs}); err != nil {
			b.Fatal(err)
		}
		c := connectTB(b, ctx, e, id)
		execTrue(b, ctx, c)
		b.StopTimer()
		_ = c.Close()
		_ = e.Delete(ctx, id)
		b.StartTimer()
	}
}

func startedTB(b *testing.B, e *Engine, rootfs string) (string, *client.Client) {
	ctx := context.Background()
	id := enginetest.NewID()
	if err := e.Create(ctx, &engine.CreateRequest{ID: id, Rootfs: rootfs}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = e.Delete(context.Background(), id) })
	c := connectTB(b, ctx, e, id)
	b.Cleanup(func() { _ = c.Close() })
	return id, c
}

// BenchmarkExec: one exec round trip through the agent.
func BenchmarkExec(b *testing.B) {
	e, rootfs := benchEngine(b)
	_, c := startedTB(b, e, rootfs)
	for b.Loop() {
		execTrue(b, context.Background(), c)
	}
}

// BenchmarkPauseResume: Pause + Resume.
func BenchmarkPauseResume(b *testing.B) {
	e, rootfs := benchEngine(b)
	id, _ := startedTB(b, e, rootfs)
	ctx := context.Background()
	for b.Loop() {
		if err := e.Pause(ctx, id); err != nil {
			b.Fatal(err)
		}
		if err := e.Resume(ctx, id); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDelete: Delete of a running sandbox.
func BenchmarkDelete(b *testing.B) {
	e, rootfs := benchEngine(b)
	ctx := context.Background()
	for b.Loop() {
		b.StopTimer()
		id, c := startedTB(b, e, rootfs)
		_ = c.Close()
		b.StartTimer()
		if err := e.Delete(ctx, id); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCheckpoint: checkpoint --leave-running of an idle sandbox.
func BenchmarkCheckpoint(b *testing.B) {
	e, rootfs := benchEngine(b)
	id, _ := startedTB(b, e, rootfs)
	ctx := context.Background()
	var pause time.Duration
	for b.Loop() {
		res, err := e.Checkpoint(ctx, &engine.CheckpointRequest{ID: id, Dir: b.TempDir()})
		if err != nil {
			b.Fatal(err)
		}
		pause += res.SourcePause
	}
	b.ReportMetric(float64(pause.Milliseconds())/float64(b.N), "pause-ms/op")
}

// BenchmarkFork: Restore → Connect → Handshake → first exec answered, with
// a pre-created container from the pool (Pool) or without (Cold).
func BenchmarkFork(b *testing.B) {
	b.Run("Cold", func(b *testing.B) { benchFork(b, false) })
	b.Run("Pool", func(b *testing.B) { benchFork(b, true) })
}

func benchFork(b *testing.B, usePool bool) {
	e, rootfs := benchEngine(b)
	if !usePool {
		e.cfg.ForkPool = -1
	}
	id, _ := startedTB(b, e, rootfs)
	ctx := context.Background()
	capture := filepath.Join(b.TempDir(), "capture")
	if _, err := e.Checkpoint(ctx, &engine.CheckpointRequest{ID: id, Dir: capture}); err != nil {
		b.Fatal(err)
	}
	if usePool {
		e.refillNow(poolKey{rootfs: rootfs})
		e.waitPool(poolKey{rootfs: rootfs})
	}
	for b.Loop() {
		child := enginetest.NewID()
		if err := e.Restore(ctx, &engine.RestoreRequest{CreateRequest: engine.CreateRequest{ID: child, Rootfs: rootfs}, From: capture}); err != nil {
			b.Fatal(err)
		}
		c := connectTB(b, ctx, e, child)
		execTrue(b, ctx, c)
		b.StopTimer()
		_ = c.Close()
		_ = e.Delete(ctx, child)
		if usePool {
			e.waitPool(poolKey{rootfs: rootfs})
		}
		b.StartTimer()
	}
}
