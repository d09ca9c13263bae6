package sdk

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"

	"github.com/coder/websocket"

	v1 "github.com/k7-dev/k7/api/v1"
)

// execReadLimit bounds one WebSocket message from the daemon.
const execReadLimit = 8 << 20

// stdinChunk is the most stdin data in one message: with its stream byte a
// message stays within coder/websocket's default read limit of 32 KiB.
const stdinChunk = 32<<10 - 1

// Run runs a command to completion without streaming and returns its
// output and exit code. req.StdinData is its stdin. With req.Detach the
// command is started and Run returns with only PID set.
// Errors: ErrNotFound (sandbox), ErrFailedPrecondition (sandbox not
// running), ErrInvalidArgument (empty args), ErrDaemonUnavailable. A command
// that cannot be started is not an error: ExitCode is 126 or 127 and the
// reason is on Stderr.
func (c *Client) Run(ctx context.Context, id string, req v1.ExecRequest) (*v1.ExecResult, error) {
	var r v1.ExecResult
	if err := c.doJSON(ctx, http.MethodPost, "/v1/sandboxes/"+pathID(id)+"/exec", nil, req, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// ExecIO connects the standard streams of a streamed command.
type ExecIO struct {
	// Stdin, when non-nil, is copied to the command's stdin until EOF, which
	// closes the command's stdin. When nil the command reads EOF at once.
	Stdin io.Reader
	// Stdout and Stderr receive the command's output; nil discards it. With
	// a TTY, all output arrives on Stdout. They are written from one
	// goroutine at a time.
	Stdout io.Writer
	Stderr io.Writer
}

// ExecExit is how a streamed command ended.
type ExecExit struct {
	PID       int
	Code      int   // exit code; 128+signal when killed by a signal
	TimedOut  bool  // killed because the request's timeout passed
	LatencyNS int64 // daemon time from the request to the start
}

// StartError reports a command that could not be started, such as an
// executable not found (ExitCode 127) or not executable (126). Its message
// is the daemon's, for example `exec: "x": executable file not found in $PATH`.
type StartError struct {
	ExitCode int
	Message  string
}

func (e *StartError) Error() string { return e.Message }

// ExecSession is a command running in a sandbox with its streams attached.
// Resize and Signal may be called concurrently with each other and with
// Wait. The session ends when the command exits, its context is done, or
// Close is called.
type ExecSession struct {
	conn    *websocket.Conn
	ctx     context.Context
	stdio   ExecIO
	started chan struct{} // closed on "started" or on the end
	done    chan struct{} // closed when the session ended

	pid  int       // set before started is closed
	exit *ExecExit // set before done is closed
	err  error     // set before done is closed

	startOnce sync.Once
}

// Exec runs a command with streamed stdio and waits for it to end. It is
// StartExec followed by Wait. When the command cannot be started, Exec
// returns its exit code (126, 127) together with a *StartError.
// Errors: as StartExec and Wait.
func (c *Client) Exec(ctx context.Context, id string, req v1.ExecRequest, stdio ExecIO) (*ExecExit, error) {
	s, err := c.StartExec(ctx, id, req, stdio)
	if err != nil {
		var se *StartError
		if errors.As(err, &se) {
			return &ExecExit{Code: se.ExitCode}, err
		}
		return nil, err
	}
	return s.Wait()
}

// StartExec starts a command over the exec WebSocket and returns once it
// runs. req.Stdin is set from stdio.Stdin; req.Detach is not supported here
// (use Run). ctx bounds the whole session: cancelling it closes the
// connection (the daemon then kills the command). The caller must call Wait
// or Close.
// Errors: ErrNotFound (sandbox), ErrFailedPrecondition (sandbox not
// running), ErrInvalidArgument, ErrDaemonUnavailable, *StartError (the
// command could not be started).
func (c *Client) StartExec(ctx context.Context, id string, req v1.ExecRequest, stdio ExecIO) (*ExecSession, error) {
	if req.Detach {
		return nil, fmt.Errorf("%w: detached exec is not streamed: use Run", ErrInvalidArgument)
	}
	req.Stdin = stdio.Stdin != nil
	opts := &websocket.DialOptions{HTTPClient: c.hc, HTTPHeader: http.Header{}}
	if c.token != "" {
		opts.HTTPHeader.Set("Authorization", "Bearer "+c.token)
	}
	conn, resp, err := websocket.Dial(ctx, c.url("/v1/sandboxes/"+pathID(id)+"/exec/ws", nil), opts) //nolint:bodyclose // on failure Dial closes the body and hands back a buffered copy; on success the body is the connection
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols && resp.Body != nil {
			return nil, errorFromResponse(resp)
		}
		return nil, c.transportError(err)
	}
	conn.SetReadLimit(execReadLimit)
	b, err := json.Marshal(req)
	if err != nil {
		conn.CloseNow()
		return nil, err
	}
	if err := conn.Write(ctx, websocket.MessageText, b); err != nil {
		conn.CloseNow()
		return nil, fmt.Errorf("sending exec request: %w", err)
	}
	s := &ExecSession{
		conn:    conn,
		ctx:     ctx,
		stdio:   stdio,
		started: make(chan struct{}),
		done:    make(chan struct{}),
	}
	go s.read()
	select {
	case <-s.started:
	case <-s.done:
	}
	select {
	case <-s.done:
		if s.err != nil {
			return nil, s.err
		}
		return s, nil
	default:
	}
	if stdio.Stdin != nil {
		go s.pumpStdin()
	}
	return s, nil
}

// PID returns the command's process ID inside the sandbox (0 if unknown).
func (s *ExecSession) PID() int { return s.pid }

// Resize sets the terminal size of a TTY command.
func (s *ExecSession) Resize(ctx context.Context, rows, cols uint16) error {
	return s.control(ctx, v1.ExecControl{Type: v1.ControlResize, Rows: rows, Cols: cols})
}

// Signal sends a signal ("TERM", "KILL", "INT", "HUP", ...) to the command.
func (s *ExecSession) Signal(ctx context.Context, signal string) error {
	return s.control(ctx, v1.ExecControl{Type: v1.ControlSignal, Signal: signal})
}

func (s *ExecSession) control(ctx context.Context, m v1.ExecControl) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	select {
	case <-s.done:
		return errors.New("exec session has ended")
	default:
	}
	return s.conn.Write(ctx, websocket.MessageText, b)
}

