package cli

import (
	"strings"

	"github.com/spf13/cobra"

	"github.com/k7-dev/k7/internal/daemon"
)

// daemonMain runs the node daemon in the foreground with its own flags and
// returns its exit code; cmd/k7d runs the same function.
var daemonMain = daemon.Main

func newDaemonCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "daemon [flags]",
		Short: "Run the k7d node daemon in the foreground",
		Long: `Run the node daemon (the same program as k7d) in the foreground. All
arguments are the daemon's own flags; see "k7 daemon --help". k7's global
flags (--host, -o) are ignored.`,
		Example: `  k7 daemon
  k7 daemon --help`,
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			if code := daemonMain(stripGlobalFlags(args)); code != 0 {
				return &exitError{code: code}
			}
			return nil
		},
	}
}

// stripGlobalFlags removes k7's global flags, which cobra hands over with the
// daemon's own when flag parsing is disabled.
func stripGlobalFlags(args []string) []string {
	var out []string
	for i := 0; i < len(args); i++ {
		switch a := args[i]; {
		case a == "--host" || a == "-o" || a == "--output":
			i++ // and its value
		case strings.HasPrefix(a, "--host=") || strings.HasPrefix(a, "--output=") || strings.HasPrefix(a, "-o="):
		default:
			out = append(out, a)
		}
	}
	return out
}
