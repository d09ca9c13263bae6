package bench

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/k7-dev/k7/internal/budget"
)

func sampleReport() *Report {
	r := &Report{Machine: "test machine", Command: "k7 bench lifecycle --reps 3", Started: time.Unix(1700000000, 0), Reps: 3, Warmup: 1}
	for i, ms := range []int64{100, 110, 90} {
		r.Samples = append(r.Samples,
			Sample{Engine: "gvisor", Op: budget.CreateToExec, Kind: KindK7, Rep: i, NS: ms * int64(time.Millisecond)},
			Sample{Engine: "gvisor", Op: budget.CreateToExec, Kind: KindFloor, Rep: i, NS: 2 * ms * int64(time.Millisecond)})
	}
	// A noisy op: spread (300-100)/150 > 0.30.
	for i, ms := range []int64{100, 150, 300} {
		r.Samples = append(r.Samples, Sample{Engine: "gvisor", Op: budget.Pause, Kind: KindK7, Rep: i, NS: ms * int64(time.Millisecond)})
	}
	return r
}

func TestRender(t *testing.T) {
	var b bytes.Buffer
	if err := Render(&b, sampleReport()); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"| gvisor | create_to_exec | 100 ms (90 ms–110 ms) | 200 ms (180 ms–220 ms) | 0.50 |",
		"| gvisor | pause | 150 ms (100 ms–300 ms) ⚠ | — | — |",
		"test machine", "k7 bench lifecycle --reps 3",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("rendered table lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "create_to_exec | 100 ms (90 ms–110 ms) ⚠") {
		t.Errorf("quiet op flagged as noisy:\n%s", out)
	}
}

func TestRenderDeterministicThroughJSON(t *testing.T) {
	path := filepath.Join(t.TempDir(), "r.json")
	if err := sampleReport().WriteJSON(path); err != nil {
		t.Fatal(err)
	}
	var outs [2]bytes.Buffer
	for i := range outs {
		r, err := ReadJSON(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := Render(&outs[i], r); err != nil {
			t.Fatal(err)
		}
	}
	if outs[0].String() != outs[1].String() || outs[0].Len() == 0 {
		t.Errorf("two renders of the same JSON differ:\n%s\n---\n%s", outs[0].String(), outs[1].String())
	}
}
