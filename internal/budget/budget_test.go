package budget

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

type recorder struct {
	logs, errs []string
}

func (r *recorder) Helper()                   {}
func (r *recorder) Logf(f string, a ...any)   { r.logs = append(r.logs, fmt.Sprintf(f, a...)) }
func (r *recorder) Errorf(f string, a ...any) { r.errs = append(r.errs, fmt.Sprintf(f, a...)) }

func TestMedian(t *testing.T) {
	for _, tc := range []struct {
		in   []time.Duration
		want time.Duration
	}{
		{nil, 0},
		{[]time.Duration{3}, 3},
		{[]time.Duration{5, 1, 3}, 3},
		{[]time.Duration{4, 1, 3, 2}, 2},
	} {
		if got := Median(tc.in); got != tc.want {
			t.Errorf("Median(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

func TestCheck(t *testing.T) {
	b, ok := Lookup("gvisor", ExecRoundTrip)
	if !ok {
		t.Fatal("no gvisor exec budget")
	}
	for _, tc := range []struct {
		name    string
		samples []time.Duration
		fail    bool
	}{
		{"under", []time.Duration{b.Limit / 2, b.Limit / 3, 2 * b.Limit}, false},
		{"over", []time.Duration{2 * b.Limit, 3 * b.Limit, b.Limit / 2}, true},
		{"none", nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &recorder{}
			Check(r, "gvisor", ExecRoundTrip, tc.samples)
			if got := len(r.errs) > 0; got != tc.fail {
				t.Errorf("failed = %v, want %v (errs %q)", got, tc.fail, r.errs)
			}
			if len(r.logs) == 0 || !strings.Contains(r.logs[0], "budget") {
				t.Errorf("measured figure not logged: %q", r.logs)
			}
		})
	}
	r := &recorder{}
	Check(r, "nosuch", Pause, []time.Duration{1})
	if len(r.errs) != 1 {
		t.Errorf("unknown engine: errs = %q, want one", r.errs)
	}
}

func TestTableSane(t *testing.T) {
	seen := map[string]bool{}
	for _, b := range All() {
		key := b.Engine + "/" + string(b.Op)
		if seen[key] {
			t.Errorf("duplicate budget %s", key)
		}
		seen[key] = true
		if b.Typical <= 0 || b.Limit < b.Typical {
			t.Errorf("%s: typical %v, limit %v: limit must be ≥ typical > 0", key, b.Typical, b.Limit)
		}
	}
}
