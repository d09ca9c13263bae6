// Package daemon is k7d: it owns every sandbox on the node, keeps their
// records in the store, drives the engines, holds one agent connection per
// running sandbox and reconciles its records with what the engines report.
//
// Main parses flags and runs the daemon; Run serves the HTTP API
// (internal/server) on a unix socket and optionally TCP until its context
// ends; New builds a Daemon without serving, for tests and --cleanup.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	v1 "github.com/k7-dev/k7/api/v1"
	"github.com/k7-dev/k7/internal/agent/client"
	"github.com/k7-dev/k7/internal/engine"
	"github.com/k7-dev/k7/internal/errdefs"
	"github.com/k7-dev/k7/internal/metrics"
	"github.com/k7-dev/k7/internal/store"
	"github.com/k7-dev/k7/internal/version"
)

// ImageStore is what the daemon needs of the image store (internal/image).
type ImageStore interface {
	Pull(ctx context.Context, ref string, insecure bool, progress func(v1.PullProgress)) (*v1.Image, error)
	Import(ctx context.Context, r io.Reader, name string, progress func(v1.PullProgress)) (*v1.Image, error)
	Get(ctx context.Context, ref string) (*v1.Image, error)
	// Rootfs returns the image and the host path of its unpacked rootfs.
	Rootfs(ctx context.Context, ref string) (*v1.Image, string, error)
	List(ctx context.Context) ([]v1.Image, error)
	Remove(ctx context.Context, ref string) error
}

// Agent is the daemon's side of one sandbox's agent connection; the
// production implementation is *client.Client.
type Agent interface {
	Handshake(ctx context.Context) (*client.Hello, error)
	Configure(ctx context.Context, hostname string) error
	Exec(ctx context.Context, req *client.ExecRequest, stdio client.Stdio) (client.Process, error)
	PutFile(ctx context.Context, path string, mode uint32, r io.Reader) error
	GetFile(ctx context.Context, path string, w io.Writer) error
	Ping(ctx context.Context) (time.Duration, error)
	Done() <-chan struct{}
	Close() error
}

// Options are the parts of a daemon that are not configuration.
type Options struct {
	// Log receives the daemon's logs. Default: discard.
	Log *slog.Logger
	// Engines, if set, replaces the engine table (tests).
	Engines []engine.Engine
	// Images, if set, replaces the image store under StateDir/images.
	Images ImageStore
	// NewAgent wraps an engine's agent stream. Default: client.New.
	NewAgent func(io.ReadWriteCloser) Agent
	// Network, if set, replaces the network manager (tests).
	Network Networks
}

// Daemon is a running k7d without its HTTP server. Its methods are safe for
// concurrent use; operations on one sandbox are serialized.
type Daemon struct {
	cfg      Config
	log      *slog.Logger
	store    *store.Store
	images   ImageStore
	engines  map[string]engine.Engine
	info     []v1.EngineInfo
	newAgent func(io.ReadWriteCloser) Agent
	metrics  *metrics.Metrics
	lock     *os.File

	ctx    context.Context // the daemon's lifetime; sandbox work runs on it
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu  sync.Mutex
	sbs map[string]*sandbox

	spares spares

	netMu   sync.Mutex
	net     Networks        // nil until first use (networks)
	netErr  error           // why networking is unavailable
	netInfo *v1.NetworkInfo // for Info
}

// sandbox is the in-memory side of one sandbox record.
type sandbox struct {
	id   string
	lock chan struct{} // one slot: serializes operations on the sandbox

	mu    sync.Mutex // guards agent
	agent Agent      // nil when not connected
}

// lockWait is how long an operation waits for another on the same sandbox
// before failing with errdefs.ErrConflict.
const lockWait = 2 * time.Minute

