package daemon

// A stateful in-memory engine and agent for the daemon's tests, used until
// (and alongside) internal/engine/fake: the engine keeps sandboxes in a
// map, its Connect returns a connection the test agent runs commands over.

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/k7-dev/k7/internal/agent/client"
	"github.com/k7-dev/k7/internal/engine"
	"github.com/k7-dev/k7/internal/errdefs"
)

type testSandbox struct {
	id       string
	state    engine.State
	hostname string
	files    map[string][]byte
	netns    string
	conn     *testConn
	log      bytes.Buffer
}

type testEngine struct {
	name    string
	fork    bool
	network bool // reports Capabilities.Network

	mu  sync.Mutex
	sbs map[string]*testSandbox

	failCreate  error // next Create fails with this
	failRestore int   // the Nth Restore (1-based) fails
	restores    int
}

func newTestEngine(fork bool) *testEngine {
	return &testEngine{name: "fake", fork: fork, sbs: map[string]*testSandbox{}}
}

func (e *testEngine) Name() string { return e.name }
func (e *testEngine) Capabilities() engine.Capabilities {
	return engine.Capabilities{Fork: e.fork, Network: e.network}
}
func (e *testEngine) Version() string { return "test-1" }

func (e *testEngine) Create(ctx context.Context, req *engine.CreateRequest) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.failCreate; err != nil {
		e.failCreate = nil
		return err
	}
	if _, ok := e.sbs[req.ID]; ok {
		return fmt.Errorf("sandbox %s: %w", req.ID, errdefs.ErrAlreadyExists)
	}
	e.sbs[req.ID] = &testSandbox{id: req.ID, state: engine.StateRunning, hostname: req.Hostname, files: map[string][]byte{}, netns: req.Netns}
	return nil
}

func (e *testEngine) get(id string) (*testSandbox, error) {
	sb, ok := e.sbs[id]
	if !ok {
		return nil, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	return sb, nil
}

func (e *testEngine) Connect(ctx context.Context, id string) (io.ReadWriteCloser, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	sb, err := e.get(id)
	if err != nil {
		return nil, err
	}
	if sb.state != engine.StateRunning {
		return nil, fmt.Errorf("sandbox %s is %s: %w", id, sb.state, errdefs.ErrFailedPrecondition)
	}
	if sb.conn != nil {
		_ = sb.conn.Close()
	}
	sb.conn = &testConn{e: e, sb: sb, done: make(chan struct{})}
	return sb.conn, nil
}

func (e *testEngine) setState(id string, from, to engine.State) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	sb, err := e.get(id)
	if err != nil {
		return err
	}
	if sb.state != from {
		return fmt.Errorf("sandbox %s is %s: %w", id, sb.state, errdefs.ErrFailedPrecondition)
	}
	sb.state = to
	return nil
}

func (e *testEngine) Pause(ctx context.Context, id string) error {
	return e.setState(id, engine.StateRunning, engine.StatePaused)
}

func (e *testEngine) Resume(ctx context.Context, id string) error {
	return e.setState(id, engine.StatePaused, engine.StateRunning)
}

func (e *testEngine) Status(ctx context.Context, id string) (engine.Status, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	sb, err := e.get(id)
	if err != nil {
		return engine.Status{}, err
	}
	return engine.Status{State: sb.state}, nil
}

func (e *testEngine) Stats(ctx context.Context, id string) (engine.Stats, error) {
	return engine.Stats{MemoryBytes: 1 << 20, PIDs: 1}, nil
}

func (e *testEngine) Logs(ctx context.Context, id string) (io.ReadCloser, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	sb, err := e.get(id)
	if err != nil {
		return nil, err
	}
	return io.NopCloser(bytes.NewReader(bytes.Clone(sb.log.Bytes()))), nil
}

func (e *testEngine) Delete(ctx context.Context, id string) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if sb, ok := e.sbs[id]; ok {
		if sb.conn != nil {
			_ = sb.conn.Close()
		}
		delete(e.sbs, id)
	}
	return nil
}

func (e *testEngine) List(ctx context.Context) ([]string, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	var ids []string
	for id := range e.sbs {
		ids = append(ids, id)
	}
	return ids, nil
}

// kill makes the sandbox die as if its process was killed.
func (e *testEngine) kill(id string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if sb, ok := e.sbs[id]; ok {
		sb.state = engine.StateDead
		if sb.conn != nil {
			_ = sb.conn.Close()
		}
	}
}

// lose removes the sandbox without the daemon knowing.
func (e *testEngine) lose(id string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.sbs, id)
}

func (e *testEngine) has(id string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	_, ok := e.sbs[id]
	return ok
}

// Checkpoint writes the sandbox's files into dir.
func (e *testEngine) Checkpoint(ctx context.Context, req *engine.CheckpointRequest) (*engine.CheckpointResult, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	sb, err := e.get(req.ID)
	if err != nil {
		return nil, err
	}
	var size int64
	for p, b := range sb.files {
		f := filepath.Join(req.Dir, "files", hex.EncodeToString([]byte(p)))
		_ = os.MkdirAll(filepath.Dir(f), 0o700)
		if err := os.WriteFile(f, b, 0o600); err != nil {
			return nil, err
		}
		size += int64(len(b))
	}
	_ = os.WriteFile(filepath.Join(req.Dir, "memory.img"), []byte("memory of "+req.ID), 0o600)
	return &engine.CheckpointResult{SourcePause: time.Millisecond, SizeBytes: size, EngineVersion: "test-1"}, nil
}

