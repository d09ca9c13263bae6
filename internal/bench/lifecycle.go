package bench

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"time"

	v1 "github.com/k7-dev/k7/api/v1"
	"github.com/k7-dev/k7/internal/budget"
	"github.com/k7-dev/k7/sdk"
)

// Config is one lifecycle bench run.
type Config struct {
	Client  *sdk.Client
	Engines []string // engines to measure through k7d, default gvisor
	Reps    int      // measured repetitions, default 5
	Warmup  int      // unmeasured repetitions first, default 1
	// Runsc enables the raw-runsc floor of gvisor: the runsc binary. Empty
	// skips that floor.
	Runsc string
	// Agent enables the raw-QEMU floor of qemu: the k7-agent binary put
	// into the floor's initramfs (k7-vminit is taken from next to it).
	// Empty skips that floor.
	Agent string
	// Rootfs is the busybox root filesystem of the floors' sandboxes.
	Rootfs string
	// Dir is scratch space for the floors' bundles, disks and captures.
	Dir string
	// Progress, when set, receives one line per step.
	Progress io.Writer
	Command  string // recorded in the report
}

func numCPU() int { return runtime.NumCPU() }

// Lifecycle runs the lifecycle bench: for each engine, Reps interleaved
// rounds of k7 operations and the same operations with the raw tool.
func Lifecycle(ctx context.Context, cfg Config) (*Report, error) {
	if cfg.Reps <= 0 {
		cfg.Reps = 5
	}
	if cfg.Warmup < 0 {
		cfg.Warmup = 0
	}
	if len(cfg.Engines) == 0 {
		cfg.Engines = []string{"gvisor"}
	}
	r := &Report{Machine: Machine(), Command: cfg.Command, Started: time.Now(), Reps: cfg.Reps, Warmup: cfg.Warmup}
	for _, engine := range cfg.Engines {
		var fl floorRunner
		switch {
		case engine == "gvisor" && cfg.Runsc != "":
			fl = &floor{runsc: cfg.Runsc, rootfs: cfg.Rootfs, dir: cfg.Dir}
		case engine == "qemu" && cfg.Agent != "":
			cfg.progress("%s: preparing the raw QEMU floor", engine)
			qf, err := newQEMUFloor(ctx, cfg.Agent, cfg.Rootfs, cfg.Dir)
			if err != nil {
				return r, fmt.Errorf("preparing the raw QEMU floor: %w", err)
			}
			fl = qf
		}
		if fl != nil {
			defer fl.close()
		}
		for rep := -cfg.Warmup; rep < cfg.Reps; rep++ {
			record := func(op budget.Op, kind string, d time.Duration) {
				if rep >= 0 {
					r.Samples = append(r.Samples, Sample{Engine: engine, Op: op, Kind: kind, Rep: rep, NS: int64(d)})
				}
			}
			cfg.progress("%s: round %d/%d (k7)", engine, rep+1, cfg.Reps)
			if err := k7Round(ctx, cfg.Client, engine, record); err != nil {
				return r, fmt.Errorf("k7 round %d on %s: %w", rep+1, engine, err)
			}
			if fl != nil {
				cfg.progress("%s: round %d/%d (%s)", engine, rep+1, cfg.Reps, fl.name())
				if err := fl.round(ctx, rep, record); err != nil {
					return r, fmt.Errorf("floor round %d: %w", rep+1, err)
				}
			}
		}
	}
	return r, nil
}

func (cfg Config) progress(format string, args ...any) {
	if cfg.Progress != nil {
		fmt.Fprintf(cfg.Progress, format+"\n", args...)
	}
}

// floorRunner is the raw tool's side of one engine.
type floorRunner interface {
	name() string
	// round measures one round of the operations, recording KindFloor
	// samples, and removes what it made.
	round(ctx context.Context, rep int, record recordFunc) error
	close()
}

type recordFunc func(op budget.Op, kind string, d time.Duration)

// timed runs f and returns how long it took.
func timed(f func() error) (time.Duration, error) {
	start := time.Now()
	err := f()
	return time.Since(start), err
}

