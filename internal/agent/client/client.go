// Package client is the daemon side of the k7-agent protocol (package
// proto): it starts commands in a sandbox, streams their stdio and moves
// files, over one transport to the sandbox's agent.
package client

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
	"syscall"
	"time"

	"github.com/k7-dev/k7/internal/agent/proto"
	"github.com/k7-dev/k7/internal/errdefs"
)

// ExecRequest mirrors api/v1.ExecRequest without the wire-only fields.
type ExecRequest struct {
	Args    []string
	Env     []string // KEY=VALUE, added to the agent's environment
	Cwd     string   // default "/"
	User    string   // name (looked up in the sandbox's /etc/passwd) or uid[:gid]; default root
	TTY     bool
	Rows    uint16
	Cols    uint16
	Stdin   bool          // the caller provides stdin (Stdio.Stdin)
	Detach  bool          // start and return; output goes to the agent's stderr (the sandbox log)
	Timeout time.Duration // 0: none; the agent kills the process group after this
}

// Stdio are the caller's ends of a command's streams. Nil writers discard.
type Stdio struct {
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer // ignored with TTY (stderr is merged into the terminal)
}

// ExitStatus is how a command ended.
type ExitStatus struct {
	Code     int  // exit code, or 128+signal
	TimedOut bool // killed by the agent because Timeout passed
}

// Process is a started command.
type Process interface {
	PID() int
	// Wait blocks until the command exits and all of its output has been
	// written to Stdio, or ctx ends.
	Wait(ctx context.Context) (ExitStatus, error)
	Signal(ctx context.Context, sig int) error
	Resize(ctx context.Context, rows, cols uint16) error
	// CloseStdin closes the command's stdin (EOF).
	CloseStdin() error
}

// Hello is the agent's answer to the handshake.
type Hello struct {
	ProtocolVersion int
	AgentVersion    string
	PID             int // the agent's pid inside the sandbox (1)
}

// ErrStart classifies the errors of commands that could not start; the
// error is a *StartError.
var ErrStart = errors.New("command not started")

// ErrClosed is returned (wrapped) by calls on a client whose transport
// ended. It is an errdefs.ErrUnavailable.
var ErrClosed = fmt.Errorf("agent transport closed: %w", errdefs.ErrUnavailable)

// StartError is a command that could not start. Code is the exit code a
// shell reports for it: 127 when the executable was not found, 126 for the
// rest (permission, working directory, user). Msg is one line, e.g.
// `exec: "nosuch": executable file not found in $PATH`.
type StartError struct {
	Code int
	Msg  string
}

func (e *StartError) Error() string { return e.Msg }

// Unwrap makes a StartError match ErrStart.
func (e *StartError) Unwrap() error { return ErrStart }

// remoteError is an error reported by the agent, classified by its errdefs
// code.
type remoteError struct {
	msg   string
	class error
}

func (e *remoteError) Error() string { return e.msg }
func (e *remoteError) Unwrap() error { return e.class }

func resultError(r proto.Result) error {
	if r.Error == "" {
		return nil
	}
	if r.Code == "start" {
		return &StartError{Code: r.ExitCode, Msg: r.Error}
	}
	return &remoteError{msg: r.Error, class: errdefs.FromCode(r.Code)}
}

// Client speaks the protocol over one transport. It is safe for concurrent
// use; many commands may run at once.
type Client struct {
	rw io.ReadWriteCloser
	w  *proto.Writer

	mu    sync.Mutex
	chans map[uint32]*channel
	next  uint32
	nonce uint64
	ready bool          // the current nonce was acknowledged
	ack   chan struct{} // closed when ready
	hello *Hello

	done      chan struct{}
	closeOnce sync.Once
}

// channel is one request's inbound frames, and the credit the agent gave
// for its stdin.
type channel struct {
	id     uint32
	q      *proto.Queue[proto.Frame]
	credit *proto.Credit
}

// New starts a client over rw (usually from engine.Connect). Call
// Handshake before anything else. Close closes rw.
func New(rw io.ReadWriteCloser) *Client {
	c := &Client{
		rw:    rw,
		w:     proto.NewWriter(rw),
		chans: map[uint32]*channel{},
		done:  make(chan struct{}),
	}
	go c.readLoop()
	return c
}

func (c *Client) readLoop() {
	defer c.shutdown()
	rd := proto.NewReader(retryReader{c.rw})
	for {
		f, err := rd.ReadFrame()
		if err != nil {
			return
		}
		c.dispatch(f)
	}
}

// retryReader retries reads interrupted by EINTR or EAGAIN.
type retryReader struct{ r io.Reader }

