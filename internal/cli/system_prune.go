package cli

import (
	"bufio"
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"
)

func newSystemPruneCmd(g *globals) *cobra.Command {
	var force bool
	cmd := &cobra.Command{
		Use:   "prune [-f]",
		Short: "Remove stopped and dead sandboxes",
		Long: `Remove every sandbox that no longer runs (stopped or dead) and print
their IDs. Asks for confirmation on stdin unless -f is given.`,
		Example: `  k7 system prune
  k7 system prune -f`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !force {
				fmt.Fprint(g.streams.Err, "This removes all stopped and dead sandboxes. Continue? [y/N] ")
				line, _ := bufio.NewReader(g.streams.In).ReadString('\n')
				if a := strings.ToLower(strings.TrimSpace(line)); a != "y" && a != "yes" {
					return errors.New("prune cancelled")
				}
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			r, err := c.Prune(ctxOf(cmd))
			if err != nil {
				return err
			}
			if g.json() {
				return printJSON(g.streams.Out, r)
			}
			for _, id := range r.Sandboxes {
				fmt.Fprintln(g.streams.Out, id)
			}
			if n := len(r.Sandboxes); n == 1 {
				fmt.Fprintln(g.streams.Err, "Removed 1 sandbox.")
			} else {
				fmt.Fprintf(g.streams.Err, "Removed %d sandboxes.\n", n)
			}
			return nil
		},
	}
	cmd.Flags().BoolVarP(&force, "force", "f", false, "do not ask for confirmation")
	return cmd
}