// Wait waits for the command to end, all its output written, and returns
// how it ended. It may be called more than once and from several goroutines.
// Errors: ErrUnavailable and the other sentinels when the daemon reports an
// error, a context error, or a connection error.
func (s *ExecSession) Wait() (*ExecExit, error) {
	<-s.done
	return s.exit, s.err
}

// Close abandons the session: the connection is closed and the daemon kills
// the command. Closing an ended session does nothing.
func (s *ExecSession) Close() error {
	select {
	case <-s.done:
		return nil
	default:
	}
	return s.conn.CloseNow()
}

// finish records the end of the session; only the reader calls it.
func (s *ExecSession) finish(exit *ExecExit, err error) {
	s.exit, s.err = exit, err
	s.startOnce.Do(func() { close(s.started) })
	close(s.done)
}

// read is the session's only reader: it writes output and decodes control
// messages until the last one.
func (s *ExecSession) read() {
	for {
		typ, b, err := s.conn.Read(s.ctx)
		if err != nil {
			if ctxErr := s.ctx.Err(); ctxErr != nil {
				err = ctxErr
			} else {
				err = fmt.Errorf("exec stream ended before the command exited: %w", err)
			}
			s.conn.CloseNow()
			s.finish(nil, err)
			return
		}
		if typ == websocket.MessageBinary {
			if len(b) < 1 {
				continue
			}
			var w io.Writer
			switch b[0] {
			case v1.StreamStdout:
				w = s.stdio.Stdout
			case v1.StreamStderr:
				w = s.stdio.Stderr
			}
			if w != nil && len(b) > 1 {
				if _, err := w.Write(b[1:]); err != nil {
					s.conn.CloseNow()
					s.finish(nil, fmt.Errorf("writing exec output: %w", err))
					return
				}
			}
			continue
		}
		var m v1.ExecControl
		if err := json.Unmarshal(b, &m); err != nil {
			s.conn.CloseNow()
			s.finish(nil, fmt.Errorf("decoding exec control message: %w", err))
			return
		}
		switch m.Type {
		case v1.ControlStarted:
			s.pid = m.PID
			s.startOnce.Do(func() { close(s.started) })
		case v1.ControlExit:
			if m.Error != "" {
				s.finish(nil, &StartError{ExitCode: m.ExitCode, Message: m.Error})
			} else {
				s.finish(&ExecExit{PID: s.pid, Code: m.ExitCode, TimedOut: m.TimedOut, LatencyNS: m.LatencyNS}, nil)
			}
			s.conn.Close(websocket.StatusNormalClosure, "")
			return
		case v1.ControlError:
			s.finish(nil, newAPIError(0, m.Code, m.Error))
			s.conn.Close(websocket.StatusNormalClosure, "")
			return
		}
	}
}

// pumpStdin copies stdin to the command and closes the command's stdin at
// EOF. A Read blocked on stdin after the session ended is left behind.
func (s *ExecSession) pumpStdin() {
	buf := make([]byte, 1+stdinChunk)
	buf[0] = v1.StreamStdin
	for {
		n, err := s.stdio.Stdin.Read(buf[1:])
		if n > 0 {
			if werr := s.conn.Write(s.ctx, websocket.MessageBinary, buf[:1+n]); werr != nil {
				return
			}
		}
		if err != nil {
			// EOF or a read error: either way the command sees the end.
			_ = s.conn.Write(s.ctx, websocket.MessageBinary, []byte{v1.StreamStdin})
			return
		}
	}
}
