package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/coder/websocket"

	v1 "github.com/k7-dev/k7/api/v1"
	"github.com/k7-dev/k7/internal/agent/client"
	"github.com/k7-dev/k7/internal/errdefs"
)

// limitedBuffer keeps the first max bytes written and drops the rest.
type limitedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
	max int64
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if room := b.max - int64(b.buf.Len()); room > 0 {
		b.buf.Write(p[:min(int64(len(p)), room)])
	}
	return len(p), nil
}

func (b *limitedBuffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.buf.Len() == 0 {
		return nil
	}
	return bytes.Clone(b.buf.Bytes())
}

// killSignal is sent to a command whose client went away.
const killSignal = int(syscall.SIGKILL)

func (s *server) exec(w http.ResponseWriter, r *http.Request) {
	var req v1.ExecRequest
	if err := decode(w, r, &req); err != nil {
		s.error(w, r, err)
		return
	}
	stdout := &limitedBuffer{max: s.outMax}
	stderr := &limitedBuffer{max: s.outMax}
	stdio := client.Stdio{Stdout: stdout, Stderr: stderr}
	if req.StdinData != nil {
		stdio.Stdin = bytes.NewReader(req.StdinData)
	}
	ctx := r.Context()
	p, err := s.b.Exec(ctx, r.PathValue("id"), &req, stdio)
	if err != nil {
		if code, msg, ok := startFailure(err); ok {
			s.writeJSON(w, r, http.StatusOK, &v1.ExecResult{ExitCode: code, Stderr: []byte(msg + "\n")})
			return
		}
		s.error(w, r, err)
		return
	}
	if req.Detach {
		s.writeJSON(w, r, http.StatusOK, &v1.ExecResult{PID: p.PID()})
		return
	}
	st, err := p.Wait(ctx)
	if err != nil {
		if ctx.Err() != nil {
			// The client went away: the command must not outlive it.
			kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			_ = p.Signal(kctx, killSignal)
			cancel()
			return
		}
		s.error(w, r, fmt.Errorf("waiting for command: %w", err))
		return
	}
	s.writeJSON(w, r, http.StatusOK, &v1.ExecResult{
		PID:      p.PID(),
		ExitCode: st.Code,
		Stdout:   stdout.Bytes(),
		Stderr:   stderr.Bytes(),
		TimedOut: st.TimedOut,
	})
}

// startFailure reports whether err says the command could not be started,
// with the exit code a shell would give (127 not found, 126 otherwise).
func startFailure(err error) (int, string, bool) {
	var se *client.StartError
	if errors.As(err, &se) {
		return se.Code, se.Msg, true
	}
	return 0, "", false
}

// signalNumber parses "TERM", "SIGTERM" or "15".
func signalNumber(s string) (int, error) {
	if n, err := strconv.Atoi(s); err == nil && n > 0 && n < 65 {
		return n, nil
	}
	switch strings.TrimPrefix(strings.ToUpper(s), "SIG") {
	case "TERM":
		return int(syscall.SIGTERM), nil
	case "KILL":
		return int(syscall.SIGKILL), nil
	case "INT":
		return int(syscall.SIGINT), nil
	case "HUP":
		return int(syscall.SIGHUP), nil
	case "QUIT":
		return int(syscall.SIGQUIT), nil
	case "USR1":
		return int(syscall.SIGUSR1), nil
	case "USR2":
		return int(syscall.SIGUSR2), nil
	case "WINCH":
		return int(syscall.SIGWINCH), nil
	}
	return 0, fmt.Errorf("unknown signal %q: %w", s, errdefs.ErrInvalidArgument)
}

// wsChunk is the most output bytes per WebSocket message.
const wsChunk = 32 << 10

// wsStream writes one output stream as binary messages.
type wsStream struct {
	ctx  context.Context
	conn *websocket.Conn
	id   byte
	mu   *sync.Mutex
}

func (w *wsStream) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		c := p[:min(len(p), wsChunk)]
		msg := append([]byte{w.id}, c...)
		w.mu.Lock()
		err := w.conn.Write(w.ctx, websocket.MessageBinary, msg)
		w.mu.Unlock()
		if err != nil {
			return n, err
		}
		n += len(c)
		p = p[len(c):]
	}
	return n, nil
}

