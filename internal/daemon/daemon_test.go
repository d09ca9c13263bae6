package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	v1 "github.com/k7-dev/k7/api/v1"
	"github.com/k7-dev/k7/internal/engine"
	"github.com/k7-dev/k7/internal/errdefs"
)

// harness is one running k7d serving on a unix socket in a temp dir.
type harness struct {
	t      *testing.T
	cfg    Config
	eng    engine.Engine
	hc     *http.Client
	cancel context.CancelFunc
	done   chan error
}

func testConfig(t *testing.T, dir string) Config {
	cfg := DefaultConfig()
	cfg.StateDir = filepath.Join(dir, "state")
	// Unix socket paths are limited to 108 bytes: keep it short.
	sock, err := os.MkdirTemp("", "k7s")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sock) })
	cfg.Socket = filepath.Join(sock, "k7.sock")
	cfg.Engines = []string{"fake"}
	cfg.DefaultEngine = "fake"
	cfg.ReconcileInterval = 100 * time.Millisecond
	return cfg
}

func startDaemon(t *testing.T, cfg Config, eng engine.Engine) *harness {
	t.Helper()
	return startDaemonNet(t, cfg, eng, nil)
}

// startDaemonNet starts a daemon whose network manager is nets (nil: the
// real one, opened on first use).
func startDaemonNet(t *testing.T, cfg Config, eng engine.Engine, nets Networks) *harness {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	h := &harness{t: t, cfg: cfg, eng: eng, cancel: cancel, done: make(chan error, 1)}
	opts := Options{
		Engines:  []engine.Engine{eng},
		Images:   testImages{dir: t.TempDir()},
		NewAgent: newTestAgent,
		Network:  nets,
	}
	go func() { h.done <- Run(ctx, cfg, opts) }()
	h.hc = &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", cfg.Socket)
	}}}
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := h.hc.Get("http://k7d/healthz")
		if err == nil {
			resp.Body.Close()
			break
		}
		select {
		case err := <-h.done:
			t.Fatalf("daemon exited during start: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("daemon did not answer: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Cleanup(func() { h.stop() })
	return h
}

// stop shuts the daemon down gracefully and checks that it exited cleanly.
func (h *harness) stop() {
	if h.cancel == nil {
		return
	}
	h.cancel()
	h.cancel = nil
	select {
	case err := <-h.done:
		if err != nil {
			h.t.Errorf("Run() = %v, want nil after graceful shutdown", err)
		}
	case <-time.After(10 * time.Second):
		h.t.Errorf("daemon did not stop")
	}
	if _, err := os.Stat(h.cfg.Socket); !errors.Is(err, os.ErrNotExist) {
		h.t.Errorf("socket left behind after shutdown: %v", err)
	}
}

// do sends a request and decodes the JSON answer into out (if not nil). It
// returns the status and, for errors, the decoded error body.
func (h *harness) do(method, path string, in, out any) (int, v1.Error) {
	h.t.Helper()
	var body io.Reader
	switch v := in.(type) {
	case nil:
	case string:
		body = strings.NewReader(v)
	case []byte:
		body = bytes.NewReader(v)
	default:
		b, _ := json.Marshal(v)
		body = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, "http://k7d"+path, body)
	resp, err := h.hc.Do(req)
	if err != nil {
		h.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var e v1.Error
	if resp.StatusCode >= 300 {
		if err := json.Unmarshal(b, &e); err != nil {
			h.t.Fatalf("%s %s: status %d with non-JSON body %q", method, path, resp.StatusCode, b)
		}
		return resp.StatusCode, e
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			h.t.Fatalf("%s %s: decoding %q: %v", method, path, b, err)
		}
	}
	return resp.StatusCode, e
}

func (h *harness) create(name string) v1.Sandbox {
	h.t.Helper()
	var sb v1.Sandbox
	code, e := h.do("POST", "/v1/sandboxes", v1.CreateSandboxRequest{Image: "busybox", Name: name, Env: []string{"A=1"}}, &sb)
	if code != http.StatusCreated {
		h.t.Fatalf("create %q: status %d, %+v", name, code, e)
	}
	return sb
}

func (h *harness) run(id string, args ...string) v1.ExecResult {
	h.t.Helper()
	var r v1.ExecResult
	code, e := h.do("POST", "/v1/sandboxes/"+id+"/exec", v1.ExecRequest{Args: args}, &r)
	if code != http.StatusOK {
		h.t.Fatalf("exec %v in %s: status %d, %+v", args, id, code, e)
	}
	return r
}

func (h *harness) get(id string) (v1.Sandbox, int) {
	h.t.Helper()
	var sb v1.Sandbox
	code, _ := h.do("GET", "/v1/sandboxes/"+id, nil, &sb)
	return sb, code
}

// waitState polls until the sandbox is in state want.
func (h *harness) waitState(id, want string) v1.Sandbox {
	h.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		var l v1.SandboxList
		h.do("GET", "/v1/sandboxes", nil, &l)
		for _, sb := range l.Sandboxes {
			if sb.ID == id && sb.State == want {
				return sb
			}
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("sandbox %s did not become %s: %+v", id, want, l.Sandboxes)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestLifecycle(t *testing.T) {
	eng := newTestEngine(false)
	h := startDaemon(t, testConfig(t, t.TempDir()), eng)

	sb := h.create("web")
	if len(sb.ID) != 16 || sb.State != v1.StateRunning || sb.Hostname != "web" || sb.Engine != "fake" || sb.ImageID != testImage.ID {
		t.Fatalf("created sandbox = %+v", sb)
	}
	if sb.LatencyNS <= 0 {
		t.Errorf("latency_ns = %d, want > 0", sb.LatencyNS)
	}
	for _, ref := range []string{sb.ID, "web", sb.ID[:6]} {
		got, code := h.get(ref)
		if code != 200 || got.ID != sb.ID || got.Stats == nil {
			t.Errorf("GET %s = %d %+v, want the sandbox with stats", ref, code, got)
		}
	}

	r := h.run("web", "echo", "hello")
	if string(r.Stdout) != "hello\n" || r.ExitCode != 0 || r.PID == 0 || r.LatencyNS <= 0 {
		t.Errorf("exec echo = %+v", r)
	}
	if r := h.run("web", "fail"); r.ExitCode != 3 || string(r.Stderr) != "failing\n" {
		t.Errorf("exec fail = %+v, want exit 3 with stderr", r)
	}
	if r := h.run("web", "hostname"); string(r.Stdout) != "web\n" {
		t.Errorf("hostname = %q, want web", r.Stdout)
	}
	if r := h.run("web", "nosuch"); r.ExitCode != 127 || !strings.Contains(string(r.Stderr), "not found") {
		t.Errorf("exec nosuch = %+v, want 127 with the reason on stderr", r)
	}
	var cat v1.ExecResult
	h.do("POST", "/v1/sandboxes/web/exec", v1.ExecRequest{Args: []string{"cat"}, StdinData: []byte("piped")}, &cat)
	if string(cat.Stdout) != "piped" {
		t.Errorf("cat with stdin_data = %q, want piped", cat.Stdout)
	}

	var op v1.OpResult
	if code, e := h.do("POST", "/v1/sandboxes/web/pause", nil, &op); code != 200 || op.State != v1.StatePaused {
		t.Fatalf("pause = %d %+v %+v", code, op, e)
	}
	code, e := h.do("POST", "/v1/sandboxes/web/exec", v1.ExecRequest{Args: []string{"echo"}}, nil)
	if code != http.StatusPreconditionFailed || e.Code != v1.CodeFailedPrecondition || !strings.Contains(e.Error, "is paused") {
		t.Errorf("exec into paused = %d %+v, want 412 failed_precondition", code, e)
	}
	if code, e := h.do("POST", "/v1/sandboxes/web/pause", nil, nil); code != http.StatusPreconditionFailed {
		t.Errorf("pause paused = %d %+v, want 412", code, e)
	}
	if code, _ := h.do("POST", "/v1/sandboxes/web/resume", nil, &op); code != 200 || op.State != v1.StateRunning {
		t.Fatalf("resume = %d %+v", code, op)
	}
	if code, _ := h.do("POST", "/v1/sandboxes/web/resume", nil, nil); code != http.StatusPreconditionFailed {
		t.Errorf("resume running = %d, want 412", code)
	}
	if r := h.run("web", "echo", "again"); string(r.Stdout) != "again\n" {
		t.Errorf("exec after resume = %+v", r)
	}

	// Files.
	req, _ := http.NewRequest("PUT", "http://k7d/v1/sandboxes/web/files?path=/tmp/a.txt&mode=0600", strings.NewReader("content"))
	resp, err := h.hc.Do(req)
	if err != nil || resp.StatusCode != http.StatusNoContent {
		t.Fatalf("PUT file = %v %v", resp, err)
	}
	resp.Body.Close()
	resp, err = h.hc.Get("http://k7d/v1/sandboxes/web/files?path=/tmp/a.txt")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != "content" {
		t.Errorf("GET file = %d %q, want content", resp.StatusCode, b)
	}
	for _, p := range []string{"tmp/a", "/tmp/../etc/passwd", ""} {
		if code, e := h.do("GET", "/v1/sandboxes/web/files?path="+p, nil, nil); code != 400 || e.Code != v1.CodeInvalidArgument {
			t.Errorf("GET file %q = %d %+v, want 400 invalid_argument", p, code, e)
		}
	}
	if code, e := h.do("GET", "/v1/sandboxes/web/files?path=/nope", nil, nil); code != 404 {
		t.Errorf("GET missing file = %d %+v, want 404", code, e)
	}

	if code, _ := h.do("DELETE", "/v1/sandboxes/web", nil, &op); code != 200 || op.ID != sb.ID {
		t.Fatalf("delete = %d %+v", code, op)
	}
	if eng.has(sb.ID) {
		t.Errorf("engine still has the sandbox after delete")
	}
	if _, code := h.get("web"); code != 404 {
		t.Errorf("GET deleted = %d, want 404", code)
	}
	// The name is free again.
	h.create("web")
}

func TestBadRequests(t *testing.T) {
	h := startDaemon(t, testConfig(t, t.TempDir()), newTestEngine(false))
	h.create("taken")
	tests := []struct {
		name       string
		method     string
		path       string
		body       any
		wantStatus int
		wantCode   string
	}{
		{"bad name", "POST", "/v1/sandboxes", v1.CreateSandboxRequest{Image: "busybox", Name: "-x"}, 400, v1.CodeInvalidArgument},
		{"long name", "POST", "/v1/sandboxes", v1.CreateSandboxRequest{Image: "busybox", Name: strings.Repeat("a", 64)}, 400, v1.CodeInvalidArgument},
		{"bad env", "POST", "/v1/sandboxes", v1.CreateSandboxRequest{Image: "busybox", Env: []string{"NOEQUALS"}}, 400, v1.CodeInvalidArgument},
		{"negative cpus", "POST", "/v1/sandboxes", v1.CreateSandboxRequest{Image: "busybox", Resources: v1.Resources{CPUs: -1}}, 400, v1.CodeInvalidArgument},
		{"tiny memory", "POST", "/v1/sandboxes", v1.CreateSandboxRequest{Image: "busybox", Resources: v1.Resources{MemoryBytes: 1 << 20}}, 400, v1.CodeInvalidArgument},
		{"no image", "POST", "/v1/sandboxes", v1.CreateSandboxRequest{}, 400, v1.CodeInvalidArgument},
		{"unknown image", "POST", "/v1/sandboxes", v1.CreateSandboxRequest{Image: "nope"}, 404, v1.CodeNotFound},
		{"unknown engine", "POST", "/v1/sandboxes", v1.CreateSandboxRequest{Image: "busybox", Engine: "qemu"}, 400, v1.CodeInvalidArgument},
		{"malformed json", "POST", "/v1/sandboxes", "{", 400, v1.CodeInvalidArgument},
		{"unknown field", "POST", "/v1/sandboxes", `{"imag":"busybox"}`, 400, v1.CodeInvalidArgument},
		{"duplicate name", "POST", "/v1/sandboxes", v1.CreateSandboxRequest{Image: "busybox", Name: "taken"}, 409, v1.CodeAlreadyExists},
		{"too large", "POST", "/v1/sandboxes", `{"image":"` + strings.Repeat("a", 2<<20) + `"}`, 413, v1.CodeInvalidArgument},
		{"unknown sandbox", "GET", "/v1/sandboxes/nosuchthing", nil, 404, v1.CodeNotFound},
		{"unknown sandbox exec", "POST", "/v1/sandboxes/nosuchthing/exec", v1.ExecRequest{Args: []string{"echo"}}, 404, v1.CodeNotFound},
		{"unknown sandbox delete", "DELETE", "/v1/sandboxes/nosuchthing", nil, 404, v1.CodeNotFound},
		{"empty exec", "POST", "/v1/sandboxes/taken/exec", v1.ExecRequest{}, 400, v1.CodeInvalidArgument},
		{"bad mode", "PUT", "/v1/sandboxes/taken/files?path=/a&mode=9z", "x", 400, v1.CodeInvalidArgument},
		{"unknown route", "GET", "/v2/nothing", nil, 404, v1.CodeNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, e := h.do(tt.method, tt.path, tt.body, nil)
			if code != tt.wantStatus || e.Code != tt.wantCode || e.Error == "" {
				t.Errorf("%s %s = %d %+v, want %d %s", tt.method, tt.path, code, e, tt.wantStatus, tt.wantCode)
			}
		})
	}
	var e struct {
		LatencyNS int64 `json:"latency_ns"`
	}
	req, _ := http.NewRequest("GET", "http://k7d/v1/sandboxes/nosuchthing", nil)
	resp, _ := h.hc.Do(req)
	_ = json.NewDecoder(resp.Body).Decode(&e)
	resp.Body.Close()
	if e.LatencyNS <= 0 {
		t.Errorf("error body latency_ns = %d, want > 0", e.LatencyNS)
	}
}

func TestInfoMetricsList(t *testing.T) {
	h := startDaemon(t, testConfig(t, t.TempDir()), newTestEngine(true))
	var info v1.Info
	h.do("GET", "/v1/info", nil, &info)
	if info.DefaultEngine != "fake" || len(info.Engines) != 1 || !info.Engines[0].Available || info.StateDir != h.cfg.StateDir {
		t.Errorf("info = %+v", info)
	}
	h.create("a")
	var raw map[string]any
	h.do("GET", "/v1/sandboxes", nil, &raw)
	if _, ok := raw["latency_ns"]; !ok {
		t.Errorf("list answer has no latency_ns: %v", raw)
	}
	resp, err := h.hc.Get("http://k7d/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`k7_sandboxes{state="running"} 1`,
		`k7_http_requests_total{code="201",method="POST",route="POST /v1/sandboxes"} 1`,
		`k7_sandbox_op_duration_seconds_count{engine="fake",op="create",outcome="ok"} 1`,
	} {
		if !strings.Contains(string(b), want) {
			t.Errorf("metrics lack %q:\n%s", want, b)
		}
	}
}

func TestDeadDetection(t *testing.T) {
	eng := newTestEngine(false)
	h := startDaemon(t, testConfig(t, t.TempDir()), eng)
	a, b := h.create("a"), h.create("b")
	eng.kill(a.ID)
	got := h.waitState(a.ID, v1.StateDead)
	if got.Reason == "" {
		t.Errorf("dead sandbox has no reason")
	}
	code, e := h.do("POST", "/v1/sandboxes/a/exec", v1.ExecRequest{Args: []string{"echo"}}, nil)
	if code != http.StatusPreconditionFailed || !strings.Contains(e.Error, "dead") {
		t.Errorf("exec into dead = %d %+v, want 412", code, e)
	}
	// Lost without the agent connection noticing: the reconciler finds it.
	eng.lose(b.ID)
	h.waitState(b.ID, v1.StateDead)
	var op v1.OpResult
	if code, e := h.do("DELETE", "/v1/sandboxes/a", nil, &op); code != 200 {
		t.Errorf("delete dead = %d %+v", code, e)
	}
}

func TestRestart(t *testing.T) {
	eng := newTestEngine(false)
	cfg := testConfig(t, t.TempDir())
	h := startDaemon(t, cfg, eng)
	keep, lost, paused := h.create("keep"), h.create("lost"), h.create("paused")
	h.do("POST", "/v1/sandboxes/paused/pause", nil, nil)
	h.stop()

	if !eng.has(keep.ID) {
		t.Fatalf("graceful shutdown deleted the sandbox")
	}
	eng.lose(lost.ID)
	_ = eng.Create(context.Background(), &engine.CreateRequest{ID: "00000000000000aa"}) // an orphan

	h2 := startDaemon(t, cfg, eng)
	got, code := h2.get("keep")
	if code != 200 || got.State != v1.StateRunning || got.ID != keep.ID {
		t.Fatalf("after restart keep = %d %+v", code, got)
	}
	if r := h2.run("keep", "echo", "back"); string(r.Stdout) != "back\n" {
		t.Errorf("exec after restart = %+v", r)
	}
	got, _ = h2.get("lost")
	if got.State != v1.StateDead || got.Reason != "lost during daemon restart" {
		t.Errorf("after restart lost = %+v, want dead (lost during daemon restart)", got)
	}
	got, _ = h2.get("paused")
	if got.State != v1.StatePaused {
		t.Errorf("after restart paused = %+v", got)
	}
	h2.do("POST", "/v1/sandboxes/paused/resume", nil, nil)
	if r := h2.run("paused", "echo", "ok"); string(r.Stdout) != "ok\n" {
		t.Errorf("exec after resume after restart = %+v", r)
	}
	if eng.has("00000000000000aa") {
		t.Errorf("orphan engine sandbox was not deleted")
	}
	_ = paused
}

func TestSecondDaemonSameStateDir(t *testing.T) {
	cfg := testConfig(t, t.TempDir())
	startDaemon(t, cfg, newTestEngine(false))
	cfg2 := cfg
	cfg2.Socket = filepath.Join(filepath.Dir(cfg.Socket), "other.sock")
	err := Run(context.Background(), cfg2, Options{Engines: []engine.Engine{newTestEngine(false)}, Images: testImages{}})
	if !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), "another k7d") {
		t.Fatalf("second daemon on the same state dir: %v, want a clear conflict", err)
	}
	// Another state dir on the same socket is refused too.
	cfg3 := testConfig(t, t.TempDir())
	cfg3.Socket = cfg.Socket
	err = Run(context.Background(), cfg3, Options{Engines: []engine.Engine{newTestEngine(false)}, Images: testImages{}})
	if !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("second daemon on the same socket: %v, want conflict", err)
	}
}

