package cli

import (
	"github.com/spf13/cobra"
)

func newRmCmd(g *globals) *cobra.Command {
	var force bool
	cmd := &cobra.Command{
		Use:   "rm [-f] SANDBOX...",
		Short: "Stop and remove sandboxes",
		Long: `Stop and remove sandboxes in any state. With -f, a sandbox is removed even
when its engine fails to stop it cleanly. Prints each ID removed; a failure
for one sandbox does not stop the others, but makes the exit code 1.`,
		Example: `  k7 rm web
  k7 rm -f $(k7 ls -aq)`,
		Args: usageArgs(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			return forEach(g, args, func(id string) error {
				r, err := c.DeleteSandbox(ctxOf(cmd), id, force)
				if err != nil {
					return err
				}
				return printOp(g, r)
			})
		},
	}
	cmd.Flags().BoolVarP(&force, "force", "f", false, "remove even if the engine fails to stop the sandbox")
	return cmd
}
