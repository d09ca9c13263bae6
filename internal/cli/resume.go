package cli

import (
	"github.com/spf13/cobra"
)

func newResumeCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "resume SANDBOX...",
		Aliases: []string{"unpause"},
		Short:   "Resume paused sandboxes",
		Long:    "Resume paused sandboxes where they stopped. Prints each ID resumed.",
		Example: `  k7 resume web`,
		Args:    usageArgs(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			return forEach(g, args, func(id string) error {
				r, err := c.ResumeSandbox(ctxOf(cmd), id)
				if err != nil {
					return err
				}
				return printOp(g, r)
			})
		},
	}
}
