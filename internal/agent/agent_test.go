package agent_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"
	"golang.org/x/term"

	"github.com/k7-dev/k7/internal/agent"
	"github.com/k7-dev/k7/internal/agent/client"
	"github.com/k7-dev/k7/internal/agent/proto"
	"github.com/k7-dev/k7/internal/errdefs"
	"github.com/k7-dev/k7/internal/testutil"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testutil.Cleanup()
	os.Exit(code)
}

// harness is an agent and a way to connect clients to it.
type harness struct {
	connect func(t *testing.T) *client.Client
	// inject writes raw bytes into the agent's input and the clients'
	// input; nil if the harness cannot.
	injectAgent, injectClient func(b []byte)
	console                   func() string // detached output, "" if not captured
}

type rwc struct {
	io.Reader
	io.Writer
	close func() error
}

func (r rwc) Close() error { return r.close() }

// inProcess runs the agent in this process over io.Pipe pairs: one client.
func inProcess(t *testing.T) *harness {
	c2aR, c2aW := io.Pipe()
	a2cR, a2cW := io.Pipe()
	var console syncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	go func() { _ = agent.Serve(ctx, c2aR, a2cW, agent.Options{NoInit: true, Console: &console}) }()
	t.Cleanup(func() {
		cancel()
		_ = c2aR.Close()
		_ = a2cW.Close()
	})
	used := false
	return &harness{
		connect: func(t *testing.T) *client.Client {
			if used {
				t.Fatal("io.Pipe harness supports one client")
			}
			used = true
			c := client.New(rwc{a2cR, c2aW, func() error { _ = c2aW.Close(); return a2cR.Close() }})
			t.Cleanup(func() { _ = c.Close() })
			return c
		},
		console: console.String,
	}
}

// fifo is a pipe pair that outlives its clients, like the named FIFOs that
// hold a sandbox's stdio: each client gets its own duplicates of the ends.
type fifo struct {
	agentR, clientW *os.File // client → agent
	clientR, agentW *os.File // agent → client
}

func newFIFO(t *testing.T) *fifo {
	var f fifo
	var err error
	if f.agentR, f.clientW, err = os.Pipe(); err != nil {
		t.Fatal(err)
	}
	if f.clientR, f.agentW, err = os.Pipe(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, x := range []*os.File{f.agentR, f.clientW, f.clientR, f.agentW} {
			x.Close()
		}
	})
	return &f
}

