package cli

import "github.com/spf13/cobra"

func newSystemCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "system",
		Short:   "Manage the node as a whole",
		Example: `  k7 system prune -f`,
		Args:    usageArgs(cobra.NoArgs),
		RunE:    func(cmd *cobra.Command, args []string) error { return cmd.Help() },
	}
	cmd.AddCommand(newSystemPruneCmd(g))
	return cmd
}
