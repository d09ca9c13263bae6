// Package enginetest is the conformance suite every engine passes.
//
// Run drives an engine through its whole interface with the real agent
// protocol (package agent/client): create, handshake, exec, pause, stats,
// logs, reconnect, files, delete, concurrent and failed creates, and, for
// engines that implement engine.Forker, fork with live memory.
//
// Commands in the suite use paths relative to their working directory "/"
// (tmp/counter, not /tmp/counter): the fake engine runs commands on the host
// without a chroot, with "/" mapped to its sandbox dir for working
// directories and file transfers only.
//
// Captures carry their engine's version in the file VersionFile; the suite
// rewrites it to check that a mismatch is refused.
package enginetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/k7-dev/k7/internal/agent/client"
	"github.com/k7-dev/k7/internal/engine"
	"github.com/k7-dev/k7/internal/errdefs"
)

// VersionFile is the file in a capture dir that holds the engine version.
const VersionFile = "engine-version"

// Config describes what the engine under test can do.
type Config struct {
	// Rootfs is the image rootfs sandboxes are created from; "" builds one
	// with BusyboxRootfs.
	Rootfs string
	// CarriesProcesses: a fork carries running processes and memory (the
	// fake engine forks files only).
	CarriesProcesses bool
	// IsolatedHostname: `hostname` in a sandbox prints its own host name.
	IsolatedHostname bool
	// Concurrent is how many sandboxes the concurrency test creates at
	// once; default 5.
	Concurrent int
	// Timeout bounds each subtest; default 60 s.
	Timeout time.Duration
}

// Run runs the suite against one engine made by newEngine.
func Run(t *testing.T, newEngine func(t *testing.T) engine.Engine, cfg Config) {
	if cfg.Rootfs == "" {
		cfg.Rootfs = BusyboxRootfs(t)
	}
	if cfg.Concurrent == 0 {
		cfg.Concurrent = 5
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 60 * time.Second
	}
	e := newEngine(t)
	s := &suite{e: e, cfg: cfg}
	tests := []struct {
		name string
		fn   func(t *testing.T, ctx context.Context)
	}{
		{"Exec", s.testExec},
		{"PauseResume", s.testPauseResume},
		{"StatsLogs", s.testStatsLogs},
		{"Reconnect", s.testReconnect},
		{"Files", s.testFiles},
		{"Delete", s.testDelete},
		{"ConcurrentCreate", s.testConcurrentCreate},
		{"FailedCreate", s.testFailedCreate},
		{"Fork", s.testFork},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), cfg.Timeout)
			defer cancel()
			tc.fn(t, ctx)
		})
	}
}

type suite struct {
	e   engine.Engine
	cfg Config
}

// NewID returns a fresh sandbox ID: 16 lower-case hex digits.
func NewID() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// sandbox is one sandbox under test with a connected client.
type sandbox struct {
	id string
	c  *client.Client
}

func (s *suite) request(id string) *engine.CreateRequest {
	return &engine.CreateRequest{
		ID:       id,
		Hostname: "h-" + id[:8],
		Rootfs:   s.cfg.Rootfs,
		Env:      []string{"K7_TEST=" + id},
		Resources: engine.Resources{
			CPUs: 1, MemoryBytes: 512 << 20, PIDs: 256,
		},
	}
}

// create creates a sandbox, deletes it when t ends, and connects to it.
func (s *suite) create(t *testing.T, ctx context.Context) *sandbox {
	t.Helper()
	id := NewID()
	if err := s.e.Create(ctx, s.request(id)); err != nil {
		t.Fatalf("Create: %v", err)
	}
	s.cleanupDelete(t, id)
	return &sandbox{id: id, c: s.connect(t, ctx, id)}
}

func (s *suite) cleanupDelete(t *testing.T, id string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := s.e.Delete(ctx, id); err != nil {
			t.Errorf("Delete(%s) in cleanup: %v", id, err)
		}
	})
}

// connect connects and handshakes; the client is closed when t ends.
func (s *suite) connect(t *testing.T, ctx context.Context, id string) *client.Client {
	t.Helper()
	rw, err := s.e.Connect(ctx, id)
	if err != nil {
		t.Fatalf("Connect(%s): %v", id, err)
	}
	c := client.New(rw)
	t.Cleanup(func() { _ = c.Close() })
	hctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if _, err := c.Handshake(hctx); err != nil {
		t.Fatalf("Handshake(%s): %v", id, err)
	}
	return c
}

type result struct {
	stdout, stderr string
	code           int
}

func run(ctx context.Context, c *client.Client, req *client.ExecRequest) (result, error) {
	var stdout, stderr bytes.Buffer
	p, err := c.Exec(ctx, req, client.Stdio{Stdout: &stdout, Stderr: &stderr})
	if err != nil {
		return result{}, err
	}
	st, err := p.Wait(ctx)
	if err != nil {
		return result{}, err
	}
	return result{stdout.String(), stderr.String(), st.Code}, nil
}

