package cli

import (
	"fmt"
	"runtime"

	"github.com/spf13/cobra"

	"github.com/k7-dev/k7/internal/version"
)

func newVersionCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Show the client and daemon versions",
		Long: `Show the version of this k7 client and of the daemon it talks to. When the
daemon cannot be reached, the client part is still printed, followed by an
error line, and the exit code is 1.`,
		Example: `  k7 version
  k7 version -o json`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			type part struct {
				Version string `json:"version"`
				Go      string `json:"go,omitempty"`
				OSArch  string `json:"os_arch,omitempty"`
				Host    string `json:"host,omitempty"`
			}
			out := struct {
				Client part   `json:"client"`
				Server *part  `json:"server,omitempty"`
				Error  string `json:"error,omitempty"`
			}{Client: part{Version: version.Version, Go: runtime.Version(), OSArch: runtime.GOOS + "/" + runtime.GOARCH}}
			c, err := g.client()
			if err == nil {
				info, ierr := c.Info(ctxOf(cmd))
				if ierr == nil {
					out.Server = &part{Version: info.Version, Host: c.Host()}
				}
				err = ierr
			}
			if err != nil {
				out.Error = err.Error()
			}
			if g.json() {
				if perr := printJSON(g.streams.Out, out); perr != nil {
					return perr
				}
			} else {
				w := g.streams.Out
				fmt.Fprintf(w, "Client:\n  Version: %s\n  Go:      %s\n  OS/Arch: %s\n", out.Client.Version, out.Client.Go, out.Client.OSArch)
				if out.Server != nil {
					fmt.Fprintf(w, "Server:\n  Version: %s\n  Host:    %s\n", out.Server.Version, out.Server.Host)
				}
			}
			return err
		},
	}
}