func (e *testEngine) Restore(ctx context.Context, req *engine.RestoreRequest) error {
	e.mu.Lock()
	e.restores++
	n := e.restores
	e.mu.Unlock()
	if e.failRestore == n {
		return fmt.Errorf("restore %d failed on purpose", n)
	}
	files := map[string][]byte{}
	ents, _ := os.ReadDir(filepath.Join(req.From, "files"))
	for _, ent := range ents {
		p, _ := hex.DecodeString(ent.Name())
		b, err := os.ReadFile(filepath.Join(req.From, "files", ent.Name()))
		if err != nil {
			return err
		}
		files[string(p)] = b
	}
	if err := e.Create(ctx, &req.CreateRequest); err != nil {
		return err
	}
	e.mu.Lock()
	e.sbs[req.ID].files = files
	e.mu.Unlock()
	return nil
}

var (
	_ engine.Engine = (*testEngine)(nil)
	_ engine.Forker = (*testEngine)(nil)
)

// testConn is the agent transport of one test sandbox.
type testConn struct {
	e    *testEngine
	sb   *testSandbox
	once sync.Once
	done chan struct{}
}

func (c *testConn) Read(p []byte) (int, error)  { <-c.done; return 0, io.EOF }
func (c *testConn) Write(p []byte) (int, error) { return len(p), nil }
func (c *testConn) Close() error                { c.once.Do(func() { close(c.done) }); return nil }

// testAgent runs a few built-in commands against its sandbox's state:
// echo ARGS, exit N, cat (stdin to stdout), hostname, sleep SECONDS,
// fail (stderr); anything else cannot be started (127).
type testAgent struct{ c *testConn }

func newTestAgent(rw io.ReadWriteCloser) Agent { return &testAgent{c: rw.(*testConn)} }

func (a *testAgent) alive() error {
	select {
	case <-a.c.done:
		return client.ErrClosed
	default:
		return nil
	}
}

func (a *testAgent) Handshake(ctx context.Context) (*client.Hello, error) {
	if err := a.alive(); err != nil {
		return nil, err
	}
	return &client.Hello{ProtocolVersion: 1, AgentVersion: "test", PID: 1}, nil
}

func (a *testAgent) Configure(ctx context.Context, hostname string) error {
	a.c.e.mu.Lock()
	a.c.sb.hostname = hostname
	a.c.e.mu.Unlock()
	return a.alive()
}

func (a *testAgent) Ping(ctx context.Context) (time.Duration, error) {
	return time.Microsecond, a.alive()
}

func (a *testAgent) Done() <-chan struct{} { return a.c.done }
func (a *testAgent) Close() error          { return a.c.Close() }

func (a *testAgent) PutFile(ctx context.Context, path string, mode uint32, r io.Reader) error {
	b, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	a.c.e.mu.Lock()
	defer a.c.e.mu.Unlock()
	a.c.sb.files[path] = b
	return nil
}

func (a *testAgent) GetFile(ctx context.Context, path string, w io.Writer) error {
	a.c.e.mu.Lock()
	b, ok := a.c.sb.files[path]
	a.c.e.mu.Unlock()
	if !ok {
		return fmt.Errorf("%s: %w", path, errdefs.ErrNotFound)
	}
	_, err := w.Write(b)
	return err
}

type testProcess struct {
	pid    int
	done   chan struct{}
	status client.ExitStatus
	kill   chan int
}

func (p *testProcess) PID() int { return p.pid }
func (p *testProcess) Wait(ctx context.Context) (client.ExitStatus, error) {
	select {
	case <-p.done:
		return p.status, nil
	case <-ctx.Done():
		return client.ExitStatus{}, ctx.Err()
	}
}
func (p *testProcess) Signal(ctx context.Context, sig int) error {
	select {
	case p.kill <- sig:
	default:
	}
	return nil
}
func (p *testProcess) Resize(ctx context.Context, rows, cols uint16) error { return nil }
func (p *testProcess) CloseStdin() error                                   { return nil }

var pidSeq struct {
	sync.Mutex
	n int
}

func (a *testAgent) Exec(ctx context.Context, req *client.ExecRequest, stdio client.Stdio) (client.Process, error) {
	if err := a.alive(); err != nil {
		return nil, err
	}
	out, errw := stdio.Stdout, stdio.Stderr
	if out == nil {
		out = io.Discard
	}
	if errw == nil {
		errw = io.Discard
	}
	pidSeq.Lock()
	pidSeq.n++
	p := &testProcess{pid: pidSeq.n + 1, done: make(chan struct{}), kill: make(chan int, 1)}
	pidSeq.Unlock()
	finish := func(code int) { p.status.Code = code; close(p.done) }
	switch req.Args[0] {
	case "echo":
		fmt.Fprintln(out, strings.Join(req.Args[1:], " "))
		finish(0)
	case "fail":
		fmt.Fprintln(errw, "failing")
		finish(3)
	case "exit":
		n, _ := strconv.Atoi(req.Args[1])
		finish(n)
	case "hostname":
		a.c.e.mu.Lock()
		fmt.Fprintln(out, a.c.sb.hostname)
		a.c.e.mu.Unlock()
		finish(0)
	case "cat":
		go func() {
			if stdio.Stdin != nil {
				_, _ = io.Copy(out, stdio.Stdin)
			}
			finish(0)
		}()
	case "sleep":
		s, _ := strconv.ParseFloat(req.Args[1], 64)
		go func() {
			select {
			case <-time.After(time.Duration(s * float64(time.Second))):
				finish(0)
			case sig := <-p.kill:
				finish(128 + sig)
			case <-a.c.done:
				finish(137)
			}
		}()
	default:
		return nil, fmt.Errorf("starting %q: %w", req.Args[0], &client.StartError{Code: 127, Msg: fmt.Sprintf("exec: %q: executable file not found in $PATH", req.Args[0])})
	}
	return p, nil
}