// sh runs `sh -c script` and fails t unless it exits 0; it returns stdout.
func sh(t *testing.T, ctx context.Context, c *client.Client, script string) string {
	t.Helper()
	r, err := run(ctx, c, &client.ExecRequest{Args: []string{"sh", "-c", script}})
	if err != nil {
		t.Fatalf("exec %q: %v", script, err)
	}
	if r.code != 0 {
		t.Fatalf("exec %q: exit %d, stderr %q", script, r.code, r.stderr)
	}
	return r.stdout
}

func detach(t *testing.T, ctx context.Context, c *client.Client, script string) {
	t.Helper()
	if _, err := c.Exec(ctx, &client.ExecRequest{Args: []string{"sh", "-c", script}, Detach: true}, client.Stdio{}); err != nil {
		t.Fatalf("exec detached %q: %v", script, err)
	}
}

// counterScript increments tmp/counter every 0.1 s.
const counterScript = `i=0; while true; do i=$((i+1)); echo $i > tmp/counter.new; mv tmp/counter.new tmp/counter; sleep 0.1; done`

func readFile(ctx context.Context, c *client.Client, path string) (string, error) {
	var b bytes.Buffer
	err := c.GetFile(ctx, path, &b)
	return b.String(), err
}

func counter(t *testing.T, ctx context.Context, c *client.Client) int {
	t.Helper()
	s, err := readFile(ctx, c, "/tmp/counter")
	if err != nil {
		t.Fatalf("reading /tmp/counter: %v", err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil {
		t.Fatalf("reading /tmp/counter: %q: %v", s, err)
	}
	return n
}

// waitCounter polls until the counter reaches min and returns it.
func waitCounter(t *testing.T, ctx context.Context, c *client.Client, min int) int {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		s, err := readFile(ctx, c, "/tmp/counter")
		if err == nil {
			if n, err := strconv.Atoi(strings.TrimSpace(s)); err == nil && n >= min {
				return n
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("counter did not reach %d in time (last %q, %v)", min, s, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (s *suite) testExec(t *testing.T, ctx context.Context) {
	sb := s.create(t, ctx)
	r, err := run(ctx, sb.c, &client.ExecRequest{Args: []string{"sh", "-c", "echo hi; exit 3"}})
	if err != nil {
		t.Fatal(err)
	}
	if r.stdout != "hi\n" || r.code != 3 {
		t.Errorf("sh -c 'echo hi; exit 3': got %q, %d; want %q, 3", r.stdout, r.code, "hi\n")
	}
	if got, want := sh(t, ctx, sb.c, "echo $K7_TEST"), sb.id+"\n"; got != want {
		t.Errorf("env K7_TEST: got %q, want %q", got, want)
	}
	if s.cfg.IsolatedHostname {
		if got, want := sh(t, ctx, sb.c, "hostname"), "h-"+sb.id[:8]+"\n"; got != want {
			t.Errorf("hostname: got %q, want %q", got, want)
		}
	}
	_, err = run(ctx, sb.c, &client.ExecRequest{Args: []string{"k7-no-such-command"}})
	var se *client.StartError
	if !errors.As(err, &se) || se.Code != 127 {
		t.Errorf("exec of a missing command: got %v, want a StartError with code 127", err)
	}
	// A detached command keeps running after Exec returns.
	detach(t, ctx, sb.c, counterScript)
	n := waitCounter(t, ctx, sb.c, 1)
	waitCounter(t, ctx, sb.c, n+2)
	st, err := s.e.Status(ctx, sb.id)
	if err != nil || st.State != engine.StateRunning {
		t.Errorf("Status: got %+v, %v; want running", st, err)
	}
}

func (s *suite) testPauseResume(t *testing.T, ctx context.Context) {
	sb := s.create(t, ctx)
	detach(t, ctx, sb.c, counterScript)
	waitCounter(t, ctx, sb.c, 2)
	before := counter(t, ctx, sb.c)
	if err := s.e.Pause(ctx, sb.id); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	if st, err := s.e.Status(ctx, sb.id); err != nil || st.State != engine.StatePaused {
		t.Errorf("Status after Pause: got %+v, %v; want paused", st, err)
	}
	time.Sleep(1500 * time.Millisecond) // the window the counter must not advance in
	if err := s.e.Resume(ctx, sb.id); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	after := counter(t, ctx, sb.c)
	// Unpaused, the counter would have advanced by about 15.
	if after-before > 5 {
		t.Errorf("counter advanced while paused: %d -> %d", before, after)
	}
	waitCounter(t, ctx, sb.c, after+3)
	if st, err := s.e.Status(ctx, sb.id); err != nil || st.State != engine.StateRunning {
		t.Errorf("Status after Resume: got %+v, %v; want running", st, err)
	}
}

func (s *suite) testStatsLogs(t *testing.T, ctx context.Context) {
	sb := s.create(t, ctx)
	marker := "detached-output-" + sb.id
	detach(t, ctx, sb.c, "echo "+marker)
	st, err := s.e.Stats(ctx, sb.id)
	if err != nil {
		t.Fatalf("Stats: %v", err)
	}
	if st.PIDs < 1 || st.CPU < 0 || st.MemoryBytes < 0 {
		t.Errorf("Stats: got %+v, want PIDs >= 1", st)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		rc, err := s.e.Logs(ctx, sb.id)
		if err != nil {
			t.Fatalf("Logs: %v", err)
		}
		b, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			t.Fatalf("reading logs: %v", err)
		}
		if bytes.Contains(b, []byte(marker)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("logs do not contain %q:\n%s", marker, b)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (s *suite) testReconnect(t *testing.T, ctx context.Context) {
	sb := s.create(t, ctx)
	detach(t, ctx, sb.c, counterScript)
	n := waitCounter(t, ctx, sb.c, 1)
	// A daemon restart: the first client goes away without a goodbye.
	_ = sb.c.Close()
	for i := 0; i < 3; i++ {
		c := s.connect(t, ctx, sb.id)
		if got := sh(t, ctx, c, "echo again"); got != "again\n" {
			t.Errorf("exec after reconnect %d: got %q", i, got)
		}
		n = waitCounter(t, ctx, c, n+1)
		_ = c.Close()
	}
}

func (s *suite) testFiles(t *testing.T, ctx context.Context) {
	sb := s.create(t, ctx)
	data := make([]byte, 1<<20)
	rand.Read(data)
	if err := sb.c.PutFile(ctx, "/tmp/sub/blob", 0o644, bytes.NewReader(data)); err != nil {
		t.Fatalf("PutFile: %v", err)
	}
	var got bytes.Buffer
	if err := sb.c.GetFile(ctx, "/tmp/sub/blob", &got); err != nil {
		t.Fatalf("GetFile: %v", err)
	}
	if !bytes.Equal(got.Bytes(), data) {
		t.Errorf("GetFile: got %d bytes, want the %d bytes put", got.Len(), len(data))
	}
	if out := sh(t, ctx, sb.c, "wc -c < tmp/sub/blob"); strings.TrimSpace(out) != "1048576" {
		t.Errorf("wc -c in the sandbox: got %q", out)
	}
}

func (s *suite) testDelete(t *testing.T, ctx context.Context) {
	id := NewID()
	if err := s.e.Create(ctx, s.request(id)); err != nil {
		t.Fatalf("Create: %v", err)
	}
	s.cleanupDelete(t, id)
	c := s.connect(t, ctx, id)
	sh(t, ctx, c, "true")
	if err := s.e.Delete(ctx, id); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	select {
	case <-c.Done():
	case <-time.After(10 * time.Second):
		t.Errorf("client not done 10 s after Delete")
	}
	ids, err := s.e.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(ids, id) {
		t.Errorf("List after Delete contains %s", id)
	}
	if _, err := s.e.Status(ctx, id); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Status after Delete: got %v, want ErrNotFound", err)
	}
	if err := s.e.Delete(ctx, id); err != nil {
		t.Errorf("second Delete: %v", err)
	}
	if _, err := s.e.Connect(ctx, id); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Connect after Delete: got %v, want ErrNotFound", err)
	}
}

func (s *suite) testConcurrentCreate(t *testing.T, ctx context.Context) {
	var wg sync.WaitGroup
	errs := make(chan error, s.cfg.Concurrent)
	for i := 0; i < s.cfg.Concurrent; i++ {
		id := NewID()
		s.cleanupDelete(t, id)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.e.Create(ctx, s.request(id)); err != nil {
				errs <- fmt.Errorf("Create(%s): %w", id, err)
				return
			}
			rw, err := s.e.Connect(ctx, id)
			if err != nil {
				errs <- err
				return
			}
			c := client.New(rw)
			defer func() { _ = c.Close() }()
			if _, err := c.Handshake(ctx); err != nil {
				errs <- fmt.Errorf("Handshake(%s): %w", id, err)
				return
			}
			r, err := run(ctx, c, &client.ExecRequest{Args: []string{"echo", id}})
			if err != nil || r.stdout != id+"\n" {
				errs <- fmt.Errorf("exec in %s: got %q, %v", id, r.stdout, err) //nolint:errorlint // err is nil when only the output is wrong
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func (s *suite) testFailedCreate(t *testing.T, ctx context.Context) {
	id := NewID()
	req := s.request(id)
	req.Rootfs = "/nonexistent/k7-rootfs-" + id
	if err := s.e.Create(ctx, req); err == nil {
		s.cleanupDelete(t, id)
		t.Fatalf("Create with a missing rootfs succeeded")
	}
	ids, err := s.e.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(ids, id) {
		t.Errorf("List after a failed Create contains %s", id)
	}
	if _, err := s.e.Status(ctx, id); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Status after a failed Create: got %v, want ErrNotFound", err)
	}
}
