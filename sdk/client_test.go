package sdk_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/k7-dev/k7/api/v1"
	"github.com/k7-dev/k7/sdk"
	"github.com/k7-dev/k7/sdk/sdktest"
)

func newClient(t *testing.T, srv *sdktest.Server) *sdk.Client {
	t.Helper()
	c, err := sdk.New(srv.Host)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestNewHosts(t *testing.T) {
	for _, tc := range []struct {
		host    string
		wantErr bool
	}{
		{"", false},
		{"unix:///run/k7/k7.sock", false},
		{"/run/k7/k7.sock", false},
		{"http://127.0.0.1:7070", false},
		{"https://k7.example:7443", false},
		{"unix://relative.sock", true},
		{"tcp://1.2.3.4:5", true},
		{"http://", true},
	} {
		t.Run(tc.host, func(t *testing.T) {
			_, err := sdk.New(tc.host)
			if got := err != nil; got != tc.wantErr {
				t.Errorf("New(%q) error = %v, want error %v", tc.host, err, tc.wantErr)
			}
		})
	}
}

func TestDaemonUnavailable(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "nope.sock")
	c, err := sdk.New("unix://" + sock)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Info(ctxT(t))
	if !errors.Is(err, sdk.ErrDaemonUnavailable) {
		t.Fatalf("Info error = %v, want ErrDaemonUnavailable", err)
	}
	want := "k7d is not running at unix://" + sock + " (dial: no such file or directory)"
	if err.Error() != want {
		t.Errorf("message = %q, want %q", err.Error(), want)
	}
	// The same through the exec WebSocket.
	_, err = c.Exec(ctxT(t), "x", v1.ExecRequest{Args: []string{"true"}}, sdk.ExecIO{})
	if !errors.Is(err, sdk.ErrDaemonUnavailable) {
		t.Errorf("Exec error = %v, want ErrDaemonUnavailable", err)
	}
}

func TestErrorMapping(t *testing.T) {
	codes := []struct {
		code   string
		status int
		want   error
	}{
		{v1.CodeNotFound, 404, sdk.ErrNotFound},
		{v1.CodeAlreadyExists, 409, sdk.ErrAlreadyExists},
		{v1.CodeInvalidArgument, 400, sdk.ErrInvalidArgument},
		{v1.CodeFailedPrecondition, 412, sdk.ErrFailedPrecondition},
		{v1.CodeConflict, 409, sdk.ErrConflict},
		{v1.CodeUnavailable, 503, sdk.ErrUnavailable},
		{v1.CodeResourceExhausted, 507, sdk.ErrResourceExhausted},
		{v1.CodeUnauthorized, 401, sdk.ErrUnauthorized},
		{"", 404, sdk.ErrNotFound}, // no code: guessed from the status
	}
	for _, tc := range codes {
		t.Run(tc.code, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				sdktest.WriteError(w, tc.status, tc.code, "the message")
			}))
			defer srv.Close()
			c, err := sdk.New(srv.URL)
			if err != nil {
				t.Fatal(err)
			}
			_, err = c.GetSandbox(ctxT(t), "x")
			if !errors.Is(err, tc.want) {
				t.Errorf("errors.Is(%v, %v) = false", err, tc.want)
			}
			if got := err.Error(); got != "the message" {
				t.Errorf("message = %q, want %q", got, "the message")
			}
			for _, other := range codes {
				if other.want != tc.want && errors.Is(err, other.want) { //nolint:errorlint // two sentinels compared by identity
					t.Errorf("error also matches %v", other.want)
				}
			}
		})
	}
}

func TestToken(t *testing.T) {
	host := sdktest.NewServer(t, sdktest.WithToken("s3cret"), sdktest.WithTCP()).Host
	c, _ := sdk.New(host)
	if _, err := c.Info(ctxT(t)); !errors.Is(err, sdk.ErrUnauthorized) {
		t.Errorf("without token: %v, want ErrUnauthorized", err)
	}
	c, _ = sdk.New(host, sdk.WithToken("s3cret"))
	if _, err := c.Info(ctxT(t)); err != nil {
		t.Errorf("with token: %v", err)
	}
	t.Setenv("K7_HOST", host)
	t.Setenv("K7_TOKEN", "s3cret")
	c, err := sdk.FromEnv()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Info(ctxT(t)); err != nil {
		t.Errorf("FromEnv: %v", err)
	}
	res, err := c.Exec(ctxT(t), "nope", v1.ExecRequest{Args: []string{"echo"}}, sdk.ExecIO{})
	if !errors.Is(err, sdk.ErrNotFound) {
		t.Errorf("Exec on missing sandbox over TCP with token: %v, %v; want ErrNotFound", res, err)
	}
}

