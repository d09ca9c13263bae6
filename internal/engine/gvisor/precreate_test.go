package gvisor

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/k7-dev/k7/internal/agent/client"
	"github.com/k7-dev/k7/internal/engine"
	"github.com/k7-dev/k7/internal/engine/enginetest"
)

// testNetns makes a named network namespace with loopback up and returns
// its path; the test removes it.
func testNetns(t *testing.T) string {
	t.Helper()
	var b [4]byte
	rand.Read(b[:])
	name := "k7tpre" + hex.EncodeToString(b[:])
	for _, args := range [][]string{{"netns", "add", name}, {"-n", name, "link", "set", "lo", "up"}} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Skipf("ip %v: %v: %s", args, err, out)
		}
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	return "/run/netns/" + name
}

func runscList(t *testing.T, e *Engine) []string {
	t.Helper()
	out, err := e.runsc(context.Background(), "", "list", "-quiet")
	if err != nil {
		t.Fatal(err)
	}
	return strings.Fields(string(out))
}

// TestPrecreate: a Restore into a sandbox made by Precreate (in a network
// namespace, which the fork pool cannot do) loads the capture into that
// container; one that does not match is replaced; Delete removes one
// never restored.
func TestPrecreate(t *testing.T) {
	e := newTestEngine(t)
	rootfs := enginetest.BusyboxRootfs(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	res := engine.Resources{MemoryBytes: 256 << 20}
	parent := enginetest.NewID()
	if err := e.Create(ctx, &engine.CreateRequest{ID: parent, Rootfs: rootfs, Resources: res, Netns: testNetns(t)}); err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() { _ = e.Delete(context.Background(), parent) })
	connect := func(id string) *client.Client {
		t.Helper()
		c := connectTB(t, ctx, e, id)
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	execOut(t, ctx, connect(parent), "sh", "-c", "echo parent > /tmp/m")
	capture := filepath.Join(t.TempDir(), "capture")
	if _, err := e.Checkpoint(ctx, &engine.CheckpointRequest{ID: parent, Dir: capture}); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name    string
		restore engine.Resources // the Restore's; the Precreate's are res
		reused  bool
	}{
		{"matching", res, true},
		{"other resources", engine.Resources{MemoryBytes: 128 << 20}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			child, ns := enginetest.NewID(), testNetns(t)
			req := engine.CreateRequest{ID: child, Rootfs: rootfs, Resources: res, Netns: ns}
			if err := e.Precreate(ctx, &req); err != nil {
				t.Fatalf("Precreate: %v", err)
			}
			t.Cleanup(func() { _ = e.Delete(context.Background(), child) })
			st, err := e.state(ctx, child)
			if err != nil || st.Status != "created" {
				t.Fatalf("runsc state of the pre-created sandbox: %+v, %v", st, err)
			}
			e.pre.mu.Lock()
			pid := e.pre.sbxs[child].pid
			e.pre.mu.Unlock()
			if pid != st.PID {
				t.Errorf("pre-created sandbox process from the state file: %d, runsc state says %d", pid, st.PID)
			}
			if ids, _ := e.List(ctx); !slices.Contains(ids, child) {
				t.Errorf("List: got %v, want the pre-created %s", ids, child)
			}
			req.Resources = tc.restore
			if err := e.Restore(ctx, &engine.RestoreRequest{CreateRequest: req, From: capture}); err != nil {
				t.Fatalf("Restore: %v", err)
			}
			after, err := e.state(ctx, child)
			if err != nil {
				t.Fatal(err)
			}
			if got := after.PID == st.PID; got != tc.reused {
				t.Errorf("restored into the pre-created process: got %v, want %v (pids %d, %d)", got, tc.reused, st.PID, after.PID)
			}
			if got := execOut(t, ctx, connect(child), "cat", "/tmp/m"); got != "parent\n" {
				t.Errorf("child's /tmp/m: got %q", got)
			}
			if err := e.Delete(ctx, child); err != nil {
				t.Fatal(err)
			}
			if slices.Contains(runscList(t, e), child) {
				t.Errorf("runsc list still has %s", child)
			}
		})
	}

	t.Run("delete unrestored", func(t *testing.T) {
		id := enginetest.NewID()
		if err := e.Precreate(ctx, &engine.CreateRequest{ID: id, Rootfs: rootfs, Resources: res, Netns: testNetns(t)}); err != nil {
			t.Fatalf("Precreate: %v", err)
		}
		if err := e.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
		if slices.Contains(runscList(t, e), id) {
			t.Errorf("runsc list still has %s", id)
		}
		if _, err := os.Stat(e.dir(id)); !os.IsNotExist(err) {
			t.Errorf("sandbox dir left: %v", err)
		}
		if d := cgroupDirs(e, id); len(d) > 0 {
			t.Errorf("cgroups left: %v", d)
		}
		if _, ok := e.takePrecreated(id); ok {
			t.Errorf("Delete kept the pre-created entry")
		}
	})
}

// TestPrecreateCancelled cancels Precreate at several points of its "runsc
// create" (the daemon cancels a spare being made when its parent goes):
// whenever the cancel lands, no process, cgroup or dir of the sandbox may
// be left.
func TestPrecreateCancelled(t *testing.T) {
	e := newTestEngine(t)
	rootfs := enginetest.BusyboxRootfs(t)
	for _, after := range []time.Duration{20 * time.Millisecond, 80 * time.Millisecond, 150 * time.Millisecond, 300 * time.Millisecond} {
		id := enginetest.NewID()
		ctx, cancel := context.WithTimeout(context.Background(), after)
		err := e.Precreate(ctx, &engine.CreateRequest{ID: id, Rootfs: rootfs, Resources: engine.Resources{PIDs: 64}})
		cancel()
		if err == nil {
			// It finished in time: deleting it must leave nothing either.
			if err := e.Delete(context.Background(), id); err != nil {
				t.Fatal(err)
			}
		}
		procs := filepath.Join("/sys/fs/cgroup/pids", e.cgroupsPath(id), "cgroup.procs")
		if b, err := os.ReadFile(procs); err == nil && len(strings.TrimSpace(string(b))) > 0 {
			t.Errorf("cancelled after %v: processes left in the sandbox's cgroup: %s", after, b)
		}
		if _, err := os.Stat(filepath.Join("/sys/fs/cgroup/pids", e.cgroupsPath(id))); err == nil {
			t.Errorf("cancelled after %v: cgroup left", after)
		}
		ids, err := e.List(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if slices.Contains(ids, id) {
			t.Errorf("cancelled after %v: engine still lists %s", after, id)
		}
	}
}
