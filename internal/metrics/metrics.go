// Package metrics holds k7d's Prometheus metrics: HTTP requests per route,
// sandbox operation latencies and sandboxes by state.
//
// Each Metrics has its own registry, so several daemons in one test process
// never collide. A Metrics is safe for concurrent use.
package metrics

import (
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// States are the sandbox states reported by k7_sandboxes.
var States = []string{"creating", "running", "paused", "stopped", "dead"}

// Metrics is the set of k7d's metrics.
type Metrics struct {
	reg      *prometheus.Registry
	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec
	ops      *prometheus.HistogramVec
}

// New returns empty metrics. states, if not nil, is called at each scrape
// and reports the number of sandboxes per state.
func New(states func() map[string]int) *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "k7_http_requests_total",
			Help: "HTTP requests served, by route pattern, method and status code.",
		}, []string{"route", "method", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "k7_http_request_duration_seconds",
			Help:    "Time spent serving HTTP requests, by route pattern.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2.5, 14),
		}, []string{"route", "method"}),
		ops: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "k7_sandbox_op_duration_seconds",
			Help:    "Time spent on sandbox operations (create, exec, pause, resume, fork, snapshot, restore, delete).",
			Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 14),
		}, []string{"op", "engine", "outcome"}),
	}
	m.reg.MustRegister(m.requests, m.latency, m.ops)
	if states != nil {
		m.reg.MustRegister(&stateCollector{
			states: states,
			desc:   prometheus.NewDesc("k7_sandboxes", "Sandboxes known to the daemon, by state.", []string{"state"}, nil),
		})
	}
	return m
}

// ObserveRequest records one HTTP request.
func (m *Metrics) ObserveRequest(route, method string, code int, d time.Duration) {
	m.requests.WithLabelValues(route, method, strconv.Itoa(code)).Inc()
	m.latency.WithLabelValues(route, method).Observe(d.Seconds())
}

// ObserveOp records one sandbox operation; err decides the outcome label.
func (m *Metrics) ObserveOp(op, engine string, d time.Duration, err error) {
	outcome := "ok"
	if err != nil {
		outcome = "error"
	}
	m.ops.WithLabelValues(op, engine, outcome).Observe(d.Seconds())
}

// Handler serves the metrics in the Prometheus exposition format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

// stateCollector reads the sandbox counts at scrape time.
type stateCollector struct {
	states func() map[string]int
	desc   *prometheus.Desc
}

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.states()
	for _, s := range States {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(st[s]), s)
	}
}
