package bench

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"
)

// series groups the points of one engine and op by their x value (SizeMiB
// or Running) and returns the sorted x values and the summaries.
func series(r *Report, engine, op string, bySize bool) ([]int, []Summary, []int64) {
	ns := map[int][]time.Duration{}
	mem := map[int][]time.Duration{} // child memory, reusing summarize
	for _, p := range r.Points {
		if p.Engine != engine || p.Op != op {
			continue
		}
		x := p.Running
		if bySize {
			x = p.SizeMiB
		}
		if x == 0 {
			continue
		}
		ns[x] = append(ns[x], time.Duration(p.NS))
		if p.ChildMemoryBytes > 0 {
			mem[x] = append(mem[x], time.Duration(p.ChildMemoryBytes))
		}
	}
	var xs []int
	for x := range ns {
		xs = append(xs, x)
	}
	slices.Sort(xs)
	var sums []Summary
	var mems []int64
	for _, x := range xs {
		sums = append(sums, summarize(ns[x]))
		mems = append(mems, int64(summarize(mem[x]).Median))
	}
	return xs, sums, mems
}

// Slope fits median = a + b·x by least squares and returns b (per unit x).
func Slope(xs []int, sums []Summary) time.Duration {
	n := float64(len(xs))
	if n < 2 {
		return 0
	}
	var sx, sy, sxx, sxy float64
	for i, x := range xs {
		fx, fy := float64(x), float64(sums[i].Median)
		sx, sy, sxx, sxy = sx+fx, sy+fy, sxx+fx*fx, sxy+fx*fy
	}
	den := n*sxx - sx*sx
	if den == 0 {
		return 0
	}
	return time.Duration((n*sxy - sx*sy) / den)
}

func engineList(r *Report) []string {
	var es []string
	for _, p := range r.Points {
		if !slices.Contains(es, p.Engine) {
			es = append(es, p.Engine)
		}
	}
	slices.Sort(es)
	return es
}

// renderPoints writes the scaling tables of r.
func renderPoints(b *strings.Builder, r *Report) {
	for _, e := range engineList(r) {
		if xs, sums, mems := series(r, e, "fork", true); len(xs) > 0 {
			fmt.Fprintf(b, "Fork → child answers against memory in use (%s):\n\n", e)
			b.WriteString("| memory in use | fork → child answers, median (min–max) | child memory (engine's figure) |\n|---:|---:|---:|\n")
			for i, x := range xs {
				m := "—"
				if mems[i] > 0 {
					m = fmt.Sprintf("%.0f MiB", float64(mems[i])/(1<<20))
				}
				fmt.Fprintf(b, "| %d MiB | %s | %s |\n", x, fmtSummary(sums[i]), m)
			}
			fmt.Fprintf(b, "\nSlope: %.2f ms per MiB in use (least squares over the medians).\n\n", float64(Slope(xs, sums))/float64(time.Millisecond))
		}
		for _, op := range []string{"create", "fork"} {
			xs, sums, _ := series(r, e, op, false)
			if len(xs) == 0 {
				continue
			}
			fmt.Fprintf(b, "%s against sandboxes already running (%s):\n\n| running | median (min–max) |\n|---:|---:|\n", op, e)
			for i, x := range xs {
				fmt.Fprintf(b, "| %d | %s |\n", x, fmtSummary(sums[i]))
			}
			fmt.Fprintf(b, "\nSlope: %.2f ms per running sandbox.\n\n", float64(Slope(xs, sums))/float64(time.Millisecond))
		}
	}
}

// RenderSVG draws fork time (median, with min–max bars) against memory in
// use, one line per engine, as a self-contained SVG.
func RenderSVG(w io.Writer, reports ...*Report) error {
	const W, H, left, right, top, bottom = 640.0, 400.0, 70.0, 20.0, 40.0, 50.0
	type line struct {
		engine string
		xs     []int
		sums   []Summary
	}
	var lines []line
	maxX, maxY := 1.0, 1.0
	for _, r := range reports {
		for _, e := range engineList(r) {
			xs, sums, _ := series(r, e, "fork", true)
			if len(xs) == 0 {
				continue
			}
			lines = append(lines, line{e, xs, sums})
			maxX = math.Max(maxX, float64(xs[len(xs)-1]))
			for _, s := range sums {
				maxY = math.Max(maxY, float64(s.Max)/float64(time.Millisecond))
			}
		}
	}
	if len(lines) == 0 {
		return fmt.Errorf("no fork scaling points to draw")
	}
	maxY = niceCeil(maxY)
	maxX = niceCeil(maxX)
	px := func(x float64) float64 { return left + x/maxX*(W-left-right) }
	py := func(y float64) float64 { return H - bottom - y/maxY*(H-top-bottom) }
	colors := []string{"#1f77b4", "#d62728", "#2ca02c", "#9467bd"}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" font-family="sans-serif" font-size="12">`+"\n", W, H)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%.0f" y="20" text-anchor="middle" font-size="14">fork → child answers against memory in use</text>`+"\n", W/2)
	for i := 0; i <= 4; i++ {
		y := maxY * float64(i) / 4
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", left, py(y), W-right, py(y))
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="end">%.0f ms</text>`+"\n", left-6, py(y)+4, y)
		x := maxX * float64(i) / 4
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%.0f MiB</text>`+"\n", px(x), H-bottom+18, x)
	}
	fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="black"/>`+"\n", left, H-bottom, W-right, H-bottom)
	fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="black"/>`+"\n", left, top, left, H-bottom)
	for i, l := range lines {
		c := colors[i%len(colors)]
		var pts []string
		for j, x := range l.xs {
			s := l.sums[j]
			X := px(float64(x))
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", X, py(float64(s.Median)/1e6)))
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s"/>`+"\n", X, py(float64(s.Min)/1e6), X, py(float64(s.Max)/1e6), c)
			fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>`+"\n", X, py(float64(s.Median)/1e6), c)
		}
		fmt.Fprintf(&b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="2"/>`+"\n", strings.Join(pts, " "), c)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" fill="%s">%s</text>`+"\n", left+10, top+16+16*float64(i), c, l.engine)
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}
