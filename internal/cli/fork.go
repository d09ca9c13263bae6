package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	v1 "github.com/k7-dev/k7/api/v1"
)

func newForkCmd(g *globals) *cobra.Command {
	var (
		req     v1.ForkRequest
		quiet   bool
		publish []string
	)
	cmd := &cobra.Command{
		Use:   "fork [flags] SANDBOX",
		Short: "Fork a running sandbox with its live memory",
		Long: `Pause the sandbox once, capture it with its memory, resume it, and start
N children from the capture. The children continue with the parent's running
processes (those started with k7 exec, including -d ones), tmpfs contents,
writable root filesystem, environment and working directories. Each child has
its own ID, name, hostname and resources and diverges independently.

Each child gets its own network namespace with the parent's policy and the
parent's in-sandbox address, and the parent's published ports on fresh free
host ports (see k7 ls); -p replaces that list (HOSTPORT must be 0 or omitted
with -n > 1).

Prints a table of the children; -q prints only their IDs, one a line; -o json
also gives the source's pause time and each child's time to its first answer.`,
		Example: `  k7 fork web
  k7 fork -n 3 --name trial web
  for id in $(k7 fork -q -n 10 web); do k7 exec $id -- ./try.sh & done`,
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			if req.Count < 1 {
				return &usageError{fmt.Errorf("invalid -n %d: must be at least 1", req.Count)}
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
			res, err := c.ForkSandbox(ctxOf(cmd), args[0], req)
			if err != nil {
				return err
			}
			return printForkResult(g, res, quiet)
		},
	}
	f := cmd.Flags()
	f.IntVarP(&req.Count, "count", "n", 1, "number of children")
	f.StringVar(&req.Name, "name", "", "name prefix: children are PREFIX-1, PREFIX-2, ... (default: derived from the source's name)")
	f.StringArrayVarP(&publish, "publish", "p", nil, "publish TCP port PORT of each child on 127.0.0.1:HOSTPORT: [HOSTPORT:]PORT (repeatable; default: the parent's ports on free host ports)")
	f.BoolVarP(&quiet, "quiet", "q", false, "print only the children's IDs")
	return cmd
}

// printForkResult prints the children of a fork or restore.
func printForkResult(g *globals, res *v1.ForkResult, quiet bool) error {
	switch {
	case quiet:
		for _, ch := range res.Children {
			fmt.Fprintln(g.streams.Out, ch.Sandbox.ID)
		}
		return nil
	case g.json():
		return printJSON(g.streams.Out, res)
	}
	t := newTable(g.streams.Out, "ID", "NAME", "STATE", "READY", "PORTS")
	for _, ch := range res.Children {
		t.row(ch.Sandbox.ID, ch.Sandbox.Name, ch.Sandbox.State, humanNS(ch.ReadyNS), formatPorts(ch.Sandbox.Ports))
	}
	if err := t.flush(); err != nil {
		return err
	}
	if res.SourcePauseNS > 0 {
		fmt.Fprintf(g.streams.Err, "source %s paused for %s\n", res.Source, humanNS(res.SourcePauseNS))
	}
	return nil
}
