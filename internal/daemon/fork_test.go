package daemon

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/k7-dev/k7/api/v1"
)

func (h *harness) putFile(id, path, content string) {
	h.t.Helper()
	req, _ := http.NewRequest("PUT", "http://k7d/v1/sandboxes/"+id+"/files?path="+path, strings.NewReader(content))
	resp, err := h.hc.Do(req)
	if err != nil || resp.StatusCode != http.StatusNoContent {
		h.t.Fatalf("PUT %s: %v %v", path, resp, err)
	}
	resp.Body.Close()
}

func (h *harness) fileContent(id, path string) string {
	h.t.Helper()
	resp, err := h.hc.Get("http://k7d/v1/sandboxes/" + id + "/files?path=" + path)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return ""
	}
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func TestFork(t *testing.T) {
	eng := newTestEngine(true)
	h := startDaemon(t, testConfig(t, t.TempDir()), eng)
	src := h.create("src")
	h.putFile("src", "/tmp/marker", "from parent")

	var res v1.ForkResult
	code, e := h.do("POST", "/v1/sandboxes/src/fork", v1.ForkRequest{Count: 3}, &res)
	if code != http.StatusCreated {
		t.Fatalf("fork = %d %+v", code, e)
	}
	if res.Source != src.ID || len(res.Children) != 3 || res.SourcePauseNS <= 0 || res.LatencyNS <= 0 {
		t.Fatalf("fork result = %+v", res)
	}
	for i, c := range res.Children {
		want := "src-fork-" + string(rune('1'+i))
		if c.Sandbox.Name != want || c.Sandbox.Hostname != want || c.Sandbox.Parent != src.ID || c.Sandbox.State != v1.StateRunning || c.ReadyNS <= 0 {
			t.Errorf("child %d = %+v, want name %s, parent %s, running", i, c, want, src.ID)
		}
		if got := h.fileContent(c.Sandbox.ID, "/tmp/marker"); got != "from parent" {
			t.Errorf("child %s /tmp/marker = %q, want the parent's", c.Sandbox.Name, got)
		}
		if r := h.run(c.Sandbox.ID, "hostname"); strings.TrimSpace(string(r.Stdout)) != want {
			t.Errorf("child hostname = %q, want %s", r.Stdout, want)
		}
	}
	if got, _ := h.get("src"); got.State != v1.StateRunning {
		t.Errorf("source after fork = %s, want running", got.State)
	}
	// A second default fork does not collide; an explicit prefix is used as is.
	h.do("POST", "/v1/sandboxes/src/fork", nil, &res)
	if res.Children[0].Sandbox.Name != "src-fork-4" {
		t.Errorf("second fork child = %s, want src-fork-4", res.Children[0].Sandbox.Name)
	}
	h.do("POST", "/v1/sandboxes/src/fork", v1.ForkRequest{Count: 2, Name: "w"}, &res)
	if len(res.Children) != 2 || res.Children[1].Sandbox.Name != "w-2" {
		t.Errorf("prefixed fork = %+v", res.Children)
	}
	if code, e := h.do("POST", "/v1/sandboxes/src/fork", v1.ForkRequest{Name: "w"}, nil); code != 409 {
		t.Errorf("fork onto taken names = %d %+v, want 409", code, e)
	}
	if ents, _ := os.ReadDir(filepath.Join(h.cfg.StateDir, "tmp")); len(ents) != 0 {
		t.Errorf("fork left %d temp captures", len(ents))
	}

	// A child that fails to start: no child is left, the source runs.
	ids, _ := eng.List(t.Context())
	before := len(ids)
	eng.mu.Lock()
	eng.failRestore = eng.restores + 2
	eng.mu.Unlock()
	code, e = h.do("POST", "/v1/sandboxes/src/fork", v1.ForkRequest{Count: 3, Name: "bad"}, nil)
	if code < 400 || !strings.Contains(e.Error, "failed on purpose") {
		t.Errorf("failing fork = %d %+v, want an error naming the failure", code, e)
	}
	ids, _ = eng.List(t.Context())
	if len(ids) != before {
		t.Errorf("failing fork left engine sandboxes: %d, want %d", len(ids), before)
	}
	if _, code := h.get("bad-1"); code != 404 {
		t.Errorf("failing fork left a record")
	}
	if got, _ := h.get("src"); got.State != v1.StateRunning {
		t.Errorf("source after failed fork = %s", got.State)
	}

	// Paused sources cannot fork.
	h.do("POST", "/v1/sandboxes/src/pause", nil, nil)
	if code, _ := h.do("POST", "/v1/sandboxes/src/fork", nil, nil); code != http.StatusPreconditionFailed {
		t.Errorf("fork of paused = %d, want 412", code)
	}
}

func TestForkUnsupported(t *testing.T) {
	h := startDaemon(t, testConfig(t, t.TempDir()), newTestEngine(false))
	h.create("a")
	code, e := h.do("POST", "/v1/sandboxes/a/fork", nil, nil)
	if code != http.StatusPreconditionFailed || e.Error != "engine fake cannot fork: failed precondition" {
		t.Errorf("fork on a non-forking engine = %d %+v", code, e)
	}
	code, _ = h.do("POST", "/v1/sandboxes/a/snapshots", v1.SnapshotRequest{Name: "s"}, nil)
	if code != http.StatusPreconditionFailed {
		t.Errorf("snapshot on a non-forking engine = %d, want 412", code)
	}
}