func TestSandboxLifecycle(t *testing.T) {
	ctx := ctxT(t)
	c := newClient(t, sdktest.NewServer(t))
	if err := c.Health(ctx); err != nil {
		t.Fatalf("Health: %v", err)
	}
	info, err := c.Info(ctx)
	if err != nil || info.Version != "fake-1.0" {
		t.Fatalf("Info = %+v, %v", info, err)
	}
	sb, err := c.CreateSandbox(ctx, v1.CreateSandboxRequest{Image: "alpine:3", Name: "web", Resources: v1.Resources{MemoryBytes: 512 << 20}})
	if err != nil {
		t.Fatalf("CreateSandbox: %v", err)
	}
	if _, err := c.CreateSandbox(ctx, v1.CreateSandboxRequest{Image: "alpine:3", Name: "web"}); !errors.Is(err, sdk.ErrAlreadyExists) {
		t.Errorf("second create: %v, want ErrAlreadyExists", err)
	}
	if _, err := c.CreateSandbox(ctx, v1.CreateSandboxRequest{Image: "nope"}); !errors.Is(err, sdk.ErrNotFound) {
		t.Errorf("create from missing image: %v, want ErrNotFound", err)
	}
	got, err := c.GetSandbox(ctx, "web")
	if err != nil || got.ID != sb.ID || got.Resources.MemoryBytes != 512<<20 {
		t.Fatalf("GetSandbox(web) = %+v, %v", got, err)
	}
	l, err := c.ListSandboxes(ctx)
	if err != nil || len(l) != 1 {
		t.Fatalf("ListSandboxes = %v, %v", l, err)
	}
	if r, err := c.PauseSandbox(ctx, sb.ID); err != nil || r.State != v1.StatePaused {
		t.Fatalf("Pause = %+v, %v", r, err)
	}
	if _, err := c.PauseSandbox(ctx, sb.ID); !errors.Is(err, sdk.ErrFailedPrecondition) {
		t.Errorf("second pause: %v, want ErrFailedPrecondition", err)
	}
	if _, err := c.Exec(ctx, sb.ID, v1.ExecRequest{Args: []string{"echo"}}, sdk.ExecIO{}); !errors.Is(err, sdk.ErrFailedPrecondition) {
		t.Errorf("exec in paused sandbox: %v, want ErrFailedPrecondition", err)
	}
	if _, err := c.ResumeSandbox(ctx, sb.ID); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	if _, err := c.DeleteSandbox(ctx, sb.ID, true); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if _, err := c.GetSandbox(ctx, sb.ID); !errors.Is(err, sdk.ErrNotFound) {
		t.Errorf("get after delete: %v, want ErrNotFound", err)
	}
	if _, err := c.Prune(ctx); err != nil {
		t.Errorf("Prune: %v", err)
	}
}

func TestRun(t *testing.T) {
	ctx := ctxT(t)
	c := newClient(t, sdktest.NewServer(t))
	sb, err := c.CreateSandbox(ctx, v1.CreateSandboxRequest{Image: "alpine:3"})
	if err != nil {
		t.Fatal(err)
	}
	r, err := c.Run(ctx, sb.ID, v1.ExecRequest{Args: []string{"cat"}, StdinData: []byte("hi")})
	if err != nil || string(r.Stdout) != "hi" || r.ExitCode != 0 {
		t.Errorf("Run(cat) = %+v, %v", r, err)
	}
	r, err = c.Run(ctx, sb.ID, v1.ExecRequest{Args: []string{"exit", "3"}})
	if err != nil || r.ExitCode != 3 {
		t.Errorf("Run(exit 3) = %+v, %v", r, err)
	}
}

