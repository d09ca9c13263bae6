package integration

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/k7-dev/k7/api/v1"
	"github.com/k7-dev/k7/internal/budget"
	"github.com/k7-dev/k7/internal/testutil"
)

func TestExecExitCodeAndOutput(t *testing.T) {
	d := startDaemon(t)
	id := d.create()
	r := d.k7(nil, "exec", id, "--", "sh", "-c", "echo hi; exit 3")
	if r.code != 3 || r.stdout != "hi\n" {
		t.Errorf("exec: code %d stdout %q stderr %q, want 3 and %q", r.code, r.stdout, r.stderr, "hi\n")
	}
	r = d.k7([]byte("from stdin\n"), "exec", "-i", id, "--", "cat")
	if r.code != 0 || r.stdout != "from stdin\n" {
		t.Errorf("exec -i cat: code %d stdout %q, want 0 and the input", r.code, r.stdout)
	}
	r = d.k7(nil, "exec", "-e", "FOO=bar", "-w", "/tmp", "-u", "nobody", id, "--", "sh", "-c", `echo "$FOO $(pwd) $(id -u)"`)
	if got, want := strings.TrimSpace(r.stdout), "bar /tmp 65534"; r.code != 0 || got != want {
		t.Errorf("exec env/cwd/user: code %d stdout %q stderr %q, want %q", r.code, got, r.stderr, want)
	}
	r = d.k7(nil, "exec", id, "--", "sh", "-c", "echo err >&2")
	if r.stderr != "err\n" || r.stdout != "" {
		t.Errorf("stderr routing: stdout %q stderr %q", r.stdout, r.stderr)
	}
}

func TestBackgroundPauseResume(t *testing.T) {
	d := startDaemon(t)
	id := d.create()
	d.startCounter(id)
	time.Sleep(300 * time.Millisecond)
	a := d.counter(id)
	time.Sleep(500 * time.Millisecond)
	if b := d.counter(id); b <= a {
		t.Fatalf("detached counter did not advance: %d then %d", a, b)
	}

	d.must("pause", id)
	sb, err := d.client.GetSandbox(context.Background(), id)
	if err != nil || sb.State != v1.StatePaused {
		t.Fatalf("after pause: %+v, %v; want state paused", sb, err)
	}
	r := d.k7(nil, "exec", id, "--", "true")
	if r.code == 0 || !strings.Contains(r.stderr, "paused") || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 {
		t.Errorf("exec into paused sandbox: code %d stderr %q, want a one-line error naming the pause", r.code, r.stderr)
	}
	time.Sleep(time.Second) // the counter would advance ~10 times if it ran
	d.must("resume", id)
	c1 := d.counter(id)
	if c1 > a+1+15 { // ~0.5 s of counting before the pause plus slack
		t.Errorf("counter advanced while paused: %d before, %d after", a, c1)
	}
	time.Sleep(500 * time.Millisecond)
	if c2 := d.counter(id); c2 <= c1 {
		t.Errorf("counter did not continue after resume: %d then %d", c1, c2)
	}
}

func TestCopyRoundTrip(t *testing.T) {
	d := startDaemon(t)
	id := d.create()
	dir := t.TempDir()
	data := make([]byte, 1<<20)
	rand.Read(data)
	src := filepath.Join(dir, "in")
	if err := os.WriteFile(src, data, 0o644); err != nil {
		t.Fatal(err)
	}
	d.must("cp", src, id+":/tmp/blob")
	if got := strings.TrimSpace(d.execOut(id, "sh", "-c", "wc -c < /tmp/blob")); got != "1048576" {
		t.Errorf("size in sandbox = %q, want 1048576", got)
	}
	out := filepath.Join(dir, "out")
	d.must("cp", id+":/tmp/blob", out)
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Errorf("copied file differs: %d bytes back, want %d identical bytes", len(got), len(data))
	}
	// Traversal through k7 cp paths is refused.
	if r := d.k7(nil, "cp", src, id+":/tmp/../../etc/x"); r.code == 0 {
		t.Errorf("cp to a path with .. succeeded; want refusal")
	}
	if r := d.k7(nil, "cp", id+":/nonexistent", filepath.Join(dir, "x")); r.code == 0 || !strings.Contains(r.stderr, "not found") {
		t.Errorf("cp of a missing file: code %d stderr %q, want not found", r.code, r.stderr)
	}
}

func TestConcurrentCreates(t *testing.T) {
	d := startDaemon(t)
	const n = 20
	var wg sync.WaitGroup
	errs := make(chan error, n)
	ids := make(chan string, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sb, err := d.client.CreateSandbox(context.Background(), v1.CreateSandboxRequest{Image: "busybox", Name: fmt.Sprintf("c%02d", i)})
			if err != nil {
				errs <- err
				return
			}
			ids <- sb.ID
		}()
	}
	wg.Wait()
	close(errs)
	close(ids)
	for err := range errs {
		t.Errorf("concurrent create: %v", err)
	}
	count := 0
	for id := range ids {
		count++
		res, err := d.client.Run(context.Background(), id, v1.ExecRequest{Args: []string{"hostname"}})
		if err != nil || res.ExitCode != 0 {
			t.Errorf("exec in %s: %+v %v", id, res, err)
		}
	}
	if count != n {
		t.Errorf("%d of %d creates succeeded", count, n)
	}
}

