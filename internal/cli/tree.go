package cli

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	v1 "github.com/k7-dev/k7/api/v1"
)

func newTreeCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "tree [SANDBOX]",
		Short: "Show the fork tree",
		Long: `Show the lineage of sandboxes and snapshots: who was forked or restored from
whom. With SANDBOX, only the tree that holds it. Deleted sandboxes stay in the
tree as "deleted" so that lineage stays connected.`,
		Example: `  k7 tree
  k7 tree web`,
		Args: usageArgs(cobra.MaximumNArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			root := ""
			if len(args) == 1 {
				root = args[0]
			}
			tr, err := c.Tree(ctxOf(cmd), root)
			if err != nil {
				return err
			}
			if g.json() {
				return printJSON(g.streams.Out, tr)
			}
			for _, n := range tr.Roots {
				printTreeNode(g.streams.Out, n, "", "")
			}
			return nil
		},
	}
}

func printTreeNode(w io.Writer, n v1.TreeNode, first, rest string) {
	var label string
	if n.Kind == "sandbox" {
		label = shortID(n.ID)
		if n.Name != "" {
			label = n.Name + " (" + shortID(n.ID) + ")"
		}
	} else {
		label = "snapshot " + n.ID
	}
	if n.State != "" {
		label += " " + n.State
	}
	fmt.Fprintln(w, first+label)
	for i, ch := range n.Children {
		if i == len(n.Children)-1 {
			printTreeNode(w, ch, rest+"└── ", rest+"    ")
		} else {
			printTreeNode(w, ch, rest+"├── ", rest+"│   ")
		}
	}
}
