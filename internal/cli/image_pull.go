package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	v1 "github.com/k7-dev/k7/api/v1"
)

func newImagePullCmd(g *globals) *cobra.Command {
	var req v1.PullRequest
	cmd := &cobra.Command{
		Use:   "pull [--insecure] REF",
		Short: "Pull an image from a registry",
		Long: `Pull an image from an OCI registry into the node's image store. Progress
goes to stderr (a progress bar on a terminal, status lines otherwise); the
image ID goes to stdout, or the image object with -o json.`,
		Example: `  k7 image pull docker.io/library/alpine:3
  k7 image pull --insecure localhost:5000/mytool:dev`,
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			req.Ref = args[0]
			c, err := g.client()
			if err != nil {
				return err
			}
			pv := newProgressView(g.streams.Err)
			img, err := c.PullImage(ctxOf(cmd), req, pv.update)
			if err != nil {
				pv.clear()
				return err
			}
			pv.done(img, "Pulled")
			return printImageResult(g, img)
		},
	}
	cmd.Flags().BoolVar(&req.Insecure, "insecure", false, "allow a plain-HTTP registry")
	return cmd
}

func printImageResult(g *globals, img *v1.Image) error {
	if g.json() {
		return printJSON(g.streams.Out, img)
	}
	_, err := fmt.Fprintln(g.streams.Out, img.ID)
	return err
}
