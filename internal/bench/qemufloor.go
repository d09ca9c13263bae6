package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/k7-dev/k7/internal/agent/client"
	"github.com/k7-dev/k7/internal/budget"
	"github.com/k7-dev/k7/internal/engine/qemu"
)

// qemuFloor does the lifecycle with raw QEMU and QMP: guests started with
// the qemu engine's command line (microvm, the same kernel, initramfs,
// root disk and accelerator), each driven over one QMP connection held
// for its life, and commands run by the guest's k7-agent over its
// virtio-serial socket with the agent client. No daemon, HTTP, store,
// state files, locks or QMP dial per operation.
//
// Rows:
//   - create_to_exec: QEMU start, QMP connect, cont, wait for the agent's
//     port, handshake, exec of true.
//   - exec_rtt: exec of true on the held agent connection.
//   - pause, resume: QMP stop, cont.
//   - fork_idle, fanout_10, fork_256m: a capture as the engine makes it
//     (stop, device state with x-ignore-shared, copy of the RAM file, cont)
//     then n concurrent restores (a new QEMU with -incoming mapping the
//     copy, device state loaded, cont) each answering an exec.
//   - source_pause: how long the capture of fork_idle stopped the guest.
//   - snapshot: the capture alone. restore: one restore from it, as above.
//   - delete: QMP quit, QEMU reaped, its files and RAM file removed.
type qemuFloor struct {
	e        *qemu.Engine
	disk     string // the busybox root disk
	captures string
	seq      atomic.Int64
	fanOut   int // children of fanout_10: 10 (a test makes fewer)
	fillMiB  int // MiB in tmpfs for fork_256m: 256 (a test fills less)
}

// newQEMUFloor prepares the floor's engine (kernel, initramfs, accelerator)
// and root disk under dir, from the agent binary and the busybox rootfs.
func newQEMUFloor(ctx context.Context, agent, rootfs, dir string) (*qemuFloor, error) {
	e, err := qemu.New(qemu.Config{Root: filepath.Join(dir, "qemu"), AgentPath: agent})
	if err != nil {
		return nil, err
	}
	disk, err := e.RootDisk(ctx, rootfs)
	if err != nil {
		_ = e.Close()
		return nil, err
	}
	return &qemuFloor{e: e, disk: disk, captures: filepath.Join(dir, "qemu-captures"), fanOut: 10, fillMiB: 256}, nil
}

func (f *qemuFloor) name() string { return "raw QEMU" }

func (f *qemuFloor) close() { _ = f.e.Close() }

// guest is one raw QEMU guest and its agent client.
type guest struct {
	vm    *qemu.RawVM
	agent *client.Client
}

// start boots (spec.From empty) or restores a guest and waits until its
// agent answers the handshake. The guest it returns, also with an error,
// is the caller's to remove.
func (f *qemuFloor) start(ctx context.Context, spec qemu.RawSpec) (*guest, error) {
	spec.ID = fmt.Sprintf("floor-%d", f.seq.Add(1))
	vm, err := f.e.StartRaw(ctx, spec)
	if err != nil {
		return nil, err
	}
	g := &guest{vm: vm}
	conn, err := vm.Run(ctx)
	if err != nil {
		return g, err
	}
	g.agent = client.New(conn)
	if _, err := g.agent.Handshake(ctx); err != nil {
		return g, err
	}
	return g, nil
}

func (g *guest) exec(ctx context.Context, args ...string) error {
	p, err := g.agent.Exec(ctx, &client.ExecRequest{Args: args}, client.Stdio{})
	if err != nil {
		return err
	}
	st, err := p.Wait(ctx)
	if err != nil {
		return err
	}
	if st.Code != 0 {
		return fmt.Errorf("%v exited %d", args, st.Code)
	}
	return nil
}

func (g *guest) remove(ctx context.Context) {
	if g.agent != nil {
		_ = g.agent.Close()
	}
	g.vm.Remove(ctx)
}

// round measures one round of the floor operations, in the order of
// k7Round.
func (f *qemuFloor) round(ctx context.Context, rep int, record recordFunc) error {
	var (
		mu     sync.Mutex
		guests []*guest
	)
	keep := func(g *guest) {
		if g != nil {
			mu.Lock()
			guests = append(guests, g)
			mu.Unlock()
		}
	}
	defer func() {
		for _, g := range guests {
			g.remove(context.WithoutCancel(ctx))
		}
		_ = os.RemoveAll(f.captures)
	}()
	// boot starts a guest and runs true in it.
	boot := func(spec qemu.RawSpec) (*guest, error) {
		g, err := f.start(ctx, spec)
		keep(g)
		if err != nil {
			return nil, err
		}
		return g, g.exec(ctx, "true")
	}

	var g *guest
	d, err := timed(func() error {
		var err error
		g, err = boot(qemu.RawSpec{Disk: f.disk})
		return err
	})
	if err != nil {
		return fmt.Errorf("create: %w", err)
	}
	record(budget.CreateToExec, KindFloor, d)
	for range 5 {
		d, err := timed(func() error { return g.exec(ctx, "true") })
		if err != nil {
			return fmt.Errorf("exec: %w", err)
		}
		record(budget.ExecRoundTrip, KindFloor, d)
	}
	for _, c := range []struct {
		op  budget.Op
		cmd string
	}{{budget.Pause, "stop"}, {budget.Resume, "cont"}} {
		d, err := timed(func() error { _, err := g.vm.QMP.Execute(ctx, c.cmd, nil); return err })
		if err != nil {
			return fmt.Errorf("%s: %w", c.op, err)
		}
		record(c.op, KindFloor, d)
	}

	capture := func(src *guest) (string, time.Duration, error) {
		dir := filepath.Join(f.captures, fmt.Sprintf("%d-%d", rep, f.seq.Add(1)))
		pause, err := src.vm.Checkpoint(ctx, dir)
		return dir, pause, err
	}
	// fork = capture + n × (restore + first exec), the restores concurrent
	fork := func(src *guest, op budget.Op, n int) error {
		return timeFork(op, n, record, func() (string, time.Duration, error) { return capture(src) }, func(dir string) error {
			_, err := boot(qemu.RawSpec{From: dir})
			return err
		})
	}
	if err := fork(g, budget.ForkIdle, 1); err != nil {
		return err
	}
	if err := fork(g, budget.FanOut10, f.fanOut); err != nil {
		return err
	}

	// A guest holding 256 MiB in tmpfs (the overlay's upper layer is in
	// guest RAM), with 1 GiB of RAM as on the k7 side.
	big, err := f.start(ctx, qemu.RawSpec{Disk: f.disk, MemoryBytes: 1 << 30})
	keep(big)
	if err != nil {
		return fmt.Errorf("starting the 256 MiB guest: %w", err)
	}
	if err := big.exec(ctx, "sh", "-c", fmt.Sprintf("dd if=/dev/urandom of=/tmp/fill bs=1M count=%d 2>/dev/null", f.fillMiB)); err != nil {
		return fmt.Errorf("filling tmpfs: %w", err)
	}
	if err := fork(big, budget.Fork256M, 1); err != nil {
		return err
	}

	var dir string
	d, err = timed(func() error {
		var err error
		dir, _, err = capture(g)
		return err
	})
	if err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	record(budget.Snapshot, KindFloor, d)
	d, err = timed(func() error { _, err := boot(qemu.RawSpec{From: dir}); return err })
	if err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	record(budget.Restore, KindFloor, d)

	d, _ = timed(func() error { g.remove(ctx); return nil })
	guests = guests[1:]
	record(budget.Delete, KindFloor, d)
	return nil
}
