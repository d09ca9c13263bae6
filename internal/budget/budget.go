// Package budget is the single source of truth for k7's latency budgets.
//
// Each entry names an operation of one engine, the typical latency measured
// on the project's machine kind (2 cores, nested PVM, Debian 12) and the
// budget, about twice the typical value. Integration tests and `k7 bench`
// import this table; no other file in the tree holds a budget number.
//
// Tests assert the daemon-side latency (latency_ns in each API answer), not
// the client's round trip, and judge the median of several samples.
package budget

import (
	"fmt"
	"slices"
	"time"
)

// Op names a measured operation. The strings appear in bench output.
type Op string

// Operations.
const (
	CreateToExec  Op = "create_to_exec" // create → first exec answered
	ExecRoundTrip Op = "exec_rtt"       // exec of /bin/true through the agent
	Pause         Op = "pause"
	Resume        Op = "resume"
	Delete        Op = "delete"
	ForkIdle      Op = "fork_idle"    // fork → child's first exec answered, idle source
	Fork256M      Op = "fork_256m"    // same with 256 MiB in tmpfs
	FanOut10      Op = "fanout_10"    // fork -n 10 → all children answered
	SourcePause   Op = "source_pause" // how long the source is paused by a fork
	Snapshot      Op = "snapshot"
	Restore       Op = "restore"       // snapshot restore → child answered
	NetworkSetup  Op = "network_setup" // k7d's network step of a create or fork child (namespaces, veths, nftables)
	TapAttach     Op = "tap_attach"    // qemu: moving the guest's tap into the sandbox netns and wiring it
)

// Budget is the latency expectation for one operation of one engine.
type Budget struct {
	Engine  string
	Op      Op
	Typical time.Duration // median measured on the reference machine kind
	Limit   time.Duration // about 2× Typical; a median above it is a miss
}

const ms = time.Millisecond

// The typical figures were measured on the project's machine kind (2 vCPU
// AMD EPYC, Debian 12, nested virtualization; see PERFORMANCE.md for the
// command and run) with `k7 bench lifecycle --reps 5` and the integration
// tests, the machine otherwise idle. Raw runsc there: run ≈ 260 ms, exec
// ≈ 40 ms, checkpoint ≈ 60 ms, restore ≈ 300 ms.
var table = []Budget{
	{"gvisor", CreateToExec, 310 * ms, 620 * ms},
	{"gvisor", ExecRoundTrip, 15 * ms, 40 * ms},
	{"gvisor", Pause, 4 * ms, 10 * ms},
	{"gvisor", Resume, 3 * ms, 10 * ms},
	{"gvisor", Delete, 140 * ms, 300 * ms},
	{"gvisor", ForkIdle, 400 * ms, 800 * ms},
	{"gvisor", Fork256M, 1500 * ms, 3000 * ms},
	{"gvisor", FanOut10, 3600 * ms, 7200 * ms},
	{"gvisor", SourcePause, 80 * ms, 160 * ms},
	{"gvisor", Snapshot, 140 * ms, 300 * ms},
	{"gvisor", Restore, 430 * ms, 900 * ms},
	// The target for networking's added cost is 30 ms.
	{"gvisor", NetworkSetup, 15 * ms, 30 * ms},

	// qemu under TCG (no usable KVM on this machine kind), guests with the
	// default network: `k7 bench lifecycle --engine qemu --reps 3`.
	{"qemu", CreateToExec, 2600 * ms, 5200 * ms},
	{"qemu", ExecRoundTrip, 12 * ms, 25 * ms},
	{"qemu", Pause, 5 * ms, 10 * ms},
	{"qemu", Resume, 4 * ms, 10 * ms},
	{"qemu", Delete, 90 * ms, 200 * ms},
	{"qemu", ForkIdle, 480 * ms, 1000 * ms},
	{"qemu", Fork256M, 880 * ms, 1800 * ms},
	{"qemu", FanOut10, 4600 * ms, 9200 * ms},
	{"qemu", SourcePause, 82 * ms, 165 * ms},
	{"qemu", Snapshot, 340 * ms, 700 * ms},
	{"qemu", Restore, 830 * ms, 1700 * ms},
	{"qemu", NetworkSetup, 15 * ms, 30 * ms},
	{"qemu", TapAttach, 20 * ms, 40 * ms},
}

// Lookup returns the budget of op on engine.
func Lookup(engine string, op Op) (Budget, bool) {
	for _, b := range table {
		if b.Engine == engine && b.Op == op {
			return b, true
		}
	}
	return Budget{}, false
}

// All returns a copy of the table.
func All() []Budget { return slices.Clone(table) }

// Median returns the median of samples (0 for none).
func Median(samples []time.Duration) time.Duration {
	if len(samples) == 0 {
		return 0
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// Report describes samples against the budget in one line.
func (b Budget) Report(samples []time.Duration) string {
	s := slices.Clone(samples)
	slices.Sort(s)
	if len(s) == 0 {
		return fmt.Sprintf("%s/%s: no samples (budget %v)", b.Engine, b.Op, b.Limit)
	}
	return fmt.Sprintf("%s/%s: median %v (min %v, max %v, n=%d), budget %v, typical %v",
		b.Engine, b.Op, Median(s).Round(10*time.Microsecond), s[0].Round(10*time.Microsecond),
		s[len(s)-1].Round(10*time.Microsecond), len(s), b.Limit, b.Typical)
}

// TB is the part of testing.TB that Check uses.
type TB interface {
	Helper()
	Logf(format string, args ...any)
	Errorf(format string, args ...any)
}

// Check logs the measured figure next to the budget and fails t when the
// median of samples is above the budget. Unknown operations fail t.
func Check(t TB, engine string, op Op, samples []time.Duration) {
	t.Helper()
	b, ok := Lookup(engine, op)
	if !ok {
		t.Errorf("budget: no budget for %s/%s", engine, op)
		return
	}
	t.Logf("budget: %s", b.Report(samples))
	if m := Median(samples); len(samples) == 0 || m > b.Limit {
		t.Errorf("budget missed: %s", b.Report(samples))
	}
}