func (s *server) execWS(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	// Answer an unknown sandbox before the upgrade, as plain HTTP.
	if _, err := s.b.GetSandbox(r.Context(), id); err != nil {
		s.error(w, r, err)
		return
	}
	conn, err := websocket.Accept(w, r, nil)
	if err != nil {
		return // Accept answered the client
	}
	defer conn.CloseNow()
	conn.SetReadLimit(1 << 20)
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	var wmu sync.Mutex
	control := func(c v1.ExecControl) error {
		b, _ := json.Marshal(c)
		wmu.Lock()
		defer wmu.Unlock()
		return conn.Write(ctx, websocket.MessageText, b)
	}
	fail := func(err error) {
		code, _ := errCode(err)
		_ = control(v1.ExecControl{Type: v1.ControlError, Error: err.Error(), Code: code})
		conn.Close(websocket.StatusNormalClosure, "")
	}

	typ, msg, err := conn.Read(ctx)
	if err != nil {
		return
	}
	var req v1.ExecRequest
	if typ != websocket.MessageText {
		fail(fmt.Errorf("first message must be the exec request as JSON text: %w", errdefs.ErrInvalidArgument))
		return
	}
	if err := json.Unmarshal(msg, &req); err != nil {
		fail(fmt.Errorf("decoding exec request: %v: %w", err, errdefs.ErrInvalidArgument)) //nolint:errorlint // classified by the sentinel alone: err's own class must not leak
		return
	}
	stdio := client.Stdio{
		Stdout: &wsStream{ctx: ctx, conn: conn, id: v1.StreamStdout, mu: &wmu},
		Stderr: &wsStream{ctx: ctx, conn: conn, id: v1.StreamStderr, mu: &wmu},
	}
	var stdinW *io.PipeWriter
	if req.Stdin {
		var stdinR *io.PipeReader
		stdinR, stdinW = io.Pipe()
		stdio.Stdin = stdinR
		defer func() { _ = stdinW.Close() }()
	}
	p, err := s.b.Exec(ctx, id, &req, stdio)
	if err != nil {
		if code, m, ok := startFailure(err); ok {
			_ = control(v1.ExecControl{Type: v1.ControlExit, ExitCode: code, Error: m, LatencyNS: latency(r)})
			conn.Close(websocket.StatusNormalClosure, "")
			return
		}
		fail(err)
		return
	}
	if err := control(v1.ExecControl{Type: v1.ControlStarted, PID: p.PID(), LatencyNS: latency(r)}); err != nil {
		if !req.Detach {
			_ = p.Signal(context.WithoutCancel(ctx), killSignal)
		}
		return
	}
	startNS := latency(r)

	// Client → server: stdin and controls, until the connection drops.
	gone := make(chan struct{})
	go func() {
		defer close(gone)
		for {
			typ, msg, err := conn.Read(ctx)
			if err != nil {
				return
			}
			switch typ {
			case websocket.MessageBinary:
				if len(msg) == 0 || msg[0] != v1.StreamStdin || stdinW == nil {
					continue
				}
				if len(msg) == 1 {
					_ = stdinW.Close()
					continue
				}
				if _, err := stdinW.Write(msg[1:]); err != nil {
					continue // the command closed its stdin
				}
			case websocket.MessageText:
				var c v1.ExecControl
				if json.Unmarshal(msg, &c) != nil {
					continue
				}
				switch c.Type {
				case v1.ControlResize:
					_ = p.Resize(ctx, c.Rows, c.Cols)
				case v1.ControlSignal:
					if n, err := signalNumber(c.Signal); err == nil {
						_ = p.Signal(ctx, n)
					}
				}
			}
		}
	}()

	type result struct {
		st  client.ExitStatus
		err error
	}
	done := make(chan result, 1)
	go func() {
		st, err := p.Wait(context.WithoutCancel(ctx))
		done <- result{st, err}
	}()
	select {
	case res := <-done:
		if res.err != nil {
			fail(fmt.Errorf("waiting for command: %w", res.err))
			return
		}
		_ = control(v1.ExecControl{Type: v1.ControlExit, PID: p.PID(), ExitCode: res.st.Code, TimedOut: res.st.TimedOut, LatencyNS: startNS})
		conn.Close(websocket.StatusNormalClosure, "")
	case <-gone:
		// The client dropped mid-command: kill it unless detached.
		if !req.Detach {
			kctx, kcancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			_ = p.Signal(kctx, killSignal)
			kcancel()
		}
	}
}
