package gvisor

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/k7-dev/k7/internal/agent/client"
	"github.com/k7-dev/k7/internal/engine"
	"github.com/k7-dev/k7/internal/engine/enginetest"
	"github.com/k7-dev/k7/internal/errdefs"
	"github.com/k7-dev/k7/internal/testutil"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testutil.Cleanup()
	os.Exit(code)
}

func newTestEngine(t testing.TB) *Engine {
	t.Helper()
	testutil.RequiresRoot(t)
	runsc := testutil.Runsc(t)
	agent := testutil.Binary(t, "k7-agent")
	log := slog.New(slog.DiscardHandler)
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	root := t.TempDir()
	e, err := New(Config{Runsc: runsc, Root: root, AgentPath: agent, Log: log, Debug: os.Getenv("K7_RUNSC_DEBUG") == "1"})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	// runsc bind-mounts an empty network namespace under its root for
	// --network=none; the temporary dir cannot be removed while it is.
	// Concurrent runsc commands may have stacked several mounts.
	t.Cleanup(func() {
		for unix.Unmount(filepath.Join(root, "runsc", "null-netns"), unix.MNT_DETACH) == nil {
		}
	})
	t.Cleanup(func() { _ = e.Close() })
	return e
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	if testing.Verbose() {
		w.t.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

func TestConformance(t *testing.T) {
	enginetest.Run(t, func(t *testing.T) engine.Engine { return newTestEngine(t) }, enginetest.Config{
		CarriesProcesses: true,
		IsolatedHostname: true,
	})
}

func TestNewUnavailable(t *testing.T) {
	_, err := New(Config{Runsc: "/nonexistent/runsc", Root: t.TempDir(), AgentPath: "/bin/true"})
	if !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("New with a missing runsc: got %v, want ErrUnavailable", err)
	}
}

// started creates a sandbox and returns a connected client.
func started(t *testing.T, ctx context.Context, e *Engine, rootfs string, res engine.Resources) (string, *client.Client) {
	t.Helper()
	id := enginetest.NewID()
	if err := e.Create(ctx, &engine.CreateRequest{ID: id, Rootfs: rootfs, Resources: res}); err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() { _ = e.Delete(context.Background(), id) })
	c := connectTB(t, ctx, e, id)
	t.Cleanup(func() { _ = c.Close() })
	return id, c
}

func cgroupDirs(e *Engine, id string) []string {
	var dirs []string
	for _, c := range cgroupControllers {
		p := filepath.Join("/sys/fs/cgroup", c, e.cgroupsPath(id))
		if _, err := os.Stat(p); err == nil {
			dirs = append(dirs, p)
		}
	}
	return dirs
}

