package cli

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	v1 "github.com/k7-dev/k7/api/v1"
)

func newInspectCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "inspect SANDBOX...",
		Short: "Show details of sandboxes",
		Long: `Show one or more sandboxes (by ID or name) with their resource usage.
With -o json the output is always a JSON array, one object per sandbox.`,
		Example: `  k7 inspect web
  k7 inspect -o json web db | jq '.[].state'`,
		Args: usageArgs(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			var found []*v1.Sandbox
			err = forEach(g, args, func(id string) error {
				sb, err := c.GetSandbox(ctxOf(cmd), id)
				if err == nil {
					found = append(found, sb)
				}
				return err
			})
			if g.json() {
				if found == nil {
					found = []*v1.Sandbox{}
				}
				if perr := printJSON(g.streams.Out, found); perr != nil {
					return perr
				}
				return err
			}
			for i, sb := range found {
				if i > 0 {
					fmt.Fprintln(g.streams.Out)
				}
				printSandbox(g, sb)
			}
			return err
		},
	}
}

func printSandbox(g *globals, sb *v1.Sandbox) {
	w := g.streams.Out
	p := func(k, v string) {
		if v != "" {
			fmt.Fprintf(w, "%-10s %s\n", k+":", v)
		}
	}
	p("ID", sb.ID)
	p("Name", sb.Name)
	p("State", sb.State)
	p("Reason", sb.Reason)
	p("Image", sb.Image)
	p("Image ID", sb.ImageID)
	p("Engine", sb.Engine)
	p("Hostname", sb.Hostname)
	p("Parent", sb.Parent)
	if n := sb.Network; n != nil {
		v := n.Policy
		if n.Address != "" {
			v += " address=" + n.Address
		}
		if n.Outer != "" {
			v += " outer=" + n.Outer
		}
		if len(n.Allow) > 0 {
			v += " allow=" + strings.Join(n.Allow, ",")
		}
		p("Network", v)
	}
	p("Ports", formatPorts(sb.Ports))
	p("Created", sb.Created.Format("2006-01-02T15:04:05Z07:00")+" ("+ago(sb.Created)+")")
	r := sb.Resources
	lim := []string{}
	if r.CPUs != 0 {
		lim = append(lim, fmt.Sprintf("cpus=%g", r.CPUs))
	}
	if r.MemoryBytes != 0 {
		lim = append(lim, "memory="+humanBytes(r.MemoryBytes))
	}
	if r.PIDs != 0 {
		lim = append(lim, fmt.Sprintf("pids=%d", r.PIDs))
	}
	if len(lim) == 0 {
		lim = append(lim, "engine defaults")
	}
	p("Limits", strings.Join(lim, " "))
	if s := sb.Stats; s != nil {
		p("Usage", fmt.Sprintf("cpu=%s memory=%s pids=%d", humanNS(s.CPUNS), humanBytes(s.MemoryBytes), s.PIDs))
	}
	for i, e := range sb.Env {
		k := ""
		if i == 0 {
			k = "Env"
		}
		fmt.Fprintf(w, "%-10s %s\n", k+map[bool]string{true: ":", false: ""}[k != ""], e)
	}
}
