// Package server is k7d's HTTP/JSON API (/v1, /healthz, /metrics). It
// decodes requests, calls the daemon through Backend, and translates errors
// into {"error","code"} bodies with the matching status (errdefs.Code).
//
// Every JSON answer carries latency_ns, the time spent inside the daemon.
// Handlers never hold a sandbox's lifetime: the backend runs sandbox work on
// its own context.
package server

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"time"

	v1 "github.com/k7-dev/k7/api/v1"
	"github.com/k7-dev/k7/internal/agent/client"
	"github.com/k7-dev/k7/internal/errdefs"
	"github.com/k7-dev/k7/internal/metrics"
)

// Backend is the daemon as the API sees it. Errors are classified with
// errdefs.
type Backend interface {
	Info(ctx context.Context) *v1.Info

	CreateSandbox(ctx context.Context, req *v1.CreateSandboxRequest) (*v1.Sandbox, error)
	ListSandboxes(ctx context.Context) ([]v1.Sandbox, error)
	GetSandbox(ctx context.Context, ref string) (*v1.Sandbox, error)
	PauseSandbox(ctx context.Context, ref string) (*v1.OpResult, error)
	ResumeSandbox(ctx context.Context, ref string) (*v1.OpResult, error)
	DeleteSandbox(ctx context.Context, ref string, force bool) (*v1.OpResult, error)
	Prune(ctx context.Context) ([]string, error)

	// Exec starts a command; ctx bounds the start only.
	Exec(ctx context.Context, ref string, req *v1.ExecRequest, stdio client.Stdio) (client.Process, error)
	PutFile(ctx context.Context, ref, path string, mode uint32, r io.Reader) error
	GetFile(ctx context.Context, ref, path string, w io.Writer) error
	Logs(ctx context.Context, ref string, follow bool, w io.Writer, start, flush func()) error

	ListImages(ctx context.Context) ([]v1.Image, error)
	GetImage(ctx context.Context, ref string) (*v1.Image, error)
	RemoveImage(ctx context.Context, ref string) error
	PullImage(ctx context.Context, req *v1.PullRequest, progress func(v1.PullProgress)) (*v1.Image, error)
	ImportImage(ctx context.Context, r io.Reader, name string, progress func(v1.PullProgress)) (*v1.Image, error)

	Fork(ctx context.Context, ref string, req *v1.ForkRequest) (*v1.ForkResult, error)
	CreateSnapshot(ctx context.Context, ref string, req *v1.SnapshotRequest) (*v1.Snapshot, error)
	ListSnapshots(ctx context.Context) (*v1.SnapshotList, error)
	GetSnapshot(ctx context.Context, name string) (*v1.Snapshot, error)
	DeleteSnapshot(ctx context.Context, name string) error
	RestoreSnapshot(ctx context.Context, name string, req *v1.RestoreRequest) (*v1.ForkResult, error)
	PruneSnapshots(ctx context.Context, req *v1.SnapshotPruneRequest) (*v1.SnapshotPruneResult, error)
	Tree(ctx context.Context, root string) (*v1.Tree, error)
}

// Body limits.
const (
	MaxJSONBody   = 1 << 20 // bytes of a JSON request body
	MaxFileBody   = 1 << 30 // bytes of a file upload
	MaxImportBody = 8 << 30 // bytes of an image archive
)

// Options configure the handler.
type Options struct {
	Log     *slog.Logger     // default: discard
	Metrics *metrics.Metrics // default: a private set
	// ExecOutputLimit caps stdout and stderr each of a non-streaming exec,
	// in bytes. Default 16 MiB.
	ExecOutputLimit int64
}

type server struct {
	b       Backend
	log     *slog.Logger
	metrics *metrics.Metrics
	outMax  int64
}

type startKey struct{}

