package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/k7-dev/k7/internal/budget"
)

// floor does the lifecycle with raw runsc commands: no daemon, no agent, no
// cgroup limits. Its init is a busybox sleep; commands run with runsc exec.
type floor struct {
	runsc, rootfs, dir string
	seq                int
}

func (f *floor) name() string { return "raw runsc" }

// close unmounts the empty network namespace runsc pins under its root for
// --network=none, so that the scratch directory can be removed.
func (f *floor) close() {
	for unix.Unmount(filepath.Join(f.dir, "runsc-root", "null-netns"), unix.MNT_DETACH) == nil {
	}
}

func (f *floor) cmd(ctx context.Context, args ...string) error {
	full := append([]string{"--root", filepath.Join(f.dir, "runsc-root"), "--platform", "systrap",
		"--network", "none", "--overlay2", "root:self"}, args...)
	// Output goes to a file, not a pipe: "run --detach" hands its stdio to
	// the sandbox, which would hold a pipe open for as long as it lives.
	out, err := os.CreateTemp(f.dir, "runsc-out-")
	if err != nil {
		return err
	}
	defer os.Remove(out.Name())
	defer out.Close()
	c := exec.CommandContext(ctx, f.runsc, full...)
	c.Stdout, c.Stderr = out, out
	if err := c.Run(); err != nil {
		b, _ := os.ReadFile(out.Name())
		return fmt.Errorf("runsc %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(b)))
	}
	return nil
}

// bundle writes an OCI bundle for a new container and returns its ID and dir.
func (f *floor) bundle() (string, string, error) {
	f.seq++
	id := fmt.Sprintf("floor%010d%06d", time.Now().UnixNano()%1e10, f.seq)
	dir := filepath.Join(f.dir, "bundles", id)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", "", err
	}
	spec := &specs.Spec{
		Version:  specs.Version,
		Root:     &specs.Root{Path: f.rootfs},
		Hostname: id,
		Process: &specs.Process{
			Args: []string{"/bin/sleep", "1000000"},
			Env:  []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"},
			Cwd:  "/",
		},
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs"},
		},
		Linux: &specs.Linux{Namespaces: []specs.LinuxNamespace{
			{Type: specs.PIDNamespace}, {Type: specs.IPCNamespace}, {Type: specs.UTSNamespace},
			{Type: specs.MountNamespace}, {Type: specs.NetworkNamespace},
		}},
	}
	b, err := json.Marshal(spec)
	if err != nil {
		return "", "", err
	}
	return id, dir, os.WriteFile(filepath.Join(dir, "config.json"), b, 0o644)
}

func (f *floor) run(ctx context.Context) (string, error) {
	id, dir, err := f.bundle()
	if err != nil {
		return "", err
	}
	return id, f.cmd(ctx, "run", "--detach", "--bundle", dir, id)
}

func (f *floor) restore(ctx context.Context, image string) (string, error) {
	id, dir, err := f.bundle()
	if err != nil {
		return "", err
	}
	return id, f.cmd(ctx, "restore", "--detach", "--bundle", dir, "--image-path", image, id)
}

func (f *floor) exec(ctx context.Context, id string, args ...string) error {
	return f.cmd(ctx, append([]string{"exec", id}, args...)...)
}

// timeFork measures a fork on a floor: capture, then n concurrent restores
// that each answer an exec. It records op and, for fork_idle, how long the
// capture paused the source.
func timeFork(op budget.Op, n int, record recordFunc, capture func() (string, time.Duration, error), restore func(image string) error) error {
	start := time.Now()
	image, pause, err := capture()
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = restore(image)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	record(op, KindFloor, time.Since(start))
	if op == budget.ForkIdle {
		record(budget.SourcePause, KindFloor, pause)
	}
	return nil
}

// round measures one round of the floor operations.
func (f *floor) round(ctx context.Context, rep int, record recordFunc) (err error) {
	var ids []string
	defer func() {
		for _, id := range ids {
			if derr := f.cmd(context.WithoutCancel(ctx), "delete", "-force", id); derr != nil && err == nil {
				err = derr
			}
		}
		os.RemoveAll(filepath.Join(f.dir, "bundles"))
		os.RemoveAll(filepath.Join(f.dir, "captures"))
	}()
	var id string
	d, err := timed(func() error {
		var err error
		if id, err = f.run(ctx); err != nil {
			return err
		}
		ids = append(ids, id)
		return f.exec(ctx, id, "/bin/true")
	})
	if err != nil {
		return err
	}
	record(budget.CreateToExec, KindFloor, d)
	for range 5 {
		d, err := timed(func() error { return f.exec(ctx, id, "/bin/true") })
		if err != nil {
			return err
		}
		record(budget.ExecRoundTrip, KindFloor, d)
	}
	for _, op := range []budget.Op{budget.Pause, budget.Resume} {
		d, err := timed(func() error { return f.cmd(ctx, string(op), id) })
		if err != nil {
			return err
		}
		record(op, KindFloor, d)
	}

	capture := func(src string) (string, time.Duration, error) {
		image := filepath.Join(f.dir, "captures", fmt.Sprintf("%d-%d", rep, f.seq))
		f.seq++
		d, err := timed(func() error {
			return f.cmd(ctx, "checkpoint", "--leave-running", "--image-path", image, src)
		})
		return image, d, err
	}
	// fork = checkpoint --leave-running + n × (restore + first exec)
	var mu sync.Mutex
	fork := func(src string, op budget.Op, n int) error {
		return timeFork(op, n, record, func() (string, time.Duration, error) { return capture(src) }, func(image string) error {
			child, err := f.restore(ctx, image)
			mu.Lock()
			ids = append(ids, child)
			mu.Unlock()
			if err != nil {
				return err
			}
			return f.exec(ctx, child, "/bin/true")
		})
	}
	if err := fork(id, budget.ForkIdle, 1); err != nil {
		return err
	}
	if err := fork(id, budget.FanOut10, 10); err != nil {
		return err
	}
	image, d, err := capture(id)
	if err != nil {
		return err
	}
	record(budget.Snapshot, KindFloor, d)
	d, err = timed(func() error {
		child, err := f.restore(ctx, image)
		ids = append(ids, child)
		if err != nil {
			return err
		}
		return f.exec(ctx, child, "/bin/true")
	})
	if err != nil {
		return err
	}
	record(budget.Restore, KindFloor, d)

	big, err := f.run(ctx)
	if err != nil {
		return err
	}
	ids = append(ids, big)
	if err := f.exec(ctx, big, "/bin/sh", "-c", "dd if=/dev/urandom of=/tmp/fill bs=1M count=256 2>/dev/null"); err != nil {
		return err
	}
	if err := fork(big, budget.Fork256M, 1); err != nil {
		return err
	}

	d, err = timed(func() error { return f.cmd(ctx, "delete", "-force", id) })
	if err != nil {
		return err
	}
	ids = ids[1:]
	record(budget.Delete, KindFloor, d)
	return nil
}