func (rr retryReader) Read(p []byte) (int, error) {
	for i := 0; ; i++ {
		n, err := rr.r.Read(p)
		if n > 0 || err == nil && i < 100 {
			if n > 0 {
				return n, nil
			}
			continue
		}
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if errors.Is(err, syscall.EAGAIN) {
			time.Sleep(5 * time.Millisecond)
			continue
		}
		if err == nil {
			err = io.ErrNoProgress
		}
		return 0, err
	}
}

func (c *Client) dispatch(f proto.Frame) {
	c.mu.Lock()
	if f.Type == proto.THelloAck {
		var a proto.HelloAck
		if err := f.Unmarshal(&a); err == nil && !c.ready && c.ack != nil && a.Nonce == c.nonce {
			c.ready = true
			c.hello = &Hello{ProtocolVersion: a.ProtocolVersion, AgentVersion: a.AgentVersion, PID: a.PID}
			close(c.ack)
		}
		c.mu.Unlock()
		return
	}
	if !c.ready {
		c.mu.Unlock()
		return // stale bytes of an earlier client
	}
	ch := c.chans[f.Channel]
	c.mu.Unlock()
	if ch == nil {
		return
	}
	if f.Type == proto.TWindow {
		ch.credit.Add(f.Credit())
		return
	}
	ch.q.Push(f)
}

func (c *Client) shutdown() {
	c.closeOnce.Do(func() {
		close(c.done)
	})
	c.mu.Lock()
	chans := c.chans
	c.chans = map[uint32]*channel{}
	c.mu.Unlock()
	for _, ch := range chans {
		ch.q.Close()
		ch.credit.Close()
	}
}

// Handshake synchronizes with the agent: it discards stale bytes left in the
// transport by an earlier client and returns the agent's hello. It sends a
// Hello with a fresh nonce every 100 ms until the agent acknowledges that
// nonce. A repeated Handshake starts a new session with the agent: the
// commands started before keep running, but their streams end.
func (c *Client) Handshake(ctx context.Context) (*Hello, error) {
	var nb [8]byte
	rand.Read(nb[:])
	nonce := binary.BigEndian.Uint64(nb[:])
	ack := make(chan struct{})
	c.mu.Lock()
	c.nonce, c.ready, c.ack = nonce, false, ack
	old := c.chans
	c.chans = map[uint32]*channel{}
	c.mu.Unlock()
	for _, ch := range old {
		ch.q.Close()
		ch.credit.Close()
	}
	hello := proto.JSON(proto.THello, 0, proto.Hello{Nonce: nonce, ProtocolVersion: proto.Version})
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		if err := c.w.WriteFrame(hello); err != nil {
			return nil, fmt.Errorf("sending hello: %w", c.closedErr(err))
		}
		select {
		case <-ack:
			c.mu.Lock()
			h := *c.hello
			c.mu.Unlock()
			if h.ProtocolVersion != proto.Version {
				return nil, fmt.Errorf("%w: agent speaks protocol %d, want %d", errdefs.ErrFailedPrecondition, h.ProtocolVersion, proto.Version)
			}
			return &h, nil
		case <-tick.C:
		case <-c.done:
			return nil, fmt.Errorf("handshake: %w", ErrClosed)
		case <-ctx.Done():
			return nil, fmt.Errorf("handshake: %w", ctx.Err())
		}
	}
}

func (c *Client) closedErr(err error) error {
	select {
	case <-c.done:
		return ErrClosed
	default:
		return err
	}
}

// open allocates a channel.
func (c *Client) open() *channel {
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		c.next++
		if c.next == 0 {
			c.next = 1
		}
		if _, used := c.chans[c.next]; !used {
			break
		}
	}
	ch := &channel{id: c.next, q: proto.NewQueue[proto.Frame](), credit: proto.NewCredit(proto.Window)}
	select {
	case <-c.done:
		ch.q.Close()
		ch.credit.Close()
	default:
		c.chans[ch.id] = ch
	}
	return ch
}

func (c *Client) release(ch *channel) {
	c.mu.Lock()
	if c.chans[ch.id] == ch {
		delete(c.chans, ch.id)
	}
	c.mu.Unlock()
	ch.q.Close()
	ch.credit.Close()
}

func (c *Client) send(f proto.Frame) error {
	if err := c.w.WriteFrame(f); err != nil {
		return c.closedErr(err)
	}
	return nil
}

// recv waits for the channel's next frame.
func (c *Client) recv(ctx context.Context, ch *channel) (proto.Frame, error) {
	f, ok := ch.q.Pop(ctx.Done())
	if ok {
		return f, nil
	}
	if err := ctx.Err(); err != nil {
		return f, err
	}
	return f, ErrClosed
}

// call sends f on a fresh channel and waits for its TResult.
func (c *Client) call(ctx context.Context, f proto.Frame) error {
	ch := c.open()
	defer c.release(ch)
	f.Channel = ch.id
	if err := c.send(f); err != nil {
		return err
	}
	r, err := c.recv(ctx, ch)
	if err != nil {
		return err
	}
	return decodeResult(r)
}

