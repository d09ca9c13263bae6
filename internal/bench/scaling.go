package bench

import (
	"context"
	"fmt"
	"strings"
	"time"

	v1 "github.com/k7-dev/k7/api/v1"
	"github.com/k7-dev/k7/sdk"
)

// Point is one measurement of a scaling run: how an operation's cost grows
// with the sandbox's memory in use (SizeMiB) or with the number of
// sandboxes already running (Running).
type Point struct {
	Engine  string `json:"engine"`
	Op      string `json:"op"` // "fork" (to child answer) or "create" (to first exec)
	SizeMiB int    `json:"size_mib,omitempty"`
	Running int    `json:"running,omitempty"`
	Rep     int    `json:"rep"`
	NS      int64  `json:"ns"`
	// ChildMemoryBytes is the child's memory use as its engine reports it
	// (fork points only).
	ChildMemoryBytes int64 `json:"child_memory_bytes,omitempty"`
}

// ScalingConfig is one scaling run.
type ScalingConfig struct {
	Client   *sdk.Client
	Engines  []string
	Reps     int   // default 3
	SizesMiB []int // memory in use; default 64, 128, 256, 512, 1024
	Running  []int // sandboxes already up; default 1, 10, 50
	Progress func(format string, args ...any)
	Command  string
}

// Scaling measures fork time and child memory against the memory in use,
// and create and fork time against the number of sandboxes running.
func Scaling(ctx context.Context, cfg ScalingConfig) (*Report, error) {
	if cfg.Reps <= 0 {
		cfg.Reps = 3
	}
	if len(cfg.SizesMiB) == 0 {
		cfg.SizesMiB = []int{64, 128, 256, 512, 1024}
	}
	if len(cfg.Running) == 0 {
		cfg.Running = []int{1, 10, 50}
	}
	if len(cfg.Engines) == 0 {
		cfg.Engines = []string{"gvisor"}
	}
	if cfg.Progress == nil {
		cfg.Progress = func(string, ...any) {}
	}
	r := &Report{Machine: Machine(), Command: cfg.Command, Started: time.Now(), Reps: cfg.Reps}
	c := cfg.Client
	for _, engine := range cfg.Engines {
		var made []string
		cleanup := func() {
			for _, id := range made {
				_, _ = c.DeleteSandbox(context.WithoutCancel(ctx), id, true)
			}
			made = nil
		}
		create := func(mem int64) (*v1.Sandbox, error) {
			sb, err := c.CreateSandbox(ctx, v1.CreateSandboxRequest{Image: "busybox", Engine: engine, Network: "none",
				Resources: v1.Resources{MemoryBytes: mem}})
			if err == nil {
				made = append(made, sb.ID)
			}
			return sb, err
		}
		fork := func(src string) (time.Duration, string, error) {
			start := time.Now()
			res, err := c.ForkSandbox(ctx, src, v1.ForkRequest{Count: 1})
			if err != nil {
				return 0, "", err
			}
			child := res.Children[0].Sandbox.ID
			made = append(made, child)
			if _, err := c.Run(ctx, child, v1.ExecRequest{Args: []string{"true"}}); err != nil {
				return 0, "", err
			}
			return time.Since(start), child, nil
		}
		for _, size := range cfg.SizesMiB {
			cfg.Progress("%s: fork with %d MiB in use", engine, size)
			// A VM guest's /tmp is a tmpfs of half its RAM: twice the
			// size, plus room for the system.
			sb, err := create(int64(2*size+256) << 20)
			if err != nil {
				cleanup()
				return r, err
			}
			fill := fmt.Sprintf("dd if=/dev/urandom of=/tmp/fill bs=1M count=%d", size)
			res, err := c.Run(ctx, sb.ID, v1.ExecRequest{Args: []string{"sh", "-c", fill}})
			if err == nil && res.ExitCode != 0 {
				err = fmt.Errorf("exit code %d: %s", res.ExitCode, strings.TrimSpace(string(res.Stderr)))
			}
			if err != nil {
				cleanup()
				return r, fmt.Errorf("filling %d MiB: %w", size, err)
			}
			for rep := range cfg.Reps {
				d, child, err := fork(sb.ID)
				if err != nil {
					cleanup()
					return r, fmt.Errorf("fork with %d MiB: %w", size, err)
				}
				p := Point{Engine: engine, Op: "fork", SizeMiB: size, Rep: rep, NS: int64(d)}
				if st, err := c.GetSandbox(ctx, child); err == nil && st.Stats != nil {
					p.ChildMemoryBytes = st.Stats.MemoryBytes
				}
				r.Points = append(r.Points, p)
				_, _ = c.DeleteSandbox(ctx, child, true)
			}
			cleanup()
		}
		running := 0
		for _, n := range cfg.Running {
			cfg.Progress("%s: create and fork with %d sandboxes running", engine, n)
			for ; running < n; running++ {
				if _, err := create(0); err != nil {
					cleanup()
					return r, fmt.Errorf("starting background sandbox %d: %w", running+1, err)
				}
			}
			bg := len(made)
			for rep := range cfg.Reps {
				start := time.Now()
				sb, err := create(0)
				if err == nil {
					_, err = c.Run(ctx, sb.ID, v1.ExecRequest{Args: []string{"true"}})
				}
				if err != nil {
					cleanup()
					return r, err
				}
				r.Points = append(r.Points, Point{Engine: engine, Op: "create", Running: n, Rep: rep, NS: int64(time.Since(start))})
				d, _, err := fork(sb.ID)
				if err != nil {
					cleanup()
					return r, err
				}
				r.Points = append(r.Points, Point{Engine: engine, Op: "fork", Running: n, Rep: rep, NS: int64(d)})
				for _, id := range made[bg:] {
					_, _ = c.DeleteSandbox(ctx, id, true)
				}
				made = made[:bg]
			}
		}
		cleanup()
	}
	return r, nil
}
