package integration

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/k7-dev/k7/internal/testutil"
	"github.com/k7-dev/k7/sdk"
)

// daemon is one k7d process on its own state dir and socket.
type daemon struct {
	t        *testing.T
	stateDir string
	socket   string
	logPath  string
	engines  string // k7d --engines
	cmd      *exec.Cmd
	client   *sdk.Client
}

// startDaemon starts k7d on a fresh state dir with the gvisor engine, or
// with the engines given (k7d's --engines); t.Cleanup prunes and stops it.
func startDaemon(t *testing.T, engines ...string) *daemon {
	t.Helper()
	testutil.RequiresRoot(t)
	testutil.Runsc(t)
	dir, err := os.MkdirTemp("", "k7-it-")
	if err != nil {
		t.Fatal(err)
	}
	d := &daemon{
		t:        t,
		stateDir: filepath.Join(dir, "state"),
		socket:   filepath.Join(dir, "k7.sock"),
		logPath:  filepath.Join(dir, "k7d.log"),
		engines:  "gvisor",
	}
	if len(engines) > 0 {
		d.engines = strings.Join(engines, ",")
	}
	d.start()
	t.Cleanup(func() {
		if d.cmd != nil {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			if _, err := d.client.Prune(ctx); err != nil {
				t.Errorf("pruning at cleanup: %v", err)
			}
			cancel()
			d.stop()
		}
		if t.Failed() {
			if b, err := os.ReadFile(d.logPath); err == nil {
				t.Logf("k7d log (last 4 KiB):\n%s", tail(b, 4096))
			}
		}
		// The daemon's own cleanup must leave nothing behind; a plain
		// removal of the temp dir is the last resort.
		if out, err := exec.Command(testutil.Binary(t, "k7d"), "--cleanup", "--state-dir", d.stateDir,
			"--socket", d.socket, "--engines", d.engines, "--runsc", testutil.Runsc(t),
			"--agent", testutil.Binary(t, "k7-agent")).CombinedOutput(); err != nil {
			t.Errorf("k7d --cleanup: %v\n%s", err, out)
		}
		os.RemoveAll(dir)
	})
	return d
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// start runs k7d and waits for its health check.
func (d *daemon) start() {
	t := d.t
	t.Helper()
	logf, err := os.OpenFile(d.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(testutil.Binary(t, "k7d"),
		"--state-dir", d.stateDir, "--socket", d.socket,
		"--runsc", testutil.Runsc(t), "--agent", testutil.Binary(t, "k7-agent"),
		"--engines", d.engines, "--log-level", "debug")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting k7d: %v", err)
	}
	d.cmd = cmd
	c, err := sdk.New("unix://" + d.socket)
	if err != nil {
		t.Fatal(err)
	}
	d.client = c
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := c.Health(ctx)
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(d.logPath)
			t.Fatalf("k7d not healthy after 30s: %v\n%s", err, tail(b, 4096))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stop sends SIGTERM and waits: a graceful stop leaves sandboxes running.
func (d *daemon) stop() {
	d.t.Helper()
	if d.cmd == nil {
		return
	}
	d.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- d.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			d.t.Errorf("k7d exited with %v after SIGTERM, want 0", err)
		}
	case <-time.After(20 * time.Second):
		d.cmd.Process.Kill()
		<-done
		d.t.Errorf("k7d did not exit within 20s of SIGTERM")
	}
	d.cmd = nil
}

// result is one run of the k7 CLI.
type result struct {
	stdout, stderr string
	code           int
}

// k7 runs the CLI against d with optional stdin.
func (d *daemon) k7(stdin []byte, args ...string) result {
	d.t.Helper()
	return runK7(d.t, "unix://"+d.socket, stdin, args...)
}

func runK7(t *testing.T, host string, stdin []byte, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, testutil.Binary(t, "k7"), args...)
	cmd.Env = append(os.Environ(), "K7_HOST="+host)
	var so, se bytes.Buffer
	cmd.Stdout, cmd.Stderr = &so, &se
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	err := cmd.Run()
	r := result{stdout: so.String(), stderr: se.String()}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	default:
		t.Fatalf("running k7 %v: %v", args, err)
	}
	return r
}

// must runs the CLI and fails t unless it exits 0; it returns stdout.
func (d *daemon) must(args ...string) string {
	d.t.Helper()
	r := d.k7(nil, args...)
	if r.code != 0 {
		d.t.Fatalf("k7 %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
	}
	return r.stdout
}

// create makes a busybox sandbox and returns its ID.
func (d *daemon) create(args ...string) string {
	d.t.Helper()
	out := d.must(append(append([]string{"create", "-q"}, args...), "busybox")...)
	id := strings.TrimSpace(out)
	if id == "" || strings.Contains(id, "\n") {
		d.t.Fatalf("create -q printed %q, want one ID", out)
	}
	return id
}

// execOut runs a command in a sandbox through the CLI and returns stdout.
func (d *daemon) execOut(id string, args ...string) string {
	d.t.Helper()
	return d.must(append([]string{"exec", id, "--"}, args...)...)
}

// eventually polls f until it returns nil or the timeout passes.
func eventually(t *testing.T, timeout time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %v", timeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// counter reads /tmp/counter in a sandbox. The loop rewrites the file with
// "echo $i > /tmp/counter" (the issue's own command), so a read can land
// between the truncation and the write: an empty read is retried.
func (d *daemon) counter(id string) int {
	d.t.Helper()
	var n int
	eventually(d.t, 2*time.Second, func() error {
		s := strings.TrimSpace(d.execOut(id, "cat", "/tmp/counter"))
		if _, err := fmt.Sscan(s, &n); err != nil {
			return fmt.Errorf("reading counter of %s: %q: %w", id, s, err)
		}
		return nil
	})
	return n
}

const counterLoop = `i=0; while true; do i=$((i+1)); echo $i > /tmp/counter; sleep 0.1; done`

// startCounter starts the detached counter loop and waits until it counts.
func (d *daemon) startCounter(id string) {
	d.t.Helper()
	d.must("exec", "-d", id, "--", "sh", "-c", counterLoop)
	eventually(d.t, 10*time.Second, func() error {
		r := d.k7(nil, "exec", id, "--", "cat", "/tmp/counter")
		if r.code != 0 || strings.TrimSpace(r.stdout) == "" {
			return fmt.Errorf("counter not running yet: %+v", r)
		}
		return nil
	})
}
