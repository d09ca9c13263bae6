package cli

import "github.com/spf13/cobra"

func newImageCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "image",
		Aliases: []string{"images"},
		Short:   "Manage the node's images",
		Example: `  k7 image pull docker.io/library/alpine:3
  k7 image import ./oci-layout --name mytool:1
  k7 image ls
  k7 image rm alpine:3`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error { return cmd.Help() },
	}
	cmd.AddCommand(newImagePullCmd(g), newImageImportCmd(g), newImageLsCmd(g), newImageRmCmd(g))
	return cmd
}
