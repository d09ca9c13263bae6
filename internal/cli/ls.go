package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	v1 "github.com/k7-dev/k7/api/v1"
)

func newLsCmd(g *globals) *cobra.Command {
	var quiet, live bool
	cmd := &cobra.Command{
		Use:     "ls [--live] [-q]",
		Aliases: []string{"ps", "list"},
		Short:   "List sandboxes",
		Long: `List the node's sandboxes in every state, dead and stopped ones with the
reason. --live lists only creating, running and paused ones.`,
		Example: `  k7 ls
  k7 ls --live -o json
  k7 rm -f $(k7 ls -q)`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			list, err := c.ListSandboxes(ctxOf(cmd))
			if err != nil {
				return err
			}
			shown := []v1.Sandbox{}
			for _, sb := range list {
				if !live || sb.State != v1.StateStopped && sb.State != v1.StateDead {
					shown = append(shown, sb)
				}
			}
			switch {
			case quiet:
				for _, sb := range shown {
					fmt.Fprintln(g.streams.Out, sb.ID)
				}
				return nil
			case g.json():
				return printJSON(g.streams.Out, shown)
			}
			t := newTable(g.streams.Out, "ID", "NAME", "IMAGE", "ENGINE", "STATE", "CREATED", "PORTS")
			for _, sb := range shown {
				state := sb.State
				if sb.Reason != "" {
					state += " (" + sb.Reason + ")"
				}
				t.row(sb.ID, sb.Name, sb.Image, sb.Engine, state, ago(sb.Created), formatPorts(sb.Ports))
			}
			return t.flush()
		},
	}
	cmd.Flags().BoolVarP(&quiet, "quiet", "q", false, "print only sandbox IDs, one a line")
	cmd.Flags().BoolVar(&live, "live", false, "only creating, running and paused sandboxes")
	return cmd
}
