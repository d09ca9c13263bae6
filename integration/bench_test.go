package integration

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/k7-dev/k7/internal/bench"
	"github.com/k7-dev/k7/internal/budget"
	"github.com/k7-dev/k7/internal/testutil"
)

// TestBenchLifecycleSmoke runs `k7 bench lifecycle` for two rounds (one
// warm-up, so that state carried between rounds is exercised): every
// operation must be measured through k7 and on the raw runsc floor, the JSON
// and Markdown written, and rendering the JSON twice must give the same
// bytes. (The figures themselves are PERFORMANCE.md's business.)
func TestBenchLifecycleSmoke(t *testing.T) {
	d := startDaemon(t)
	out := t.TempDir()
	r := d.k7(nil, "bench", "lifecycle", "--reps", "1", "--warmup", "1", "--out", out, "--runsc", testutil.Runsc(t))
	if r.code != 0 {
		t.Fatalf("k7 bench lifecycle: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	rep, err := bench.ReadJSON(filepath.Join(out, "lifecycle.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, op := range []budget.Op{budget.CreateToExec, budget.ExecRoundTrip, budget.Pause, budget.Resume,
		budget.ForkIdle, budget.Fork256M, budget.FanOut10, budget.SourcePause, budget.Snapshot, budget.Restore, budget.Delete} {
		for _, kind := range []string{bench.KindK7, bench.KindFloor} {
			if s := rep.Summarize("gvisor", op, kind); s.N == 0 || s.Median <= 0 {
				t.Errorf("no %s sample for %s", kind, op)
			}
		}
	}
	md, err := os.ReadFile(filepath.Join(out, "lifecycle.md"))
	if err != nil || !bytes.Contains(md, []byte("| gvisor | create_to_exec |")) {
		t.Errorf("lifecycle.md: %v\n%s", err, md)
	}
	var renders [2][]byte
	for i := range renders {
		cmd := exec.Command(testutil.Binary(t, "k7"), "bench", "render", filepath.Join(out, "lifecycle.json"))
		if renders[i], err = cmd.Output(); err != nil {
			t.Fatalf("k7 bench render: %v", err)
		}
	}
	if !bytes.Equal(renders[0], renders[1]) || !bytes.Equal(renders[0], md) {
		t.Errorf("rendering the same JSON twice (or again after the run) differs")
	}
}
