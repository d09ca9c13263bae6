package sdktest

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

	v1 "github.com/k7-dev/k7/api/v1"
)

// Version is what the fake daemon reports as its version.
const Version = "fake-1.0"

// Server is a fake k7 daemon serving the /v1 API.
type Server struct {
	// Host is the address to give sdk.New or k7 --host:
	// "unix:///.../k7.sock", or "http://127.0.0.1:PORT" with WithTCP.
	Host string
	// Socket is the path of the unix socket; empty with WithTCP.
	Socket string

	tb    testing.TB
	token string

	mu        sync.Mutex
	sandboxes map[string]*v1.Sandbox
	deleted   map[string]*v1.Sandbox // tombstones, kept for the fork tree
	files     map[string][]byte      // "id:path"
	modes     map[string]string      // "id:path": the mode query of the upload
	images    map[string]*v1.Image
	logs      map[string]string
	snapshots map[string]*v1.Snapshot
	snapFiles map[string]map[string][]byte // by snapshot, then path
	next      int
}

// Option configures NewServer.
type Option func(*Server)

// WithToken makes the server require "Authorization: Bearer TOKEN" on
// every request; others get 401 with code "unauthorized".
func WithToken(token string) Option { return func(s *Server) { s.token = token } }

// WithTCP serves plain HTTP on a loopback port instead of a unix socket.
func WithTCP() Option { return func(s *Server) { s.Socket = "-" } }

// NewServer starts a fake daemon with no sandboxes and the image
// "alpine:3". It is closed by tb.Cleanup.
func NewServer(tb testing.TB, opts ...Option) *Server {
	tb.Helper()
	s := &Server{
		tb:        tb,
		sandboxes: map[string]*v1.Sandbox{},
		deleted:   map[string]*v1.Sandbox{},
		files:     map[string][]byte{},
		modes:     map[string]string{},
		images: map[string]*v1.Image{
			"alpine:3": {ID: "sha256:aaaaaaaaaaaaaaaaaaaa", Refs: []string{"alpine:3"}, SizeBytes: 8 << 20},
		},
		logs:      map[string]string{},
		snapshots: map[string]*v1.Snapshot{},
		snapFiles: map[string]map[string][]byte{},
	}
	for _, o := range opts {
		o(s)
	}
	if s.Socket == "-" {
		s.Socket = ""
		srv := httptest.NewServer(s.handler())
		tb.Cleanup(srv.Close)
		s.Host = srv.URL
		return s
	}
	s.Socket = filepath.Join(tb.TempDir(), "k7.sock")
	l, err := net.Listen("unix", s.Socket)
	if err != nil {
		tb.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(s.handler())
	srv.Listener.Close()
	srv.Listener = l
	srv.Start()
	tb.Cleanup(srv.Close)
	s.Host = "unix://" + s.Socket
	return s
}

// Sandbox returns a copy of the sandbox with this ID or name.
func (s *Server) Sandbox(idOrName string) (v1.Sandbox, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sb := s.lookup(idOrName); sb != nil {
		return *sb, true
	}
	return v1.Sandbox{}, false
}

// SetState sets the state of the sandbox with this ID or name, as the
// daemon would when, say, its engine lost it (v1.StateDead). It fails the
// test if there is no such sandbox.
func (s *Server) SetState(idOrName, state string) {
	s.tb.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	sb := s.lookup(idOrName)
	if sb == nil {
		s.tb.Fatalf("sdktest: no sandbox %q", idOrName)
		return
	}
	sb.State = state
}

// File returns the content of a file last uploaded to (or forked into) a
// sandbox.
func (s *Server) File(id, path string) ([]byte, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.files[id+":"+path]
	return b, ok
}

// FileMode returns the mode query parameter ("0755") the last upload of
// path into sandbox id was sent with.
func (s *Server) FileMode(id, path string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.modes[id+":"+path]
}

// WriteError writes a /v1 error body, as k7d does.
func WriteError(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, v1.Error{Error: msg, Code: code})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func notFound(w http.ResponseWriter, kind, name string) {
	WriteError(w, 404, v1.CodeNotFound, fmt.Sprintf("%s %q not found", kind, name))
}

// lookup finds a sandbox by ID or name; s.mu is held.
func (s *Server) lookup(idOrName string) *v1.Sandbox {
	if sb, ok := s.sandboxes[idOrName]; ok {
		return sb
	}
	for _, sb := range s.sandboxes {
		if sb.Name == idOrName {
			return sb
		}
	}
	return nil
}

// newSandbox adds a running sandbox from tmpl with a fresh ID; s.mu is held.
func (s *Server) newSandbox(tmpl v1.Sandbox) *v1.Sandbox {
	s.next++
	sb := &tmpl
	sb.ID = fmt.Sprintf("sb%010d", s.next)
	if sb.Name == "" {
		sb.Name = "sandbox-" + strconv.Itoa(s.next)
	}
	if sb.Engine == "" {
		sb.Engine = "fake"
	}
	sb.State = v1.StateRunning
	sb.Created = time.Now().UTC()
	sb.LatencyNS = 1000
	s.sandboxes[sb.ID] = sb
	s.logs[sb.ID] = "booted " + sb.ID + "\n"
	return sb
}

// decode reads a JSON request body into v, answering 400 on failure.
func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	if err := json.NewDecoder(r.Body).Decode(v); err != nil && err != io.EOF {
		WriteError(w, 400, v1.CodeInvalidArgument, "decoding request: "+err.Error())
		return false
	}
	return true
}