// k7Round measures one round of every operation through k7d, as a client
// sees it (wall time of the SDK calls).
func k7Round(ctx context.Context, c *sdk.Client, engine string, record recordFunc) (err error) {
	run := func(id string, args ...string) error {
		res, err := c.Run(ctx, id, v1.ExecRequest{Args: args})
		if err != nil {
			return err
		}
		if res.ExitCode != 0 {
			return fmt.Errorf("%v exited %d: %s", args, res.ExitCode, res.Stderr)
		}
		return nil
	}
	var cleanup []string
	defer func() {
		for _, id := range cleanup {
			if _, derr := c.DeleteSandbox(context.WithoutCancel(ctx), id, true); derr != nil && err == nil {
				err = derr
			}
		}
	}()

	var sb *v1.Sandbox
	d, err := timed(func() error {
		var err error
		if sb, err = c.CreateSandbox(ctx, v1.CreateSandboxRequest{Image: "busybox", Engine: engine}); err != nil {
			return err
		}
		return run(sb.ID, "true")
	})
	if err != nil {
		return fmt.Errorf("create: %w", err)
	}
	cleanup = append(cleanup, sb.ID)
	record(budget.CreateToExec, KindK7, d)

	for range 5 {
		d, err := timed(func() error { return run(sb.ID, "true") })
		if err != nil {
			return fmt.Errorf("exec: %w", err)
		}
		record(budget.ExecRoundTrip, KindK7, d)
	}
	d, err = timed(func() error { _, err := c.PauseSandbox(ctx, sb.ID); return err })
	if err != nil {
		return err
	}
	record(budget.Pause, KindK7, d)
	d, err = timed(func() error { _, err := c.ResumeSandbox(ctx, sb.ID); return err })
	if err != nil {
		return err
	}
	record(budget.Resume, KindK7, d)

	fork := func(src string, op budget.Op, n int) error {
		var res *v1.ForkResult
		d, err := timed(func() error {
			var err error
			if res, err = c.ForkSandbox(ctx, src, v1.ForkRequest{Count: n}); err != nil {
				return err
			}
			for _, ch := range res.Children {
				if err := run(ch.Sandbox.ID, "true"); err != nil {
					return err
				}
			}
			return nil
		})
		if res != nil {
			for _, ch := range res.Children {
				cleanup = append(cleanup, ch.Sandbox.ID)
			}
		}
		if err != nil {
			return fmt.Errorf("%s: %w", op, err)
		}
		record(op, KindK7, d)
		if op == budget.ForkIdle {
			record(budget.SourcePause, KindK7, time.Duration(res.SourcePauseNS))
		}
		return nil
	}
	if err := fork(sb.ID, budget.ForkIdle, 1); err != nil {
		return err
	}
	if err := fork(sb.ID, budget.FanOut10, 10); err != nil {
		return err
	}

	// A sandbox holding 256 MiB in tmpfs.
	big, err := c.CreateSandbox(ctx, v1.CreateSandboxRequest{Image: "busybox", Engine: engine, Resources: v1.Resources{MemoryBytes: 1 << 30}})
	if err != nil {
		return fmt.Errorf("creating the 256 MiB sandbox: %w", err)
	}
	cleanup = append(cleanup, big.ID)
	if err := run(big.ID, "sh", "-c", "dd if=/dev/urandom of=/tmp/fill bs=1M count=256 2>/dev/null"); err != nil {
		return fmt.Errorf("filling tmpfs: %w", err)
	}
	if err := fork(big.ID, budget.Fork256M, 1); err != nil {
		return err
	}

	name := fmt.Sprintf("bench-%d", time.Now().UnixNano())
	d, err = timed(func() error {
		_, err := c.CreateSnapshot(ctx, sb.ID, v1.SnapshotRequest{Name: name})
		return err
	})
	if err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	record(budget.Snapshot, KindK7, d)
	var rr *v1.ForkResult
	d, err = timed(func() error {
		var err error
		if rr, err = c.RestoreSnapshot(ctx, name, v1.RestoreRequest{}); err != nil {
			return err
		}
		return run(rr.Children[0].Sandbox.ID, "true")
	})
	if rr != nil {
		for _, ch := range rr.Children {
			cleanup = append(cleanup, ch.Sandbox.ID)
		}
	}
	if derr := c.DeleteSnapshot(ctx, name); derr != nil && err == nil {
		err = derr
	}
	if err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	record(budget.Restore, KindK7, d)

	d, err = timed(func() error { _, err := c.DeleteSandbox(ctx, sb.ID, true); return err })
	if err != nil {
		return err
	}
	cleanup = cleanup[1:]
	record(budget.Delete, KindK7, d)
	return nil
}