func TestSideBySide(t *testing.T) {
	e1, e2 := newTestEngine(false), newTestEngine(false)
	h1 := startDaemon(t, testConfig(t, t.TempDir()), e1)
	h2 := startDaemon(t, testConfig(t, t.TempDir()), e2)
	h1.create("same")
	h2.create("same")
	var p v1.PruneResult
	h1.do("POST", "/v1/system/prune", nil, &p)
	if len(p.Sandboxes) != 1 {
		t.Errorf("prune = %+v, want one sandbox", p)
	}
	if _, code := h2.get("same"); code != 200 {
		t.Errorf("prune of one daemon touched the other's sandbox")
	}
}

func TestConcurrentCreates(t *testing.T) {
	eng := newTestEngine(false)
	h := startDaemon(t, testConfig(t, t.TempDir()), eng)
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var sb v1.Sandbox
			code, e := h.do("POST", "/v1/sandboxes", v1.CreateSandboxRequest{Image: "busybox", Name: fmt.Sprintf("c%d", i)}, &sb)
			if code != 201 {
				errs <- fmt.Errorf("create c%d: %d %+v", i, code, e)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	var l v1.SandboxList
	h.do("GET", "/v1/sandboxes", nil, &l)
	ids, _ := eng.List(context.Background())
	if len(l.Sandboxes) != 20 || len(ids) != 20 {
		t.Errorf("got %d records and %d engine sandboxes, want 20", len(l.Sandboxes), len(ids))
	}
}

func TestCreateFailureUndone(t *testing.T) {
	eng := newTestEngine(false)
	h := startDaemon(t, testConfig(t, t.TempDir()), eng)
	eng.failCreate = fmt.Errorf("no space: %w", errdefs.ErrResourceExhausted)
	code, e := h.do("POST", "/v1/sandboxes", v1.CreateSandboxRequest{Image: "busybox", Name: "x"}, nil)
	if code != http.StatusInsufficientStorage || e.Code != v1.CodeResourceExhausted {
		t.Errorf("failed create = %d %+v", code, e)
	}
	var l v1.SandboxList
	h.do("GET", "/v1/sandboxes", nil, &l)
	if len(l.Sandboxes) != 0 {
		t.Errorf("failed create left records: %+v", l)
	}
	h.create("x") // the name is free
}

func TestTokenAuth(t *testing.T) {
	cfg := testConfig(t, t.TempDir())
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	cfg.TCP = l.Addr().String()
	l.Close()
	cfg.Token = "s3cret"
	startDaemon(t, cfg, newTestEngine(false))
	tests := []struct {
		auth string
		want int
	}{
		{"", 401},
		{"Bearer wrong", 401},
		{"Bearer s3cret", 200},
	}
	for _, tt := range tests {
		req, _ := http.NewRequest("GET", "http://"+cfg.TCP+"/v1/sandboxes", nil)
		if tt.auth != "" {
			req.Header.Set("Authorization", tt.auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var e v1.Error
		_ = json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		if resp.StatusCode != tt.want || (tt.want == 401 && e.Code != v1.CodeUnauthorized) {
			t.Errorf("auth %q = %d %+v, want %d", tt.auth, resp.StatusCode, e, tt.want)
		}
	}
	cfg.Token = ""
	if err := cfg.Validate(); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("--tcp without a token validated: %v", err)
	}
}

func TestExecWebSocket(t *testing.T) {
	h := startDaemon(t, testConfig(t, t.TempDir()), newTestEngine(false))
	h.create("ws")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dial := func(req v1.ExecRequest) *websocket.Conn {
		t.Helper()
		c, _, err := websocket.Dial(ctx, "ws://k7d/v1/sandboxes/ws/exec/ws", &websocket.DialOptions{HTTPClient: h.hc}) //nolint:bodyclose // websocket.Dial closes the handshake body itself
		if err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(req)
		_ = c.Write(ctx, websocket.MessageText, b)
		return c
	}
	readControl := func(c *websocket.Conn, stdout *bytes.Buffer) v1.ExecControl {
		t.Helper()
		for {
			typ, msg, err := c.Read(ctx)
			if err != nil {
				t.Fatalf("reading: %v", err)
			}
			if typ == websocket.MessageBinary {
				if msg[0] == v1.StreamStdout {
					stdout.Write(msg[1:])
				}
				continue
			}
			var ctl v1.ExecControl
			_ = json.Unmarshal(msg, &ctl)
			return ctl
		}
	}

	// stdin → cat → stdout, then exit 0.
	c := dial(v1.ExecRequest{Args: []string{"cat"}, Stdin: true})
	var out bytes.Buffer
	if ctl := readControl(c, &out); ctl.Type != v1.ControlStarted || ctl.PID == 0 {
		t.Fatalf("first control = %+v, want started", ctl)
	}
	_ = c.Write(ctx, websocket.MessageBinary, append([]byte{v1.StreamStdin}, "over ws"...))
	_ = c.Write(ctx, websocket.MessageBinary, []byte{v1.StreamStdin})
	if ctl := readControl(c, &out); ctl.Type != v1.ControlExit || ctl.ExitCode != 0 {
		t.Fatalf("last control = %+v, want exit 0", ctl)
	}
	if out.String() != "over ws" {
		t.Errorf("stdout = %q, want %q", out.String(), "over ws")
	}
	c.CloseNow()

	// A signal ends a sleeping command.
	c = dial(v1.ExecRequest{Args: []string{"sleep", "30"}})
	readControl(c, &out)
	_ = c.Write(ctx, websocket.MessageText, []byte(`{"type":"signal","signal":"TERM"}`))
	if ctl := readControl(c, &out); ctl.Type != v1.ControlExit || ctl.ExitCode != 128+15 {
		t.Errorf("after TERM = %+v, want exit 143", ctl)
	}
	c.CloseNow()

	// A command that cannot start.
	c = dial(v1.ExecRequest{Args: []string{"nosuch"}})
	if ctl := readControl(c, &out); ctl.Type != v1.ControlExit || ctl.ExitCode != 127 || ctl.Error == "" {
		t.Errorf("start failure = %+v, want exit 127 with error", ctl)
	}
	c.CloseNow()

	// Into a paused sandbox: error control message.
	h.do("POST", "/v1/sandboxes/ws/pause", nil, nil)
	c = dial(v1.ExecRequest{Args: []string{"echo"}})
	if ctl := readControl(c, &out); ctl.Type != v1.ControlError || ctl.Code != v1.CodeFailedPrecondition {
		t.Errorf("exec into paused = %+v, want error failed_precondition", ctl)
	}
	c.CloseNow()

	// Unknown sandbox: plain 404 before the upgrade.
	_, resp, err := websocket.Dial(ctx, "ws://k7d/v1/sandboxes/nope/exec/ws", &websocket.DialOptions{HTTPClient: h.hc}) //nolint:bodyclose // websocket.Dial closes the handshake body itself
	if err == nil || resp == nil || resp.StatusCode != 404 {
		t.Errorf("ws to unknown sandbox: %v %v, want 404", resp, err)
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		mod  func(*Config)
		ok   bool
	}{
		{"defaults", func(*Config) {}, true},
		{"relative state dir", func(c *Config) { c.StateDir = "state" }, false},
		{"unknown engine", func(c *Config) { c.Engines = []string{"vmware"} }, false},
		{"default not enabled", func(c *Config) { c.DefaultEngine = "fake" }, false},
		{"bad level", func(c *Config) { c.LogLevel = "loud" }, false},
		{"tls half", func(c *Config) { c.TLSCert = "/c" }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := DefaultConfig()
			tt.mod(&c)
			if err := c.Validate(); (err == nil) != tt.ok {
				t.Errorf("Validate() = %v, want ok=%v", err, tt.ok)
			}
		})
	}
	cfg, err := ParseFlags([]string{"--state-dir", "/tmp/x", "--engines", "fake"}, io.Discard)
	if err != nil || cfg.DefaultEngine != "fake" || cfg.StateDir != "/tmp/x" {
		t.Errorf("ParseFlags = %+v, %v; want default engine fake", cfg, err)
	}
}

// TestCleanupRefusesUnavailableEngine: --cleanup deletes the sandboxes of
// every engine that left files, enabled or not; one that cannot run (here
// gvisor without runsc) cannot, so while it has sandboxes its files are
// kept and the cleanup fails naming it, instead of orphaning them.
func TestCleanupRefusesUnavailableEngine(t *testing.T) {
	cfg := testConfig(t, t.TempDir())
	cfg.Cleanup = true
	cfg.Runsc = filepath.Join(t.TempDir(), "no-runsc")
	left := filepath.Join(engineRoot(cfg.StateDir, "gvisor"), "sandboxes", "0123456789abcdef")
	if err := os.MkdirAll(left, 0o755); err != nil {
		t.Fatal(err)
	}
	err := Run(context.Background(), cfg, Options{Images: testImages{}})
	if err == nil || !strings.Contains(err.Error(), "engine gvisor is unavailable") {
		t.Fatalf("cleanup with gvisor unavailable: %v, want an error naming gvisor", err)
	}
	if _, err := os.Stat(left); err != nil {
		t.Errorf("the unavailable engine's files were removed: %v", err)
	}
	// The same for a container of its fork pool.
	pooled := filepath.Join(engineRoot(cfg.StateDir, "gvisor"), "pool", "k7pool0123")
	if err := os.MkdirAll(pooled, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(left); err != nil {
		t.Fatal(err)
	}
	if err := Run(context.Background(), cfg, Options{Images: testImages{}}); err == nil {
		t.Fatalf("cleanup with a pool container of unavailable gvisor succeeded, want an error")
	}
	if err := os.RemoveAll(filepath.Dir(pooled)); err != nil {
		t.Fatal(err)
	}

	// Without sandboxes (files it made for itself may stay) the same
	// cleanup succeeds and empties the state dir.
	if err := os.RemoveAll(filepath.Dir(left)); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(engineRoot(cfg.StateDir, "gvisor"), "runsc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := Run(context.Background(), cfg, Options{Images: testImages{}}); err != nil {
		t.Fatalf("cleanup: %v", err)
	}
	ents, _ := os.ReadDir(cfg.StateDir)
	for _, e := range ents {
		if e.Name() != "k7d.lock" {
			t.Errorf("left in the state dir after cleanup: %s", e.Name())
		}
	}
}
