package cli

// fakeDaemon is a tiny in-memory k7d for tests: the HTTP endpoints the SDK
// calls, with canned exec behaviour. a copy of sdk/fake_test.go; keep them in step.

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	v1 "github.com/k7-dev/k7/api/v1"
)

type fakeDaemon struct {
	mu        sync.Mutex
	sandboxes map[string]*v1.Sandbox
	files     map[string][]byte // "id:path"
	modes     map[string]string
	images    map[string]*v1.Image
	logs      map[string]string
	next      int
	token     string // when set, required as bearer token
}

func newFakeDaemon() *fakeDaemon {
	return &fakeDaemon{
		sandboxes: map[string]*v1.Sandbox{},
		files:     map[string][]byte{},
		modes:     map[string]string{},
		images: map[string]*v1.Image{
			"alpine:3": {ID: "sha256:aaaaaaaaaaaaaaaaaaaa", Refs: []string{"alpine:3"}, SizeBytes: 8 << 20},
		},
		logs: map[string]string{},
	}
}

// serveUnix serves f on a unix socket and returns the host string.
func (f *fakeDaemon) serveUnix(t *testing.T) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "k7.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(f.handler())
	srv.Listener.Close()
	srv.Listener = l
	srv.Start()
	t.Cleanup(srv.Close)
	return "unix://" + sock
}

// serveTCP serves f over plain HTTP and returns the host string.
func (f *fakeDaemon) serveTCP(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(f.handler())
	t.Cleanup(srv.Close)
	return srv.URL
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeErr(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, v1.Error{Error: msg, Code: code})
}

// lookup finds a sandbox by ID or name; f.mu is held.
func (f *fakeDaemon) lookup(idOrName string) *v1.Sandbox {
	if sb, ok := f.sandboxes[idOrName]; ok {
		return sb
	}
	for _, sb := range f.sandboxes {
		if sb.Name == idOrName {
			return sb
		}
	}
	return nil
}

