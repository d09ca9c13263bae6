package sdktest

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"github.com/coder/websocket"

	v1 "github.com/k7-dev/k7/api/v1"
)

// commands are the canned commands; see the package doc.
var commands = map[string]struct{}{"echo": {}, "cat": {}, "exit": {}, "stderr": {}, "env": {}, "wait": {}}

// runCommand runs one canned command. It returns the exit code, or a start
// error message. ctl, when non-nil, delivers terminal sizes and signals.
func runCommand(req v1.ExecRequest, stdin io.Reader, stdout, stderr io.Writer, ctl <-chan v1.ExecControl) (int, string) {
	switch req.Args[0] {
	case "echo":
		fmt.Fprintln(stdout, strings.Join(req.Args[1:], " "))
	case "cat":
		_, _ = io.Copy(stdout, stdin)
	case "exit":
		n := 0
		if len(req.Args) > 1 {
			n, _ = strconv.Atoi(req.Args[1])
		}
		return n, ""
	case "stderr":
		fmt.Fprintln(stderr, strings.Join(req.Args[1:], " "))
		return 1, ""
	case "env":
		fmt.Fprintf(stdout, "env=%s cwd=%s user=%s tty=%v timeout=%d\n", strings.Join(req.Env, ","), req.Cwd, req.User, req.TTY, req.TimeoutNS)
	case "wait":
		for m := range ctl {
			switch m.Type {
			case v1.ControlResize:
				fmt.Fprintf(stdout, "resize %dx%d\n", m.Rows, m.Cols)
			case v1.ControlSignal:
				fmt.Fprintf(stdout, "signal %s\n", m.Signal)
				return 143, ""
			}
		}
	default:
		return 127, fmt.Sprintf("exec: %q: executable file not found in $PATH", req.Args[0])
	}
	return 0, ""
}

// execWS serves the exec WebSocket.
func execWS(w http.ResponseWriter, r *http.Request, sb *v1.Sandbox) {
	conn, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	defer conn.CloseNow()
	ctx := r.Context()
	typ, b, err := conn.Read(ctx)
	if err != nil || typ != websocket.MessageText {
		return
	}
	var req v1.ExecRequest
	sendCtl := func(m v1.ExecControl) {
		b, _ := json.Marshal(m)
		_ = conn.Write(ctx, websocket.MessageText, b)
	}
	if err := json.Unmarshal(b, &req); err != nil || len(req.Args) == 0 {
		sendCtl(v1.ExecControl{Type: v1.ControlError, Error: "exec needs args", Code: v1.CodeInvalidArgument})
		conn.Close(websocket.StatusNormalClosure, "")
		return
	}
	if sb.State != v1.StateRunning {
		sendCtl(v1.ExecControl{Type: v1.ControlError, Error: fmt.Sprintf("sandbox %s is %s", sb.ID, sb.State), Code: v1.CodeFailedPrecondition})
		conn.Close(websocket.StatusNormalClosure, "")
		return
	}
	stdinR, stdinW := io.Pipe()
	if !req.Stdin {
		_ = stdinW.Close()
	}
	ctl := make(chan v1.ExecControl, 16)
	go func() { // reader: stdin and control messages
		defer close(ctl)
		for {
			typ, b, err := conn.Read(ctx)
			if err != nil {
				stdinW.CloseWithError(err)
				return
			}
			if typ == websocket.MessageBinary {
				if len(b) == 1 && b[0] == v1.StreamStdin {
					_ = stdinW.Close()
				} else if len(b) > 1 && b[0] == v1.StreamStdin {
					_, _ = stdinW.Write(b[1:])
				}
				continue
			}
			var m v1.ExecControl
			if json.Unmarshal(b, &m) == nil {
				ctl <- m
			}
		}
	}()
	var wmu sync.Mutex
	out := func(stream byte) io.Writer {
		return writerFunc(func(p []byte) (int, error) {
			wmu.Lock()
			defer wmu.Unlock()
			msg := append([]byte{stream}, p...)
			return len(p), conn.Write(ctx, websocket.MessageBinary, msg)
		})
	}
	if _, ok := commands[req.Args[0]]; ok {
		sendCtl(v1.ExecControl{Type: v1.ControlStarted, PID: 42})
	}
	code, startErr := runCommand(req, stdinR, out(v1.StreamStdout), out(v1.StreamStderr), ctl)
	sendCtl(v1.ExecControl{Type: v1.ControlExit, ExitCode: code, Error: startErr, LatencyNS: 5})
	conn.Close(websocket.StatusNormalClosure, "")
}

type writerFunc func(p []byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