func dup(t *testing.T, f *os.File) *os.File {
	fd, err := syscall.Dup(int(f.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	_ = syscall.SetNonblock(fd, true)
	return os.NewFile(uintptr(fd), f.Name())
}

func (f *fifo) connect(t *testing.T) *client.Client {
	r, w := dup(t, f.clientR), dup(t, f.clientW)
	c := client.New(rwc{r, w, func() error { w.Close(); return r.Close() }})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// inProcessFIFO runs the agent in this process over os.Pipe FIFOs.
func inProcessFIFO(t *testing.T) *harness {
	f := newFIFO(t)
	var console syncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	go func() { _ = agent.Serve(ctx, f.agentR, f.agentW, agent.Options{NoInit: true, Console: &console}) }()
	t.Cleanup(cancel)
	return &harness{
		connect:      f.connect,
		injectAgent:  func(b []byte) { _, _ = f.clientW.Write(b) },
		injectClient: func(b []byte) { _, _ = f.agentW.Write(b) },
		console:      console.String,
	}
}

// subprocess runs the built k7-agent over os.Pipe FIFOs. As root it runs
// as PID 1 of new PID, mount and UTS namespaces, as in a sandbox.
func subprocess(t *testing.T) *harness {
	bin := testutil.Binary(t, "k7-agent")
	f := newFIFO(t)
	cmd := exec.Command(bin)
	cmd.Stdin, cmd.Stdout = f.agentR, f.agentW
	var console syncBuffer
	cmd.Stderr = &console
	if os.Geteuid() == 0 {
		cmd.SysProcAttr = &syscall.SysProcAttr{
			Cloneflags:   syscall.CLONE_NEWPID,
			Unshareflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWUTS,
		}
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("agent log:\n%s", console.String())
		}
	})
	return &harness{
		connect:      f.connect,
		injectAgent:  func(b []byte) { _, _ = f.clientW.Write(b) },
		injectClient: func(b []byte) { _, _ = f.agentW.Write(b) },
		console:      console.String,
	}
}

var harnesses = []struct {
	name string
	new  func(t *testing.T) *harness
}{
	{"inprocess", inProcess},
	{"subprocess", subprocess},
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func handshake(t *testing.T, h *harness) *client.Client {
	t.Helper()
	c := h.connect(t)
	hello, err := c.Handshake(ctxT(t, 10*time.Second))
	if err != nil {
		t.Fatalf("Handshake: %v", err)
	}
	if hello.ProtocolVersion != agent.ProtocolVersion || hello.AgentVersion != agent.Version {
		t.Errorf("hello = %+v, want protocol %d agent %s", hello, agent.ProtocolVersion, agent.Version)
	}
	return c
}

type result struct {
	stdout, stderr string
	status         client.ExitStatus
}

func run(t *testing.T, c *client.Client, req *client.ExecRequest, stdin io.Reader) (result, error) {
	t.Helper()
	ctx := ctxT(t, 20*time.Second)
	var out, errb syncBuffer
	p, err := c.Exec(ctx, req, client.Stdio{Stdin: stdin, Stdout: &out, Stderr: &errb})
	if err != nil {
		return result{}, err
	}
	st, err := p.Wait(ctx)
	return result{out.String(), errb.String(), st}, err
}

func TestExec(t *testing.T) {
	testutil.RequiresRoot(t) // user switching
	tests := []struct {
		name       string
		req        client.ExecRequest
		stdin      string
		wantOut    string
		wantErr    string
		wantCode   int
		wantTimout bool
	}{
		{name: "echo and exit code", req: client.ExecRequest{Args: []string{"sh", "-c", "echo hello; exit 3"}}, wantOut: "hello\n", wantCode: 3},
		{name: "stdin to EOF", req: client.ExecRequest{Args: []string{"cat"}, Stdin: true}, stdin: "line 1\nline 2", wantOut: "line 1\nline 2"},
		{name: "stderr separate", req: client.ExecRequest{Args: []string{"sh", "-c", "echo out; echo err >&2; echo out2"}}, wantOut: "out\nout2\n", wantErr: "err\n"},
		{name: "env cwd default path", req: client.ExecRequest{Args: []string{"sh", "-c", `echo "$FOO $PATH"; pwd`}, Env: []string{"FOO=bar", "PATH="}, Cwd: "/tmp"},
			wantOut: "bar " + agent.DefaultPath + "\n/tmp\n"},
		{name: "default cwd", req: client.ExecRequest{Args: []string{"pwd"}}, wantOut: "/\n"},
		{name: "user by name", req: client.ExecRequest{Args: []string{"sh", "-c", `id -u; id -g; echo $HOME`}, User: "nobody"}, wantOut: "65534\n65534\n/nonexistent\n"},
		{name: "user uid:gid", req: client.ExecRequest{Args: []string{"sh", "-c", "id -u; id -g"}, User: "1234:5678"}, wantOut: "1234\n5678\n"},
		{name: "user groups", req: client.ExecRequest{Args: []string{"id", "-G"}, User: "65534:65534"}, wantOut: "65534\n"},
		{name: "timeout", req: client.ExecRequest{Args: []string{"sleep", "30"}, Timeout: 200 * time.Millisecond}, wantCode: 137, wantTimout: true},
		{name: "killed by signal", req: client.ExecRequest{Args: []string{"sh", "-c", "kill -TERM $$"}}, wantCode: 128 + 15},
		{name: "exit waits for output", req: client.ExecRequest{Args: []string{"sh", "-c", "head -c 300000 /dev/zero | tr '\\0' x; exit 0"}}, wantOut: strings.Repeat("x", 300000)},
		{name: "background holder does not block exit", req: client.ExecRequest{Args: []string{"sh", "-c", "sleep 5 & echo started"}}, wantOut: "started\n"},
	}
	for _, hs := range harnesses {
		t.Run(hs.name, func(t *testing.T) {
			c := handshake(t, hs.new(t))
			for _, tc := range tests {
				t.Run(tc.name, func(t *testing.T) {
					t.Parallel()
					var stdin io.Reader
					if tc.req.Stdin {
						stdin = strings.NewReader(tc.stdin)
					}
					got, err := run(t, c, &tc.req, stdin)
					if err != nil {
						t.Fatalf("run: %v", err)
					}
					if got.stdout != tc.wantOut || got.stderr != tc.wantErr {
						t.Errorf("stdout, stderr = %.200q, %.200q; want %.200q, %.200q", got.stdout, got.stderr, tc.wantOut, tc.wantErr)
					}
					if got.status.Code != tc.wantCode || got.status.TimedOut != tc.wantTimout {
						t.Errorf("status = %+v, want code %d timed out %v", got.status, tc.wantCode, tc.wantTimout)
					}
				})
			}
		})
	}
}

func TestStartErrors(t *testing.T) {
	tests := []struct {
		name     string
		req      client.ExecRequest
		wantCode int
		wantMsg  string
	}{
		{"not found", client.ExecRequest{Args: []string{"nosuch"}}, 127, `exec: "nosuch": executable file not found in $PATH`},
		{"not found by path", client.ExecRequest{Args: []string{"/no/such"}}, 127, `exec: "/no/such": no such file or directory`},
		{"not executable", client.ExecRequest{Args: []string{"/etc/passwd"}}, 126, `exec: "/etc/passwd": permission denied`},
		{"bad cwd", client.ExecRequest{Args: []string{"true"}, Cwd: "/no/such/dir"}, 126, `chdir /no/such/dir: no such file or directory`},
		{"bad user", client.ExecRequest{Args: []string{"true"}, User: "nosuchuser"}, 126, `user "nosuchuser": no such user in /etc/passwd`},
		{"no args", client.ExecRequest{}, 126, `exec: no command`},
	}
	for _, hs := range harnesses {
		t.Run(hs.name, func(t *testing.T) {
			c := handshake(t, hs.new(t))
			for _, tc := range tests {
				t.Run(tc.name, func(t *testing.T) {
					_, err := run(t, c, &tc.req, nil)
					var se *client.StartError
					if !errors.As(err, &se) || !errors.Is(err, client.ErrStart) {
						t.Fatalf("err = %v, want a StartError", err)
					}
					if se.Code != tc.wantCode || se.Msg != tc.wantMsg {
						t.Errorf("StartError = %d %q, want %d %q", se.Code, se.Msg, tc.wantCode, tc.wantMsg)
					}
				})
			}
			// The channel still works after failures.
			if got, err := run(t, c, &client.ExecRequest{Args: []string{"echo", "ok"}}, nil); err != nil || got.stdout != "ok\n" {
				t.Errorf("echo after failures = %q, %v", got.stdout, err)
			}
		})
	}
}

func TestTTY(t *testing.T) {
	for _, hs := range harnesses {
		t.Run(hs.name, func(t *testing.T) {
			c := handshake(t, hs.new(t))
			got, err := run(t, c, &client.ExecRequest{Args: []string{"sh", "-c", "tty; stty size; echo err >&2; test -t 0 && echo interactive"}, TTY: true, Rows: 30, Cols: 100}, nil)
			if err != nil {
				t.Fatal(err)
			}
			lines := strings.Split(strings.ReplaceAll(got.stdout, "\r\n", "\n"), "\n")
			if len(lines) < 4 || !strings.HasPrefix(lines[0], "/dev/pts/") || lines[1] != "30 100" || lines[2] != "err" || lines[3] != "interactive" {
				t.Errorf("tty output = %q, want /dev/pts/N, 30 100, err, interactive", got.stdout)
			}

			// Resize while running, then read the size.
			ctx := ctxT(t, 10*time.Second)
			var out syncBuffer
			pr, pw := io.Pipe()
			p, err := c.Exec(ctx, &client.ExecRequest{Args: []string{"sh", "-c", "read x; stty size"}, TTY: true, Stdin: true, Rows: 10, Cols: 20}, client.Stdio{Stdin: pr, Stdout: &out})
			if err != nil {
				t.Fatal(err)
			}
			if err := p.Resize(ctx, 40, 120); err != nil {
				t.Fatal(err)
			}
			_, _ = pw.Write([]byte("go\n"))
			st, err := p.Wait(ctx)
			if err != nil || st.Code != 0 {
				t.Fatalf("Wait = %+v, %v", st, err)
			}
			if !strings.Contains(out.String(), "40 120") {
				t.Errorf("output after resize = %q, want 40 120", out.String())
			}
		})
	}
}

func TestSignalAndStdinClose(t *testing.T) {
	for _, hs := range harnesses {
		t.Run(hs.name, func(t *testing.T) {
			c := handshake(t, hs.new(t))
			ctx := ctxT(t, 10*time.Second)
			for _, tc := range []struct {
				sig  syscall.Signal
				want int
			}{{syscall.SIGKILL, 137}, {syscall.SIGTERM, 143}, {syscall.SIGINT, 130}} {
				var out syncBuffer
				p, err := c.Exec(ctx, &client.ExecRequest{Args: []string{"sh", "-c", "echo ready; sleep 30"}}, client.Stdio{Stdout: &out})
				if err != nil {
					t.Fatal(err)
				}
				waitFor(t, func() bool { return out.String() == "ready\n" })
				if err := p.Signal(ctx, int(tc.sig)); err != nil {
					t.Fatal(err)
				}
				st, err := p.Wait(ctx)
				if err != nil || st.Code != tc.want {
					t.Errorf("after %v: Wait = %+v, %v; want code %d", tc.sig, st, err, tc.want)
				}
			}
			// CloseStdin without a reader: cat sees EOF.
			p, err := c.Exec(ctx, &client.ExecRequest{Args: []string{"cat"}, Stdin: true}, client.Stdio{})
			if err != nil {
				t.Fatal(err)
			}
			_ = p.CloseStdin()
			if st, err := p.Wait(ctx); err != nil || st.Code != 0 {
				t.Errorf("cat after CloseStdin: %+v, %v", st, err)
			}
		})
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met before deadline")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestDetach(t *testing.T) {
	for _, hs := range harnesses {
		t.Run(hs.name, func(t *testing.T) {
			h := hs.new(t)
			c := handshake(t, h)
			ctx := ctxT(t, 10*time.Second)
			p, err := c.Exec(ctx, &client.ExecRequest{Args: []string{"sh", "-c", "echo detached-out; echo detached-err >&2; exec sleep 30"}, Detach: true}, client.Stdio{})
			if err != nil {
				t.Fatal(err)
			}
			if st, err := p.Wait(ctx); err != nil || st != (client.ExitStatus{}) {
				t.Errorf("detached Wait = %+v, %v; want zero at once", st, err)
			}
			pid := p.PID()
			// Still running after Exec returned.
			got, err := run(t, c, &client.ExecRequest{Args: []string{"kill", "-0", strconv.Itoa(pid)}}, nil)
			if err != nil || got.status.Code != 0 {
				t.Errorf("kill -0 %d = %+v, %v; want running", pid, got, err)
			}
			prefix := fmt.Sprintf("[pid %d] ", pid)
			waitFor(t, func() bool {
				s := h.console()
				return strings.Contains(s, prefix+"detached-out\n") && strings.Contains(s, prefix+"detached-err\n")
			})
		})
	}
}

func TestFiles(t *testing.T) {
	for _, hs := range harnesses {
		t.Run(hs.name, func(t *testing.T) {
			c := handshake(t, hs.new(t))
			ctx := ctxT(t, 20*time.Second)
			dir := "/tmp/k7-agent-test-" + strconv.Itoa(os.Getpid()) + "-" + hs.name
			t.Cleanup(func() { os.RemoveAll(dir) })
			data := make([]byte, 1<<20+17)
			rand.Read(data)
			path := dir + "/a/b/file.bin"
			if err := c.PutFile(ctx, path, 0o640, bytes.NewReader(data)); err != nil {
				t.Fatalf("PutFile: %v", err)
			}
			var got bytes.Buffer
			if err := c.GetFile(ctx, path, &got); err != nil {
				t.Fatalf("GetFile: %v", err)
			}
			if !bytes.Equal(got.Bytes(), data) {
				t.Fatalf("GetFile returned %d bytes, differing from the %d put", got.Len(), len(data))
			}
			r, err := run(t, c, &client.ExecRequest{Args: []string{"stat", "-c", "%a %s", path}}, nil)
			if err != nil || r.stdout != fmt.Sprintf("640 %d\n", len(data)) {
				t.Errorf("stat = %q, %v; want mode 640 and size %d", r.stdout, err, len(data))
			}
			// Overwrite atomically, and an empty file.
			if err := c.PutFile(ctx, dir+"/a/../a/b/file.bin", 0o600, strings.NewReader("small")); err != nil {
				t.Fatal(err)
			}
			got.Reset()
			if err := c.GetFile(ctx, path, &got); err != nil || got.String() != "small" {
				t.Errorf("after overwrite: %q, %v", got.String(), err)
			}
			if err := c.PutFile(ctx, dir+"/empty", 0, strings.NewReader("")); err != nil {
				t.Errorf("empty PutFile: %v", err)
			}

			for _, tc := range []struct {
				name string
				err  error
				fn   func() error
			}{
				{"get missing", errdefs.ErrNotFound, func() error { return c.GetFile(ctx, dir+"/nope", io.Discard) }},
				{"get directory", errdefs.ErrInvalidArgument, func() error { return c.GetFile(ctx, dir, io.Discard) }},
				{"get relative", errdefs.ErrInvalidArgument, func() error { return c.GetFile(ctx, "tmp/x", io.Discard) }},
				{"put directory", errdefs.ErrInvalidArgument, func() error { return c.PutFile(ctx, dir+"/a", 0o644, strings.NewReader("x")) }},
				{"put relative", errdefs.ErrInvalidArgument, func() error { return c.PutFile(ctx, "x", 0o644, strings.NewReader("x")) }},
				{"put under a file", errdefs.ErrInvalidArgument, func() error { return c.PutFile(ctx, path+"/x", 0o644, strings.NewReader("x")) }},
			} {
				if err := tc.fn(); !errors.Is(err, tc.err) {
					t.Errorf("%s: err = %v, want %v", tc.name, err, tc.err)
				}
			}
			// No temporary files were left behind.
			r, _ = run(t, c, &client.ExecRequest{Args: []string{"sh", "-c", "find " + dir + " -name '.k7-put-*' | wc -l"}}, nil)
			if strings.TrimSpace(r.stdout) != "0" {
				t.Errorf("temporary files left: %q", r.stdout)
			}
		})
	}
}

// countWriter counts bytes and checks they are all 'x'... or anything.
type countWriter struct {
	mu sync.Mutex
	n  int64
}

func (w *countWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	w.n += int64(len(p))
	w.mu.Unlock()
	return len(p), nil
}

// slowWriter blocks until released.
type slowWriter struct{ release chan struct{} }

func (w slowWriter) Write(p []byte) (int, error) { <-w.release; return len(p), nil }

func TestLargeOutputAndSlowConsumer(t *testing.T) {
	for _, hs := range harnesses {
		t.Run(hs.name, func(t *testing.T) {
			c := handshake(t, hs.new(t))
			ctx := ctxT(t, 30*time.Second)
			// A consumer that does not read must not stall other commands.
			slow := slowWriter{make(chan struct{})}
			ps, err := c.Exec(ctx, &client.ExecRequest{Args: []string{"head", "-c", "10000000", "/dev/zero"}}, client.Stdio{Stdout: slow})
			if err != nil {
				t.Fatal(err)
			}
			const size = 50 << 20
			var w countWriter
			p, err := c.Exec(ctx, &client.ExecRequest{Args: []string{"head", "-c", strconv.Itoa(size), "/dev/zero"}}, client.Stdio{Stdout: &w})
			if err != nil {
				t.Fatal(err)
			}
			st, err := p.Wait(ctx)
			if err != nil || st.Code != 0 || w.n != size {
				t.Errorf("50 MB: status %+v err %v, got %d bytes; want %d", st, err, w.n, size)
			}
			if _, err := c.Ping(ctx); err != nil {
				t.Errorf("Ping while a consumer is stuck: %v", err)
			}
			close(slow.release)
			if st, err := ps.Wait(ctx); err != nil || st.Code != 0 {
				t.Errorf("slow consumer's command: %+v, %v", st, err)
			}
		})
	}
}

// frameBytes encodes a frame.
func frameBytes(t *testing.T, f proto.Frame) []byte {
	b, err := proto.AppendFrame(nil, f)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestResyncAndReconnect(t *testing.T) {
	for _, hs := range []struct {
		name string
		new  func(t *testing.T) *harness
	}{{"inprocess", inProcessFIFO}, {"subprocess", subprocess}} {
		t.Run(hs.name, func(t *testing.T) {
			h := hs.new(t)
			// A daemon died mid-frame in both directions: a header promising
			// 500 KB that never come, a truncated frame, and noise.
			partial := frameBytes(t, proto.Frame{Type: proto.TPutFile, Channel: 5, Payload: make([]byte, 500000)})[:proto.HeaderSize+1000]
			garbage := append([]byte("\x00garbage K7\x01"), partial...)
			garbage = append(garbage, frameBytes(t, proto.Frame{Type: proto.TStdout, Channel: 1, Payload: []byte("stale")})[:30]...)
			h.injectAgent(garbage)
			h.injectClient(garbage)

			c1 := handshake(t, h)
			if got, err := run(t, c1, &client.ExecRequest{Args: []string{"echo", "one"}}, nil); err != nil || got.stdout != "one\n" {
				t.Fatalf("first client: %q, %v", got.stdout, err)
			}
			ctx := ctxT(t, 20*time.Second)
			// Leave a chatty command and a detached one behind, and half a
			// frame in the agent's input.
			if _, err := c1.Exec(ctx, &client.ExecRequest{Args: []string{"sh", "-c", "while :; do echo chatter; sleep 0.01; done"}}, client.Stdio{}); err != nil {
				t.Fatal(err)
			}
			d, err := c1.Exec(ctx, &client.ExecRequest{Args: []string{"sleep", "30"}, Detach: true}, client.Stdio{})
			if err != nil {
				t.Fatal(err)
			}
			time.Sleep(50 * time.Millisecond) // let chatter pile up in the transport
			h.injectAgent(partial[:100])
			_ = c1.Close()
			select {
			case <-c1.Done():
			case <-time.After(5 * time.Second):
				t.Fatal("Done not closed after Close")
			}
			if _, err := c1.Ping(ctx); !errors.Is(err, client.ErrClosed) {
				t.Errorf("Ping on closed client: %v, want ErrClosed", err)
			}

			c2 := handshake(t, h)
			got, err := run(t, c2, &client.ExecRequest{Args: []string{"sh", "-c", "echo two; kill -0 " + strconv.Itoa(d.PID()) + " && echo alive"}}, nil)
			if err != nil || got.stdout != "two\nalive\n" || got.status.Code != 0 {
				t.Errorf("second client: %+v, %v; want two, alive", got, err)
			}
			if rtt, err := c2.Ping(ctx); err != nil || rtt <= 0 {
				t.Errorf("Ping = %v, %v", rtt, err)
			}
		})
	}
}

func TestConfigure(t *testing.T) {
	testutil.RequiresRoot(t)
	h := subprocess(t) // own UTS namespace
	c := handshake(t, h)
	if err := c.Configure(ctxT(t, 5*time.Second), "k7-child-1"); err != nil {
		t.Fatal(err)
	}
	got, err := run(t, c, &client.ExecRequest{Args: []string{"hostname"}}, nil)
	if err != nil || got.stdout != "k7-child-1\n" {
		t.Errorf("hostname = %q, %v", got.stdout, err)
	}
	// In-process (NoInit) only records the name.
	c2 := handshake(t, inProcess(t))
	if err := c2.Configure(ctxT(t, 5*time.Second), "not-the-host"); err != nil {
		t.Fatal(err)
	}
	if hn, _ := os.Hostname(); hn == "not-the-host" {
		t.Fatal("NoInit agent changed the host name")
	}
}

func TestFreezeThaw(t *testing.T) {
	f := newFIFO(t)
	srv := agent.NewServer(agent.Options{NoInit: true, Console: io.Discard})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() { _ = srv.Serve(ctx, f.agentR, f.agentW) }()
	c := handshake(t, &harness{connect: f.connect})
	var out syncBuffer
	p, err := c.Exec(ctxT(t, 10*time.Second), &client.ExecRequest{Args: []string{"sh", "-c", "while :; do echo t; sleep 0.01; done"}}, client.Stdio{Stdout: &out})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return len(out.String()) > 0 })
	if err := srv.Freeze(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // let in-flight output arrive
	before := out.String()
	time.Sleep(200 * time.Millisecond)
	if after := out.String(); after != before {
		t.Errorf("output grew while frozen: %d → %d bytes", len(before), len(after))
	}
	if err := srv.Thaw(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return len(out.String()) > len(before) })
	_ = p.Signal(context.Background(), int(syscall.SIGKILL))
	if st, _ := p.Wait(ctxT(t, 5*time.Second)); st.Code != 137 {
		t.Errorf("status after kill = %+v", st)
	}
}

// As PID 1 the agent reaps orphans: a zombie would still answer kill -0.
func TestReapsOrphans(t *testing.T) {
	testutil.RequiresRoot(t) // PID namespace
	c := handshake(t, subprocess(t))
	got, err := run(t, c, &client.ExecRequest{Args: []string{"sh", "-c", "sleep 0.1 >/dev/null 2>&1 & echo $!"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	orphan := strings.TrimSpace(got.stdout)
	waitFor(t, func() bool {
		r, err := run(t, c, &client.ExecRequest{Args: []string{"kill", "-0", orphan}}, nil)
		return err == nil && r.status.Code != 0
	})
}

// --transport serves on a character device; a raw pty slave stands in for
// a virtio-serial port.
func TestTransportFlag(t *testing.T) {
	master, slave, err := pty.Open()
	if err != nil {
		t.Skipf("no pty: %v", err)
	}
	defer master.Close()
	if _, err := term.MakeRaw(int(slave.Fd())); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(testutil.Binary(t, "k7-agent"), "--transport", slave.Name())
	var console syncBuffer
	cmd.Stderr = &console
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// The test keeps the slave open: a master reads EIO while no slave is.
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait(); _ = slave.Close() })
	c := client.New(master)
	defer func() { _ = c.Close() }()
	if _, err := c.Handshake(ctxT(t, 10*time.Second)); err != nil {
		t.Fatalf("Handshake over %s: %v\n%s", slave.Name(), err, console.String())
	}
	got, err := run(t, c, &client.ExecRequest{Args: []string{"echo", "over the port"}}, nil)
	if err != nil || got.stdout != "over the port\n" {
		t.Errorf("echo = %q, %v", got.stdout, err)
	}
}

// Finished commands leave no descriptors open in the agent.
func TestNoFDLeak(t *testing.T) {
	c := handshake(t, inProcess(t))
	fds := func() int {
		ents, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Skip(err)
		}
		return len(ents)
	}
	runAll := func() {
		for _, req := range []client.ExecRequest{
			{Args: []string{"cat"}, Stdin: true},
			{Args: []string{"tty"}, TTY: true},
			{Args: []string{"true"}},
			{Args: []string{"nosuch"}},
		} {
			_, _ = run(t, c, &req, strings.NewReader("x"))
		}
		_, _ = run(t, c, &client.ExecRequest{Args: []string{"true"}, Stdin: true}, nil) // stdin never closed
	}
	runAll() // warm up lazily opened descriptors
	before := fds()
	for range 5 {
		runAll()
	}
	// Descriptors are closed by goroutines that may lag the exit a little.
	deadline := time.Now().Add(5 * time.Second)
	for fds() > before && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if after := fds(); after > before {
		t.Errorf("open descriptors grew from %d to %d", before, after)
	}
}