func TestDaemonRestartKeepsSandboxes(t *testing.T) {
	d := startDaemon(t)
	id := d.create("--name", "survivor")
	d.startCounter(id)
	d.stop()
	d.start()
	out := d.must("ls", "-q")
	if !strings.Contains(out, id) {
		t.Fatalf("after restart ls -q = %q, want %s listed", out, id)
	}
	sb, err := d.client.GetSandbox(context.Background(), "survivor")
	if err != nil || sb.State != v1.StateRunning {
		t.Fatalf("after restart: %+v %v, want running", sb, err)
	}
	if got := strings.TrimSpace(d.execOut("survivor", "echo", "still here")); got != "still here" {
		t.Errorf("exec after restart: %q", got)
	}
	a := d.counter(id)
	time.Sleep(400 * time.Millisecond)
	if b := d.counter(id); b <= a {
		t.Errorf("background process stopped across the restart: %d then %d", a, b)
	}
}

func TestKilledSandboxIsDead(t *testing.T) {
	d := startDaemon(t)
	id := d.create()
	pids := sandboxPIDs(t, id)
	if len(pids) == 0 {
		t.Fatalf("no runsc-sandbox process found for %s", id)
	}
	for _, p := range pids {
		syscallKill(t, p)
	}
	eventually(t, 10*time.Second, func() error {
		sb, err := d.client.GetSandbox(context.Background(), id)
		if err != nil {
			return err
		}
		if sb.State != v1.StateDead && sb.State != v1.StateStopped {
			return fmt.Errorf("state %q, want dead or stopped", sb.State)
		}
		return nil
	})
	if out := d.must("ls"); !strings.Contains(out, "dead") && !strings.Contains(out, "stopped") {
		t.Errorf("k7 ls does not show the killed sandbox as dead:\n%s", out)
	}
	d.must("rm", "-f", id)
	checkNothingLeft(t, d, id)
}

func TestRemoveLeavesNothing(t *testing.T) {
	d := startDaemon(t)
	id := d.create("--memory", "256M", "--cpus", "1", "--pids", "200")
	d.startCounter(id)
	d.must("rm", "-f", id)
	if r := d.k7(nil, "inspect", id); r.code == 0 {
		t.Errorf("inspect after rm succeeded")
	}
	checkNothingLeft(t, d, id)
}

// checkNothingLeft verifies that no runsc container, process, mount or
// cgroup of sandbox id is left.
func checkNothingLeft(t *testing.T, d *daemon, id string) {
	t.Helper()
	eventually(t, 10*time.Second, func() error {
		if p := sandboxPIDs(t, id); len(p) > 0 {
			return fmt.Errorf("processes of %s left: %v", id, p)
		}
		mi, _ := os.ReadFile("/proc/self/mountinfo")
		for _, l := range strings.Split(string(mi), "\n") {
			if strings.Contains(l, id) {
				return fmt.Errorf("mount left: %s", l)
			}
		}
		if m, _ := filepath.Glob("/sys/fs/cgroup/*/*/" + id + "*"); len(m) > 0 {
			return fmt.Errorf("cgroups left: %v", m)
		}
		if m, _ := filepath.Glob("/sys/fs/cgroup/*/*/*/" + id + "*"); len(m) > 0 {
			return fmt.Errorf("cgroups left: %v", m)
		}
		for _, root := range runscRoots(t, d) {
			out, err := exec.Command(testutil.Runsc(t), "--root", root, "list", "-quiet").CombinedOutput()
			if err != nil {
				return fmt.Errorf("runsc list: %w %s", err, out)
			}
			if strings.Contains(string(out), id) {
				return fmt.Errorf("runsc still lists %s under %s", id, root)
			}
		}
		return nil
	})
}

// runscRoots finds the runsc --root directories under the daemon's state dir
// (runsc keeps a <id>.state file per container in its root).
func runscRoots(t *testing.T, d *daemon) []string {
	var roots []string
	_ = filepath.WalkDir(d.stateDir, func(p string, e os.DirEntry, err error) error {
		if err == nil && e.IsDir() && strings.HasSuffix(p, "runsc") {
			roots = append(roots, p)
		}
		return nil
	})
	if len(roots) == 0 {
		t.Fatalf("no runsc root under %s", d.stateDir)
	}
	return roots
}

