package cli

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	v1 "github.com/k7-dev/k7/api/v1"
)

func newCreateCmd(g *globals) *cobra.Command {
	var (
		req    v1.CreateSandboxRequest
		memory string
		quiet  bool
	)
	cmd := &cobra.Command{
		Use:   "create [flags] IMAGE",
		Short: "Create and start a sandbox",
		Long: `Create a sandbox from an image in the daemon's image store and start it.
It prints the new sandbox's ID; with -o json the whole sandbox.

--memory takes bytes (1048576) or a number with a binary unit: 512M, 1G,
1.5GiB (K, M, G, T are powers of 1024).`,
		Example: `  k7 create docker.io/library/alpine:3
  k7 create --name db --cpus 2 --memory 1G --env POSTGRES_PASSWORD=x postgres:16
  id=$(k7 create -q alpine:3)`,
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			req.Image = args[0]
			if memory != "" {
				n, err := parseSize(memory)
				if err != nil {
					return err
				}
				req.Resources.MemoryBytes = n
			}
			if req.Resources.CPUs < 0 {
				return fmt.Errorf("invalid --cpus %v: must not be negative", req.Resources.CPUs)
			}
			if req.Resources.PIDs < 0 {
				return fmt.Errorf("invalid --pids %d: must not be negative", req.Resources.PIDs)
			}
			if err := checkEnv(req.Env); err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			sb, err := c.CreateSandbox(ctxOf(cmd), req)
			if err != nil {
				return err
			}
			if g.json() && !quiet {
				return printJSON(g.streams.Out, sb)
			}
			fmt.Fprintln(g.streams.Out, sb.ID)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&req.Engine, "engine", "", "engine to run the sandbox on: gvisor, qemu, fake (default: the daemon's default)")
	f.StringVar(&req.Name, "name", "", "sandbox name (default: generated)")
	f.Float64Var(&req.Resources.CPUs, "cpus", 0, "number of vCPUs, fractions allowed (default: the engine's)")
	f.StringVar(&memory, "memory", "", "memory limit, e.g. 512M, 1G, 1.5GiB (default: the engine's)")
	f.Int64Var(&req.Resources.PIDs, "pids", 0, "maximum number of tasks (default: the engine's)")
	f.StringArrayVarP(&req.Env, "env", "e", nil, "environment variable KEY=VALUE (repeatable)")
	f.BoolVarP(&quiet, "quiet", "q", false, "print only the sandbox ID")
	return cmd
}

// checkEnv rejects env entries that are not KEY=VALUE.
func checkEnv(env []string) error {
	for _, e := range env {
		if k, _, ok := strings.Cut(e, "="); !ok || k == "" {
			return fmt.Errorf("invalid environment variable %q: want KEY=VALUE", e)
		}
	}
	return nil
}