func (f *fakeDaemon) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	mux.HandleFunc("GET /v1/info", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 200, v1.Info{Version: "fake-1.0", DefaultEngine: "fake", Engines: []v1.EngineInfo{{Name: "fake", Available: true}}, StateDir: "/var/lib/k7"})
	})
	mux.HandleFunc("POST /v1/sandboxes", func(w http.ResponseWriter, r *http.Request) {
		var req v1.CreateSandboxRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			writeErr(w, 400, v1.CodeInvalidArgument, "decoding request: "+err.Error())
			return
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		if _, ok := f.images[req.Image]; !ok {
			writeErr(w, 404, v1.CodeNotFound, fmt.Sprintf("image %q not found", req.Image))
			return
		}
		if req.Name != "" && f.lookup(req.Name) != nil {
			writeErr(w, 409, v1.CodeAlreadyExists, fmt.Sprintf("sandbox name %q already exists", req.Name))
			return
		}
		f.next++
		id := fmt.Sprintf("sb%010d", f.next)
		name := req.Name
		if name == "" {
			name = "sandbox-" + strconv.Itoa(f.next)
		}
		engine := req.Engine
		if engine == "" {
			engine = "fake"
		}
		sb := &v1.Sandbox{ID: id, Name: name, Image: req.Image, Engine: engine, State: v1.StateRunning,
			Env: req.Env, Resources: req.Resources, Created: time.Now().UTC(), LatencyNS: 1000}
		f.sandboxes[id] = sb
		f.logs[id] = "booted " + id + "\n"
		writeJSON(w, 201, sb)
	})
	mux.HandleFunc("GET /v1/sandboxes", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		l := v1.SandboxList{Sandboxes: []v1.Sandbox{}}
		for _, sb := range f.sandboxes {
			l.Sandboxes = append(l.Sandboxes, *sb)
		}
		sort.Slice(l.Sandboxes, func(i, j int) bool { return l.Sandboxes[i].ID < l.Sandboxes[j].ID })
		writeJSON(w, 200, l)
	})
	withSandbox := func(h func(w http.ResponseWriter, r *http.Request, sb *v1.Sandbox)) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			f.mu.Lock()
			sb := f.lookup(r.PathValue("id"))
			var cp v1.Sandbox
			if sb != nil {
				cp = *sb
			}
			f.mu.Unlock()
			if sb == nil {
				writeErr(w, 404, v1.CodeNotFound, fmt.Sprintf("sandbox %q not found", r.PathValue("id")))
				return
			}
			h(w, r, &cp)
		}
	}
	setState := func(from, to string) http.HandlerFunc {
		return withSandbox(func(w http.ResponseWriter, r *http.Request, sb *v1.Sandbox) {
			f.mu.Lock()
			defer f.mu.Unlock()
			if sb.State != from {
				writeErr(w, 412, v1.CodeFailedPrecondition, fmt.Sprintf("sandbox %s is %s, not %s", sb.ID, sb.State, from))
				return
			}
			f.sandboxes[sb.ID].State = to
			writeJSON(w, 200, v1.OpResult{ID: sb.ID, State: to, LatencyNS: 10})
		})
	}
	mux.HandleFunc("GET /v1/sandboxes/{id}", withSandbox(func(w http.ResponseWriter, r *http.Request, sb *v1.Sandbox) {
		sb.Stats = &v1.Stats{MemoryBytes: 1 << 20, PIDs: 1}
		writeJSON(w, 200, sb)
	}))
	mux.HandleFunc("POST /v1/sandboxes/{id}/pause", setState(v1.StateRunning, v1.StatePaused))
	mux.HandleFunc("POST /v1/sandboxes/{id}/resume", setState(v1.StatePaused, v1.StateRunning))
	mux.HandleFunc("DELETE /v1/sandboxes/{id}", withSandbox(func(w http.ResponseWriter, r *http.Request, sb *v1.Sandbox) {
		f.mu.Lock()
		defer f.mu.Unlock()
		delete(f.sandboxes, sb.ID)
		writeJSON(w, 200, v1.OpResult{ID: sb.ID, LatencyNS: 10})
	}))
	mux.HandleFunc("POST /v1/sandboxes/{id}/exec", withSandbox(func(w http.ResponseWriter, r *http.Request, sb *v1.Sandbox) {
		var req v1.ExecRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || len(req.Args) == 0 {
			writeErr(w, 400, v1.CodeInvalidArgument, "exec needs args")
			return
		}
		if req.Detach {
			writeJSON(w, 200, v1.ExecResult{PID: 42})
			return
		}
		var out, errb strings.Builder
		code, startErr := fakeCommand(req, strings.NewReader(string(req.StdinData)), &out, &errb, nil)
		if startErr != "" {
			errb.WriteString(startErr + "\n")
		}
		writeJSON(w, 200, v1.ExecResult{PID: 42, ExitCode: code, Stdout: []byte(out.String()), Stderr: []byte(errb.String())})
	}))
	mux.HandleFunc("GET /v1/sandboxes/{id}/exec/ws", withSandbox(f.execWS))
	mux.HandleFunc("GET /v1/sandboxes/{id}/logs", withSandbox(func(w http.ResponseWriter, r *http.Request, sb *v1.Sandbox) {
		f.mu.Lock()
		s := f.logs[sb.ID]
		f.mu.Unlock()
		io.WriteString(w, s)
	}))
	mux.HandleFunc("PUT /v1/sandboxes/{id}/files", withSandbox(func(w http.ResponseWriter, r *http.Request, sb *v1.Sandbox) {
		p := r.URL.Query().Get("path")
		if !strings.HasPrefix(p, "/") {
			writeErr(w, 400, v1.CodeInvalidArgument, fmt.Sprintf("path %q is not absolute", p))
			return
		}
		b, _ := io.ReadAll(r.Body)
		f.mu.Lock()
		f.files[sb.ID+":"+p] = b
		f.modes[sb.ID+":"+p] = r.URL.Query().Get("mode")
		f.mu.Unlock()
		w.WriteHeader(204)
	}))
	mux.HandleFunc("GET /v1/sandboxes/{id}/files", withSandbox(func(w http.ResponseWriter, r *http.Request, sb *v1.Sandbox) {
		p := r.URL.Query().Get("path")
		f.mu.Lock()
		b, ok := f.files[sb.ID+":"+p]
		f.mu.Unlock()
		if !ok {
			writeErr(w, 404, v1.CodeNotFound, fmt.Sprintf("open %s: no such file or directory", p))
			return
		}
		w.Write(b)
	}))
	mux.HandleFunc("GET /v1/images", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		l := v1.ImageList{Images: []v1.Image{}}
		for _, img := range f.images {
			l.Images = append(l.Images, *img)
		}
		sort.Slice(l.Images, func(i, j int) bool { return l.Images[i].ID < l.Images[j].ID })
		writeJSON(w, 200, l)
	})
	mux.HandleFunc("GET /v1/images/{ref}", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		img, ok := f.images[r.PathValue("ref")]
		f.mu.Unlock()
		if !ok {
			writeErr(w, 404, v1.CodeNotFound, fmt.Sprintf("image %q not found", r.PathValue("ref")))
			return
		}
		writeJSON(w, 200, img)
	})
	mux.HandleFunc("DELETE /v1/images/{ref}", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if _, ok := f.images[r.PathValue("ref")]; !ok {
			writeErr(w, 404, v1.CodeNotFound, fmt.Sprintf("image %q not found", r.PathValue("ref")))
			return
		}
		delete(f.images, r.PathValue("ref"))
		writeJSON(w, 200, v1.OpResult{ID: r.PathValue("ref")})
	})
	mux.HandleFunc("POST /v1/images/pull", func(w http.ResponseWriter, r *http.Request) {
		var req v1.PullRequest
		json.NewDecoder(r.Body).Decode(&req)
		enc := json.NewEncoder(w)
		enc.Encode(v1.PullProgress{Status: "resolving " + req.Ref})
		if strings.Contains(req.Ref, "missing") {
			enc.Encode(v1.PullProgress{Error: fmt.Sprintf("manifest for %s not found", req.Ref), Code: v1.CodeNotFound})
			return
		}
		enc.Encode(v1.PullProgress{Status: "downloading", TotalBytes: 100, DoneBytes: 50})
		enc.Encode(v1.PullProgress{Status: "downloading", TotalBytes: 100, DoneBytes: 100})
		img := &v1.Image{ID: "sha256:" + strings.Repeat("b", 64), Refs: []string{req.Ref}, SizeBytes: 100}
		f.mu.Lock()
		f.images[req.Ref] = img
		f.mu.Unlock()
		enc.Encode(v1.PullProgress{Status: "done", Image: img})
	})
	mux.HandleFunc("POST /v1/images/import", func(w http.ResponseWriter, r *http.Request) {
		name := r.URL.Query().Get("name")
		n, _ := io.Copy(io.Discard, r.Body)
		enc := json.NewEncoder(w)
		if n == 0 {
			enc.Encode(v1.PullProgress{Error: "empty archive", Code: v1.CodeInvalidArgument})
			return
		}
		img := &v1.Image{ID: "sha256:" + strings.Repeat("c", 64), Refs: []string{name}, SizeBytes: n}
		f.mu.Lock()
		f.images[name] = img
		f.mu.Unlock()
		enc.Encode(v1.PullProgress{Status: "unpacking", TotalBytes: n, DoneBytes: n})
		enc.Encode(v1.PullProgress{Status: "done", Image: img})
	})
	mux.HandleFunc("POST /v1/system/prune", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		res := v1.PruneResult{Sandboxes: []string{}}
		for id, sb := range f.sandboxes {
			if sb.State == v1.StateStopped || sb.State == v1.StateDead {
				delete(f.sandboxes, id)
				res.Sandboxes = append(res.Sandboxes, id)
			}
		}
		writeJSON(w, 200, res)
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if f.token != "" && r.Header.Get("Authorization") != "Bearer "+f.token {
			writeErr(w, 401, v1.CodeUnauthorized, "bad or missing token")
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// fakeCommand runs one canned command. It returns the exit code, or a start
// error message. resize, when non-nil, delivers terminal sizes and signals.
//
//	echo ARGS...   prints ARGS
//	cat            copies stdin to stdout
//	exit N         exits with N
//	stderr MSG     prints MSG on stderr, exits 1
//	env            prints the request's env, cwd and user
//	wait           waits for a control message: a resize is printed, a
//	               signal ends the command with 128+15
//	other          not found (127)
func fakeCommand(req v1.ExecRequest, stdin io.Reader, stdout, stderr io.Writer, ctl <-chan v1.ExecControl) (int, string) {
	switch req.Args[0] {
	case "echo":
		fmt.Fprintln(stdout, strings.Join(req.Args[1:], " "))
	case "cat":
		io.Copy(stdout, stdin)
	case "exit":
		n, _ := strconv.Atoi(req.Args[1])
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
func (f *fakeDaemon) execWS(w http.ResponseWriter, r *http.Request, sb *v1.Sandbox) {
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
		conn.Write(ctx, websocket.MessageText, b)
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
		stdinW.Close()
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
					stdinW.Close()
				} else if len(b) > 1 && b[0] == v1.StreamStdin {
					stdinW.Write(b[1:])
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
	if _, ok := fakeKnown[req.Args[0]]; ok {
		sendCtl(v1.ExecControl{Type: v1.ControlStarted, PID: 42})
	}
	code, startErr := fakeCommand(req, stdinR, out(v1.StreamStdout), out(v1.StreamStderr), ctl)
	sendCtl(v1.ExecControl{Type: v1.ControlExit, ExitCode: code, Error: startErr, LatencyNS: 5})
	conn.Close(websocket.StatusNormalClosure, "")
}

var fakeKnown = map[string]struct{}{"echo": {}, "cat": {}, "exit": {}, "stderr": {}, "env": {}, "wait": {}}

type writerFunc func(p []byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