// New opens the state under cfg.StateDir (taking its lock), the store, the
// engines and the image store, reconciles the records with the engines and
// starts the background reconciler. The caller must Close the daemon.
func New(ctx context.Context, cfg Config, opts Options) (*Daemon, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := opts.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("creating state dir: %w", err)
	}
	lock, err := lockStateDir(cfg.StateDir)
	if err != nil {
		return nil, err
	}
	d := &Daemon{
		cfg:      cfg,
		log:      log,
		lock:     lock,
		images:   opts.Images,
		engines:  map[string]engine.Engine{},
		newAgent: opts.NewAgent,
		sbs:      map[string]*sandbox{},
		spares:   spares{ready: map[string]*spare{}, filling: map[string]*spareFill{}},
	}
	d.ctx, d.cancel = context.WithCancel(context.WithoutCancel(ctx))
	ok := false
	defer func() {
		if !ok {
			_ = d.Close()
		}
	}()
	if d.newAgent == nil {
		d.newAgent = func(rw io.ReadWriteCloser) Agent { return client.New(rw) }
	}
	d.metrics = metrics.New(d.stateCounts)
	if d.store, err = store.Open(filepath.Join(cfg.StateDir, "k7.db")); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(cfg.StateDir, "tmp"), 0o700); err != nil {
		return nil, err
	}
	// Captures of forks interrupted by a crash.
	if ents, _ := os.ReadDir(filepath.Join(cfg.StateDir, "tmp")); len(ents) > 0 {
		for _, e := range ents {
			os.RemoveAll(filepath.Join(cfg.StateDir, "tmp", e.Name()))
		}
	}
	// Snapshots whose capture was interrupted.
	if tmps, _ := filepath.Glob(filepath.Join(cfg.StateDir, "snapshots", ".tmp-*")); len(tmps) > 0 {
		for _, t := range tmps {
			os.RemoveAll(t)
		}
	}
	d.openEngines(opts.Engines)
	d.initNetwork(opts.Network)
	if d.images == nil {
		if d.images, err = openImageStore(filepath.Join(cfg.StateDir, "images"), log); err != nil {
			return nil, err
		}
	}
	d.recover(ctx)
	d.reconcileNetworks(ctx)
	d.wg.Add(1)
	go d.reconcileLoop()
	ok = true
	return d, nil
}

// lockStateDir takes the exclusive lock on <dir>/k7d.lock.
func lockStateDir(dir string) (*os.File, error) {
	p := filepath.Join(dir, "k7d.lock")
	f, err := os.OpenFile(p, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("another k7d is using state dir %s (lock %s is held): %w", dir, p, errdefs.ErrConflict)
		}
		return nil, fmt.Errorf("locking %s: %w", p, err)
	}
	_ = f.Truncate(0)
	fmt.Fprintf(f, "%d\n", os.Getpid())
	return f, nil
}

func (d *Daemon) openEngines(given []engine.Engine) {
	if given != nil {
		for _, e := range given {
			d.engines[e.Name()] = e
			d.info = append(d.info, engineInfo(e, ""))
		}
		return
	}
	for _, reg := range engineTable {
		enabled := false
		for _, n := range d.cfg.Engines {
			enabled = enabled || n == reg.name
		}
		root := engineRoot(d.cfg.StateDir, reg.name)
		if !enabled && d.cfg.Cleanup {
			// Cleanup deletes the sandboxes of every engine that has
			// left any, enabled or not.
			enabled = dirExists(root)
		}
		if !enabled {
			continue
		}
		e, err := reg.open(&d.cfg, root, d.log.With("engine", reg.name))
		if err != nil {
			d.log.Warn("engine unavailable", "engine", reg.name, "err", err)
			d.info = append(d.info, v1.EngineInfo{Name: reg.name, Reason: err.Error()})
			continue
		}
		d.engines[reg.name] = e
		d.info = append(d.info, engineInfo(e, "root "+root))
	}
}

func engineInfo(e engine.Engine, reason string) v1.EngineInfo {
	in := v1.EngineInfo{Name: e.Name(), Available: true, Reason: reason}
	if a, ok := e.(interface{ Accel() (name, reason string) }); ok {
		name, why := a.Accel()
		in.Reason = strings.TrimPrefix(fmt.Sprintf("%s; accel %s: %s", in.Reason, name, why), "; ")
	}
	if v, ok := e.(interface{ Version() string }); ok {
		in.Version = v.Version()
	}
	if _, ok := e.(engine.Forker); ok && e.Capabilities().Fork {
		in.Features = append(in.Features, "fork", "snapshot")
	}
	return in
}

// engine returns the enabled, available engine name.
func (d *Daemon) engine(name string) (engine.Engine, error) {
	if e, ok := d.engines[name]; ok {
		return e, nil
	}
	for _, in := range d.info {
		if in.Name == name {
			return nil, fmt.Errorf("engine %q is unavailable: %s: %w", name, in.Reason, errdefs.ErrUnavailable)
		}
	}
	return nil, fmt.Errorf("engine %q is not enabled on this daemon: %w", name, errdefs.ErrInvalidArgument)
}

// Close stops the background work, deletes the spares (spare.go), closes
// every agent connection and the store and releases the state dir.
// Sandboxes keep running. Close may be called once.
func (d *Daemon) Close() error {
	d.closeSpares()
	d.cancel()
	d.wg.Wait()
	d.mu.Lock()
	for _, sb := range d.sbs {
		sb.setAgent(nil)
	}
	d.mu.Unlock()
	var err error
	if d.store != nil {
		err = d.store.Close()
	}
	if c, ok := d.images.(io.Closer); ok {
		c.Close()
	}
	if n := d.openedNetworks(); n != nil {
		_ = n.Close() // stops the published-port proxies; namespaces stay
	}
	for _, e := range d.engines {
		if c, ok := e.(io.Closer); ok {
			if cerr := c.Close(); cerr != nil {
				d.log.Warn("closing engine", "engine", e.Name(), "err", cerr)
			}
		}
	}
	if d.lock != nil {
		d.lock.Close()
	}
	return err
}

