package qemu

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/k7-dev/k7/internal/agent/client"
	"github.com/k7-dev/k7/internal/engine"
	"github.com/k7-dev/k7/internal/testutil"
)

// testRoot is the engine root shared by the package's tests, so that the
// kernel is extracted and the initramfs and root disk built once.
var testRoot string

func TestMain(m *testing.M) {
	d, err := os.MkdirTemp("", "k7-qemu-test-")
	if err != nil {
		panic(err)
	}
	testRoot = d
	code := m.Run()
	_ = os.RemoveAll(d)
	testutil.Cleanup()
	os.Exit(code)
}

var rootfsOnce sync.Once

// requireQEMU skips t unless QEMU, a kernel and root are there.
func requireQEMU(t *testing.T) {
	t.Helper()
	testutil.RequiresQEMU(t)
}

// busyboxRootfs makes a root filesystem of a static busybox, the smallest
// image that has a shell.
func busyboxRootfs(t testing.TB, dir string) {
	t.Helper()
	bb, err := exec.LookPath("busybox")
	if err != nil {
		t.Skip("no busybox for the test rootfs (apt install busybox-static)")
	}
	for _, d := range []string{"bin", "tmp", "etc", "root", "proc", "sys", "dev", "run"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	_ = os.Chmod(filepath.Join(dir, "tmp"), 0o1777)
	b, err := os.ReadFile(bb)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "bin", "busybox"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bb, "--list").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range strings.Fields(string(out)) {
		if name != "busybox" {
			_ = os.Symlink("busybox", filepath.Join(dir, "bin", name))
		}
	}
	_ = os.WriteFile(filepath.Join(dir, "etc", "passwd"), []byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n"), 0o644)
	_ = os.WriteFile(filepath.Join(dir, "etc", "group"), []byte("root:x:0:\nnogroup:x:65534:\n"), 0o644)
}

// newEngine returns an engine with a fresh root and a busybox rootfs
// path; the agent is built from this tree.
func newEngine(t *testing.T) (*Engine, string) {
	t.Helper()
	requireQEMU(t)
	root := filepath.Join(testRoot, "engine")
	rootfs := filepath.Join(testRoot, "rootfs")
	rootfsOnce.Do(func() { busyboxRootfs(t, rootfs) })
	var log *slog.Logger
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	pool := 0
	if os.Getenv("K7_QEMU_POOL") == "1" {
		pool = 1
	}
	e, err := New(Config{Root: root, AgentPath: testutil.Binary(t, "k7-agent"), Accel: os.Getenv("K7_QEMU_ACCEL"), Log: log, ForkPool: pool})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	return e, rootfs
}

func create(t *testing.T, e *Engine, id, rootfs string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := e.Create(ctx, &engine.CreateRequest{ID: id, Hostname: "sb-" + id, Rootfs: rootfs, Env: []string{"K7_TEST=1"}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Delete(context.Background(), id) })
}

func connect(t testing.TB, e *Engine, id string) *client.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rw, err := e.Connect(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	c := client.New(rw)
	if _, err := c.Handshake(ctx); err != nil {
		_ = c.Close()
		t.Fatalf("handshake with %s: %v", id, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func run(t testing.TB, c *client.Client, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out bytes.Buffer
	p, err := c.Exec(ctx, &client.ExecRequest{Args: args}, client.Stdio{Stdout: &out, Stderr: &out})
	if err != nil {
		t.Fatalf("exec %q: %v", args, err)
	}
	st, err := p.Wait(ctx)
	if err != nil {
		t.Fatalf("exec %q: %v", args, err)
	}
	return out.String(), st.Code
}

func TestAccelProbe(t *testing.T) {
	requireQEMU(t)
	dir := t.TempDir()
	qemuBin, _ := exec.LookPath("qemu-system-x86_64")
	start := time.Now()
	c, err := chooseAccel(context.Background(), qemuBin, dir, "")
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	t.Logf("accel %s (%s), probe took %v", c.Name, c.Reason, took)
	if os.Getenv("K7_EXPECT_ACCEL") != "" && c.Name != os.Getenv("K7_EXPECT_ACCEL") {
		t.Errorf("accel = %s, want %s", c.Name, os.Getenv("K7_EXPECT_ACCEL"))
	}
	if c.Reason == "" {
		t.Error("no reason")
	}
	if took > 2500*time.Millisecond {
		t.Errorf("probe took %v, want < 2.5s", took)
	}
	// Cached.
	start = time.Now()
	c2, _ := chooseAccel(context.Background(), qemuBin, dir, "")
	if c2.Name != c.Name || time.Since(start) > 50*time.Millisecond {
		t.Errorf("second probe: %+v after %v, want cached %+v", c2, time.Since(start), c)
	}
}

func TestBootExec(t *testing.T) {
	e, rootfs := newEngine(t)
	name, reason := e.Accel()
	t.Logf("accel %s: %s; version %s", name, reason, e.Version())
	start := time.Now()
	create(t, e, "b1", rootfs)
	c := connect(t, e, "b1")
	t.Logf("boot -> agent answers: %v", time.Since(start))

	out, code := run(t, c, "sh", "-c", "echo hi; exit 3")
	if out != "hi\n" || code != 3 {
		t.Errorf("exec = %q, %d; want %q, 3", out, code, "hi\n")
	}
	out, _ = run(t, c, "sh", "-c", "hostname; echo $K7_TEST; cat /proc/1/comm; touch /newfile && echo rw; mount | grep ' / '")
	t.Logf("guest: %s", out)
	if !strings.Contains(out, "sb-b1\n1\n") || !strings.Contains(out, "rw\n") {
		t.Errorf("guest = %q, want host name sb-b1, K7_TEST=1, writable root", out)
	}
	var rtts []time.Duration
	for i := 0; i < 5; i++ {
		t0 := time.Now()
		run(t, c, "true")
		rtts = append(rtts, time.Since(t0))
	}
	t.Logf("exec true round trip: median %v of %v", median(rtts), rtts)

	st, err := e.Status(context.Background(), "b1")
	if err != nil || st.State != engine.StateRunning || st.PID == 0 {
		t.Errorf("Status = %+v, %v; want running", st, err)
	}
	stats, err := e.Stats(context.Background(), "b1")
	if err != nil || stats.MemoryBytes == 0 {
		t.Errorf("Stats = %+v, %v", stats, err)
	}
	t.Logf("stats: %+v", stats)
	ids, _ := e.List(context.Background())
	if !slices.Contains(ids, "b1") {
		t.Errorf("List = %v, want b1 in it", ids)
	}
	pauseResume(t, e, c, "b1")

	// Pause, resume and status share one kept QMP connection; Delete
	// closes it.
	kept := func() *qmp {
		m := e.mons.get("b1")
		m.mu.Lock()
		defer m.mu.Unlock()
		return m.q
	}
	q := kept()
	if q == nil {
		t.Fatal("no QMP connection kept after pause and resume")
	}
	if _, err := e.Status(context.Background(), "b1"); err != nil {
		t.Fatal(err)
	}
	if kept() != q {
		t.Errorf("Status dialed QMP again instead of using the kept connection")
	}

	lr, err := e.Logs(context.Background(), "b1")
	if err != nil {
		t.Fatal(err)
	}
	logb, _ := readAllClose(lr)
	if !bytes.Contains(logb, []byte("k7-vminit: starting agent")) {
		t.Errorf("console log lacks vminit line:\n%s", logb)
	}
	if err := e.Delete(context.Background(), "b1"); err != nil {
		t.Fatal(err)
	}
	e.mons.mu.Lock()
	_, left := e.mons.m["b1"]
	e.mons.mu.Unlock()
	if left {
		t.Errorf("a QMP connection is kept for the deleted sandbox")
	}
}

// TestReattach: a new Engine on the same root (a daemon restart) finds
// the running sandbox and reaches its agent again.
func TestReattach(t *testing.T) {
	e, rootfs := newEngine(t)
	ctx := context.Background()
	create(t, e, "r1", rootfs)
	c := connect(t, e, "r1")
	run(t, c, "sh", "-c", "echo before > /tmp/x")
	_ = c.Close()
	// The first daemon goes away: its QMP connections close (QEMU's
	// monitor serves one client at a time).
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	e2, err := New(e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e2.Close() })
	if st, err := e2.Status(ctx, "r1"); err != nil || st.State != engine.StateRunning {
		t.Fatalf("Status after restart = %+v, %v", st, err)
	}
	c2 := connect(t, e2, "r1")
	if out, _ := run(t, c2, "cat", "/tmp/x"); out != "before\n" {
		t.Errorf("after restart: %q", out)
	}
}

func TestDeleteLeavesNothing(t *testing.T) {
	e, rootfs := newEngine(t)
	ctx := context.Background()
	create(t, e, "d1", rootfs)
	st, err := e.readState("d1")
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Delete(ctx, "d1"); err != nil {
		t.Fatal(err)
	}
	if err := e.Delete(ctx, "d1"); err != nil {
		t.Errorf("second Delete: %v", err)
	}
	assertNothingLeft(t, e, st)
	if _, err := e.Status(ctx, "d1"); err == nil {
		t.Error("Status after Delete: no error")
	}
	// A failed create leaves nothing either.
	err = e.Create(ctx, &engine.CreateRequest{ID: "d2", Rootfs: rootfs, Resources: engine.Resources{MemoryBytes: 1 << 50}})
	if err == nil {
		t.Fatal("Create with 1 PiB of RAM succeeded")
	}
	t.Logf("failed create: %v", err)
	assertNothingLeft(t, e, &vmState{ID: "d2", SockDir: e.sockDir("d2")})

	// A create whose context ends during boot leaves nothing.
	cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	err = e.Create(cctx, &engine.CreateRequest{ID: "d3", Rootfs: rootfs})
	cancel()
	if err == nil {
		t.Fatal("Create with a 300 ms deadline succeeded")
	}
	assertNothingLeft(t, e, &vmState{ID: "d3", SockDir: e.sockDir("d3")})

	// A guest that dies is reported dead, and Delete still cleans up.
	create(t, e, "d4", rootfs)
	c := connect(t, e, "d4")
	st4, _ := e.readState("d4")
	_, _ = c.Exec(ctx, &client.ExecRequest{Args: []string{"sh", "-c", "echo c > /proc/sysrq-trigger"}}, client.Stdio{})
	deadline := time.Now().Add(30 * time.Second)
	for {
		s, err := e.Status(ctx, "d4")
		if err == nil && s.State == engine.StateDead {
			t.Logf("dead guest: %+v", s)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Status of a crashed guest: %+v, %v; want dead", s, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := e.Delete(ctx, "d4"); err != nil {
		t.Fatal(err)
	}
	assertNothingLeft(t, e, st4)
}

func assertNothingLeft(t *testing.T, e *Engine, st *vmState) {
	t.Helper()
	if st.PID != 0 && alive(st) {
		t.Errorf("QEMU pid %d still runs", st.PID)
	}
	if out, _ := exec.Command("pgrep", "-f", e.dir(st.ID)).Output(); len(out) > 0 {
		t.Errorf("processes with %s in their command line: %s", e.dir(st.ID), out)
	}
	if _, err := os.Stat(e.dir(st.ID)); !os.IsNotExist(err) {
		t.Errorf("sandbox dir still there: %v", err)
	}
	if _, err := os.Stat(st.SockDir); !os.IsNotExist(err) {
		t.Errorf("socket dir still there: %v", err)
	}
	if m, _ := filepath.Glob(filepath.Join(e.cfg.ShmDir, "k7-qemu-"+e.rootHash+"-"+st.ID+".mem")); len(m) > 0 {
		t.Errorf("memory files left: %v", m)
	}
}

func TestFork(t *testing.T) {
	e, rootfs := newEngine(t)
	ctx := context.Background()
	create(t, e, "src", rootfs)
	c := connect(t, e, "src")
	if _, code := run(t, c, "sh", "-c", "echo marker > /tmp/marker; echo layer > /rootfile"); code != 0 {
		t.Fatal("writing marker")
	}
	// A counter that keeps running in the guest.
	p, err := c.Exec(ctx, &client.ExecRequest{Args: []string{"sh", "-c", "i=0; while true; do i=$((i+1)); echo $i > /tmp/count; sleep 0.1; done"}, Detach: true}, client.Stdio{})
	if err != nil {
		t.Fatal(err)
	}
	_ = p
	time.Sleep(500 * time.Millisecond) // let the counter count
	capDir := t.TempDir()
	res, err := e.Checkpoint(ctx, &engine.CheckpointRequest{ID: "src", Dir: capDir})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("checkpoint: pause %v, size %d, version %q", res.SourcePause, res.SizeBytes, res.EngineVersion)

	const n = 2
	var kids []*client.Client
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("kid%d", i)
		t0 := time.Now()
		if err := e.Restore(ctx, &engine.RestoreRequest{CreateRequest: engine.CreateRequest{ID: id, Rootfs: rootfs}, From: capDir}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.Delete(context.Background(), id) })
		t1 := time.Now()
		kc := connect(t, e, id)
		t2 := time.Now()
		out, _ := run(t, kc, "cat", "/tmp/marker", "/rootfile")
		t.Logf("fork -> child %s answers: %v (restore %v, handshake %v, exec %v)", id, time.Since(t0), t1.Sub(t0), t2.Sub(t1), time.Since(t2))
		if out != "marker\nlayer\n" {
			t.Errorf("child %s: marker files = %q", id, out)
		}
		kids = append(kids, kc)
	}
	// Siblings are isolated; the counter runs on in each.
	run(t, kids[0], "sh", "-c", "echo kid0 > /tmp/own")
	if out, code := run(t, kids[1], "cat", "/tmp/own"); code == 0 {
		t.Errorf("kid1 sees kid0's file: %q", out)
	}
	if out, code := run(t, c, "cat", "/tmp/own"); code == 0 {
		t.Errorf("source sees kid0's file: %q", out)
	}
	for i, kc := range kids {
		a, _ := run(t, kc, "cat", "/tmp/count")
		deadline := time.Now().Add(20 * time.Second)
		for {
			b, _ := run(t, kc, "cat", "/tmp/count")
			if strings.TrimSpace(b) != strings.TrimSpace(a) && strings.TrimSpace(b) != "" {
				t.Logf("kid%d counter: %s -> %s", i, strings.TrimSpace(a), strings.TrimSpace(b))
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("kid%d: counter stuck at %q", i, a)
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	var pss, rss int64
	for i := 0; i < n; i++ {
		st, _ := e.readState(fmt.Sprintf("kid%d", i))
		p, r, err := smapsRollup(st.PID)
		if err != nil {
			t.Fatal(err)
		}
		pss, rss = pss+p, rss+r
	}
	t.Logf("children: PSS sum %d MiB, RSS sum %d MiB, %d x memory = %d MiB", pss>>20, rss>>20, n, n*DefaultMemoryBytes>>20)
	if pss >= n*DefaultMemoryBytes {
		t.Errorf("children PSS sum %d >= %d", pss, n*DefaultMemoryBytes)
	}
	// The source goes on.
	if out, _ := run(t, c, "cat", "/tmp/marker"); out != "marker\n" {
		t.Errorf("source after fork: %q", out)
	}
	// The source can be forked again.
	run(t, c, "sh", "-c", "echo second > /tmp/marker")
	cap3 := t.TempDir()
	if _, err := e.Checkpoint(ctx, &engine.CheckpointRequest{ID: "src", Dir: cap3}); err != nil {
		t.Fatalf("second checkpoint: %v", err)
	}
	if err := e.Restore(ctx, &engine.RestoreRequest{CreateRequest: engine.CreateRequest{ID: "kid2"}, From: cap3}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Delete(context.Background(), "kid2") })
	if out, _ := run(t, connect(t, e, "kid2"), "cat", "/tmp/marker"); out != "second\n" {
		t.Errorf("child of the second checkpoint: marker %q", out)
	}
	// A child can be forked again (its RAM is private: the stream carries it).
	cap2 := t.TempDir()
	if _, err := e.Checkpoint(ctx, &engine.CheckpointRequest{ID: "kid0", Dir: cap2}); err != nil {
		t.Fatal(err)
	}
	if err := e.Restore(ctx, &engine.RestoreRequest{CreateRequest: engine.CreateRequest{ID: "grandkid"}, From: cap2}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Delete(context.Background(), "grandkid") })
	if out, _ := run(t, connect(t, e, "grandkid"), "cat", "/tmp/own"); out != "kid0\n" {
		t.Errorf("grandchild: /tmp/own = %q", out)
	}
	// Delete of a child leaves nothing, and the capture is not needed by
	// the others after they started.
	st, _ := e.readState("kid1")
	_ = e.Delete(ctx, "kid1")
	assertNothingLeft(t, e, st)
}

func pauseResume(t *testing.T, e *Engine, c *client.Client, id string) {
	ctx := context.Background()
	if err := e.Pause(ctx, id); err != nil {
		t.Fatal(err)
	}
	if st, _ := e.Status(ctx, id); st.State != engine.StatePaused {
		t.Errorf("state after Pause = %v, want paused", st.State)
	}
	// A paused guest does not answer.
	pctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err := c.Ping(pctx)
	cancel()
	if err == nil {
		t.Error("paused guest answered a ping")
	}
	if err := e.Resume(ctx, id); err != nil {
		t.Fatal(err)
	}
	if st, _ := e.Status(ctx, id); st.State != engine.StateRunning {
		t.Errorf("state after Resume = %v, want running", st.State)
	}
	if out, code := run(t, c, "echo", "back"); out != "back\n" || code != 0 {
		t.Errorf("exec after resume = %q, %d", out, code)
	}
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

func median(d []time.Duration) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

func readAllClose(r interface {
	Read([]byte) (int, error)
	Close() error
}) ([]byte, error) {
	defer func() { _ = r.Close() }()
	var b bytes.Buffer
	_, err := b.ReadFrom(r)
	return b.Bytes(), err
}