func decodeResult(f proto.Frame) error {
	if f.Type != proto.TResult {
		return fmt.Errorf("unexpected %v frame from agent", f.Type)
	}
	var r proto.Result
	if err := f.Unmarshal(&r); err != nil {
		return err
	}
	return resultError(r)
}

// Configure sets the sandbox's host name (after a fork each child gets its
// own) and brings its clock to the host's (a restored VM wakes with the
// clock of its capture).
func (c *Client) Configure(ctx context.Context, hostname string) error {
	m := proto.Configure{Hostname: hostname, TimeUnixNano: time.Now().UnixNano()}
	if err := c.call(ctx, proto.JSON(proto.TConfigure, 0, m)); err != nil {
		return fmt.Errorf("configuring sandbox: %w", err)
	}
	return nil
}

// Exec starts a command. A command that cannot be started (not found, bad
// user, bad cwd) returns an error wrapping ErrStart, whose *StartError
// gives the exit code a shell would report.
//
// The command's output is written to stdio's writers from a goroutine of
// the returned Process; a slow writer slows only this command (flow control
// bounds what is buffered). A detached command's Wait returns at once with
// a zero ExitStatus: the agent does not report its exit.
func (c *Client) Exec(ctx context.Context, req *ExecRequest, stdio Stdio) (Process, error) {
	ch := c.open()
	m := proto.Exec{
		Args: req.Args, Env: req.Env, Cwd: req.Cwd, User: req.User,
		TTY: req.TTY, Rows: req.Rows, Cols: req.Cols, Stdin: req.Stdin,
		Detach: req.Detach, TimeoutNS: int64(req.Timeout),
	}
	if err := c.send(proto.JSON(proto.TExec, ch.id, m)); err != nil {
		c.release(ch)
		return nil, fmt.Errorf("starting command: %w", err)
	}
	f, err := c.recv(ctx, ch)
	if err != nil {
		c.release(ch)
		return nil, fmt.Errorf("starting command: %w", err)
	}
	if f.Type != proto.TStarted {
		c.release(ch)
		return nil, fmt.Errorf("starting command: %w", decodeResult(f))
	}
	var st proto.Started
	if err := f.Unmarshal(&st); err != nil {
		c.release(ch)
		return nil, err
	}
	p := &process{c: c, ch: ch, pid: st.PID, exited: make(chan struct{})}
	if req.Detach {
		c.release(ch)
		close(p.exited)
		return p, nil
	}
	stdout, stderr := stdio.Stdout, stdio.Stderr
	if stdout == nil {
		stdout = io.Discard
	}
	if stderr == nil {
		stderr = io.Discard
	}
	go p.receive(stdout, stderr)
	if req.Stdin && stdio.Stdin != nil {
		go p.feed(stdio.Stdin)
	}
	return p, nil
}

// process is a started command.
type process struct {
	c   *Client
	ch  *channel
	pid int

	exited    chan struct{} // closed when status and err are set
	status    ExitStatus
	err       error
	stdinOnce sync.Once
}

var _ Process = (*process)(nil)

func (p *process) PID() int { return p.pid }

// receive writes the command's output and records its exit.
func (p *process) receive(stdout, stderr io.Writer) {
	defer close(p.exited)
	defer p.c.release(p.ch)
	var werr error
	for {
		f, ok := p.ch.q.Pop(nil)
		if !ok {
			p.err = fmt.Errorf("waiting for command: %w", ErrClosed)
			return
		}
		switch f.Type {
		case proto.TStdout, proto.TStderr:
			w := stdout
			if f.Type == proto.TStderr {
				w = stderr
			}
			if werr == nil {
				if _, err := w.Write(f.Payload); err != nil {
					werr = fmt.Errorf("writing command output: %w", err)
				}
			}
			_ = p.c.send(proto.WindowFrame(p.ch.id, len(f.Payload)))
		case proto.TExit:
			var e proto.Exit
			if err := f.Unmarshal(&e); err != nil {
				p.err = err
				return
			}
			p.status = ExitStatus{Code: e.Code, TimedOut: e.TimedOut}
			p.err = werr
			return
		}
	}
}

// feed copies r to the command's stdin under flow control, then closes it.
func (p *process) feed(r io.Reader) {
	buf := make([]byte, proto.ChunkSize)
	for {
		n, err := r.Read(buf)
		for b := buf[:n]; len(b) > 0; {
			k, ok := p.ch.credit.Take(p.exited, len(b))
			if !ok {
				return
			}
			if p.c.send(proto.Frame{Type: proto.TStdin, Channel: p.ch.id, Payload: append([]byte(nil), b[:k]...)}) != nil {
				return
			}
			b = b[k:]
		}
		if err != nil {
			_ = p.CloseStdin()
			return
		}
	}
}

