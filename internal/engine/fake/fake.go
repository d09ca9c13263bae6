// Package fake is an in-process engine for tests: no isolation at all.
//
// Each sandbox is a directory (Root/sandboxes/<id>/root) and an in-process
// k7-agent (agent.Options{Root: dir, NoInit: true}) served over pipes.
// Commands run on the host as the test process's children, with "/" mapped
// to the sandbox dir for working directories and file transfers only (no
// chroot: executables and absolute paths in commands are the host's). The
// sandbox dir starts with the image rootfs's top-level directories, empty.
//
// Connect may be called again after the previous stream was closed (the
// daemon-restart case): bytes the agent writes while nobody is connected
// wait for the next stream, like a FIFO's buffer. Pause stops the agent's
// commands with SIGSTOP (the agent itself keeps answering).
//
// Fork copies files only: Checkpoint copies the sandbox dir, Restore starts
// a new agent on a copy. Processes and memory are not carried.
//
// Sandboxes live as long as the process that made them; New removes the
// dirs an earlier process left under Root.
package fake

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/k7-dev/k7/internal/agent"
	"github.com/k7-dev/k7/internal/engine"
	"github.com/k7-dev/k7/internal/errdefs"
)

var (
	_ engine.Engine = (*Engine)(nil)
	_ engine.Forker = (*Engine)(nil)
)

// Name is the engine's registered name.
const Name = "fake"

// Version is the fake engine's version; captures restore only into it.
const Version = "fake-1"

const versionFile = "engine-version"

// Config configures the engine.
type Config struct {
	// Root is the engine's state directory, created if missing. Required.
	Root string
	// Log receives the engine's log; nil discards.
	Log *slog.Logger
}

// Engine is the fake engine. It is safe for concurrent use.
type Engine struct {
	root string
	log  *slog.Logger

	mu        sync.Mutex
	sandboxes map[string]*sandbox
}

// New returns a fake engine keeping its sandboxes under cfg.Root.
func New(cfg Config) (*Engine, error) {
	if cfg.Root == "" {
		return nil, fmt.Errorf("fake engine: Config.Root is empty: %w", errdefs.ErrInvalidArgument)
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	root := filepath.Join(cfg.Root, "sandboxes")
	// Sandboxes of an earlier process are gone with it.
	if err := os.RemoveAll(root); err != nil {
		return nil, fmt.Errorf("fake engine: clearing %s: %w", root, err)
	}
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, fmt.Errorf("fake engine: %w", err)
	}
	return &Engine{root: root, log: cfg.Log.With("engine", Name), sandboxes: map[string]*sandbox{}}, nil
}

// Name returns "fake".
func (e *Engine) Name() string { return Name }

// Capabilities reports fork support (files only).
func (e *Engine) Capabilities() engine.Capabilities { return engine.Capabilities{Fork: true} }

// Version returns Version.
func (e *Engine) Version() string { return Version }