// sandboxPIDs returns the host PIDs of processes whose command line names
// the sandbox ID (runsc-sandbox, gofer).
func sandboxPIDs(t *testing.T, id string) []int {
	t.Helper()
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		cl := strings.ReplaceAll(string(b), "\x00", " ")
		if strings.Contains(cl, "runsc") && strings.Contains(cl, id) && strings.Contains(cl, "boot") {
			pids = append(pids, pid)
		}
	}
	return pids
}

func syscallKill(t *testing.T, pid int) {
	t.Helper()
	p, err := os.FindProcess(pid)
	if err == nil {
		err = p.Kill()
	}
	if err != nil {
		t.Fatalf("killing %d: %v", pid, err)
	}
}

func TestBadInput(t *testing.T) {
	d := startDaemon(t)
	d.create("--name", "taken")
	for _, tc := range []struct {
		name string
		args []string
		want string // in the one-line error
	}{
		{"unknown sandbox", []string{"exec", "nosuchbox", "--", "true"}, "not found"},
		{"duplicate name", []string{"create", "--name", "taken", "busybox"}, "taken"},
		{"bad image ref", []string{"create", "Bad::Ref@@"}, "Bad::Ref@@"},
		{"unknown image", []string{"create", "k7.invalid/none:1"}, "k7.invalid/none:1"},
		{"bad memory", []string{"create", "--memory", "12X", "busybox"}, "12X"},
		{"bad name", []string{"create", "--name", "../etc", "busybox"}, "name"},
		{"inspect unknown", []string{"inspect", "nosuchbox"}, "not found"},
		{"rm unknown", []string{"rm", "nosuchbox"}, "not found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := d.k7(nil, tc.args...)
			line := strings.TrimSpace(r.stderr)
			if r.code == 0 || !strings.Contains(line, tc.want) || strings.Contains(line, "\n") || strings.Contains(line, "goroutine") {
				t.Errorf("k7 %v: code %d stderr %q; want non-zero and one line containing %q", tc.args, r.code, r.stderr, tc.want)
			}
		})
	}
	r := d.k7(nil, "exec", "taken", "--", "nosuchcommand")
	if r.code != 127 || !strings.Contains(r.stderr, "nosuchcommand") {
		t.Errorf("command not found: code %d stderr %q, want 127 naming the command", r.code, r.stderr)
	}
	r = runK7(t, "unix://"+filepath.Join(t.TempDir(), "none.sock"), nil, "ls")
	if r.code == 0 || !strings.Contains(r.stderr, "not running") || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 {
		t.Errorf("daemon not running: code %d stderr %q, want a one-line error", r.code, r.stderr)
	}
	// Nothing of the failed creates is left.
	list, err := d.client.ListSandboxes(context.Background())
	if err != nil || len(list) != 1 {
		t.Errorf("after failed creates: %d sandboxes (%v), want only 'taken'", len(list), err)
	}
}

// TestLatencyBudgets checks the daemon-side latency of the lifecycle on
// each engine against internal/budget (median of several samples) and
// prints the figures.
func TestLatencyBudgets(t *testing.T) {
	for _, tc := range []struct {
		engine string
		reps   int
	}{{"gvisor", 5}, {"qemu", 3}} { // qemu: TCG boots take seconds
		t.Run(tc.engine, func(t *testing.T) {
			engines := []string{"gvisor"}
			if tc.engine != "gvisor" {
				engines = append(engines, tc.engine)
			}
			d := startDaemon(t, engines...)
			ctx := context.Background()
			var create, execs, pause, resume []time.Duration
			for range tc.reps {
				sb, err := d.client.CreateSandbox(ctx, v1.CreateSandboxRequest{Image: "busybox", Engine: tc.engine})
				if err != nil {
					t.Fatal(err)
				}
				res, err := d.client.Run(ctx, sb.ID, v1.ExecRequest{Args: []string{"true"}})
				if err != nil {
					t.Fatal(err)
				}
				create = append(create, time.Duration(sb.LatencyNS+res.LatencyNS))
				for range 5 {
					res, err := d.client.Run(ctx, sb.ID, v1.ExecRequest{Args: []string{"true"}})
					if err != nil {
						t.Fatal(err)
					}
					execs = append(execs, time.Duration(res.LatencyNS))
				}
				p, err := d.client.PauseSandbox(ctx, sb.ID)
				if err != nil {
					t.Fatal(err)
				}
				pause = append(pause, time.Duration(p.LatencyNS))
				r, err := d.client.ResumeSandbox(ctx, sb.ID)
				if err != nil {
					t.Fatal(err)
				}
				resume = append(resume, time.Duration(r.LatencyNS))
				if _, err := d.client.DeleteSandbox(ctx, sb.ID, true); err != nil {
					t.Fatal(err)
				}
			}
			budget.Check(t, tc.engine, budget.CreateToExec, create)
			budget.Check(t, tc.engine, budget.ExecRoundTrip, execs)
			budget.Check(t, tc.engine, budget.Pause, pause)
			budget.Check(t, tc.engine, budget.Resume, resume)
		})
	}
}
