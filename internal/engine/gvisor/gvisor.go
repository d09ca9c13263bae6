// Package gvisor runs sandboxes under gVisor (runsc, systrap platform).
//
// # Layout
//
// Everything lives under Config.Root:
//
//	Root/runsc/               runsc --root: runsc's own container state
//	Root/sandboxes/<id>/      one sandbox: OCI bundle (config.json), in.fifo,
//	                          out.fifo, console.log, debug/ (with Debug), and
//	                          the (unlinked) overlay file store of the
//	                          sandbox's writable rootfs layer; "container"
//	                          names its runsc container when that is not <id>
//	Root/pool/<cid>/          a pre-created container of the fork pool
//
// A sandbox made by Precreate (precreate.go) has its ordinary dir and
// container ID; it only waits for its Restore.
//
// Sandboxes of daemons with different roots never see each other: runsc's
// state and the cgroups ("/k7-<hash of Root>/<id>") are keyed by the root.
//
// # Rootfs
//
// CreateRequest.Rootfs is shared by every sandbox of an image and is never
// written. The rootfs is mounted through runsc's overlay with its upper layer
// in a memory-backed file store placed in the sandbox dir
// (--overlay2=root:dir=<sandbox dir>). "root:self" was measured to create
// ".gvisor.filestore.<id>" inside the shared image rootfs itself (removed by
// delete, but left behind when a sandbox is killed, and impossible on a
// read-only image store), so it is not used. The file store is part of a
// checkpoint: a fork carries the writable layer.
//
// # Agent transport
//
// The k7-agent is PID 1 (bind-mounted read-only from Config.AgentPath to
// /dev/.k7-agent, never copied into the image) and speaks over its stdin and
// stdout. Those are two named FIFOs in the sandbox dir, so that the channel
// outlives the daemon:
//
//   - Create opens in.fifo and out.fifo O_RDWR and hands them to runsc as its
//     stdin/stdout (console.log as stderr). runsc passes them to the sandbox
//     process (runsc-sandbox), which keeps both open read-write for the
//     sandbox's life (verified in /proc/<pid>/fd: fds 253/254 -> the FIFOs).
//     The engine closes its own copies once runsc returns.
//   - Because the sandbox holds a writer of in.fifo, the agent never reads
//     EOF when the daemon goes away; because it holds a reader of out.fifo,
//     its writes buffer (64 KiB pipe buffer, then block) instead of failing.
//   - Connect opens in.fifo O_WRONLY and out.fifo O_RDONLY, non-blocking
//     (both have a peer: the sandbox), and uses them through Go's poller. A
//     restarted daemon calls Connect again; the agent client's handshake
//     discards stale bytes.
//   - When the sandbox dies, no writer of out.fifo is left: the daemon's
//     reader gets EOF at once (verified with kill -9 of runsc-sandbox).
//
// A restored sandbox is attached to the stdio of the runsc command that
// creates its sandbox process: with "runsc create" then "runsc restore", that
// is create's stdio (verified: restore's stdio is ignored then), so Restore
// gives the child's fresh FIFOs to create. That is also what makes the fork
// pool possible (pool.go): containers pre-created with their own FIFOs, to
// which a later "runsc restore" only adds the captured state.
//
// The agent path is under /dev (a tmpfs of the sandbox) because runsc
// creates missing mount points of bind mounts in the host rootfs itself
// (measured: a /.k7 dir appeared in the shared image). The same holds for
// the spec's other mount points (/proc, /sys, /dev, /tmp): images are
// expected to have them, as OCI images do.
//
// # Status
//
// "runsc state" keeps reporting "running" with a stale pid after the sandbox
// process was killed; Status checks that the pid is alive and reports
// engine.StateDead otherwise.
package gvisor

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/k7-dev/k7/internal/engine"
	"github.com/k7-dev/k7/internal/errdefs"
)

var (
	_ engine.Engine = (*Engine)(nil)
	_ engine.Forker = (*Engine)(nil)
)

// Name is the engine's registered name.
const Name = "gvisor"

// agentDest is where the agent binary is mounted inside every sandbox.
const agentDest = "/dev/.k7-agent"

