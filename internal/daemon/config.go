package daemon

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/k7-dev/k7/internal/errdefs"
)

// Config is everything k7d is configured with. DefaultConfig returns the
// defaults; flags override them; Validate checks the result.
type Config struct {
	// StateDir holds the database, engine roots, snapshots and images.
	// Default /var/lib/k7.
	StateDir string
	// Socket is the path of the API's unix socket (mode 0600, parent
	// created). Default /run/k7/k7.sock.
	Socket string
	// TCP is an optional TCP listen address (host:port) for the API; it
	// requires a Token. Default none.
	TCP string
	// TokenFile holds the bearer token for TCP clients. Default none; the
	// token may also come from $K7_TOKEN.
	TokenFile string
	// Token is the bearer token itself (from TokenFile or $K7_TOKEN).
	Token string
	// TLSCert and TLSKey turn on TLS for TCP. Default none (plain HTTP,
	// acceptable on loopback only).
	TLSCert, TLSKey string
	// DefaultEngine is used when a request names none. Default "gvisor",
	// or the first of Engines when gvisor is not enabled.
	DefaultEngine string
	// Engines are the engines to enable, by name. Default ["gvisor", "qemu"]
	// (an engine the host cannot run is reported unavailable); "fake" only
	// when asked.
	Engines []string
	// Runsc is the runsc binary. Default: $K7_RUNSC, else runsc next to
	// the k7d executable, else bin/runsc of a source tree above it, else
	// PATH.
	Runsc string
	// Platform is the runsc platform. Default "systrap".
	Platform string
	// Agent is the k7-agent binary. Default: k7-agent next to the k7d
	// executable, else PATH.
	Agent string
	// LogLevel is debug, info, warn or error. Default info.
	LogLevel string
	// Cleanup makes k7d remove everything it owns under StateDir and exit.
	Cleanup bool
	// ReconcileInterval is how often sandbox states are compared with the
	// engines'. Default 2s.
	ReconcileInterval time.Duration
	// ExecOutputLimit caps the stdout and stderr each kept by a
	// non-streaming exec, in bytes. Default 16 MiB.
	ExecOutputLimit int64
	// Subnet is the IPv4 pool of the sandboxes' host-facing addresses (a
	// masked prefix, /8 to /29). Default 10.77.0.0/16 for the default state
	// dir, else a free /24 of 10.80.0.0/12 chosen by a hash of the state dir
	// (so that daemons side by side never share one).
	Subnet string
	// OpTimeout bounds one engine operation run on the daemon's behalf
	// (create, delete, cleanup). Default 2m.
	OpTimeout time.Duration
}

// DefaultConfig returns the defaults documented on Config.
func DefaultConfig() Config {
	return Config{
		StateDir:          "/var/lib/k7",
		Socket:            "/run/k7/k7.sock",
		DefaultEngine:     "gvisor",
		Engines:           []string{"gvisor", "qemu"},
		Platform:          "systrap",
		LogLevel:          "info",
		ReconcileInterval: 2 * time.Second,
		ExecOutputLimit:   16 << 20,
		OpTimeout:         2 * time.Minute,
	}
}

// Validate checks c and reports every problem at once, wrapped in
// errdefs.ErrInvalidArgument.
func (c *Config) Validate() error {
	var errs []error
	if !filepath.IsAbs(c.StateDir) {
		errs = append(errs, fmt.Errorf("--state-dir %q must be an absolute path", c.StateDir))
	}
	if c.Socket == "" && c.TCP == "" {
		errs = append(errs, errors.New("one of --socket or --tcp is required"))
	}
	if c.Socket != "" && !filepath.IsAbs(c.Socket) {
		errs = append(errs, fmt.Errorf("--socket %q must be an absolute path", c.Socket))
	}
	if c.TCP != "" && c.Token == "" {
		errs = append(errs, errors.New("--tcp requires a token: --token-file or $K7_TOKEN"))
	}
	if (c.TLSCert == "") != (c.TLSKey == "") {
		errs = append(errs, errors.New("--tls-cert and --tls-key go together"))
	}
	if len(c.Engines) == 0 {
		errs = append(errs, errors.New("--engines lists no engine"))
	}
	for _, e := range c.Engines {
		if !slices.ContainsFunc(engineTable, func(r engineReg) bool { return r.name == e }) {
			errs = append(errs, fmt.Errorf("unknown engine %q (known: %s)", e, strings.Join(engineNames(), ", ")))
		}
	}
	if !slices.Contains(c.Engines, c.DefaultEngine) {
		errs = append(errs, fmt.Errorf("--default-engine %q is not among --engines %s", c.DefaultEngine, strings.Join(c.Engines, ",")))
	}
	if _, err := parseLevel(c.LogLevel); err != nil {
		errs = append(errs, err)
	}
	if c.ReconcileInterval <= 0 || c.ExecOutputLimit <= 0 || c.OpTimeout <= 0 {
		errs = append(errs, errors.New("intervals, timeouts and limits must be positive"))
	}
	if c.Subnet != "" {
		if p, err := netip.ParsePrefix(c.Subnet); err != nil || !p.Addr().Is4() || p.Masked() != p || p.Bits() < 8 || p.Bits() > 29 {
			errs = append(errs, fmt.Errorf("--subnet %q: want a masked IPv4 prefix /8 to /29, like 10.77.0.0/16", c.Subnet))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("invalid configuration: %w: %w", errdefs.ErrInvalidArgument, err)
	}
	return nil
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("--log-level %q: want debug, info, warn or error", s)
	}
	return l, nil
}

// findRunsc resolves the default runsc binary (see Config.Runsc).
func findRunsc() string {
	if p := os.Getenv("K7_RUNSC"); p != "" {
		return p
	}
	if exe, err := os.Executable(); err == nil {
		dir := filepath.Dir(exe)
		if p := filepath.Join(dir, "runsc"); isExec(p) {
			return p
		}
		// A source tree: <repo>/bin/k7d or <repo>/somewhere/k7d with <repo>/bin/runsc.
		for d := dir; d != "/" && d != "."; d = filepath.Dir(d) {
			if p := filepath.Join(d, "bin", "runsc"); isExec(p) {
				if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
					return p
				}
			}
		}
	}
	if p, err := exec.LookPath("runsc"); err == nil {
		return p
	}
	return ""
}

// FindAgent resolves the default k7-agent binary (see Config.Agent): next to
// this executable, else in PATH; "" when there is none.
func FindAgent() string {
	if exe, err := os.Executable(); err == nil {
		if p := filepath.Join(filepath.Dir(exe), "k7-agent"); isExec(p) {
			return p
		}
	}
	if p, err := exec.LookPath("k7-agent"); err == nil {
		return p
	}
	return ""
}

func isExec(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}