func TestExecStreaming(t *testing.T) {
	ctx := ctxT(t)
	c := newClient(t, sdktest.NewServer(t))
	sb, err := c.CreateSandbox(ctx, v1.CreateSandboxRequest{Image: "alpine:3"})
	if err != nil {
		t.Fatal(err)
	}
	t.Run("stdin", func(t *testing.T) {
		big := strings.Repeat("0123456789", 20000) // several stdin messages
		var out bytes.Buffer
		exit, err := c.Exec(ctx, sb.ID, v1.ExecRequest{Args: []string{"cat"}}, sdk.ExecIO{Stdin: strings.NewReader(big), Stdout: &out})
		if err != nil {
			t.Fatalf("Exec(cat): %v", err)
		}
		if exit.Code != 0 || exit.PID != 42 {
			t.Errorf("exit = %+v, want code 0 pid 42", exit)
		}
		if out.String() != big {
			t.Errorf("stdout has %d bytes, want %d", out.Len(), len(big))
		}
	})
	t.Run("stderr and exit code", func(t *testing.T) {
		var out, errb bytes.Buffer
		exit, err := c.Exec(ctx, sb.ID, v1.ExecRequest{Args: []string{"stderr", "oops"}}, sdk.ExecIO{Stdout: &out, Stderr: &errb})
		if err != nil || exit.Code != 1 {
			t.Fatalf("Exec = %+v, %v", exit, err)
		}
		if got, want := errb.String(), "oops\n"; got != want || out.Len() != 0 {
			t.Errorf("stderr = %q, stdout = %q; want %q, empty", got, out.String(), want)
		}
		exit, err = c.Exec(ctx, sb.ID, v1.ExecRequest{Args: []string{"exit", "3"}}, sdk.ExecIO{})
		if err != nil || exit.Code != 3 {
			t.Errorf("Exec(exit 3) = %+v, %v", exit, err)
		}
	})
	t.Run("start failure", func(t *testing.T) {
		exit, err := c.Exec(ctx, sb.ID, v1.ExecRequest{Args: []string{"x"}}, sdk.ExecIO{})
		var se *sdk.StartError
		if !errors.As(err, &se) {
			t.Fatalf("error = %v, want *StartError", err)
		}
		if got, want := err.Error(), `exec: "x": executable file not found in $PATH`; got != want {
			t.Errorf("message = %q, want %q", got, want)
		}
		if se.ExitCode != 127 || exit == nil || exit.Code != 127 {
			t.Errorf("exit = %+v, StartError.ExitCode = %d, want 127", exit, se.ExitCode)
		}
	})
	t.Run("resize and signal", func(t *testing.T) {
		pr, pw := io.Pipe()
		s, err := c.StartExec(ctx, sb.ID, v1.ExecRequest{Args: []string{"wait"}, TTY: true}, sdk.ExecIO{Stdout: pw})
		if err != nil {
			t.Fatal(err)
		}
		if s.PID() != 42 {
			t.Errorf("PID = %d, want 42", s.PID())
		}
		buf := make([]byte, 64)
		if err := s.Resize(ctx, 40, 120); err != nil {
			t.Fatal(err)
		}
		n, _ := pr.Read(buf)
		if got, want := string(buf[:n]), "resize 40x120\n"; got != want {
			t.Errorf("after resize: %q, want %q", got, want)
		}
		if err := s.Signal(ctx, "TERM"); err != nil {
			t.Fatal(err)
		}
		n, _ = pr.Read(buf)
		if got, want := string(buf[:n]), "signal TERM\n"; got != want {
			t.Errorf("after signal: %q, want %q", got, want)
		}
		exit, err := s.Wait()
		if err != nil || exit.Code != 143 {
			t.Errorf("Wait = %+v, %v; want code 143", exit, err)
		}
		if err := s.Signal(ctx, "KILL"); err == nil {
			t.Errorf("Signal after exit succeeded")
		}
	})
	t.Run("detach rejected", func(t *testing.T) {
		_, err := c.StartExec(ctx, sb.ID, v1.ExecRequest{Args: []string{"echo"}, Detach: true}, sdk.ExecIO{})
		if !errors.Is(err, sdk.ErrInvalidArgument) {
			t.Errorf("error = %v, want ErrInvalidArgument", err)
		}
	})
}

