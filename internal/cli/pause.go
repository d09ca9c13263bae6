package cli

import (
	"context"

	"github.com/spf13/cobra"

	v1 "github.com/k7-dev/k7/api/v1"
	"github.com/k7-dev/k7/sdk"
)

func newPauseCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "pause SANDBOX...",
		Short: "Freeze running sandboxes in place",
		Long:  "Freeze the processes of running sandboxes; memory stays as it is. Prints each ID paused.",
		Example: `  k7 pause web
  k7 pause $(k7 ls -q)`,
		Args: usageArgs(cobra.MinimumNArgs(1)),
		RunE: eachOp(g, func(ctx context.Context, c *sdk.Client, id string) (*v1.OpResult, error) {
			return c.PauseSandbox(ctx, id)
		}),
	}
}
