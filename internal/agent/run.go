package agent

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/sys/unix"
)

// Run is k7-agent's main: it parses args (without the program name) and
// serves the protocol on stdin/stdout, or on the character device given by
// --transport (a virtio-serial port), logging to stderr. As PID 1 it mounts
// what is missing; in any case it becomes the reaper of orphans. It returns
// an exit code only for bad flags: init never ends.
func Run(args []string) int {
	fs := flag.NewFlagSet("k7-agent", flag.ContinueOnError)
	transport := fs.String("transport", "", "character device to serve on instead of stdin/stdout")
	debug := fs.Bool("debug", false, "log debug messages")
	showVersion := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *showVersion {
		fmt.Printf("k7-agent %s (protocol %d)\n", Version, ProtocolVersion)
		return 0
	}
	level := slog.LevelInfo
	if *debug {
		level = slog.LevelDebug
	}
	console := &lineWriter{w: os.Stderr}
	log := slog.New(slog.NewTextHandler(console, &slog.HandlerOptions{Level: level}))
	log = log.With("agent", Version, "pid", os.Getpid())

	if os.Getpid() == 1 {
		setupMounts(log)
	} else if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		log.Warn("becoming child subreaper", "err", err)
	}

	var r io.Reader = os.Stdin
	var w io.Writer = os.Stdout
	if *transport != "" {
		f, err := openTransport(*transport, log)
		if err != nil {
			log.Error("opening transport", "path", *transport, "err", err)
			return 1
		}
		r, w = f, f
	}
	srv := NewServer(Options{Logger: log, Console: console})

	// As init, SIGTERM is forwarded to every command's process group; other
	// terminal signals are logged. Handled (not ignored) so that children
	// start with default dispositions.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGPIPE)
	go func() {
		for sig := range sigs {
			log.Info("signal received", "signal", sig)
			if sig == syscall.SIGTERM {
				if err := srv.signalAll(syscall.SIGTERM); err != nil {
					log.Warn("forwarding SIGTERM", "err", err)
				}
			}
		}
	}()
	log.Info("k7-agent serving", "transport", transportName(*transport))
	_ = srv.Serve(context.Background(), r, w)
	return 0
}

func transportName(p string) string {
	if p == "" {
		return "stdio"
	}
	return p
}

// openTransport opens a character device, waiting for it to appear (a
// virtio port shows up when its driver loads).
func openTransport(path string, log *slog.Logger) (*os.File, error) {
	for i := 0; ; i++ {
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err == nil {
			return f, nil
		}
		if !os.IsNotExist(err) || i == 100 {
			return nil, err
		}
		if i == 0 {
			log.Info("waiting for transport", "path", path)
		}
		sleep()
	}
}
