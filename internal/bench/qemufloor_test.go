package bench

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/k7-dev/k7/internal/budget"
	"github.com/k7-dev/k7/internal/image"
	"github.com/k7-dev/k7/internal/testutil"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testutil.Cleanup()
	os.Exit(code)
}

// TestQEMUFloorRound runs one round of the raw QEMU floor, with a fan-out
// of 2 and 16 MiB in tmpfs to keep it short under TCG: every operation
// must be measured, and nothing of the guests may be left.
func TestQEMUFloorRound(t *testing.T) {
	testutil.RequiresQEMU(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	dir := t.TempDir()
	st, err := image.Open(filepath.Join(dir, "images"), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	_, rootfs, err := st.Rootfs(ctx, "busybox")
	if err != nil {
		t.Fatalf("busybox image (apt install busybox-static): %v", err)
	}
	f, err := newQEMUFloor(ctx, testutil.Binary(t, "k7-agent"), rootfs, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer f.close()
	f.fanOut, f.fillMiB = 2, 16

	var mu sync.Mutex
	got := map[budget.Op]int{}
	err = f.round(ctx, 0, func(op budget.Op, kind string, d time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		if kind != KindFloor || d <= 0 {
			t.Errorf("sample %s: kind %q, %v; want %q, > 0", op, kind, d, KindFloor)
		}
		got[op]++
		t.Logf("%s: %v", op, d)
	})
	if err != nil {
		t.Fatalf("floor round: %v", err)
	}
	for _, op := range opOrder {
		want := 1
		if op == budget.ExecRoundTrip {
			want = 5
		}
		if got[op] != want {
			t.Errorf("%s: %d samples, want %d", op, got[op], want)
		}
	}
	left, _ := filepath.Glob(filepath.Join(dir, "qemu", "sandboxes", "*"))
	mem, _ := filepath.Glob("/dev/shm/k7-qemu-*-floor-*.mem")
	if len(left)+len(mem) > 0 {
		t.Errorf("left after the round: %v %v", left, mem)
	}
}
