package cli

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	v1 "github.com/k7-dev/k7/api/v1"
)

func newImageLsCmd(g *globals) *cobra.Command {
	var quiet bool
	cmd := &cobra.Command{
		Use:     "ls [-q]",
		Aliases: []string{"list"},
		Short:   "List images",
		Example: `  k7 image ls
  k7 image ls -q`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			imgs, err := c.ListImages(ctxOf(cmd))
			if err != nil {
				return err
			}
			switch {
			case quiet:
				for _, img := range imgs {
					fmt.Fprintln(g.streams.Out, img.ID)
				}
				return nil
			case g.json():
				if imgs == nil {
					imgs = []v1.Image{}
				}
				return printJSON(g.streams.Out, imgs)
			}
			t := newTable(g.streams.Out, "ID", "REFS", "SIZE", "CREATED")
			for _, img := range imgs {
				t.row(shortID(img.ID), dash(strings.Join(img.Refs, ", ")), humanBytes(img.SizeBytes), ago(img.Created))
			}
			return t.flush()
		},
	}
	cmd.Flags().BoolVarP(&quiet, "quiet", "q", false, "print only image IDs, one a line")
	return cmd
}