// Metrics returns the daemon's metrics.
func (d *Daemon) Metrics() *metrics.Metrics { return d.metrics }

// Info describes the daemon and its engines.
func (d *Daemon) Info(ctx context.Context) *v1.Info {
	return &v1.Info{
		Version:       version.Version,
		DefaultEngine: d.cfg.DefaultEngine,
		Engines:       append([]v1.EngineInfo(nil), d.info...),
		StateDir:      d.cfg.StateDir,
		Network:       d.networkInfo(),
	}
}

func (d *Daemon) stateCounts() map[string]int {
	m := map[string]int{}
	recs, _ := d.store.ListSandboxes()
	for _, r := range recs {
		m[r.State]++
	}
	return m
}

// entry returns the in-memory sandbox for id, creating it.
func (d *Daemon) entry(id string) *sandbox {
	d.mu.Lock()
	defer d.mu.Unlock()
	sb := d.sbs[id]
	if sb == nil {
		sb = &sandbox{id: id, lock: make(chan struct{}, 1)}
		d.sbs[id] = sb
	}
	return sb
}

func (d *Daemon) forget(id string) {
	d.mu.Lock()
	delete(d.sbs, id)
	d.mu.Unlock()
}

// acquire takes sb's operation lock, waiting at most lockWait.
func (sb *sandbox) acquire(ctx context.Context) error {
	select {
	case sb.lock <- struct{}{}:
		return nil
	default:
	}
	t := time.NewTimer(lockWait)
	defer t.Stop()
	select {
	case sb.lock <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return fmt.Errorf("sandbox %s is busy with another operation: %w", sb.id, errdefs.ErrConflict)
	}
}

func (sb *sandbox) tryAcquire() bool {
	select {
	case sb.lock <- struct{}{}:
		return true
	default:
		return false
	}
}

func (sb *sandbox) release() { <-sb.lock }

// getAgent returns the connected agent or nil.
func (sb *sandbox) getAgent() Agent {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	return sb.agent
}

// setAgent replaces the agent, closing the previous one.
func (sb *sandbox) setAgent(a Agent) {
	sb.mu.Lock()
	old := sb.agent
	sb.agent = a
	sb.mu.Unlock()
	if old != nil && old != a {
		_ = old.Close()
	}
}

// dropAgent forgets a if it is still the current agent and reports whether
// it was.
func (sb *sandbox) dropAgent(a Agent) bool {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.agent != a {
		return false
	}
	sb.agent = nil
	return true
}

// lockSandbox resolves ref (ID, name or unique ID prefix) and takes the
// sandbox's operation lock. The caller calls unlock.
func (d *Daemon) lockSandbox(ctx context.Context, ref string) (sb *sandbox, rec *store.Sandbox, unlock func(), err error) {
	rec, err = d.store.FindSandbox(ref)
	if err != nil {
		return nil, nil, nil, err
	}
	sb = d.entry(rec.ID)
	if err := sb.acquire(ctx); err != nil {
		return nil, nil, nil, err
	}
	// Re-read: the record may have changed or gone while we waited.
	rec, err = d.store.GetSandbox(rec.ID)
	if err != nil {
		sb.release()
		return nil, nil, nil, fmt.Errorf("sandbox %q not found: %w", ref, errdefs.ErrNotFound)
	}
	return sb, rec, sb.release, nil
}

// opContext is the context of engine work done on the daemon's behalf: it
// outlives the request that asked for it and ends with the daemon.
func (d *Daemon) opContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(d.ctx, d.cfg.OpTimeout)
}

// cleanupContext is the context of undoing half-done work: it survives the
// daemon's shutdown for a short while.
func (d *Daemon) cleanupContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(d.ctx), 30*time.Second)
}

// cleanup is a stack of undo steps run in reverse order unless released.
type cleanup struct {
	log   *slog.Logger
	steps []cleanupStep
}

type cleanupStep struct {
	name string
	fn   func(context.Context) error
}

func (c *cleanup) add(name string, fn func(context.Context) error) {
	c.steps = append(c.steps, cleanupStep{name, fn})
}

// release drops every step: the work is kept.
func (c *cleanup) release() { c.steps = nil }

// run undoes the steps, last first, on ctx.
func (c *cleanup) run(ctx context.Context) {
	for i := len(c.steps) - 1; i >= 0; i-- {
		s := c.steps[i]
		if err := s.fn(ctx); err != nil {
			c.log.Warn("cleanup step failed", "step", s.name, "err", err)
		}
	}
	c.steps = nil
}

// step runs one named, logged and timed step of a multi-step operation.
func step(ctx context.Context, log *slog.Logger, name string, fn func(context.Context) error) error {
	start := time.Now()
	err := fn(ctx)
	log.Debug("step", "step", name, "took", time.Since(start), "err", err)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}
