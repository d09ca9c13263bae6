package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	v1 "github.com/k7-dev/k7/api/v1"
	"github.com/k7-dev/k7/sdk"
)

func newExecCmd(g *globals) *cobra.Command {
	var (
		interactive, tty, detach bool
		req                      v1.ExecRequest
		timeout                  time.Duration
	)
	cmd := &cobra.Command{
		Use:   "exec [flags] SANDBOX [--] CMD [ARG...]",
		Short: "Run a command in a sandbox",
		Long: `Run a command in a running sandbox and exit with its exit code.

Output is streamed as it comes. With -i, k7's stdin is sent to the command;
with -t the command gets a terminal, the local terminal is put in raw mode
and window size changes are forwarded. With -d the command is started in
the background, its PID printed, and its output goes to the sandbox log
(k7 logs). Flags after SANDBOX belong to the command; "--" is optional.

Exit codes: the command's own; 126 or 127 when it cannot be started (not
executable, not found); 1 when k7 itself fails (no such sandbox, no daemon).
SIGINT, SIGTERM and SIGHUP sent to k7 are forwarded to the command.`,
		Example: `  k7 exec web -- ls -l /
  k7 exec -it web -- sh
  echo hi | k7 exec -i web -- cat
  k7 exec -e DEBUG=1 -w /srv -u nobody --timeout 30s web -- ./run-tests
  k7 exec -d web -- python3 -m http.server`,
		Args: usageArgs(cobra.MinimumNArgs(2)),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, argv := args[0], args[1:]
			if argv[0] == "--" {
				argv = argv[1:]
			}
			if len(argv) == 0 {
				return &usageError{errors.New("no command given")}
			}
			if err := checkEnv(req.Env); err != nil {
				return err
			}
			if timeout < 0 {
				return &usageError{fmt.Errorf("invalid --timeout %s: must not be negative", timeout)}
			}
			if detach && (interactive || tty) {
				return &usageError{errors.New("-d cannot be combined with -i or -t")}
			}
			req.Args, req.TTY, req.TimeoutNS = argv, tty, int64(timeout)
			c, err := g.client()
			if err != nil {
				return err
			}
			ctx := ctxOf(cmd)
			if detach {
				req.Detach = true
				r, err := c.Run(ctx, id, req)
				if err != nil {
					return err
				}
				fmt.Fprintln(g.streams.Out, r.PID)
				return nil
			}
			return runExec(ctx, g, c, id, req, interactive)
		},
	}
	f := cmd.Flags()
	f.SetInterspersed(false)
	f.BoolVarP(&interactive, "interactive", "i", false, "send stdin to the command")
	f.BoolVarP(&tty, "tty", "t", false, "give the command a terminal (raw mode locally)")
	f.BoolVarP(&detach, "detach", "d", false, "start in the background, print the PID and return")
	f.StringArrayVarP(&req.Env, "env", "e", nil, "environment variable KEY=VALUE (repeatable)")
	f.StringVarP(&req.Cwd, "workdir", "w", "", "working directory inside the sandbox (default /)")
	f.StringVarP(&req.User, "user", "u", "", "user name or uid[:gid] (default root)")
	f.DurationVar(&timeout, "timeout", 0, "kill the command after this long, e.g. 10s (default: no limit)")
	return cmd
}

// runExec streams one command and turns its end into the CLI's exit.
func runExec(ctx context.Context, g *globals, c *sdk.Client, id string, req v1.ExecRequest, interactive bool) error {
	stdio := sdk.ExecIO{Stdout: g.streams.Out, Stderr: g.streams.Err}
	if interactive {
		stdio.Stdin = g.streams.In
	}
	inFd, inTerm := terminalFd(g.streams.In)
	outFd, outTerm := terminalFd(g.streams.Out)
	if req.TTY {
		if outTerm {
			if cols, rows, err := term.GetSize(outFd); err == nil {
				req.Rows, req.Cols = uint16(rows), uint16(cols)
			}
		}
		if interactive && inTerm {
			old, err := term.MakeRaw(inFd)
			if err != nil {
				return fmt.Errorf("putting the terminal in raw mode: %w", err)
			}
			defer func() { _ = term.Restore(inFd, old) }()
		}
	}
	s, err := c.StartExec(ctx, id, req, stdio)
	if err != nil {
		return execError(err)
	}
	defer func() { _ = s.Close() }()

	sigs := make(chan os.Signal, 4)
	fwd := []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP}
	if req.TTY && outTerm {
		fwd = append(fwd, syscall.SIGWINCH)
	}
	signal.Notify(sigs, fwd...)
	defer signal.Stop(sigs)
	done := make(chan struct{})
	defer close(done)
	go func() {
		for {
			select {
			case <-done:
				return
			case sig := <-sigs:
				if sig == syscall.SIGWINCH {
					if cols, rows, err := term.GetSize(outFd); err == nil {
						_ = s.Resize(ctx, uint16(rows), uint16(cols))
					}
					continue
				}
				_ = s.Signal(ctx, signalName(sig))
			}
		}
	}()

	exit, err := s.Wait()
	if err != nil {
		return execError(err)
	}
	if exit.TimedOut {
		fmt.Fprintf(g.streams.Err, "k7: command timed out after %s\n", time.Duration(req.TimeoutNS))
	}
	if exit.Code != 0 {
		return &exitError{code: exit.Code}
	}
	return nil
}

// execError maps a start failure to its exit code (126, 127).
func execError(err error) error {
	var se *sdk.StartError
	if errors.As(err, &se) {
		code := se.ExitCode
		if code == 0 {
			code = 127
		}
		return &exitError{code: code, msg: se.Message}
	}
	return err
}

// terminalFd returns the file descriptor of s and whether it is a terminal.
func terminalFd(s any) (int, bool) {
	f, ok := s.(*os.File)
	if !ok {
		return -1, false
	}
	fd := int(f.Fd())
	return fd, term.IsTerminal(fd)
}

func signalName(sig os.Signal) string {
	switch sig {
	case syscall.SIGINT:
		return "INT"
	case syscall.SIGHUP:
		return "HUP"
	case syscall.SIGKILL:
		return "KILL"
	default:
		return "TERM"
	}
}
