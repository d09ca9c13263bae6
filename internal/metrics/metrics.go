// Package metrics holds k7d's metrics and serves them in the Prometheus text
// exposition format (version 0.0.4): HTTP requests per route, sandbox
// operation latencies and sandboxes by state.
//
// It is a small self-contained implementation (counters and histograms with
// fixed label sets) so that the daemon carries no metrics dependency tree.
// A Metrics is independent of any other (several daemons in one test
// process never collide) and is safe for concurrent use.
package metrics

import (
	"fmt"
	"io"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Buckets are the histogram upper bounds in seconds.
var (
	requestBuckets = expBuckets(0.0005, 2.5, 14)
	opBuckets      = expBuckets(0.001, 2.5, 14)
)

func expBuckets(start, factor float64, n int) []float64 {
	b := make([]float64, n)
	for i := range b {
		b[i] = start
		start *= factor
	}
	return b
}

// Metrics is the set of k7d's metrics.
type Metrics struct {
	states func() map[string]int

	mu       sync.Mutex
	requests map[string]uint64     // key: labels
	latency  map[string]*histogram // key: labels
	ops      map[string]*histogram // key: labels
}

type histogram struct {
	bounds []float64
	counts []uint64 // per bucket, not cumulative
	count  uint64
	sum    float64
}

func (h *histogram) observe(v float64) {
	i := sort.SearchFloat64s(h.bounds, v)
	if i < len(h.counts) {
		h.counts[i]++
	}
	h.count++
	h.sum += v
}

// New returns empty metrics. states, if not nil, is called at each scrape
// and reports the number of sandboxes per state.
func New(states func() map[string]int) *Metrics {
	return &Metrics{
		states:   states,
		requests: map[string]uint64{},
		latency:  map[string]*histogram{},
		ops:      map[string]*histogram{},
	}
}

func labels(kv ...string) string {
	var b strings.Builder
	for i := 0; i+1 < len(kv); i += 2 {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%s=%s", kv[i], strconv.Quote(kv[i+1]))
	}
	return b.String()
}

func (m *Metrics) observe(hs map[string]*histogram, bounds []float64, key string, v float64) {
	h := hs[key]
	if h == nil {
		h = &histogram{bounds: bounds, counts: make([]uint64, len(bounds))}
		hs[key] = h
	}
	h.observe(v)
}

// ObserveRequest records one HTTP request.
func (m *Metrics) ObserveRequest(route, method string, code int, d time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.requests[labels("route", route, "method", method, "code", strconv.Itoa(code))]++
	m.observe(m.latency, requestBuckets, labels("route", route, "method", method), d.Seconds())
}

// ObserveOp records one sandbox operation; err decides the outcome label.
func (m *Metrics) ObserveOp(op, engine string, d time.Duration, err error) {
	outcome := "ok"
	if err != nil {
		outcome = "error"
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.observe(m.ops, opBuckets, labels("op", op, "engine", engine, "outcome", outcome), d.Seconds())
}

// Handler serves the metrics in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		m.WriteTo(w)
	})
}

// WriteTo writes every metric in the text format.
func (m *Metrics) WriteTo(w io.Writer) (int64, error) {
	var b strings.Builder
	if m.states != nil {
		st := m.states()
		b.WriteString("# HELP k7_sandboxes Sandboxes known to the daemon, by state.\n# TYPE k7_sandboxes gauge\n")
		for _, s := range []string{"creating", "running", "paused", "stopped", "dead"} {
			fmt.Fprintf(&b, "k7_sandboxes{state=%q} %d\n", s, st[s])
		}
	}
	m.mu.Lock()
	b.WriteString("# HELP k7_http_requests_total HTTP requests served, by route pattern, method and status code.\n# TYPE k7_http_requests_total counter\n")
	for _, k := range sortedKeys(m.requests) {
		fmt.Fprintf(&b, "k7_http_requests_total{%s} %d\n", k, m.requests[k])
	}
	writeHist(&b, "k7_http_request_duration_seconds", "Time spent serving HTTP requests, by route pattern.", m.latency)
	writeHist(&b, "k7_sandbox_op_duration_seconds", "Time spent on sandbox operations (create, exec, pause, resume, fork, snapshot, restore, delete).", m.ops)
	m.mu.Unlock()
	n, err := io.WriteString(w, b.String())
	return int64(n), err
}

func writeHist(b *strings.Builder, name, help string, hs map[string]*histogram) {
	fmt.Fprintf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name)
	for _, k := range sortedKeys(hs) {
		h := hs[k]
		var cum uint64
		for i, ub := range h.bounds {
			cum += h.counts[i]
			fmt.Fprintf(b, "%s_bucket{%s,le=%q} %d\n", name, k, strconv.FormatFloat(ub, 'g', -1, 64), cum)
		}
		fmt.Fprintf(b, "%s_bucket{%s,le=\"+Inf\"} %d\n", name, k, h.count)
		fmt.Fprintf(b, "%s_sum{%s} %s\n", name, k, strconv.FormatFloat(h.sum, 'g', -1, 64))
		fmt.Fprintf(b, "%s_count{%s} %d\n", name, k, h.count)
	}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
