package cli

import (
	"context"

	"github.com/spf13/cobra"

	v1 "github.com/k7-dev/k7/api/v1"
	"github.com/k7-dev/k7/sdk"
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
  k7 rm -f $(k7 ls -q)`,
		Args: usageArgs(cobra.MinimumNArgs(1)),
		RunE: eachOp(g, func(ctx context.Context, c *sdk.Client, id string) (*v1.OpResult, error) {
			return c.DeleteSandbox(ctx, id, force)
		}),
	}
	cmd.Flags().BoolVarP(&force, "force", "f", false, "remove even if the engine fails to stop the sandbox")
	return cmd
}
