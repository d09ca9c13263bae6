package qemu

import (
	"runtime"
	"time"
)

func rdtsc() uint64

// measureTSCkHz counts host TSC ticks over a few milliseconds of wall
// clock. Under TCG the guest's TSC is the host's; under KVM it runs at the
// host's rate unless scaled.
func measureTSCkHz() int64 {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var best int64
	for i := 0; i < 5; i++ {
		t0, c0 := time.Now(), rdtsc()
		time.Sleep(4 * time.Millisecond)
		c1, t1 := rdtsc(), time.Now()
		// Being descheduled between a clock read and its rdtsc only
		// loses ticks: the highest rate is the least disturbed.
		best = max(best, int64(float64(c1-c0)/float64(t1.Sub(t0).Nanoseconds())*1e6))
	}
	return best
}
