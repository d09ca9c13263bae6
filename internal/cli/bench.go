package cli

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/k7-dev/k7/internal/bench"
	"github.com/k7-dev/k7/internal/daemon"
	"github.com/k7-dev/k7/internal/image"
)

func newBenchCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench COMMAND",
		Short: "Measure k7's latencies next to the raw tools",
	}
	cmd.AddCommand(newBenchLifecycleCmd(g), newBenchScalingCmd(g), newBenchRenderCmd(g))
	return cmd
}

func newBenchLifecycleCmd(g *globals) *cobra.Command {
	var (
		cfg   bench.Config
		out   string
		runsc string
		agent string
	)
	cmd := &cobra.Command{
		Use:   "lifecycle [flags]",
		Short: "Benchmark create, exec, pause, resume, fork, snapshot, restore, delete",
		Long: `Run interleaved rounds of the sandbox lifecycle through the daemon (as a client
sees it) and the same operations with the raw tool on this host: the floor.
For gvisor the floor is raw runsc commands; for qemu it is QEMU started with
the engine's command line, driven over QMP, with commands run by the guest's
k7-agent over its socket. Must run on the daemon's host as root for the floor.

Writes the raw samples to DIR/lifecycle.json and the Markdown table to
DIR/lifecycle.md (and stdout): median (min–max), ⚠ where (max−min)/median >
0.30, the ratio k7 / floor, and the budget from internal/budget.`,
		Example: `  k7 bench lifecycle --reps 5 --out out/bench
  k7 bench lifecycle --engine gvisor --reps 10 --warmup 2 --runsc /usr/local/bin/runsc
  k7 bench lifecycle --engine qemu --reps 3`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := ctxOf(cmd)
			c, err := g.client()
			if err != nil {
				return err
			}
			if err := c.Health(ctx); err != nil {
				return err
			}
			cfg.Client = c
			cfg.Progress = g.streams.Err
			cfg.Command = "k7 " + strings.Join(os.Args[1:], " ")
			if slices.Contains(cfg.Engines, "gvisor") {
				if runsc == "" {
					runsc, _ = exec.LookPath("runsc")
				}
				if cfg.Runsc = runsc; runsc == "" {
					fmt.Fprintln(g.streams.Err, "no runsc found (--runsc): measuring gvisor without the floor")
				}
			}
			if slices.Contains(cfg.Engines, "qemu") {
				if agent == "" {
					agent = daemon.FindAgent()
				}
				if cfg.Agent = agent; agent == "" {
					fmt.Fprintln(g.streams.Err, "no k7-agent found (--agent): measuring qemu without the floor")
				}
			}
			if cfg.Runsc != "" || cfg.Agent != "" {
				dir, err := os.MkdirTemp("", "k7-bench-")
				if err != nil {
					return err
				}
				defer os.RemoveAll(dir)
				if cfg.Rootfs, err = benchRootfs(ctx, dir); err != nil {
					return err
				}
				cfg.Dir = dir
			}
			r, err := bench.Lifecycle(ctx, cfg)
			if err != nil {
				return err
			}
			return writeReport(g, r, out, "lifecycle")
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&cfg.Engines, "engine", []string{"gvisor"}, "engines to measure (repeatable)")
	f.IntVar(&cfg.Reps, "reps", 5, "measured rounds")
	f.IntVar(&cfg.Warmup, "warmup", 1, "unmeasured rounds first")
	f.StringVar(&out, "out", "out/bench", "directory for lifecycle.json and lifecycle.md")
	f.StringVar(&runsc, "runsc", "", "runsc binary for the gvisor floor (default: runsc in PATH)")
	f.StringVar(&agent, "agent", "", "k7-agent binary for the qemu floor, with k7-vminit next to it (default: next to k7, else in PATH)")
	return cmd
}