// New returns the API handler.
func New(b Backend, o Options) http.Handler {
	s := &server{b: b, log: o.Log, metrics: o.Metrics, outMax: o.ExecOutputLimit}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.metrics == nil {
		s.metrics = metrics.New(nil)
	}
	if s.outMax <= 0 {
		s.outMax = 16 << 20
	}
	mux := http.NewServeMux()
	h := func(pattern string, fn http.HandlerFunc) { mux.Handle(pattern, fn) }

	h("GET /healthz", s.healthz)
	mux.Handle("GET /metrics", s.metrics.Handler())
	h("GET /v1/info", s.info)

	h("POST /v1/sandboxes", s.createSandbox)
	h("GET /v1/sandboxes", s.listSandboxes)
	h("GET /v1/sandboxes/{id}", s.getSandbox)
	h("POST /v1/sandboxes/{id}/pause", s.pause)
	h("POST /v1/sandboxes/{id}/resume", s.resume)
	h("DELETE /v1/sandboxes/{id}", s.deleteSandbox)
	h("POST /v1/sandboxes/{id}/exec", s.exec)
	h("GET /v1/sandboxes/{id}/exec/ws", s.execWS)
	h("GET /v1/sandboxes/{id}/logs", s.logs)
	h("PUT /v1/sandboxes/{id}/files", s.putFile)
	h("GET /v1/sandboxes/{id}/files", s.getFile)
	h("POST /v1/sandboxes/{id}/fork", s.fork)
	h("POST /v1/sandboxes/{id}/snapshots", s.createSnapshot)

	h("GET /v1/images", s.listImages)
	h("GET /v1/images/{ref...}", s.getImage)
	h("DELETE /v1/images/{ref...}", s.removeImage)
	h("POST /v1/images/pull", s.pull)
	h("POST /v1/images/import", s.importImage)

	h("GET /v1/snapshots", s.listSnapshots)
	h("GET /v1/snapshots/{name}", s.getSnapshot)
	h("DELETE /v1/snapshots/{name}", s.deleteSnapshot)
	h("POST /v1/snapshots/{name}/restore", s.restore)
	h("POST /v1/snapshots/prune", s.pruneSnapshots)
	h("GET /v1/tree", s.tree)

	h("POST /v1/system/prune", s.prune)

	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.error(w, r, fmt.Errorf("no route for %s %s: %w", r.Method, r.URL.Path, errdefs.ErrNotFound))
	})
	return s.instrument(mux)
}

// statusWriter records the status code; it passes Flush and Hijack
// through (streams, WebSockets).
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (s *server) instrument(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		r = r.WithContext(context.WithValue(r.Context(), startKey{}, start))
		sw := &statusWriter{ResponseWriter: w}
		next.ServeHTTP(sw, r)
		route := r.Pattern
		if route == "" {
			route = "unmatched"
		}
		if sw.code == 0 {
			sw.code = http.StatusOK
		}
		d := time.Since(start)
		s.metrics.ObserveRequest(route, r.Method, sw.code, d)
		s.log.Debug("request", "method", r.Method, "path", r.URL.Path, "code", sw.code, "took", d)
	})
}

func latency(r *http.Request) int64 {
	if t, ok := r.Context().Value(startKey{}).(time.Time); ok {
		return int64(time.Since(t))
	}
	return 0
}