func (p *process) Wait(ctx context.Context) (ExitStatus, error) {
	select {
	case <-p.exited:
		return p.status, p.err
	case <-ctx.Done():
		return ExitStatus{}, ctx.Err()
	}
}

func (p *process) Signal(ctx context.Context, sig int) error {
	return p.c.send(proto.JSON(proto.TSignal, p.ch.id, proto.Signal{Signal: sig}))
}

func (p *process) Resize(ctx context.Context, rows, cols uint16) error {
	return p.c.send(proto.JSON(proto.TResize, p.ch.id, proto.Resize{Rows: rows, Cols: cols}))
}

func (p *process) CloseStdin() error {
	var err error
	p.stdinOnce.Do(func() {
		err = p.c.send(proto.Frame{Type: proto.TStdinEOF, Channel: p.ch.id})
	})
	return err
}

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// PutFile writes r to path inside the sandbox with mode, creating parents.
// The file appears atomically (written aside, then renamed). Mode holds
// permission bits; 0 means 0644. A path that is not absolute, or names a
// directory, is an errdefs.ErrInvalidArgument.
func (c *Client) PutFile(ctx context.Context, path string, mode uint32, r io.Reader) error {
	err := c.putFile(ctx, path, mode, r)
	if err != nil {
		return fmt.Errorf("putting %s: %w", path, err)
	}
	return nil
}

func (c *Client) putFile(ctx context.Context, path string, mode uint32, r io.Reader) error {
	ch := c.open()
	defer c.release(ch)
	if err := c.send(proto.JSON(proto.TPutFile, ch.id, proto.PutFile{Path: path, Mode: mode})); err != nil {
		return err
	}
	buf := make([]byte, proto.ChunkSize)
	for {
		if f, ok := ch.q.Pop(closedChan); ok {
			return decodeResult(f) // an early error
		}
		if err := ctx.Err(); err != nil {
			_ = c.send(proto.Frame{Type: proto.TCancel, Channel: ch.id})
			return err
		}
		n, rerr := r.Read(buf)
		if n > 0 {
			if err := c.send(proto.Frame{Type: proto.TData, Channel: ch.id, Payload: buf[:n]}); err != nil {
				return err
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			_ = c.send(proto.Frame{Type: proto.TCancel, Channel: ch.id})
			return fmt.Errorf("reading: %w", rerr)
		}
	}
	if err := c.send(proto.Frame{Type: proto.TEnd, Channel: ch.id}); err != nil {
		return err
	}
	f, err := c.recv(ctx, ch)
	if err != nil {
		return err
	}
	return decodeResult(f)
}

// GetFile streams the file at path inside the sandbox to w. A missing file
// is an errdefs.ErrNotFound; a directory, a non-regular file or a relative
// path an errdefs.ErrInvalidArgument.
func (c *Client) GetFile(ctx context.Context, path string, w io.Writer) error {
	if err := c.getFile(ctx, path, w); err != nil {
		return fmt.Errorf("getting %s: %w", path, err)
	}
	return nil
}

func (c *Client) getFile(ctx context.Context, path string, w io.Writer) error {
	ch := c.open()
	defer c.release(ch)
	if err := c.send(proto.JSON(proto.TGetFile, ch.id, proto.GetFile{Path: path})); err != nil {
		return err
	}
	for {
		f, err := c.recv(ctx, ch)
		if err != nil {
			_ = c.send(proto.Frame{Type: proto.TCancel, Channel: ch.id})
			return err
		}
		switch f.Type {
		case proto.TData:
			if _, err := w.Write(f.Payload); err != nil {
				_ = c.send(proto.Frame{Type: proto.TCancel, Channel: ch.id})
				return err
			}
			_ = c.send(proto.WindowFrame(ch.id, len(f.Payload)))
		default:
			return decodeResult(f)
		}
	}
}

// Ping measures a protocol round trip.
func (c *Client) Ping(ctx context.Context) (time.Duration, error) {
	ch := c.open()
	defer c.release(ch)
	start := time.Now()
	if err := c.send(proto.Frame{Type: proto.TPing, Channel: ch.id}); err != nil {
		return 0, fmt.Errorf("ping: %w", err)
	}
	for {
		f, err := c.recv(ctx, ch)
		if err != nil {
			return 0, fmt.Errorf("ping: %w", err)
		}
		if f.Type == proto.TPong {
			return time.Since(start), nil
		}
	}
}

// Done is closed when the transport ends (the sandbox died or Close was called).
func (c *Client) Done() <-chan struct{} { return c.done }

// Close closes the transport. Running commands keep running in the sandbox;
// their Wait returns an error wrapping ErrClosed. It may be repeated.
func (c *Client) Close() error {
	err := c.rw.Close()
	c.shutdown()
	return err
}