// benchRootfs assembles the built-in busybox root filesystem in dir for the
// floor's raw runsc containers.
func benchRootfs(ctx context.Context, dir string) (string, error) {
	st, err := image.Open(filepath.Join(dir, "images"), slog.New(slog.DiscardHandler))
	if err != nil {
		return "", err
	}
	_, rootfs, err := st.Rootfs(ctx, "busybox")
	return rootfs, err
}

func newBenchRenderCmd(g *globals) *cobra.Command {
	var svg string
	cmd := &cobra.Command{
		Use:   "render FILE...",
		Short: "Render Markdown tables (and the fork/memory chart) from saved bench JSON",
		Long: `Render the tables of one or more saved bench JSON files (lifecycle.json,
scaling.json) again; the same JSON always renders to the same bytes. --svg
also draws fork time against memory in use from the scaling points.`,
		Example: `  k7 bench render out/bench/lifecycle.json out/bench/scaling.json
  k7 bench render --svg fork-memory.svg out/bench/scaling.json`,
		Args: usageArgs(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			var reports []*bench.Report
			for _, a := range args {
				r, err := bench.ReadJSON(a)
				if err != nil {
					return err
				}
				reports = append(reports, r)
			}
			if svg != "" {
				if err := writeSVG(svg, reports...); err != nil {
					return err
				}
			}
			return bench.Render(g.streams.Out, reports...)
		},
	}
	cmd.Flags().StringVar(&svg, "svg", "", "also write the fork/memory chart to this file")
	return cmd
}

func writeSVG(path string, reports ...*bench.Report) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := bench.RenderSVG(f, reports...); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// writeReport writes r as DIR/NAME.json and DIR/NAME.md and prints the table.
func writeReport(g *globals, r *bench.Report, dir, name string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	js, md := filepath.Join(dir, name+".json"), filepath.Join(dir, name+".md")
	if err := r.WriteJSON(js); err != nil {
		return err
	}
	f, err := os.Create(md)
	if err != nil {
		return err
	}
	if err := bench.Render(f, r); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	fmt.Fprintf(g.streams.Err, "wrote %s and %s\n", js, md)
	return bench.Render(g.streams.Out, r)
}

func newBenchScalingCmd(g *globals) *cobra.Command {
	var (
		cfg bench.ScalingConfig
		out string
	)
	cmd := &cobra.Command{
		Use:   "scaling [flags]",
		Short: "Measure how fork and create costs grow with memory and with load",
		Long: `Fork time and child memory against the memory a sandbox uses (tmpfs filled
with random data: 64 MiB to 1 GiB by default), and create/fork time with 1, 10
and 50 sandboxes already running. Writes DIR/scaling.json, DIR/scaling.md and
DIR/fork-memory.svg, and prints the tables with the per-MiB and per-sandbox
slopes.`,
		Example: `  k7 bench scaling --out out/bench
  k7 bench scaling --sizes 64,256 --running 1,10 --reps 2`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := ctxOf(cmd)
			c, err := g.client()
			if err != nil {
				return err
			}
			cfg.Client = c
			cfg.Command = "k7 " + strings.Join(os.Args[1:], " ")
			cfg.Progress = func(format string, args ...any) { fmt.Fprintf(g.streams.Err, format+"\n", args...) }
			r, err := bench.Scaling(ctx, cfg)
			if err != nil {
				return err
			}
			if err := writeReport(g, r, out, "scaling"); err != nil {
				return err
			}
			return writeSVG(filepath.Join(out, "fork-memory.svg"), r)
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&cfg.Engines, "engine", []string{"gvisor"}, "engines to measure (repeatable)")
	f.IntVar(&cfg.Reps, "reps", 3, "measurements per point")
	f.IntSliceVar(&cfg.SizesMiB, "sizes", []int{64, 128, 256, 512, 1024}, "memory in use, MiB")
	f.IntSliceVar(&cfg.Running, "running", []int{1, 10, 50}, "sandboxes already running")
	f.StringVar(&out, "out", "out/bench", "directory for scaling.json, scaling.md and fork-memory.svg")
	return cmd
}
