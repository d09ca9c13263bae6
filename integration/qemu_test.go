package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/k7-dev/k7/api/v1"
)

// TestQEMUEndToEnd drives the qemu engine (TCG here) from the CLI: create,
// exec with exit code, a fork that carries the marker and the running
// counter to two children that share the template's pages, and removal
// that leaves no QEMU process or memory file behind.
func TestQEMUEndToEnd(t *testing.T) {
	d := startDaemon(t, "gvisor", "qemu")
	info, err := d.client.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range info.Engines {
		if e.Name == "qemu" {
			if !e.Available {
				t.Fatalf("qemu engine unavailable: %s", e.Reason)
			}
			if !strings.Contains(e.Reason, "accel tcg") && !strings.Contains(e.Reason, "accel kvm") {
				t.Errorf("k7 info does not say which acceleration qemu uses and why: %q", e.Reason)
			}
		}
	}
	vm := d.create("--engine", "qemu", "--memory", "256M", "--name", "vm")
	r := d.k7(nil, "exec", vm, "--", "sh", "-c", "echo hi; exit 3")
	if r.code != 3 || r.stdout != "hi\n" {
		t.Fatalf("exec in qemu sandbox: code %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
	}
	d.execOut(vm, "sh", "-c", "echo vm-marker > /tmp/marker")
	d.startCounter(vm)

	children := strings.Fields(d.must("fork", "-q", "-n", "2", "vm"))
	if len(children) != 2 {
		t.Fatalf("fork printed %v, want 2 IDs", children)
	}
	atFork := d.counter(vm)
	var pss int64
	for _, c := range children {
		if got := strings.TrimSpace(d.execOut(c, "cat", "/tmp/marker")); got != "vm-marker" {
			t.Errorf("child %s marker %q", c, got)
		}
		a := d.counter(c)
		eventually(t, 20*time.Second, func() error {
			if b := d.counter(c); b <= a {
				return fmt.Errorf("child %s counter stuck at %d", c, b)
			}
			return nil
		})
		// A restored VM wakes with its capture's clock; the agent steps it.
		var guest int64
		_, _ = fmt.Sscan(d.execOut(c, "date", "+%s"), &guest)
		if off := time.Now().Unix() - guest; off > 2 || off < -2 {
			t.Errorf("child %s clock is off by %d s", c, off)
		}
		sb, err := d.client.GetSandbox(context.Background(), c)
		if err != nil || sb.Stats == nil || sb.Stats.MemoryBytes <= 0 {
			t.Fatalf("child %s stats: %+v %v", c, sb, err)
		}
		pss += sb.Stats.MemoryBytes
	}
	t.Logf("children's PSS: %d MiB total for 2 × 256 MiB guests (counter at fork %d)", pss>>20, atFork)
	if pss >= 2*256<<20 {
		t.Errorf("children's PSS sum %d MiB is not below 2 × 256 MiB: template pages are not shared", pss>>20)
	}
	d.execOut(children[0], "sh", "-c", "echo x > /tmp/only-here")
	if r := d.k7(nil, "exec", children[1], "--", "cat", "/tmp/only-here"); r.code == 0 {
		t.Errorf("a sibling sees the other child's file")
	}

	d.must(append([]string{"rm", "-f", vm}, children...)...)
	list, _ := d.client.ListSandboxes(context.Background())
	for _, sb := range list {
		if sb.State != v1.StateDead {
			t.Errorf("sandbox %s still listed after rm", sb.ID)
		}
	}
	eventually(t, 10*time.Second, func() error {
		for _, id := range append([]string{vm}, children...) {
			if p := processesMentioning(id); len(p) > 0 {
				return fmt.Errorf("QEMU processes of %s left: %v", id, p)
			}
			if m, _ := filepath.Glob("/dev/shm/*" + id + "*"); len(m) > 0 {
				return fmt.Errorf("memory files of %s left: %v", id, m)
			}
		}
		if m, _ := filepath.Glob(filepath.Join(d.stateDir, "engines", "qemu", "sandboxes", "*")); len(m) > 0 {
			return fmt.Errorf("sandbox dirs left: %v", m)
		}
		return nil
	})
}

// processesMentioning returns the PIDs whose command line contains s.
func processesMentioning(s string) []string {
	ents, _ := os.ReadDir("/proc")
	var out []string
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(b), s) {
			out = append(out, e.Name())
		}
	}
	return out
}
