package cli

import (
	"io"

	"github.com/spf13/cobra"
)

func newLogsCmd(g *globals) *cobra.Command {
	var follow bool
	cmd := &cobra.Command{
		Use:   "logs [-f] SANDBOX",
		Short: "Print a sandbox's log",
		Long: `Print the output of a sandbox's init and of its detached commands
(k7 exec -d). With -f, keep printing until the sandbox stops or k7 is
interrupted.`,
		Example: `  k7 logs web
  k7 logs -f web`,
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			rc, err := c.Logs(ctxOf(cmd), args[0], follow)
			if err != nil {
				return err
			}
			defer rc.Close()
			_, err = io.Copy(g.streams.Out, rc)
			return err
		},
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing new output")
	return cmd
}
