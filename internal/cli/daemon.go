package cli

import (
	"errors"

	"github.com/spf13/cobra"
)

// daemonMain runs the node daemon in the foreground with its own flags and
// returns its exit code. It is internal/daemon.Main once that exists.
var daemonMain func(args []string) int

func newDaemonCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "daemon [flags]",
		Short: "Run the k7d node daemon in the foreground",
		Long: `Run the node daemon (the same program as k7d) in the foreground. All
arguments are the daemon's own flags; see "k7 daemon --help".`,
		Example: `  k7 daemon
  k7 daemon --help`,
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			if daemonMain == nil {
				return errors.New("this k7 build has no daemon: run k7d")
			}
			if code := daemonMain(args); code != 0 {
				return &exitError{code: code}
			}
			return nil
		},
	}
}
