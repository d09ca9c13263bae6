// Package bench measures k7's lifecycle latencies next to the floor: the
// same operations done with the raw tools (runsc; QEMU and QMP) in the same
// run, so that a reader sees k7's overhead and not only its time.
//
// A run writes its raw samples as JSON (Report) and renders a Markdown table:
// median (min–max) per operation, ⚠ where (max−min)/median > 0.30, and the
// ratio k7 / floor. Rendering is deterministic: the same JSON always gives
// the same bytes.
package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/k7-dev/k7/internal/budget"
)

// Kinds of sample.
const (
	KindK7    = "k7"    // through k7d's API, as a client sees it
	KindFloor = "floor" // the raw tool doing the same work
)

// Sample is one measurement.
type Sample struct {
	Engine string    `json:"engine"`
	Op     budget.Op `json:"op"`
	Kind   string    `json:"kind"`
	Rep    int       `json:"rep"`
	NS     int64     `json:"ns"`
}

// Report is what one bench run writes.
type Report struct {
	Machine string    `json:"machine"` // CPU model, cores, memory, kernel
	Command string    `json:"command"` // how to reproduce
	Started time.Time `json:"started"`
	Reps    int       `json:"reps"`
	Warmup  int       `json:"warmup"`
	Samples []Sample  `json:"samples,omitempty"`
	Points  []Point   `json:"points,omitempty"` // scaling runs
	Notes   []string  `json:"notes,omitempty"`
}

// WriteJSON writes r to path.
func (r *Report) WriteJSON(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// ReadJSON reads a report written by WriteJSON.
func ReadJSON(path string) (*Report, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var r Report
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("reading bench report %s: %w", path, err)
	}
	return &r, nil
}

// Summary is the statistics of one set of samples.
type Summary struct {
	N                int
	Median, Min, Max time.Duration
}

// Spread is (max−min)/median.
func (s Summary) Spread() float64 {
	if s.Median == 0 {
		return 0
	}
	return float64(s.Max-s.Min) / float64(s.Median)
}

// Noisy reports whether the spread is above 30 %.
func (s Summary) Noisy() bool { return s.Spread() > 0.30 }

func summarize(ds []time.Duration) Summary {
	if len(ds) == 0 {
		return Summary{}
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return Summary{N: len(s), Median: budget.Median(s), Min: s[0], Max: s[len(s)-1]}
}

// Summarize groups the samples of r by engine, op and kind.
func (r *Report) Summarize(engine string, op budget.Op, kind string) Summary {
	var ds []time.Duration
	for _, s := range r.Samples {
		if s.Engine == engine && s.Op == op && s.Kind == kind {
			ds = append(ds, time.Duration(s.NS))
		}
	}
	return summarize(ds)
}

// opOrder is the row order of the table.
var opOrder = []budget.Op{
	budget.CreateToExec, budget.ExecRoundTrip, budget.Pause, budget.Resume,
	budget.ForkIdle, budget.Fork256M, budget.FanOut10, budget.SourcePause,
	budget.Snapshot, budget.Restore, budget.Delete,
}

func fmtDur(d time.Duration) string {
	switch {
	case d >= time.Second:
		return fmt.Sprintf("%.2f s", d.Seconds())
	case d >= 10*time.Millisecond:
		return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond))
	default:
		return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
	}
}

func fmtSummary(s Summary) string {
	if s.N == 0 {
		return "—"
	}
	warn := ""
	if s.Noisy() {
		warn = " ⚠"
	}
	return fmt.Sprintf("%s (%s–%s)%s", fmtDur(s.Median), fmtDur(s.Min), fmtDur(s.Max), warn)
}

// Render writes the Markdown tables of reports to w.
func Render(w io.Writer, reports ...*Report) error {
	var b strings.Builder
	for _, r := range reports {
		fmt.Fprintf(&b, "Machine: %s  \nCommand: `%s`  \nStarted: %s, %d reps after %d warm-up\n\n",
			r.Machine, r.Command, r.Started.UTC().Format(time.RFC3339), r.Reps, r.Warmup)
		var engines []string
		for _, s := range r.Samples {
			if !slices.Contains(engines, s.Engine) {
				engines = append(engines, s.Engine)
			}
		}
		slices.Sort(engines)
		if len(r.Samples) > 0 {
			b.WriteString("| engine | operation | k7 median (min–max) | floor median (min–max) | k7 / floor | budget |\n")
			b.WriteString("|---|---|---:|---:|---:|---:|\n")
		}
		for _, e := range engines {
			for _, op := range opOrder {
				k := r.Summarize(e, op, KindK7)
				f := r.Summarize(e, op, KindFloor)
				if k.N == 0 && f.N == 0 {
					continue
				}
				ratio := "—"
				if k.N > 0 && f.N > 0 && f.Median > 0 {
					ratio = fmt.Sprintf("%.2f", float64(k.Median)/float64(f.Median))
				}
				lim := "—"
				if bu, ok := budget.Lookup(e, op); ok {
					lim = fmtDur(bu.Limit)
				}
				fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s |\n", e, op, fmtSummary(k), fmtSummary(f), ratio, lim)
			}
		}
		renderPoints(&b, r)
		for _, n := range r.Notes {
			fmt.Fprintf(&b, "\n- %s", n)
		}
		if len(r.Notes) > 0 {
			b.WriteString("\n")
		}
		b.WriteString("\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// Machine describes this host in one line.
func Machine() string {
	model := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "model name") {
				if _, v, ok := strings.Cut(l, ":"); ok {
					model = strings.TrimSpace(v)
				}
				break
			}
		}
	}
	mem := ""
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb int64
		_, _ = fmt.Sscanf(strings.TrimPrefix(strings.SplitN(string(b), "\n", 2)[0], "MemTotal:"), "%d", &kb)
		mem = fmt.Sprintf(", %.0f GiB", float64(kb)/(1<<20))
	}
	kernel := ""
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		kernel = ", kernel " + strings.TrimSpace(string(b))
	}
	return fmt.Sprintf("%s, %d cores%s%s", model, numCPU(), mem, kernel)
}
