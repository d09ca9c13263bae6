package cli

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	v1 "github.com/k7-dev/k7/api/v1"
)

func newCreateCmd(g *globals) *cobra.Command {
	var (
		req     v1.CreateSandboxRequest
		memory  string
		quiet   bool
		publish []string
	)
	cmd := &cobra.Command{
		Use:   "create [flags] IMAGE",
		Short: "Create and start a sandbox",
		Long: `Create a sandbox from an image in the daemon's image store and start it.
It prints the new sandbox's ID; with -o json the whole sandbox.

--memory takes bytes (1048576) or a number with a binary unit: 512M, 1G,
1.5GiB (K, M, G, T are powers of 1024).

--network chooses the sandbox's network policy:
  isolated  (default) the host reaches the published ports; the sandbox
            reaches nothing: not other sandboxes, not the host, not k7d
  none      loopback only
  egress    as isolated, plus outbound connections through NAT; with
            --allow, only to those destinations (CIDR or CIDR:PORT)
Both engines (gvisor, qemu) support every policy.

-p HOSTPORT:PORT publishes the sandbox's TCP PORT on 127.0.0.1:HOSTPORT of
the host; -p PORT picks a free host port (see k7 ls or k7 inspect).`,
		Example: `  k7 create docker.io/library/alpine:3
  k7 create --name db --cpus 2 --memory 1G --env POSTGRES_PASSWORD=x postgres:16
  k7 create -p 8080:80 nginx:1
  k7 create --network egress --allow 10.0.0.0/8:443 alpine:3
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
			ports, err := parsePorts(publish)
			if err != nil {
				return err
			}
			req.Ports = ports
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
	f.StringVar(&req.Network, "network", "", "network policy: isolated, none or egress (default: isolated; none on engines without networking)")
	f.StringArrayVar(&req.Allow, "allow", nil, "with --network egress, allow only this destination: CIDR[:PORT] (repeatable)")
	f.StringArrayVarP(&publish, "publish", "p", nil, "publish TCP port PORT on 127.0.0.1:HOSTPORT: [HOSTPORT:]PORT (repeatable)")
	f.BoolVarP(&quiet, "quiet", "q", false, "print only the sandbox ID")
	return cmd
}

// parsePorts parses -p values: [HOSTPORT:]PORT[/tcp].
func parsePorts(specs []string) ([]v1.Port, error) {
	var out []v1.Port
	for _, s := range specs {
		bad := &usageError{fmt.Errorf("invalid -p %q: want [HOSTPORT:]PORT, ports 1-65535 (HOSTPORT 0: a free one)", s)}
		s, proto, _ := strings.Cut(s, "/")
		if proto != "" && proto != "tcp" {
			return nil, bad
		}
		host, ctr, ok := strings.Cut(s, ":")
		if !ok {
			host, ctr = "0", host
		}
		hp, err1 := strconv.Atoi(host)
		cp, err2 := strconv.Atoi(ctr)
		if err1 != nil || err2 != nil || hp < 0 || hp > 65535 || cp < 1 || cp > 65535 {
			return nil, bad
		}
		out = append(out, v1.Port{HostPort: hp, Port: cp, Protocol: "tcp"})
	}
	return out, nil
}

// formatPorts renders published ports as 127.0.0.1:HOSTPORT->PORT, comma-separated.
func formatPorts(ports []v1.Port) string {
	var l []string
	for _, p := range ports {
		l = append(l, fmt.Sprintf("127.0.0.1:%d->%d", p.HostPort, p.Port))
	}
	return strings.Join(l, ",")
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
