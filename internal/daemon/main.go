package daemon

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/k7-dev/k7/internal/errdefs"
	"github.com/k7-dev/k7/internal/server"
)

// Main runs k7d with command-line args (without the program name) and
// returns the process exit code: 0 after a graceful shutdown on SIGTERM or
// SIGINT, 2 for bad flags, 1 for any other failure.
func Main(args []string) int {
	cfg, err := ParseFlags(args, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "k7d:", err)
		return 2
	}
	level, _ := parseLevel(cfg.LogLevel)
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := Run(ctx, cfg, Options{Log: log}); err != nil {
		log.Error("k7d failed", "err", err)
		return 1
	}
	return 0
}

// ParseFlags builds a Config from the defaults, the environment ($K7_TOKEN,
// $K7_RUNSC) and args, and validates it.
func ParseFlags(args []string, stderr io.Writer) (Config, error) {
	cfg := DefaultConfig()
	fs := flag.NewFlagSet("k7d", flag.ContinueOnError)
	fs.SetOutput(stderr)
	engines := strings.Join(cfg.Engines, ",")
	fs.StringVar(&cfg.StateDir, "state-dir", cfg.StateDir, "directory of the daemon's state (database, sandboxes, snapshots, images)")
	fs.StringVar(&cfg.Socket, "socket", cfg.Socket, "unix socket of the API (mode 0600)")
	fs.StringVar(&cfg.TCP, "tcp", "", "also serve the API on this TCP address (needs --token-file or $K7_TOKEN)")
	fs.StringVar(&cfg.TokenFile, "token-file", "", "file with the bearer token TCP clients must send")
	fs.StringVar(&cfg.TLSCert, "tls-cert", "", "TLS certificate for --tcp")
	fs.StringVar(&cfg.TLSKey, "tls-key", "", "TLS key for --tcp")
	fs.StringVar(&cfg.DefaultEngine, "default-engine", cfg.DefaultEngine, "engine of sandboxes whose request names none")
	fs.StringVar(&engines, "engines", engines, "comma-separated engines to enable (gvisor, qemu, fake)")
	fs.StringVar(&cfg.Runsc, "runsc", "", "runsc binary (default $K7_RUNSC, next to k7d, <tree>/bin/runsc, or PATH)")
	fs.StringVar(&cfg.Platform, "platform", cfg.Platform, "runsc platform")
	fs.StringVar(&cfg.Agent, "agent", "", "k7-agent binary (default next to k7d, or PATH)")
	fs.StringVar(&cfg.LogLevel, "log-level", cfg.LogLevel, "debug, info, warn or error")
	fs.StringVar(&cfg.Subnet, "subnet", "", "IPv4 pool of the sandboxes' host-facing addresses (default 10.77.0.0/16 for the default --state-dir, else a free /24 of 10.80.0.0/12 derived from it)")
	fs.BoolVar(&cfg.Cleanup, "cleanup", false, "delete every sandbox, network and file this daemon owns under --state-dir, then exit")
	fs.DurationVar(&cfg.ReconcileInterval, "reconcile-interval", cfg.ReconcileInterval, "how often sandbox states are checked against the engines")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected arguments %q: %w", fs.Args(), errdefs.ErrInvalidArgument)
	}
	setFlags := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { setFlags[f.Name] = true })
	cfg.Engines = nil
	for _, e := range strings.Split(engines, ",") {
		if e = strings.TrimSpace(e); e != "" {
			cfg.Engines = append(cfg.Engines, e)
		}
	}
	if !setFlags["default-engine"] && len(cfg.Engines) > 0 && !contains(cfg.Engines, cfg.DefaultEngine) {
		cfg.DefaultEngine = cfg.Engines[0]
	}
	if cfg.Runsc == "" {
		cfg.Runsc = findRunsc()
	}
	if cfg.Agent == "" {
		cfg.Agent = FindAgent()
	}
	cfg.Token = os.Getenv("K7_TOKEN")
	if cfg.TokenFile != "" {
		b, err := os.ReadFile(cfg.TokenFile)
		if err != nil {
			return cfg, fmt.Errorf("reading token file: %w", err)
		}
		cfg.Token = strings.TrimSpace(string(b))
	}
	if cfg.StateDir != "" {
		if abs, err := filepath.Abs(cfg.StateDir); err == nil {
			cfg.StateDir = abs
		}
	}
	return cfg, cfg.Validate()
}

func contains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

// Run starts the daemon and serves the API until ctx ends, then shuts down
// gracefully: it stops accepting, closes the agent connections (sandboxes
// keep running), removes the socket and returns nil. With cfg.Cleanup it
// deletes everything the daemon owns and returns instead of serving.
func Run(ctx context.Context, cfg Config, opts Options) error {
	log := opts.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
		opts.Log = log
	}
	d, err := New(ctx, cfg, opts)
	if err != nil {
		return err
	}
	defer func() { _ = d.Close() }()
	if cfg.Cleanup {
		if err := d.CleanupAll(ctx); err != nil {
			return fmt.Errorf("cleaning up %s: %w", cfg.StateDir, err)
		}
		log.Info("cleanup done", "state_dir", cfg.StateDir)
		return nil
	}

	h := server.New(d, server.Options{Log: log, Metrics: d.Metrics(), ExecOutputLimit: cfg.ExecOutputLimit})
	var servers []*http.Server
	errc := make(chan error, 2)
	serve := func(srv *http.Server, l net.Listener, tlsOn bool) {
		servers = append(servers, srv)
		go func() {
			var err error
			if tlsOn {
				err = srv.ServeTLS(l, "", "")
			} else {
				err = srv.Serve(l)
			}
			if !errors.Is(err, http.ErrServerClosed) {
				errc <- err
			}
		}()
	}
	newServer := func(h http.Handler) *http.Server {
		return &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug)}
	}
	if cfg.Socket != "" {
		l, err := listenUnix(cfg.Socket)
		if err != nil {
			return err
		}
		defer os.Remove(cfg.Socket)
		serve(newServer(h), l, false)
		log.Info("serving", "socket", cfg.Socket)
	}
	if cfg.TCP != "" {
		l, err := net.Listen("tcp", cfg.TCP)
		if err != nil {
			return fmt.Errorf("listening on %s: %w", cfg.TCP, err)
		}
		srv := newServer(server.RequireToken(h, cfg.Token))
		tlsOn := cfg.TLSCert != ""
		if tlsOn {
			cert, err := tls.LoadX509KeyPair(cfg.TLSCert, cfg.TLSKey)
			if err != nil {
				l.Close()
				return fmt.Errorf("loading TLS key pair: %w", err)
			}
			srv.TLSConfig = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
		}
		serve(srv, l, tlsOn)
		log.Info("serving", "tcp", l.Addr().String(), "tls", tlsOn)
	}
	log.Info("k7d ready", "state_dir", cfg.StateDir, "engines", d.Info(ctx).Engines)

	select {
	case <-ctx.Done():
		log.Info("shutting down")
	case err = <-errc:
		log.Error("serving", "err", err)
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, srv := range servers {
		if srv.Shutdown(sctx) != nil {
			srv.Close() // long-lived streams (follow, exec) are cut
		}
	}
	return err
}

// listenUnix listens on path (mode 0600, parent created), replacing a stale
// socket but never one another daemon still serves.
func listenUnix(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("creating socket dir: %w", err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("%s exists and is not a socket: %w", path, errdefs.ErrConflict)
		}
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("socket %s is served by another k7d: %w", path, errdefs.ErrConflict)
		}
		os.Remove(path)
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}
