package qemu

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/k7-dev/k7/internal/agent/client"
	"github.com/k7-dev/k7/internal/engine"
)

// TestMeasure times the engine's main operations (K7_QEMU_MEASURE=1;
// K7_QEMU_MEASURE_N sets the number of runs, default 5) and logs median
// and range. Timing claims live here, not in asserts.
func TestMeasure(t *testing.T) {
	if os.Getenv("K7_QEMU_MEASURE") != "1" {
		t.Skip("set K7_QEMU_MEASURE=1")
	}
	n := 5
	_, _ = fmt.Sscan(os.Getenv("K7_QEMU_MEASURE_N"), &n)
	e, rootfs := newEngine(t)
	ctx := context.Background()
	name, reason := e.Accel()
	t.Logf("accel %s (%s)", name, reason)

	answer := func(id string) *client.Client {
		c := connect(t, e, id)
		run(t, c, "true")
		return c
	}
	var boot, pause, fork, fan4, execRTT, ping []time.Duration
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("m%d", i)
		t0 := time.Now()
		create(t, e, id, rootfs)
		c := answer(id)
		boot = append(boot, time.Since(t0))
		for j := 0; j < 10; j++ {
			t1 := time.Now()
			run(t, c, "true")
			execRTT = append(execRTT, time.Since(t1))
			d, err := c.Ping(ctx)
			if err != nil {
				t.Fatal(err)
			}
			ping = append(ping, d)
		}
		capDir := t.TempDir()
		res, err := e.Checkpoint(ctx, &engine.CheckpointRequest{ID: id, Dir: capDir})
		if err != nil {
			t.Fatal(err)
		}
		pause = append(pause, res.SourcePause)
		t0 = time.Now()
		kid := id + "k"
		if err := e.Restore(ctx, &engine.RestoreRequest{CreateRequest: engine.CreateRequest{ID: kid}, From: capDir}); err != nil {
			t.Fatal(err)
		}
		answer(kid)
		fork = append(fork, time.Since(t0))
		_ = e.Delete(ctx, kid)

		t0 = time.Now()
		var wg sync.WaitGroup
		for k := 0; k < 4; k++ {
			wg.Add(1)
			go func(k int) {
				defer wg.Done()
				kid := fmt.Sprintf("%sf%d", id, k)
				if err := e.Restore(ctx, &engine.RestoreRequest{CreateRequest: engine.CreateRequest{ID: kid}, From: capDir}); err != nil {
					t.Error(err)
					return
				}
				t.Cleanup(func() { _ = e.Delete(context.Background(), kid) })
				answer(kid)
			}(k)
		}
		wg.Wait()
		fan4 = append(fan4, time.Since(t0))
		if i == n-1 {
			var pss, rss int64
			for k := 0; k < 4; k++ {
				st, _ := e.readState(fmt.Sprintf("%sf%d", id, k))
				p, r, _ := smapsRollup(st.PID)
				pss, rss = pss+p, rss+r
			}
			p, r, _ := func() (int64, int64, error) { st, _ := e.readState(id); return smapsRollup(st.PID) }()
			t.Logf("memory: source PSS %d MiB RSS %d MiB; 4 children PSS sum %d MiB, RSS sum %d MiB (4 x %d MiB guest)",
				p>>20, r>>20, pss>>20, rss>>20, DefaultMemoryBytes>>20)
		}
		for k := 0; k < 4; k++ {
			_ = e.Delete(ctx, fmt.Sprintf("%sf%d", id, k))
		}
		_ = e.Delete(ctx, id)
	}
	for _, m := range []struct {
		name string
		d    []time.Duration
	}{
		{"create -> agent answers (exec true)", boot},
		{"exec true round trip", execRTT},
		{"ping round trip", ping},
		{"checkpoint source pause", pause},
		{"fork -> child answers (exec true)", fork},
		{"fan-out 4 -> all answered", fan4},
	} {
		s := append([]time.Duration(nil), m.d...)
		med := median(s)
		lo, hi := s[0], s[0]
		for _, d := range s {
			lo, hi = min(lo, d), max(hi, d)
		}
		t.Logf("%-40s median %8v  range %v – %v  n=%d", m.name, med.Round(100*time.Microsecond), lo.Round(100*time.Microsecond), hi.Round(100*time.Microsecond), len(s))
	}
}
