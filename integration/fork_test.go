package integration

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/k7-dev/k7/api/v1"
	"github.com/k7-dev/k7/internal/budget"
)

// TestForkCarriesMemory is the product's core promise: children continue
// with the parent's running processes and tmpfs, and diverge independently.
func TestForkCarriesMemory(t *testing.T) {
	d := startDaemon(t)
	parent := d.create("--name", "parent")
	d.execOut(parent, "sh", "-c", "echo carried > /tmp/marker")
	d.startCounter(parent)
	time.Sleep(300 * time.Millisecond)

	out := d.must("fork", "-q", "-n", "3", "parent")
	children := strings.Fields(out)
	if len(children) != 3 {
		t.Fatalf("fork -q -n 3 printed %q, want 3 IDs", out)
	}
	atFork := d.counter(parent)
	for _, c := range children {
		if c == parent {
			t.Fatalf("child has the parent's ID")
		}
		if got := strings.TrimSpace(d.execOut(c, "cat", "/tmp/marker")); got != "carried" {
			t.Errorf("child %s marker = %q, want carried", c, got)
		}
		sb, err := d.client.GetSandbox(context.Background(), c)
		if err != nil || sb.Parent != parent || sb.Name == "parent" {
			t.Errorf("child %s: %+v %v; want parent %s and its own name", c, sb, err, parent)
		}
		if h := strings.TrimSpace(d.execOut(c, "hostname")); h == "parent" {
			t.Errorf("child %s kept the parent's hostname", c)
		}
	}
	// Each child's counter continues from about the fork's value and keeps
	// increasing; the parent keeps counting on its own.
	first := map[string]int{}
	for _, c := range children {
		first[c] = d.counter(c)
		if first[c] < 1 || first[c] > atFork+30 {
			t.Errorf("child %s counter %d right after the fork, parent had %d", c, first[c], atFork)
		}
	}
	time.Sleep(600 * time.Millisecond)
	for _, c := range children {
		if n := d.counter(c); n <= first[c] {
			t.Errorf("child %s counter did not advance: %d then %d (the parent's process was not carried)", c, first[c], n)
		}
	}
	if n := d.counter(parent); n <= atFork {
		t.Errorf("parent counter stopped after the fork: %d then %d", atFork, n)
	}
	// Children diverge: a file written in one is seen nowhere else.
	d.execOut(children[0], "sh", "-c", "echo mine > /tmp/only-in-child")
	for _, other := range []string{parent, children[1], children[2]} {
		if r := d.k7(nil, "exec", other, "--", "cat", "/tmp/only-in-child"); r.code == 0 {
			t.Errorf("file written in child %s is visible in %s", children[0], other)
		}
	}
	// The tree shows the lineage.
	tree := d.must("tree", "parent")
	for _, c := range children {
		if !strings.Contains(tree, c[:12]) {
			t.Errorf("k7 tree does not show child %s:\n%s", c, tree)
		}
	}
}

func TestForkJSONAndBudgets(t *testing.T) {
	d := startDaemon(t)
	id := d.create()
	var pauses, ready []time.Duration
	for range 5 {
		out := d.must("fork", "-o", "json", id)
		var res v1.ForkResult
		if err := json.Unmarshal([]byte(out), &res); err != nil {
			t.Fatalf("fork -o json: %v\n%s", err, out)
		}
		if len(res.Children) != 1 || res.SourcePauseNS <= 0 || res.Children[0].ReadyNS <= 0 {
			t.Fatalf("fork result %+v: want one child, source pause and ready times", res)
		}
		pauses = append(pauses, time.Duration(res.SourcePauseNS))
		ready = append(ready, time.Duration(res.Children[0].ReadyNS))
		d.must("rm", "-f", res.Children[0].Sandbox.ID)
	}
	budget.Check(t, "gvisor", budget.SourcePause, pauses)
	budget.Check(t, "gvisor", budget.ForkIdle, ready)
}

func TestSnapshotRestoreAfterDeleteAndRestart(t *testing.T) {
	d := startDaemon(t)
	id := d.create("--name", "snapsrc")
	d.execOut(id, "sh", "-c", "echo snap > /tmp/marker")
	d.startCounter(id)
	time.Sleep(300 * time.Millisecond)
	d.must("snapshot", id, "snap1")
	atSnap := d.counter(id)
	d.must("rm", "-f", id)

	d.stop()
	d.start()

	ls := d.must("snapshot", "ls")
	if !strings.Contains(ls, "snap1") {
		t.Fatalf("snapshot ls after restart = %q, want snap1", ls)
	}
	insp := d.must("snapshot", "inspect", "snap1")
	for _, f := range []string{"gvisor", "busybox", "checksum"} {
		if !strings.Contains(insp, f) {
			t.Errorf("snapshot inspect lacks %q:\n%s", f, insp)
		}
	}
	child := strings.TrimSpace(d.must("restore", "-q", "snap1"))
	if got := strings.TrimSpace(d.execOut(child, "cat", "/tmp/marker")); got != "snap" {
		t.Errorf("restored marker = %q, want snap", got)
	}
	a := d.counter(child)
	if a < 1 || a > atSnap+30 {
		t.Errorf("restored counter %d, source had %d at the snapshot", a, atSnap)
	}
	time.Sleep(500 * time.Millisecond)
	if b := d.counter(child); b <= a {
		t.Errorf("restored counter does not advance: %d then %d", a, b)
	}
	// Restoring again gives another independent sandbox.
	second := strings.TrimSpace(d.must("restore", "-q", "--name", "again", "snap1"))
	if second == child {
		t.Errorf("second restore reused ID %s", child)
	}
	d.must("snapshot", "rm", "snap1")
	if r := d.k7(nil, "snapshot", "inspect", "snap1"); r.code == 0 {
		t.Errorf("snapshot inspect after rm succeeded")
	}
}

func TestCorruptSnapshotRefused(t *testing.T) {
	d := startDaemon(t)
	id := d.create()
	d.must("snapshot", id, "broken")
	// Flip bytes in the largest file of the capture.
	var biggest string
	var size int64
	_ = filepath.WalkDir(d.stateDir, func(p string, e os.DirEntry, err error) error {
		if err != nil || e.IsDir() || !strings.Contains(p, "broken") || strings.HasSuffix(p, ".json") {
			return nil //nolint:nilerr // unreadable entries are skipped: any large file of the capture will do
		}
		if fi, err := e.Info(); err == nil && fi.Size() > size {
			biggest, size = p, fi.Size()
		}
		return nil
	})
	if biggest == "" {
		t.Fatalf("no capture file of snapshot broken under %s", d.stateDir)
	}
	f, err := os.OpenFile(biggest, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = f.WriteAt([]byte("corrupt!"), size/2)
	f.Close()
	r := d.k7(nil, "restore", "broken")
	if r.code == 0 || !strings.Contains(r.stderr, "broken") {
		t.Errorf("restore of a corrupted snapshot: code %d stderr %q, want an error naming the snapshot", r.code, r.stderr)
	}
	list, _ := d.client.ListSandboxes(context.Background())
	if len(list) != 1 {
		t.Errorf("%d sandboxes after a refused restore, want 1", len(list))
	}
}