// RequireToken wraps h so that every request but /healthz must carry
// "Authorization: Bearer <token>"; the comparison takes constant time.
func RequireToken(h http.Handler, token string) http.Handler {
	want := []byte("Bearer " + token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got := []byte(r.Header.Get("Authorization"))
		if r.URL.Path != "/healthz" && subtle.ConstantTimeCompare(got, want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="k7"`)
			writeJSONStatus(w, http.StatusUnauthorized, &v1.Error{Error: "missing or wrong bearer token", Code: v1.CodeUnauthorized}, 0)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// writeJSON answers v with status, stamping latency_ns: into v's LatencyNS
// field if it has one, else as an extra member of the object.
func (s *server) writeJSON(w http.ResponseWriter, r *http.Request, status int, v any) {
	writeJSONStatus(w, status, v, latency(r))
}

func writeJSONStatus(w http.ResponseWriter, status int, v any, ns int64) {
	stamped := false
	if rv := reflect.ValueOf(v); rv.Kind() == reflect.Pointer && !rv.IsNil() && rv.Elem().Kind() == reflect.Struct {
		if f := rv.Elem().FieldByName("LatencyNS"); f.IsValid() && f.CanSet() && f.Kind() == reflect.Int64 {
			f.SetInt(ns)
			stamped = true
		}
	}
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	if !stamped && len(b) >= 2 && b[0] == '{' {
		extra := `"latency_ns":` + strconv.FormatInt(ns, 10)
		if len(b) > 2 {
			extra = "," + extra
		}
		b = append(b[:len(b)-1], append([]byte(extra), '}')...)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

func (s *server) error(w http.ResponseWriter, r *http.Request, err error) {
	code, status := errCode(err)
	if status >= 500 {
		s.log.Warn("request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	}
	s.writeJSON(w, r, status, &v1.Error{Error: err.Error(), Code: code})
}

// errCode classifies err, adding what errdefs does not know: body limits,
// malformed JSON and cancellations.
func errCode(err error) (string, int) {
	var mb *http.MaxBytesError
	switch {
	case errors.As(err, &mb):
		return v1.CodeInvalidArgument, http.StatusRequestEntityTooLarge
	case errors.Is(err, context.DeadlineExceeded):
		return v1.CodeUnavailable, http.StatusGatewayTimeout
	}
	return errdefs.Code(err)
}

// decode reads a JSON body of at most MaxJSONBody bytes into v. An empty
// body leaves v as is.
func decode(w http.ResponseWriter, r *http.Request, v any) error {
	body := http.MaxBytesReader(w, r.Body, MaxJSONBody)
	b, err := io.ReadAll(body)
	if err != nil {
		return fmt.Errorf("reading body: %w", err)
	}
	if len(bytes.TrimSpace(b)) == 0 {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("decoding JSON body: %v: %w", err, errdefs.ErrInvalidArgument) //nolint:errorlint // classified by the sentinel alone: err's own class must not leak
	}
	return nil
}

func boolQuery(r *http.Request, name string) bool {
	v := strings.ToLower(r.URL.Query().Get(name))
	return v == "1" || v == "true" || v == "yes"
}

func (s *server) healthz(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain")
	_, _ = io.WriteString(w, "ok\n")
}

func (s *server) info(w http.ResponseWriter, r *http.Request) {
	s.writeJSON(w, r, http.StatusOK, s.b.Info(r.Context()))
}

func (s *server) createSandbox(w http.ResponseWriter, r *http.Request) {
	var req v1.CreateSandboxRequest
	if err := decode(w, r, &req); err != nil {
		s.error(w, r, err)
		return
	}
	sb, err := s.b.CreateSandbox(r.Context(), &req)
	if err != nil {
		s.error(w, r, err)
		return
	}
	s.writeJSON(w, r, http.StatusCreated, sb)
}

func (s *server) listSandboxes(w http.ResponseWriter, r *http.Request) {
	l, err := s.b.ListSandboxes(r.Context())
	if err != nil {
		s.error(w, r, err)
		return
	}
	s.writeJSON(w, r, http.StatusOK, &v1.SandboxList{Sandboxes: l})
}

func (s *server) getSandbox(w http.ResponseWriter, r *http.Request) {
	sb, err := s.b.GetSandbox(r.Context(), r.PathValue("id"))
	if err != nil {
		s.error(w, r, err)
		return
	}
	s.writeJSON(w, r, http.StatusOK, sb)
}

func (s *server) op(w http.ResponseWriter, r *http.Request, fn func(context.Context, string) (*v1.OpResult, error)) {
	res, err := fn(r.Context(), r.PathValue("id"))
	if err != nil {
		s.error(w, r, err)
		return
	}
	s.writeJSON(w, r, http.StatusOK, res)
}

func (s *server) pause(w http.ResponseWriter, r *http.Request)  { s.op(w, r, s.b.PauseSandbox) }
func (s *server) resume(w http.ResponseWriter, r *http.Request) { s.op(w, r, s.b.ResumeSandbox) }

func (s *server) deleteSandbox(w http.ResponseWriter, r *http.Request) {
	force := boolQuery(r, "force")
	s.op(w, r, func(ctx context.Context, id string) (*v1.OpResult, error) { return s.b.DeleteSandbox(ctx, id, force) })
}

func (s *server) prune(w http.ResponseWriter, r *http.Request) {
	ids, err := s.b.Prune(r.Context())
	if err != nil {
		s.error(w, r, err)
		return
	}
	s.writeJSON(w, r, http.StatusOK, &v1.PruneResult{Sandboxes: ids})
}

func (s *server) putFile(w http.ResponseWriter, r *http.Request) {
	mode := uint64(0o644)
	if m := r.URL.Query().Get("mode"); m != "" {
		var err error
		if mode, err = strconv.ParseUint(m, 8, 32); err != nil || mode > 0o7777 {
			s.error(w, r, fmt.Errorf("invalid mode %q: want octal like 0644: %w", m, errdefs.ErrInvalidArgument))
			return
		}
	}
	body := http.MaxBytesReader(w, r.Body, MaxFileBody)
	if err := s.b.PutFile(r.Context(), r.PathValue("id"), r.URL.Query().Get("path"), uint32(mode), body); err != nil {
		s.error(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// lazyWriter sends the header before the first byte, so that an error
// found before any output can still be answered as JSON.
type lazyWriter struct {
	w           http.ResponseWriter
	contentType string
	started     bool
}

func (l *lazyWriter) start() {
	if !l.started {
		l.started = true
		l.w.Header().Set("Content-Type", l.contentType)
		l.w.WriteHeader(http.StatusOK)
	}
}

func (l *lazyWriter) Write(b []byte) (int, error) {
	l.start()
	return l.w.Write(b)
}

func (l *lazyWriter) flush() {
	if f, ok := l.w.(http.Flusher); ok {
		f.Flush()
	}
}

func (s *server) getFile(w http.ResponseWriter, r *http.Request) {
	lw := &lazyWriter{w: w, contentType: "application/octet-stream"}
	err := s.b.GetFile(r.Context(), r.PathValue("id"), r.URL.Query().Get("path"), lw)
	if err != nil {
		if !lw.started {
			s.error(w, r, err)
			return
		}
		s.log.Warn("file download broken off", "path", r.URL.Query().Get("path"), "err", err)
		return
	}
	lw.start() // an empty file
}

func (s *server) logs(w http.ResponseWriter, r *http.Request) {
	lw := &lazyWriter{w: w, contentType: "text/plain; charset=utf-8"}
	err := s.b.Logs(r.Context(), r.PathValue("id"), boolQuery(r, "follow"), lw, func() { lw.start(); lw.flush() }, lw.flush)
	if err != nil && !lw.started {
		s.error(w, r, err)
	}
}

func (s *server) listImages(w http.ResponseWriter, r *http.Request) {
	l, err := s.b.ListImages(r.Context())
	if err != nil {
		s.error(w, r, err)
		return
	}
	s.writeJSON(w, r, http.StatusOK, &v1.ImageList{Images: l})
}

func (s *server) getImage(w http.ResponseWriter, r *http.Request) {
	img, err := s.b.GetImage(r.Context(), r.PathValue("ref"))
	if err != nil {
		s.error(w, r, err)
		return
	}
	s.writeJSON(w, r, http.StatusOK, img)
}

func (s *server) removeImage(w http.ResponseWriter, r *http.Request) {
	ref := r.PathValue("ref")
	if err := s.b.RemoveImage(r.Context(), ref); err != nil {
		s.error(w, r, err)
		return
	}
	s.writeJSON(w, r, http.StatusOK, &v1.OpResult{ID: ref, State: "deleted"})
}

// ndjson streams PullProgress lines, one flush per line.
type ndjson struct {
	w       http.ResponseWriter
	enc     *json.Encoder
	started bool
}

func newNDJSON(w http.ResponseWriter) *ndjson { return &ndjson{w: w, enc: json.NewEncoder(w)} }

func (n *ndjson) send(p v1.PullProgress) {
	if !n.started {
		n.started = true
		n.w.Header().Set("Content-Type", "application/x-ndjson")
		n.w.WriteHeader(http.StatusOK)
	}
	_ = n.enc.Encode(p)
	if f, ok := n.w.(http.Flusher); ok {
		f.Flush()
	}
}

func (n *ndjson) finish(img *v1.Image, err error) {
	if err != nil {
		code, _ := errCode(err)
		n.send(v1.PullProgress{Status: "error", Error: err.Error(), Code: code})
		return
	}
	n.send(v1.PullProgress{Status: "done", Image: img})
}

func (s *server) pull(w http.ResponseWriter, r *http.Request) {
	var req v1.PullRequest
	if err := decode(w, r, &req); err != nil {
		s.error(w, r, err)
		return
	}
	if req.Ref == "" {
		s.error(w, r, fmt.Errorf("ref is required: %w", errdefs.ErrInvalidArgument))
		return
	}
	n := newNDJSON(w)
	img, err := s.b.PullImage(r.Context(), &req, n.send)
	n.finish(img, err)
}

func (s *server) importImage(w http.ResponseWriter, r *http.Request) {
	body := http.MaxBytesReader(w, r.Body, MaxImportBody)
	n := newNDJSON(w)
	img, err := s.b.ImportImage(r.Context(), body, r.URL.Query().Get("name"), n.send)
	n.finish(img, err)
}

func (s *server) fork(w http.ResponseWriter, r *http.Request) {
	var req v1.ForkRequest
	if err := decode(w, r, &req); err != nil {
		s.error(w, r, err)
		return
	}
	res, err := s.b.Fork(r.Context(), r.PathValue("id"), &req)
	if err != nil {
		s.error(w, r, err)
		return
	}
	s.writeJSON(w, r, http.StatusCreated, res)
}

func (s *server) createSnapshot(w http.ResponseWriter, r *http.Request) {
	var req v1.SnapshotRequest
	if err := decode(w, r, &req); err != nil {
		s.error(w, r, err)
		return
	}
	sn, err := s.b.CreateSnapshot(r.Context(), r.PathValue("id"), &req)
	if err != nil {
		s.error(w, r, err)
		return
	}
	s.writeJSON(w, r, http.StatusCreated, sn)
}

func (s *server) listSnapshots(w http.ResponseWriter, r *http.Request) {
	l, err := s.b.ListSnapshots(r.Context())
	if err != nil {
		s.error(w, r, err)
		return
	}
	s.writeJSON(w, r, http.StatusOK, l)
}

func (s *server) getSnapshot(w http.ResponseWriter, r *http.Request) {
	sn, err := s.b.GetSnapshot(r.Context(), r.PathValue("name"))
	if err != nil {
		s.error(w, r, err)
		return
	}
	s.writeJSON(w, r, http.StatusOK, sn)
}

func (s *server) deleteSnapshot(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if err := s.b.DeleteSnapshot(r.Context(), name); err != nil {
		s.error(w, r, err)
		return
	}
	s.writeJSON(w, r, http.StatusOK, &v1.OpResult{ID: name, State: "deleted"})
}

func (s *server) restore(w http.ResponseWriter, r *http.Request) {
	var req v1.RestoreRequest
	if err := decode(w, r, &req); err != nil {
		s.error(w, r, err)
		return
	}
	res, err := s.b.RestoreSnapshot(r.Context(), r.PathValue("name"), &req)
	if err != nil {
		s.error(w, r, err)
		return
	}
	s.writeJSON(w, r, http.StatusCreated, res)
}

func (s *server) pruneSnapshots(w http.ResponseWriter, r *http.Request) {
	var req v1.SnapshotPruneRequest
	if err := decode(w, r, &req); err != nil {
		s.error(w, r, err)
		return
	}
	res, err := s.b.PruneSnapshots(r.Context(), &req)
	if err != nil {
		s.error(w, r, err)
		return
	}
	s.writeJSON(w, r, http.StatusOK, res)
}

func (s *server) tree(w http.ResponseWriter, r *http.Request) {
	t, err := s.b.Tree(r.Context(), r.URL.Query().Get("root"))
	if err != nil {
		s.error(w, r, err)
		return
	}
	s.writeJSON(w, r, http.StatusOK, t)
}
