package cli

import (
	"fmt"

	"github.com/spf13/cobra"
)

func newImageRmCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "rm REF...",
		Aliases: []string{"remove"},
		Short:   "Remove images",
		Long:    "Remove images by reference or ID. Prints each one removed.",
		Example: `  k7 image rm alpine:3 docker.io/library/busybox:latest`,
		Args:    usageArgs(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			return forEach(g, args, func(ref string) error {
				if err := c.RemoveImage(ctxOf(cmd), ref); err != nil {
					return err
				}
				fmt.Fprintln(g.streams.Out, ref)
				return nil
			})
		},
	}
}
