package gvisor

import (
	"context"
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/k7-dev/k7/internal/engine"
	"github.com/k7-dev/k7/internal/engine/enginetest"
	"github.com/k7-dev/k7/internal/errdefs"
)

// TestQuickState checks runsc's state file against "runsc state" through a
// sandbox's life: running, paused, resumed, killed, deleted. Pause and
// Resume (control.go) write the file themselves: runsc must read it back.
func TestQuickState(t *testing.T) {
	e := newTestEngine(t)
	rootfs := enginetest.BusyboxRootfs(t)
	ctx := context.Background()
	id, _ := started(t, ctx, e, rootfs, engine.Resources{})

	same := func(step string) *runscState {
		t.Helper()
		quick, ok, qerr := e.quickState(id)
		want, werr := e.state(ctx, id)
		if !ok {
			t.Fatalf("%s: quickState cannot answer (runsc state: %+v, %v)", step, want, werr)
		}
		if qerr != nil || werr != nil {
			t.Fatalf("%s: quickState: %v; runsc state: %v", step, qerr, werr)
		}
		if *quick != *want {
			t.Errorf("%s: quickState: got %+v, want %+v", step, *quick, *want)
		}
		return quick
	}
	st := same("running")
	if st.Status != "running" || st.PID == 0 {
		t.Errorf("running: got %+v", *st)
	}
	for _, op := range []struct {
		name string
		fn   func(context.Context, string) error
		want string
	}{
		{"pause", e.Pause, "paused"},
		{"resume", e.Resume, "running"},
	} {
		if err := op.fn(ctx, id); err != nil {
			t.Fatal(err)
		}
		if got := same(op.name).Status; got != op.want {
			t.Errorf("after %s: got %q, want %q", op.name, got, op.want)
		}
		// Repeating it finds the sandbox in the wrong state, as runsc
		// would, and changes nothing.
		if err := op.fn(ctx, id); !errors.Is(err, errdefs.ErrFailedPrecondition) {
			t.Errorf("%s twice: got %v, want ErrFailedPrecondition", op.name, err)
		}
		if got := same(op.name + " twice").Status; got != op.want {
			t.Errorf("after %s twice: got %q, want %q", op.name, got, op.want)
		}
	}

	// A killed sandbox: the file still says running, the pid is gone, so
	// quickState leaves the answer to runsc; Status reports it gone.
	if err := syscall.Kill(st.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, ok, _ := e.quickState(id); !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("quickState still answers 5 s after the sandbox was killed")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if s, err := e.Status(ctx, id); err != nil || (s.State != engine.StateDead && s.State != engine.StateStopped) {
		t.Errorf("Status after kill: got %+v, %v; want dead or stopped", s, err)
	}

	if err := e.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := e.quickState(id); !ok || !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("quickState after Delete: got ok=%v, %v; want ErrNotFound", ok, err)
	}
}

// BenchmarkStatus: Status of a running sandbox.
func BenchmarkStatus(b *testing.B) {
	e, rootfs := benchEngine(b)
	id, _ := startedTB(b, e, rootfs)
	ctx := context.Background()
	for b.Loop() {
		if st, err := e.Status(ctx, id); err != nil || st.State != engine.StateRunning {
			b.Fatalf("Status: %+v, %v", st, err)
		}
	}
}