func TestSnapshots(t *testing.T) {
	eng := newTestEngine(true)
	cfg := testConfig(t, t.TempDir())
	h := startDaemon(t, cfg, eng)
	src := h.create("src")
	h.putFile("src", "/tmp/marker", "saved")

	var sn v1.Snapshot
	code, e := h.do("POST", "/v1/sandboxes/src/snapshots", v1.SnapshotRequest{Name: "s1"}, &sn)
	if code != http.StatusCreated || sn.Name != "s1" || sn.Sandbox != src.ID || sn.SandboxName != "src" || !strings.HasPrefix(sn.Checksum, checksumPrefix) || sn.SizeBytes == 0 || sn.EngineVersion != "test-1" {
		t.Fatalf("snapshot = %d %+v %+v", code, sn, e)
	}
	if _, err := os.Stat(filepath.Join(cfg.StateDir, "snapshots", "s1", "manifest.json")); err != nil {
		t.Errorf("manifest: %v", err)
	}
	if code, _ := h.do("POST", "/v1/sandboxes/src/snapshots", v1.SnapshotRequest{Name: "s1"}, nil); code != 409 {
		t.Errorf("duplicate snapshot = %d, want 409", code)
	}
	if code, _ := h.do("POST", "/v1/sandboxes/src/snapshots", v1.SnapshotRequest{Name: "../x"}, nil); code != 400 {
		t.Errorf("bad snapshot name = %d, want 400", code)
	}
	h.do("POST", "/v1/sandboxes/src/snapshots", v1.SnapshotRequest{Name: "s2"}, nil)

	// The snapshot outlives its sandbox and the daemon.
	h.do("DELETE", "/v1/sandboxes/src", nil, nil)
	h.stop()
	h = startDaemon(t, cfg, eng)

	var l v1.SnapshotList
	h.do("GET", "/v1/snapshots", nil, &l)
	if len(l.Snapshots) != 2 || l.TotalBytes != l.Snapshots[0].SizeBytes+l.Snapshots[1].SizeBytes || l.TotalBytes == 0 {
		t.Errorf("snapshot list = %+v", l)
	}
	var res v1.ForkResult
	code, e = h.do("POST", "/v1/snapshots/s1/restore", v1.RestoreRequest{Name: "back"}, &res)
	if code != http.StatusCreated || len(res.Children) != 1 || res.Children[0].Sandbox.Name != "back" || res.Children[0].Sandbox.Parent != "s1" {
		t.Fatalf("restore = %d %+v %+v", code, res, e)
	}
	if got := h.fileContent("back", "/tmp/marker"); got != "saved" {
		t.Errorf("restored /tmp/marker = %q, want saved", got)
	}
	h.do("POST", "/v1/snapshots/s1/restore", v1.RestoreRequest{Count: 2}, &res)
	if len(res.Children) != 2 || res.Children[0].Sandbox.Name != "s1-restore-1" {
		t.Errorf("restore x2 = %+v", res.Children)
	}

	// The tree stays connected through the deleted source.
	var tree v1.Tree
	h.do("GET", "/v1/tree?root="+src.ID, nil, &tree)
	if len(tree.Roots) != 1 || tree.Roots[0].State != "deleted" || len(tree.Roots[0].Children) != 2 {
		t.Fatalf("tree = %+v", tree)
	}
	s1 := tree.Roots[0].Children[0]
	if s1.Kind != "snapshot" || s1.ID != "s1" || len(s1.Children) != 3 {
		t.Errorf("snapshot node = %+v, want s1 with 3 restored children", s1)
	}
	h.do("GET", "/v1/tree", nil, &tree)
	if len(tree.Roots) != 1 {
		t.Errorf("full tree roots = %+v, want one", tree.Roots)
	}

	// Corruption is detected and names the snapshot.
	capture := filepath.Join(cfg.StateDir, "snapshots", "s2", "capture", "memory.img")
	if err := os.WriteFile(capture, []byte("bit rot"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, e = h.do("POST", "/v1/snapshots/s2/restore", nil, nil)
	if code != http.StatusPreconditionFailed || !strings.Contains(e.Error, `snapshot "s2" is corrupted`) {
		t.Errorf("restore of corrupted = %d %+v", code, e)
	}

	// Engine version mismatch.
	h.stop()
	eng2 := &versionedEngine{testEngine: eng, version: "test-2"}
	h = startDaemon(t, cfg, eng2)
	code, e = h.do("POST", "/v1/snapshots/s1/restore", nil, nil)
	if code != http.StatusPreconditionFailed || !strings.Contains(e.Error, "version test-1") {
		t.Errorf("restore across engine versions = %d %+v", code, e)
	}

	var pr v1.SnapshotPruneResult
	h.do("POST", "/v1/snapshots/prune", v1.SnapshotPruneRequest{KeepLast: 1}, &pr)
	if len(pr.Removed) != 1 || pr.Removed[0] != "s1" || pr.FreedBytes == 0 {
		t.Errorf("prune keep 1 = %+v, want s1 removed", pr)
	}
	if code, _ := h.do("DELETE", "/v1/snapshots/s2", nil, nil); code != 200 {
		t.Errorf("delete snapshot = %d", code)
	}
	if code, _ := h.do("GET", "/v1/snapshots/s2", nil, nil); code != 404 {
		t.Errorf("get deleted snapshot = %d, want 404", code)
	}
	if _, err := os.Stat(filepath.Join(cfg.StateDir, "snapshots", "s2")); !os.IsNotExist(err) {
		t.Errorf("snapshot files left: %v", err)
	}
}

type versionedEngine struct {
	*testEngine
	version string
}

func (e *versionedEngine) Version() string { return e.version }