// Config configures the engine.
type Config struct {
	// Runsc is the path of the runsc binary. Required.
	Runsc string
	// Root is the engine's state directory (e.g. <state-dir>/engines/gvisor),
	// created if missing. Required.
	Root string
	// AgentPath is the host path of the static k7-agent binary. Required.
	AgentPath string
	// Platform is runsc's platform; default "systrap".
	Platform string
	// Debug makes runsc write debug logs to <sandbox dir>/debug/.
	Debug bool
	// ForkPool is how many containers are pre-created ("runsc create")
	// per rootfs and resources after a Restore, so that the next Restore of
	// that kind skips the create step. 0 means 1; negative disables the pool.
	ForkPool int
	// Log receives the engine's log; nil discards.
	Log *slog.Logger

	// initArgs replaces the agent as PID 1 (tests of the runsc mechanics).
	initArgs []string
}

// Engine is the gVisor engine. It is safe for concurrent use on different
// IDs; the daemon serializes operations on one ID.
type Engine struct {
	cfg       Config
	log       *slog.Logger
	runscRoot string
	sbxRoot   string
	cgParent  string // "/k7-<hash of root>"
	version   string
	pool      pool
	pre       precreated
}

// New checks that runsc runs and returns the engine. It returns an error
// wrapping errdefs.ErrUnavailable when runsc or the agent is missing or
// unusable.
func New(cfg Config) (*Engine, error) {
	if cfg.Platform == "" {
		cfg.Platform = "systrap"
	}
	if cfg.ForkPool == 0 {
		cfg.ForkPool = 1
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Root == "" {
		return nil, fmt.Errorf("gvisor engine: Config.Root is empty: %w", errdefs.ErrInvalidArgument)
	}
	root, err := filepath.Abs(cfg.Root)
	if err != nil {
		return nil, fmt.Errorf("gvisor engine: resolving root: %w", err)
	}
	cfg.Root = root
	if cfg.Runsc == "" {
		return nil, fmt.Errorf("gvisor engine: no runsc binary configured: %w", errdefs.ErrUnavailable)
	}
	if cfg.initArgs == nil {
		if cfg.AgentPath == "" {
			return nil, fmt.Errorf("gvisor engine: no k7-agent binary configured: %w", errdefs.ErrUnavailable)
		}
		if fi, err := os.Stat(cfg.AgentPath); err != nil || !fi.Mode().IsRegular() {
			return nil, fmt.Errorf("gvisor engine: k7-agent %q is not a file: %w", cfg.AgentPath, errdefs.ErrUnavailable)
		}
	}
	out, err := exec.Command(cfg.Runsc, "--version").CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("gvisor engine: running %s --version: %v: %s: %w", cfg.Runsc, err, bytes.TrimSpace(out), errdefs.ErrUnavailable) //nolint:errorlint // classified by the sentinel alone: err's own class must not leak
	}
	sum, err := fileSHA256(cfg.Runsc)
	if err != nil {
		return nil, fmt.Errorf("gvisor engine: hashing runsc: %v: %w", err, errdefs.ErrUnavailable) //nolint:errorlint // classified by the sentinel alone: err's own class must not leak
	}
	e := &Engine{
		cfg:       cfg,
		log:       cfg.Log.With("engine", Name),
		runscRoot: filepath.Join(root, "runsc"),
		sbxRoot:   filepath.Join(root, "sandboxes"),
		version:   runscVersion(out) + "+sha256." + sum[:12],
		pool:      pool{free: map[poolKey][]poolEntry{}, filling: map[poolKey]int{}},
		pre:       precreated{sbxs: map[string]precreatedEntry{}},
	}
	h := sha256.Sum256([]byte(root))
	e.cgParent = "/k7-" + hex.EncodeToString(h[:])[:12]
	for _, d := range []string{e.runscRoot, e.sbxRoot, filepath.Join(root, "pool")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("gvisor engine: creating %s: %w", d, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	e.clearStalePool(ctx)
	return e, nil
}

func runscVersion(out []byte) string {
	// "runsc version VERSION_MISSING\nspec: 1.2.1"
	line, _, _ := strings.Cut(string(out), "\n")
	return "runsc-" + strings.TrimSpace(strings.TrimPrefix(line, "runsc version "))
}

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// Name returns "gvisor".
func (e *Engine) Name() string { return Name }

// Capabilities reports fork support.
func (e *Engine) Capabilities() engine.Capabilities {
	return engine.Capabilities{Fork: true, Network: true}
}

// Version identifies the runsc build (its version string and a sha256 prefix
// of the binary): checkpoints restore only into the same version.
func (e *Engine) Version() string { return e.version }

var idRE = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,127}$`)

func checkID(id string) error {
	if !idRE.MatchString(id) || isPoolID(id) {
		return fmt.Errorf("sandbox id %q: %w", id, errdefs.ErrInvalidArgument)
	}
	return nil
}

func (e *Engine) dir(id string) string { return filepath.Join(e.sbxRoot, id) }

func (e *Engine) cgroupsPath(id string) string { return e.cgParent + "/" + id }

// runsc runs one runsc command with the global flags and returns its
// stdout. Errors carry runsc's stderr and map "does not exist" to
// errdefs.ErrNotFound.
func (e *Engine) runsc(ctx context.Context, dir string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, e.cfg.Runsc, append(e.globalFlags(dir), args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), runscError(args[0], err, stderr.Bytes())
	}
	return stdout.Bytes(), nil
}

func runscError(op string, err error, stderr []byte) error {
	msg := strings.TrimSpace(string(stderr))
	if len(msg) > 2000 {
		msg = "..." + msg[len(msg)-2000:]
	}
	if strings.Contains(msg, "loading container") &&
		(strings.Contains(msg, "does not exist") || strings.Contains(msg, "no such file") || strings.Contains(msg, "not found")) {
		return fmt.Errorf("runsc %s: %s: %w", op, msg, errdefs.ErrNotFound)
	}
	if msg == "" {
		return fmt.Errorf("runsc %s: %w", op, err)
	}
	return fmt.Errorf("runsc %s: %v: %s", op, err, msg) //nolint:errorlint // with stderr, the message is the error; the exit status is not matched on
}

// globalFlags are the flags before runsc's subcommand. The overlay's file
// store and the debug logs go into dir, the sandbox's own dir ("" for
// commands that start no sandbox). A sandbox whose dir holds netnsFile
// runs with --network=sandbox in that namespace (named in its spec).
func (e *Engine) globalFlags(dir string) []string {
	network := "--network=none"
	if dir != "" {
		if _, err := os.Stat(filepath.Join(dir, netnsFile)); err == nil {
			network = "--network=sandbox"
		}
	}
	f := []string{
		"--root=" + e.runscRoot,
		"--platform=" + e.cfg.Platform,
		network,
	}
	if dir != "" {
		f = append(f, "--overlay2=root:dir="+dir)
		if e.cfg.Debug {
			f = append(f, "--debug", "--debug-log="+filepath.Join(dir, "debug")+"/")
		}
	}
	return f
}

// step runs one named, timed step of a multi-step operation.
func step(log *slog.Logger, name string, fn func() error) error {
	start := time.Now()
	err := fn()
	if err != nil {
		log.Warn("step failed", "step", name, "took", time.Since(start), "err", err)
		return fmt.Errorf("%s: %w", name, err)
	}
	log.Debug("step done", "step", name, "took", time.Since(start))
	return nil
}

// cleanup is a stack of undo functions run in reverse on failure.
type cleanup struct {
	fns []func(context.Context)
}

func (c *cleanup) add(fn func(context.Context)) { c.fns = append(c.fns, fn) }

// release forgets the stack (success).
func (c *cleanup) release() { c.fns = nil }

// clean runs the stack on a context detached from ctx's cancellation.
func (c *cleanup) clean(ctx context.Context) {
	if len(c.fns) == 0 {
		return
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	for i := len(c.fns) - 1; i >= 0; i-- {
		c.fns[i](cctx)
	}
	c.fns = nil
}

func isNotExist(err error) bool { return errors.Is(err, os.ErrNotExist) }
