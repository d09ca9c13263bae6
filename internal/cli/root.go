// Package cli implements the k7 command line. Every command talks to the
// daemon through the Go SDK. Besides internal/version it uses internal/daemon
// (for `k7 daemon`) and internal/bench with internal/image (for the raw-tool
// floor of `k7 bench`, which runs on the daemon's host).
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/k7-dev/k7/sdk"
)

// Exit codes that scripts can rely on. `k7 exec` exits with the command's
// own code instead.
const (
	exitOK      = 0
	exitFailure = 1 // a runtime error, reported as one line on stderr
	exitUsage   = 2 // wrong flags or arguments; usage is printed
)

// Streams are the standard streams of one CLI run; tests swap them.
type Streams struct {
	In  io.Reader
	Out io.Writer
	Err io.Writer
}

// Run runs the k7 CLI with args (without the program name) on the process's
// standard streams and returns the exit code.
func Run(args []string) int {
	return run(context.Background(), Streams{In: os.Stdin, Out: os.Stdout, Err: os.Stderr}, args)
}

// run executes one command line and maps its error to an exit code.
func run(ctx context.Context, s Streams, args []string) int {
	root := newRootCmd(s)
	root.SetArgs(args)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return exitOK
	}
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.msg != "" {
			fmt.Fprintf(s.Err, "k7: %s\n", oneLine(ee.msg))
		}
		return ee.code
	}
	fmt.Fprintf(s.Err, "k7: %s\n", oneLine(err.Error()))
	var ue *usageError
	if errors.As(err, &ue) || strings.HasPrefix(err.Error(), "unknown command") {
		if cmd == nil {
			cmd = root
		}
		fmt.Fprintf(s.Err, "\n%s", cmd.UsageString())
		return exitUsage
	}
	return exitFailure
}

// oneLine keeps an error message on one line.
func oneLine(s string) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", " ")), " ")
}

// exitError ends the CLI with code, printing msg (if any) as `k7: msg`.
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }

// usageError is a wrong flag or argument: the usage is printed after it.
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

// usageArgs wraps a cobra argument validator so its errors print usage.
func usageArgs(v cobra.PositionalArgs) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if err := v(cmd, args); err != nil {
			return &usageError{err}
		}
		return nil
	}
}

// globals are the flags every command has.
type globals struct {
	streams Streams
	host    string
	output  string
}

// client returns an SDK client for --host / $K7_HOST and $K7_TOKEN.
func (g *globals) client() (*sdk.Client, error) {
	host := g.host
	if host == "" {
		host = os.Getenv("K7_HOST")
	}
	var opts []sdk.Option
	if t := os.Getenv("K7_TOKEN"); t != "" {
		opts = append(opts, sdk.WithToken(t))
	}
	return sdk.New(host, opts...)
}

// json reports whether -o json was asked for.
func (g *globals) json() bool { return g.output == "json" }

// newRootCmd builds the k7 command tree on streams.
func newRootCmd(s Streams) *cobra.Command {
	g := &globals{streams: s}
	root := &cobra.Command{
		Use:   "k7",
		Short: "Run and manage isolated, forkable sandboxes",
		Long: `k7 manages the sandboxes of a k7d node daemon: create them from images,
run commands in them, pause and resume them, fork them with their live memory,
snapshot and restore them, copy files, and manage images.

The daemon is reached at --host, $K7_HOST, or unix:///run/k7/k7.sock; for an
http(s):// host the bearer token is read from $K7_TOKEN.`,
		Example: `  k7 image pull docker.io/library/alpine:3
  id=$(k7 create -q docker.io/library/alpine:3)
  k7 exec $id -- echo hello
  k7 exec -it $id -- sh
  k7 fork -n 3 $id
  k7 rm -f $id`,
		SilenceUsage:      true,
		SilenceErrors:     true,
		CompletionOptions: cobra.CompletionOptions{DisableDefaultCmd: true},
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			switch g.output {
			case "table", "json":
				return nil
			}
			return &usageError{fmt.Errorf("invalid output format %q: want table or json", g.output)}
		},
	}
	root.SetIn(s.In)
	root.SetOut(s.Out)
	root.SetErr(s.Err)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &usageError{err} })
	pf := root.PersistentFlags()
	pf.StringVar(&g.host, "host", "", "daemon address: unix:///path or http(s)://host:port (default $K7_HOST or "+sdk.DefaultHost+")")
	pf.StringVarP(&g.output, "output", "o", "table", "output format: table or json")

	root.AddCommand(
		newCreateCmd(g),
		newExecCmd(g),
		newLsCmd(g),
		newInspectCmd(g),
		newPauseCmd(g),
		newResumeCmd(g),
		newRmCmd(g),
		newLogsCmd(g),
		newCpCmd(g),
		newVersionCmd(g),
		newInfoCmd(g),
		newImageCmd(g),
		newSystemCmd(g),
		newForkCmd(g),
		newSnapshotCmd(g),
		newRestoreCmd(g),
		newTreeCmd(g),
		newBenchCmd(g),
		newDaemonCmd(),
	)
	return root
}

// forEach runs fn for every argument, reporting each failure on its own line;
// it fails when any did.
func forEach(g *globals, args []string, fn func(arg string) error) error {
	failed := 0
	for _, a := range args {
		if err := fn(a); err != nil {
			fmt.Fprintf(g.streams.Err, "k7: %s\n", oneLine(err.Error()))
			failed++
		}
	}
	if failed > 0 {
		return &exitError{code: exitFailure}
	}
	return nil
}

// ctxOf returns the command's context.
func ctxOf(cmd *cobra.Command) context.Context {
	if ctx := cmd.Context(); ctx != nil {
		return ctx
	}
	return context.Background()
}
