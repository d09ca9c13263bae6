package cli

import (
	"github.com/spf13/cobra"
)

func newPauseCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "pause SANDBOX...",
		Short: "Freeze running sandboxes in place",
		Long:  "Freeze the processes of running sandboxes; memory stays as it is. Prints each ID paused.",
		Example: `  k7 pause web
  k7 pause $(k7 ls -q)`,
		Args: usageArgs(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			return forEach(g, args, func(id string) error {
				r, err := c.PauseSandbox(ctxOf(cmd), id)
				if err != nil {
					return err
				}
				return printOp(g, r)
			})
		},
	}
}
