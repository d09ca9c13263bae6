package cli

import (
	"fmt"

	"github.com/spf13/cobra"
)

func newInfoCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "info",
		Short: "Show the daemon's version and engines",
		Example: `  k7 info
  k7 info -o json`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			info, err := c.Info(ctxOf(cmd))
			if err != nil {
				return err
			}
			if g.json() {
				return printJSON(g.streams.Out, info)
			}
			w := g.streams.Out
			fmt.Fprintf(w, "Host:           %s\n", c.Host())
			fmt.Fprintf(w, "Version:        %s\n", info.Version)
			fmt.Fprintf(w, "State dir:      %s\n", info.StateDir)
			fmt.Fprintf(w, "Default engine: %s\n", info.DefaultEngine)
			if n := info.Network; n != nil && n.Reason != "" {
				fmt.Fprintf(w, "Network:        unavailable: %s\n", n.Reason)
			} else if n != nil {
				fmt.Fprintf(w, "Network:        bridge %s %s, subnet %s, in-sandbox %s\n", n.Bridge, n.Address, n.Subnet, n.Inner)
			}
			fmt.Fprintln(w, "Engines:")
			t := newTable(w, "  NAME", "AVAILABLE", "VERSION", "FEATURES", "NOTE")
			for _, e := range info.Engines {
				feat := "-"
				if len(e.Features) > 0 {
					feat = fmt.Sprint(e.Features)
				}
				avail := "no"
				if e.Available {
					avail = "yes"
				}
				t.row("  "+e.Name, avail, dash(e.Version), feat, dash(e.Reason))
			}
			return t.flush()
		},
	}
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