func readTrim(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func listDir(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

// TestHostSide checks what the suite cannot see: cgroup limits applied and
// removed, the shared rootfs never written, death of the sandbox process
// noticed, and a killed sandbox cleaned up.
func TestHostSide(t *testing.T) {
	e := newTestEngine(t)
	rootfs := enginetest.BusyboxRootfs(t)
	before := listDir(t, rootfs)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	id, c := started(t, ctx, e, rootfs, engine.Resources{CPUs: 0.5, MemoryBytes: 256 << 20, PIDs: 64})
	if _, err := c.Exec(ctx, &client.ExecRequest{Args: []string{"sh", "-c", "echo x > /etc/written; echo y > /new-file"}}, client.Stdio{}); err != nil {
		t.Fatal(err)
	}
	cg := "/sys/fs/cgroup"
	if _, err := os.Stat(filepath.Join(cg, "memory")); err == nil {
		if got := readTrim(t, filepath.Join(cg, "memory", e.cgroupsPath(id), "memory.limit_in_bytes")); got != "268435456" {
			t.Errorf("memory.limit_in_bytes: got %s, want 268435456", got)
		}
		if got := readTrim(t, filepath.Join(cg, "cpu", e.cgroupsPath(id), "cpu.cfs_quota_us")); got != "50000" {
			t.Errorf("cpu.cfs_quota_us: got %s, want 50000", got)
		}
		if got := readTrim(t, filepath.Join(cg, "pids", e.cgroupsPath(id), "pids.max")); got != "64" {
			t.Errorf("pids.max: got %s, want 64", got)
		}
	}

	st, err := e.Status(ctx, id)
	if err != nil || st.State != engine.StateRunning || st.PID == 0 {
		t.Fatalf("Status: got %+v, %v", st, err)
	}
	// Killing the sandbox process: the agent stream ends and Status says dead.
	if err := syscall.Kill(st.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-c.Done():
	case <-time.After(5 * time.Second):
		t.Errorf("agent stream still open 5 s after the sandbox was killed")
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		st, err = e.Status(ctx, id)
		if err == nil && (st.State == engine.StateDead || st.State == engine.StateStopped) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Status after kill: got %+v, %v; want dead", st, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("status after kill: %+v", st)
	if _, err := e.Connect(ctx, id); err == nil {
		t.Errorf("Connect to a killed sandbox succeeded")
	}
	if err := e.Delete(ctx, id); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if d := cgroupDirs(e, id); len(d) > 0 {
		t.Errorf("cgroups left after Delete: %v", d)
	}
	if _, err := os.Stat(e.dir(id)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("sandbox dir left after Delete: %v", err)
	}
	ids, _ := e.List(ctx)
	if slices.Contains(ids, id) {
		t.Errorf("List after Delete contains %s", id)
	}
	if after := listDir(t, rootfs); !slices.Equal(before, after) {
		t.Errorf("shared rootfs changed: before %v, after %v", before, after)
	}
	if _, err := os.Stat(filepath.Join(rootfs, "etc/written")); err == nil {
		t.Errorf("a write in the sandbox reached the shared rootfs")
	}
}

// TestFailedCreateLeavesNothing checks the cleanup stack against runsc: a
// Create that fails in runsc leaves no container, cgroup or dir.
func TestFailedCreateLeavesNothing(t *testing.T) {
	e := newTestEngine(t)
	ctx := context.Background()
	id := enginetest.NewID()
	// A rootfs without the mount points' parents and a bad memory limit
	// make runsc fail after the bundle was written.
	rootfs := t.TempDir()
	err := e.Create(ctx, &engine.CreateRequest{ID: id, Rootfs: rootfs, Resources: engine.Resources{MemoryBytes: 1}})
	if err == nil {
		t.Cleanup(func() { _ = e.Delete(ctx, id) })
		t.Skip("runsc accepted the sandbox; nothing to check")
	}
	t.Logf("Create error: %v", err)
	if d := cgroupDirs(e, id); len(d) > 0 {
		t.Errorf("cgroups left after a failed Create: %v", d)
	}
	if _, err := os.Stat(e.dir(id)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("sandbox dir left after a failed Create: %v", err)
	}
	ids, _ := e.List(ctx)
	if slices.Contains(ids, id) {
		t.Errorf("List after a failed Create contains %s", id)
	}
}

func execOut(t *testing.T, ctx context.Context, c *client.Client, args ...string) string {
	t.Helper()
	var out strings.Builder
	p, err := c.Exec(ctx, &client.ExecRequest{Args: args}, client.Stdio{Stdout: &out})
	if err != nil {
		t.Fatalf("exec %q: %v", args, err)
	}
	if st, err := p.Wait(ctx); err != nil || st.Code != 0 {
		t.Fatalf("exec %q: %+v, %v", args, st, err)
	}
	return out.String()
}

// TestDaemonRestart: a second Engine on the same root (a restarted daemon)
// sees, reaches and deletes the first one's sandboxes; the agent keeps
// what it was doing.
func TestDaemonRestart(t *testing.T) {
	e1 := newTestEngine(t)
	rootfs := enginetest.BusyboxRootfs(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	id, c1 := started(t, ctx, e1, rootfs, engine.Resources{})
	execOut(t, ctx, c1, "sh", "-c", "echo before > /tmp/f")
	// The old daemon dies mid-conversation: a command is running and its
	// output is pending when the stream goes away.
	if _, err := c1.Exec(ctx, &client.ExecRequest{Args: []string{"sh", "-c", "sleep 0.2; echo late"}}, client.Stdio{}); err != nil {
		t.Fatal(err)
	}
	_ = c1.Close()

	e2, err := New(e1.cfg)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := e2.List(ctx)
	if err != nil || !slices.Contains(ids, id) {
		t.Fatalf("List after restart: got %v, %v; want %s", ids, err, id)
	}
	if st, err := e2.Status(ctx, id); err != nil || st.State != engine.StateRunning {
		t.Fatalf("Status after restart: %+v, %v", st, err)
	}
	time.Sleep(300 * time.Millisecond) // let the orphaned command write into the FIFO
	rw, err := e2.Connect(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	c2 := client.New(rw)
	defer func() { _ = c2.Close() }()
	if _, err := c2.Handshake(ctx); err != nil {
		t.Fatalf("Handshake after restart: %v", err)
	}
	if got := execOut(t, ctx, c2, "cat", "/tmp/f"); got != "before\n" {
		t.Errorf("after restart: got %q", got)
	}
	if err := e2.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	if d := cgroupDirs(e2, id); len(d) > 0 {
		t.Errorf("cgroups left: %v", d)
	}
}

// TestForkPool: a Restore takes a pre-created container from the pool;
// the child is a normal sandbox under its own ID, and Delete removes the
// pool container's runsc state and cgroups.
func TestForkPool(t *testing.T) {
	e := newTestEngine(t)
	rootfs := enginetest.BusyboxRootfs(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res := engine.Resources{MemoryBytes: 256 << 20}
	id, c := started(t, ctx, e, rootfs, res)
	execOut(t, ctx, c, "sh", "-c", "echo parent > /tmp/m")
	capture := filepath.Join(t.TempDir(), "capture")
	if _, err := e.Checkpoint(ctx, &engine.CheckpointRequest{ID: id, Dir: capture}); err != nil {
		t.Fatal(err)
	}
	key := poolKey{rootfs: rootfs, res: res}
	e.refillNow(key)
	e.waitPool(key)

	child := enginetest.NewID()
	if err := e.Restore(ctx, &engine.RestoreRequest{CreateRequest: engine.CreateRequest{ID: child, Rootfs: rootfs, Resources: res}, From: capture}); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	t.Cleanup(func() { _ = e.Delete(context.Background(), child) })
	cid := e.cid(child)
	if !isPoolID(cid) {
		t.Fatalf("child's container: got %q, want a pool container", cid)
	}
	rw, err := e.Connect(ctx, child)
	if err != nil {
		t.Fatal(err)
	}
	cc := client.New(rw)
	defer func() { _ = cc.Close() }()
	if _, err := cc.Handshake(ctx); err != nil {
		t.Fatal(err)
	}
	if got := execOut(t, ctx, cc, "cat", "/tmp/m"); got != "parent\n" {
		t.Errorf("child's /tmp/m: got %q", got)
	}
	if err := e.Pause(ctx, child); err != nil {
		t.Fatal(err)
	}
	if st, err := e.Status(ctx, child); err != nil || st.State != engine.StatePaused {
		t.Errorf("Status: %+v, %v", st, err)
	}
	if err := e.Resume(ctx, child); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Stats(ctx, child); err != nil {
		t.Error(err)
	}
	if got := readTrim(t, filepath.Join("/sys/fs/cgroup/memory", e.cgroupsPath(cid), "memory.limit_in_bytes")); got != "268435456" {
		t.Errorf("child's memory limit: got %s", got)
	}
	ids, _ := e.List(ctx)
	if !slices.Contains(ids, child) || slices.ContainsFunc(ids, isPoolID) {
		t.Errorf("List: got %v, want %s and no pool container", ids, child)
	}
	if err := e.Delete(ctx, child); err != nil {
		t.Fatal(err)
	}
	if d := cgroupDirs(e, cid); len(d) > 0 {
		t.Errorf("cgroups left: %v", d)
	}
	if _, err := e.state(ctx, cid); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("runsc state of the deleted child's container: %v", err)
	}
}

// TestPausedSandbox: a paused sandbox can be checkpointed (the capture
// restores running) and deleted.
func TestPausedSandbox(t *testing.T) {
	e := newTestEngine(t)
	rootfs := enginetest.BusyboxRootfs(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	id, _ := started(t, ctx, e, rootfs, engine.Resources{})
	if err := e.Pause(ctx, id); err != nil {
		t.Fatal(err)
	}
	capture := filepath.Join(t.TempDir(), "capture")
	if _, err := e.Checkpoint(ctx, &engine.CheckpointRequest{ID: id, Dir: capture}); err != nil {
		t.Errorf("Checkpoint of a paused sandbox: %v", err)
	} else {
		child := enginetest.NewID()
		if err := e.Restore(ctx, &engine.RestoreRequest{CreateRequest: engine.CreateRequest{ID: child, Rootfs: rootfs}, From: capture}); err != nil {
			t.Errorf("Restore from a paused source: %v", err)
		} else {
			t.Cleanup(func() { _ = e.Delete(context.Background(), child) })
			st, err := e.Status(ctx, child)
			t.Logf("child of a paused source: %+v, %v", st, err)
		}
	}
	if st, err := e.Status(ctx, id); err != nil || st.State != engine.StatePaused {
		t.Errorf("Status after Checkpoint: %+v, %v; want paused", st, err)
	}
	if err := e.Delete(ctx, id); err != nil {
		t.Fatalf("Delete of a paused sandbox: %v", err)
	}
	if _, err := e.Status(ctx, id); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Status after Delete: %v", err)
	}
	if d := cgroupDirs(e, id); len(d) > 0 {
		t.Errorf("cgroups left: %v", d)
	}
}