var idRE = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,127}$`)

// sandbox is one running fake sandbox.
type sandbox struct {
	id, dir string
	srv     *agent.Server
	cancel  context.CancelFunc
	served  chan struct{} // closed when Serve returned
	console *os.File

	inR  *io.PipeReader // agent reads
	inW  *io.PipeWriter // connections write
	outR *io.PipeReader // pump reads
	outW *io.PipeWriter // agent writes

	mu      sync.Mutex
	cur     *conn
	changed chan struct{} // closed and replaced when cur changes
	paused  bool
	deleted bool
}

// Create starts an in-process agent over a fresh sandbox dir.
func (e *Engine) Create(ctx context.Context, req *engine.CreateRequest) error {
	return e.start(req, "")
}

func (e *Engine) start(req *engine.CreateRequest, from string) (err error) {
	if !idRE.MatchString(req.ID) {
		return fmt.Errorf("sandbox id %q: %w", req.ID, errdefs.ErrInvalidArgument)
	}
	if fi, err := os.Stat(req.Rootfs); err != nil || !fi.IsDir() {
		return fmt.Errorf("creating sandbox %q: rootfs %q is not a directory: %w", req.ID, req.Rootfs, errdefs.ErrInvalidArgument)
	}
	e.mu.Lock()
	if _, ok := e.sandboxes[req.ID]; ok {
		e.mu.Unlock()
		return fmt.Errorf("creating sandbox %q: %w", req.ID, errdefs.ErrAlreadyExists)
	}
	e.sandboxes[req.ID] = nil // reserved
	e.mu.Unlock()
	dir := filepath.Join(e.root, req.ID)
	defer func() {
		if err != nil {
			os.RemoveAll(dir)
			e.mu.Lock()
			delete(e.sandboxes, req.ID)
			e.mu.Unlock()
			err = fmt.Errorf("creating sandbox %q: %w", req.ID, err)
		}
	}()
	if err := os.Mkdir(dir, 0o700); err != nil {
		return err
	}
	root := filepath.Join(dir, "root")
	if from != "" {
		if err := os.CopyFS(root, os.DirFS(filepath.Join(from, "root"))); err != nil {
			return fmt.Errorf("copying capture: %w", err)
		}
	} else if err := skeleton(req.Rootfs, root); err != nil {
		return err
	}
	console, err := os.OpenFile(filepath.Join(dir, "console.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	env := append([]string(nil), req.Env...)
	if !hasPath(env) {
		env = append(env, "PATH="+agent.DefaultPath)
	}
	s := &sandbox{id: req.ID, dir: dir, console: console, served: make(chan struct{}), changed: make(chan struct{})}
	s.inR, s.inW = io.Pipe()
	s.outR, s.outW = io.Pipe()
	s.srv = agent.NewServer(agent.Options{
		Root: root, NoInit: true, Env: env, Console: console,
		Logger: slog.New(slog.NewTextHandler(console, nil)),
	})
	sctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	go func() {
		defer close(s.served)
		_ = s.srv.Serve(sctx, s.inR, s.outW)
	}()
	go s.pump()
	e.mu.Lock()
	e.sandboxes[req.ID] = s
	e.mu.Unlock()
	e.log.Info("sandbox created", "sandbox", req.ID)
	return nil
}

func hasPath(env []string) bool {
	for _, kv := range env {
		if strings.HasPrefix(kv, "PATH=") {
			return true
		}
	}
	return false
}

// skeleton makes dst with rootfs's top-level directories, empty.
func skeleton(rootfs, dst string) error {
	if err := os.MkdirAll(filepath.Join(dst, "tmp"), 0o755); err != nil {
		return err
	}
	ents, err := os.ReadDir(rootfs)
	if err != nil {
		return err
	}
	for _, d := range ents {
		if d.IsDir() {
			if err := os.MkdirAll(filepath.Join(dst, d.Name()), 0o755); err != nil {
				return err
			}
		}
	}
	return nil
}

// pump copies the agent's output to the current connection, waiting for
// one when there is none. When the agent's output ends, the current
// connection reads EOF.
func (s *sandbox) pump() {
	buf := make([]byte, 32<<10)
	for {
		n, err := s.outR.Read(buf)
		if n > 0 {
			s.deliver(buf[:n])
		}
		if err != nil {
			s.mu.Lock()
			if s.cur != nil {
				_ = s.cur.pw.Close()
			}
			s.mu.Unlock()
			return
		}
	}
}

func (s *sandbox) deliver(p []byte) {
	for {
		s.mu.Lock()
		c, changed, deleted := s.cur, s.changed, s.deleted
		s.mu.Unlock()
		if deleted {
			return
		}
		if c == nil {
			<-changed
			continue
		}
		if _, err := c.pw.Write(p); err == nil {
			return
		}
		// That connection was closed; what it did not read is dropped
		// (the next client's handshake resynchronizes).
		return
	}
}

// conn is one stream to a sandbox's agent.
type conn struct {
	s      *sandbox
	pr     *io.PipeReader
	pw     *io.PipeWriter
	mu     sync.Mutex
	closed bool
}

func (c *conn) Read(p []byte) (int, error) { return c.pr.Read(p) }

func (c *conn) Write(p []byte) (int, error) {
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return 0, io.ErrClosedPipe
	}
	return c.s.inW.Write(p)
}

func (c *conn) Close() error {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	_ = c.pr.Close()
	s := c.s
	s.mu.Lock()
	if s.cur == c {
		s.cur = nil
		close(s.changed)
		s.changed = make(chan struct{})
	}
	s.mu.Unlock()
	return nil
}

func (e *Engine) get(id string) (*sandbox, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := e.sandboxes[id]
	if s == nil {
		return nil, fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound)
	}
	return s, nil
}

// Connect returns a stream to the agent; an earlier stream is cut off.
func (e *Engine) Connect(ctx context.Context, id string) (io.ReadWriteCloser, error) {
	s, err := e.get(id)
	if err != nil {
		return nil, fmt.Errorf("connecting: %w", err)
	}
	pr, pw := io.Pipe()
	c := &conn{s: s, pr: pr, pw: pw}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.deleted {
		return nil, fmt.Errorf("connecting to sandbox %q: %w", id, errdefs.ErrNotFound)
	}
	if old := s.cur; old != nil {
		_ = old.pw.Close()
	}
	s.cur = c
	close(s.changed)
	s.changed = make(chan struct{})
	return c, nil
}

// Pause stops the sandbox's commands (SIGSTOP to their process groups).
func (e *Engine) Pause(ctx context.Context, id string) error {
	s, err := e.get(id)
	if err != nil {
		return fmt.Errorf("pausing: %w", err)
	}
	if err := s.srv.Freeze(); err != nil {
		return fmt.Errorf("pausing sandbox %q: %w", id, err)
	}
	s.mu.Lock()
	s.paused = true
	s.mu.Unlock()
	return nil
}

// Resume continues the sandbox's commands.
func (e *Engine) Resume(ctx context.Context, id string) error {
	s, err := e.get(id)
	if err != nil {
		return fmt.Errorf("resuming: %w", err)
	}
	if err := s.srv.Thaw(); err != nil {
		return fmt.Errorf("resuming sandbox %q: %w", id, err)
	}
	s.mu.Lock()
	s.paused = false
	s.mu.Unlock()
	return nil
}

// Status reports running or paused.
func (e *Engine) Status(ctx context.Context, id string) (engine.Status, error) {
	s, err := e.get(id)
	if err != nil {
		return engine.Status{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.paused {
		return engine.Status{State: engine.StatePaused, PID: os.Getpid()}, nil
	}
	return engine.Status{State: engine.StateRunning, PID: os.Getpid()}, nil
}

// Stats reports one process (the agent); the fake measures nothing.
func (e *Engine) Stats(ctx context.Context, id string) (engine.Stats, error) {
	if _, err := e.get(id); err != nil {
		return engine.Stats{}, fmt.Errorf("reading stats: %w", err)
	}
	return engine.Stats{PIDs: 1}, nil
}

// Logs opens the console log: the agent's log and detached output.
func (e *Engine) Logs(ctx context.Context, id string) (io.ReadCloser, error) {
	s, err := e.get(id)
	if err != nil {
		return nil, fmt.Errorf("opening log: %w", err)
	}
	return os.Open(filepath.Join(s.dir, "console.log"))
}

// Delete kills the sandbox's commands, stops its agent and removes its dir.
func (e *Engine) Delete(ctx context.Context, id string) error {
	e.mu.Lock()
	s, ok := e.sandboxes[id]
	if ok && s != nil {
		delete(e.sandboxes, id)
	}
	e.mu.Unlock()
	if s == nil {
		return nil
	}
	_ = s.srv.Thaw()
	_ = s.srv.KillAll()
	s.cancel()
	<-s.served
	s.mu.Lock()
	s.deleted = true
	close(s.changed)
	s.changed = make(chan struct{})
	s.mu.Unlock()
	_ = s.inR.Close()
	_ = s.inW.Close()
	_ = s.outW.Close() // the pump ends; the current stream reads EOF
	s.console.Close()
	if err := os.RemoveAll(s.dir); err != nil {
		return fmt.Errorf("deleting sandbox %q: %w", id, err)
	}
	e.log.Info("sandbox deleted", "sandbox", id)
	return nil
}

// List returns the IDs of the sandboxes, sorted.
func (e *Engine) List(ctx context.Context) ([]string, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	ids := make([]string, 0, len(e.sandboxes))
	for id, s := range e.sandboxes {
		if s != nil {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	return ids, nil
}

// Checkpoint copies the sandbox's files into req.Dir, its commands stopped
// meanwhile. Processes are not captured.
func (e *Engine) Checkpoint(ctx context.Context, req *engine.CheckpointRequest) (*engine.CheckpointResult, error) {
	s, err := e.get(req.ID)
	if err != nil {
		return nil, fmt.Errorf("checkpointing: %w", err)
	}
	if err := os.MkdirAll(req.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("checkpointing sandbox %q: %w", req.ID, err)
	}
	start := time.Now()
	_ = s.srv.Freeze()
	err = os.CopyFS(filepath.Join(req.Dir, "root"), os.DirFS(filepath.Join(s.dir, "root")))
	s.mu.Lock()
	if !s.paused {
		_ = s.srv.Thaw()
	}
	s.mu.Unlock()
	pause := time.Since(start)
	if err != nil {
		return nil, fmt.Errorf("checkpointing sandbox %q: %w", req.ID, err)
	}
	if err := os.WriteFile(filepath.Join(req.Dir, versionFile), []byte(Version+"\n"), 0o600); err != nil {
		return nil, fmt.Errorf("checkpointing sandbox %q: %w", req.ID, err)
	}
	var size int64
	_ = filepath.WalkDir(req.Dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				size += fi.Size()
			}
		}
		return nil
	})
	return &engine.CheckpointResult{SourcePause: max(pause, time.Nanosecond), SizeBytes: size, EngineVersion: Version}, nil
}

// Restore starts a new sandbox on a copy of a capture's files.
func (e *Engine) Restore(ctx context.Context, req *engine.RestoreRequest) error {
	b, err := os.ReadFile(filepath.Join(req.From, versionFile))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("restoring sandbox %q: capture has no %s: %w", req.ID, versionFile, errdefs.ErrFailedPrecondition)
		}
		return fmt.Errorf("restoring sandbox %q: %w", req.ID, err)
	}
	if v := strings.TrimSpace(string(b)); v != Version {
		return fmt.Errorf("restoring sandbox %q: capture made by engine version %q, this is %q: %w", req.ID, v, Version, errdefs.ErrFailedPrecondition)
	}
	return e.start(&req.CreateRequest, req.From)
}
