package cli

import (
	"context"

	"github.com/spf13/cobra"

	v1 "github.com/k7-dev/k7/api/v1"
	"github.com/k7-dev/k7/sdk"
)

func newResumeCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "resume SANDBOX...",
		Aliases: []string{"unpause"},
		Short:   "Resume paused sandboxes",
		Long:    "Resume paused sandboxes where they stopped. Prints each ID resumed.",
		Example: `  k7 resume web`,
		Args:    usageArgs(cobra.MinimumNArgs(1)),
		RunE: eachOp(g, func(ctx context.Context, c *sdk.Client, id string) (*v1.OpResult, error) {
			return c.ResumeSandbox(ctx, id)
		}),
	}
}
