package bench

import (
	"bytes"
	"encoding/xml"
	"strings"
	"testing"
	"time"
)

func scalingReport() *Report {
	r := &Report{Machine: "m", Command: "k7 bench scaling", Started: time.Unix(1700000000, 0), Reps: 2}
	for _, size := range []int{64, 128, 256} {
		for rep := range 2 {
			// 100 ms + 1 ms per MiB, ±5 ms.
			ns := int64(100+size+10*rep-5) * int64(time.Millisecond)
			r.Points = append(r.Points, Point{Engine: "gvisor", Op: "fork", SizeMiB: size, Rep: rep, NS: ns, ChildMemoryBytes: int64(size+20) << 20})
		}
	}
	for _, n := range []int{1, 10, 50} {
		r.Points = append(r.Points, Point{Engine: "gvisor", Op: "create", Running: n, NS: int64(200+n) * int64(time.Millisecond)})
	}
	return r
}

func TestSlope(t *testing.T) {
	xs := []int{64, 128, 256}
	sums := []Summary{{Median: 164 * time.Millisecond}, {Median: 228 * time.Millisecond}, {Median: 356 * time.Millisecond}}
	if got := Slope(xs, sums); got != time.Millisecond {
		t.Errorf("Slope = %v, want 1ms per unit", got)
	}
	if got := Slope(xs[:1], sums[:1]); got != 0 {
		t.Errorf("Slope of one point = %v, want 0", got)
	}
}

func TestRenderPoints(t *testing.T) {
	var b bytes.Buffer
	if err := Render(&b, scalingReport()); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"| 64 MiB | 164 ms (159 ms–169 ms) | 84 MiB |",
		"Slope: 1.00 ms per MiB in use",
		"| 50 | 250 ms (250 ms–250 ms) |",
		"Slope: 1.00 ms per running sandbox.",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("render lacks %q:\n%s", want, out)
		}
	}
}

func TestRenderSVG(t *testing.T) {
	var b bytes.Buffer
	if err := RenderSVG(&b, scalingReport()); err != nil {
		t.Fatal(err)
	}
	if err := xml.Unmarshal(b.Bytes(), new(struct{})); err != nil {
		t.Fatalf("SVG is not well-formed XML: %v", err)
	}
	if n := strings.Count(b.String(), "<circle"); n != 3 {
		t.Errorf("SVG has %d points, want 3 (one per size)", n)
	}
	var again bytes.Buffer
	_ = RenderSVG(&again, scalingReport())
	if again.String() != b.String() {
		t.Errorf("SVG rendering is not deterministic")
	}
	if err := RenderSVG(&b, &Report{}); err == nil {
		t.Errorf("RenderSVG of an empty report succeeded")
	}
}