func TestFilesAndLogs(t *testing.T) {
	ctx := ctxT(t)
	f := sdktest.NewServer(t)
	c := newClient(t, f)
	sb, err := c.CreateSandbox(ctx, v1.CreateSandboxRequest{Image: "alpine:3"})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.CopyTo(ctx, sb.ID, "/tmp/a b", 0o755, strings.NewReader("hello")); err != nil {
		t.Fatalf("CopyTo: %v", err)
	}
	if got := f.FileMode(sb.ID, "/tmp/a b"); got != "0755" {
		t.Errorf("mode sent = %q, want 0755", got)
	}
	var out bytes.Buffer
	if n, err := c.CopyFrom(ctx, sb.ID, "/tmp/a b", &out); err != nil || n != 5 || out.String() != "hello" {
		t.Errorf("CopyFrom = %d, %q, %v", n, out.String(), err)
	}
	if _, err := c.CopyFrom(ctx, sb.ID, "/nope", &out); !errors.Is(err, sdk.ErrNotFound) {
		t.Errorf("CopyFrom(missing) = %v, want ErrNotFound", err)
	}
	rc, err := c.Logs(ctx, sb.ID, false)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if !strings.Contains(string(b), "booted") {
		t.Errorf("logs = %q", b)
	}
	if _, err := c.Logs(ctx, "nope", true); !errors.Is(err, sdk.ErrNotFound) {
		t.Errorf("Logs(nope) = %v, want ErrNotFound", err)
	}
}

func TestImages(t *testing.T) {
	ctx := ctxT(t)
	c := newClient(t, sdktest.NewServer(t))
	var reports []v1.PullProgress
	img, err := c.PullImage(ctx, v1.PullRequest{Ref: "docker.io/library/busybox:latest"}, func(p v1.PullProgress) { reports = append(reports, p) })
	if err != nil {
		t.Fatalf("PullImage: %v", err)
	}
	if len(reports) != 4 || reports[3].Image == nil {
		t.Errorf("got %d reports, want 4 with the image last", len(reports))
	}
	// A ref with slashes and a colon travels as one path segment.
	got, err := c.GetImage(ctx, "docker.io/library/busybox:latest")
	if err != nil || got.ID != img.ID {
		t.Errorf("GetImage = %+v, %v", got, err)
	}
	if _, err := c.PullImage(ctx, v1.PullRequest{Ref: "missing:1"}, nil); !errors.Is(err, sdk.ErrNotFound) || !strings.Contains(err.Error(), "manifest") {
		t.Errorf("pull of missing image: %v, want ErrNotFound with the daemon's message", err)
	}
	imp, err := c.ImportImage(ctx, "mine", strings.NewReader("tar bytes"), nil)
	if err != nil || imp.Refs[0] != "mine" {
		t.Errorf("ImportImage = %+v, %v", imp, err)
	}
	if _, err := c.ImportImage(ctx, "empty", strings.NewReader(""), nil); !errors.Is(err, sdk.ErrInvalidArgument) {
		t.Errorf("import of empty archive: %v, want ErrInvalidArgument", err)
	}
	l, err := c.ListImages(ctx)
	if err != nil || len(l) != 3 {
		t.Errorf("ListImages = %d images, %v; want 3", len(l), err)
	}
	if err := c.RemoveImage(ctx, "docker.io/library/busybox:latest"); err != nil {
		t.Errorf("RemoveImage: %v", err)
	}
	if err := c.RemoveImage(ctx, "docker.io/library/busybox:latest"); !errors.Is(err, sdk.ErrNotFound) {
		t.Errorf("second RemoveImage: %v, want ErrNotFound", err)
	}
}

func TestProgressStreamCut(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, `{"status":"downloading"}`+"\n")
	}))
	defer srv.Close()
	c, _ := sdk.New(srv.URL)
	if _, err := c.PullImage(ctxT(t), v1.PullRequest{Ref: "x"}, nil); err == nil {
		t.Errorf("PullImage of a cut stream succeeded")
	}
}