func sortedValues[T any](m map[string]*T, less func(a, b *T) bool) []T {
	out := make([]T, 0, len(m))
	for _, v := range m {
		out = append(out, *v)
	}
	sort.Slice(out, func(i, j int) bool { return less(&out[i], &out[j]) })
	return out
}

// withSandbox resolves {id} and passes h a copy of the sandbox.
func (s *Server) withSandbox(h func(w http.ResponseWriter, r *http.Request, sb *v1.Sandbox)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		sb, ok := s.Sandbox(r.PathValue("id"))
		if !ok {
			notFound(w, "sandbox", r.PathValue("id"))
			return
		}
		h(w, r, &sb)
	}
}

func (s *Server) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") })
	mux.HandleFunc("GET /v1/info", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 200, v1.Info{Version: Version, DefaultEngine: "fake", Engines: []v1.EngineInfo{{Name: "fake", Available: true}}, StateDir: "/var/lib/k7"})
	})
	s.sandboxRoutes(mux)
	s.imageRoutes(mux)
	s.forkRoutes(mux)
	mux.HandleFunc("POST /v1/system/prune", func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		defer s.mu.Unlock()
		res := v1.PruneResult{Sandboxes: []string{}}
		for id, sb := range s.sandboxes {
			if sb.State == v1.StateStopped || sb.State == v1.StateDead {
				s.remove(id)
				res.Sandboxes = append(res.Sandboxes, id)
			}
		}
		writeJSON(w, 200, res)
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.token != "" && r.Header.Get("Authorization") != "Bearer "+s.token {
			WriteError(w, 401, v1.CodeUnauthorized, "bad or missing token")
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// remove deletes a sandbox, keeping a tombstone; s.mu is held.
func (s *Server) remove(id string) {
	sb := s.sandboxes[id]
	delete(s.sandboxes, id)
	sb.State = "deleted"
	s.deleted[id] = sb
}

func (s *Server) sandboxRoutes(mux *http.ServeMux) {
	mux.HandleFunc("POST /v1/sandboxes", func(w http.ResponseWriter, r *http.Request) {
		var req v1.CreateSandboxRequest
		if !decode(w, r, &req) {
			return
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		if _, ok := s.images[req.Image]; !ok {
			notFound(w, "image", req.Image)
			return
		}
		if req.Name != "" && s.lookup(req.Name) != nil {
			WriteError(w, 409, v1.CodeAlreadyExists, fmt.Sprintf("sandbox name %q already exists", req.Name))
			return
		}
		sb := s.newSandbox(v1.Sandbox{Name: req.Name, Image: req.Image, Engine: req.Engine, Env: req.Env, Resources: req.Resources})
		writeJSON(w, 201, sb)
	})
	mux.HandleFunc("GET /v1/sandboxes", func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		defer s.mu.Unlock()
		writeJSON(w, 200, v1.SandboxList{Sandboxes: sortedValues(s.sandboxes, func(a, b *v1.Sandbox) bool { return a.ID < b.ID })})
	})
	setState := func(from, to string) http.HandlerFunc {
		return s.withSandbox(func(w http.ResponseWriter, r *http.Request, sb *v1.Sandbox) {
			s.mu.Lock()
			defer s.mu.Unlock()
			if sb.State != from {
				WriteError(w, 412, v1.CodeFailedPrecondition, fmt.Sprintf("sandbox %s is %s, not %s", sb.ID, sb.State, from))
				return
			}
			s.sandboxes[sb.ID].State = to
			writeJSON(w, 200, v1.OpResult{ID: sb.ID, State: to, LatencyNS: 10})
		})
	}
	mux.HandleFunc("GET /v1/sandboxes/{id}", s.withSandbox(func(w http.ResponseWriter, r *http.Request, sb *v1.Sandbox) {
		sb.Stats = &v1.Stats{MemoryBytes: 1 << 20, PIDs: 1}
		writeJSON(w, 200, sb)
	}))
	mux.HandleFunc("POST /v1/sandboxes/{id}/pause", setState(v1.StateRunning, v1.StatePaused))
	mux.HandleFunc("POST /v1/sandboxes/{id}/resume", setState(v1.StatePaused, v1.StateRunning))
	mux.HandleFunc("DELETE /v1/sandboxes/{id}", s.withSandbox(func(w http.ResponseWriter, r *http.Request, sb *v1.Sandbox) {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.remove(sb.ID)
		writeJSON(w, 200, v1.OpResult{ID: sb.ID, LatencyNS: 10})
	}))
	mux.HandleFunc("POST /v1/sandboxes/{id}/exec", s.withSandbox(func(w http.ResponseWriter, r *http.Request, sb *v1.Sandbox) {
		var req v1.ExecRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || len(req.Args) == 0 {
			WriteError(w, 400, v1.CodeInvalidArgument, "exec needs args")
			return
		}
		if req.Detach {
			writeJSON(w, 200, v1.ExecResult{PID: 42})
			return
		}
		var out, errb strings.Builder
		code, startErr := runCommand(req, strings.NewReader(string(req.StdinData)), &out, &errb, nil)
		if startErr != "" {
			errb.WriteString(startErr + "\n")
		}
		writeJSON(w, 200, v1.ExecResult{PID: 42, ExitCode: code, Stdout: []byte(out.String()), Stderr: []byte(errb.String())})
	}))
	mux.HandleFunc("GET /v1/sandboxes/{id}/exec/ws", s.withSandbox(execWS))
	mux.HandleFunc("GET /v1/sandboxes/{id}/logs", s.withSandbox(func(w http.ResponseWriter, r *http.Request, sb *v1.Sandbox) {
		s.mu.Lock()
		l := s.logs[sb.ID]
		s.mu.Unlock()
		_, _ = io.WriteString(w, l)
	}))
	mux.HandleFunc("PUT /v1/sandboxes/{id}/files", s.withSandbox(func(w http.ResponseWriter, r *http.Request, sb *v1.Sandbox) {
		p := r.URL.Query().Get("path")
		if !strings.HasPrefix(p, "/") {
			WriteError(w, 400, v1.CodeInvalidArgument, fmt.Sprintf("path %q is not absolute", p))
			return
		}
		b, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		s.files[sb.ID+":"+p] = b
		s.modes[sb.ID+":"+p] = r.URL.Query().Get("mode")
		s.mu.Unlock()
		w.WriteHeader(204)
	}))
	mux.HandleFunc("GET /v1/sandboxes/{id}/files", s.withSandbox(func(w http.ResponseWriter, r *http.Request, sb *v1.Sandbox) {
		p := r.URL.Query().Get("path")
		b, ok := s.File(sb.ID, p)
		if !ok {
			WriteError(w, 404, v1.CodeNotFound, fmt.Sprintf("open %s: no such file or directory", p))
			return
		}
		_, _ = w.Write(b)
	}))
}

func (s *Server) imageRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /v1/images", func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		defer s.mu.Unlock()
		writeJSON(w, 200, v1.ImageList{Images: sortedValues(s.images, func(a, b *v1.Image) bool { return a.ID < b.ID })})
	})
	mux.HandleFunc("GET /v1/images/{ref}", func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		img, ok := s.images[r.PathValue("ref")]
		s.mu.Unlock()
		if !ok {
			notFound(w, "image", r.PathValue("ref"))
			return
		}
		writeJSON(w, 200, img)
	})
	mux.HandleFunc("DELETE /v1/images/{ref}", func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		defer s.mu.Unlock()
		if _, ok := s.images[r.PathValue("ref")]; !ok {
			notFound(w, "image", r.PathValue("ref"))
			return
		}
		delete(s.images, r.PathValue("ref"))
		writeJSON(w, 200, v1.OpResult{ID: r.PathValue("ref")})
	})
	mux.HandleFunc("POST /v1/images/pull", func(w http.ResponseWriter, r *http.Request) {
		var req v1.PullRequest
		_ = json.NewDecoder(r.Body).Decode(&req)
		enc := json.NewEncoder(w)
		_ = enc.Encode(v1.PullProgress{Status: "resolving " + req.Ref})
		if strings.Contains(req.Ref, "missing") {
			_ = enc.Encode(v1.PullProgress{Error: fmt.Sprintf("manifest for %s not found", req.Ref), Code: v1.CodeNotFound})
			return
		}
		_ = enc.Encode(v1.PullProgress{Status: "downloading", TotalBytes: 100, DoneBytes: 50})
		_ = enc.Encode(v1.PullProgress{Status: "downloading", TotalBytes: 100, DoneBytes: 100})
		s.addImage(enc, &v1.Image{ID: "sha256:" + strings.Repeat("b", 64), Refs: []string{req.Ref}, SizeBytes: 100})
	})
	mux.HandleFunc("POST /v1/images/import", func(w http.ResponseWriter, r *http.Request) {
		name := r.URL.Query().Get("name")
		n, _ := io.Copy(io.Discard, r.Body)
		enc := json.NewEncoder(w)
		if n == 0 {
			_ = enc.Encode(v1.PullProgress{Error: "empty archive", Code: v1.CodeInvalidArgument})
			return
		}
		_ = enc.Encode(v1.PullProgress{Status: "unpacking", TotalBytes: n, DoneBytes: n})
		s.addImage(enc, &v1.Image{ID: "sha256:" + strings.Repeat("c", 64), Refs: []string{name}, SizeBytes: n})
	})
}

// addImage stores img under its first ref and sends the final progress line.
func (s *Server) addImage(enc *json.Encoder, img *v1.Image) {
	s.mu.Lock()
	s.images[img.Refs[0]] = img
	s.mu.Unlock()
	_ = enc.Encode(v1.PullProgress{Status: "done", Image: img})
}
