package qemu

import (
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/k7-dev/k7/internal/errdefs"
)

// TestProbeFirmware runs the probe guest under TCG: it must exit with the
// probe's code, quickly.
func TestProbeFirmware(t *testing.T) {
	requireQEMU(t)
	qemuBin, _ := exec.LookPath("qemu-system-x86_64")
	fw := filepath.Join(t.TempDir(), "fw.bin")
	if err := writeFile(fw, probeFirmware()); err != nil {
		t.Fatal(err)
	}
	d, err := runProbe(context.Background(), qemuBin, fw, AccelTCG, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("TCG probe: %v", d)
	// A timeout is reported as such.
	if _, err := runProbe(context.Background(), qemuBin, fw, AccelTCG, time.Millisecond); err == nil {
		t.Error("probe with 1 ms timeout succeeded")
	}
}

func TestDecideAccel(t *testing.T) {
	ms := time.Millisecond
	for _, tc := range []struct {
		name     string
		kvm, tcg time.Duration
		kvmErr   error
		want     string
	}{
		{"hardware", 60 * ms, 160 * ms, nil, AccelKVM},
		{"emulated", 1400 * ms, 160 * ms, nil, AccelTCG},
		{"timeout", 1500 * ms, 160 * ms, errors.New("did not finish"), AccelTCG},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := decideAccel(tc.kvm, tc.kvmErr, tc.tcg, nil)
			if got.Name != tc.want || got.Reason == "" {
				t.Errorf("decideAccel = %+v, want %s with a reason", got, tc.want)
			}
		})
	}
}

func TestTSC(t *testing.T) {
	m, c := measureTSCkHz(), cpuinfoMHz()
	t.Logf("measured TSC %d kHz, /proc/cpuinfo %d kHz", m, c)
	if m <= 0 {
		t.Skip("no TSC measurement on this architecture")
	}
	if c > 0 && (m < c*9/10 || m > c*11/10) {
		t.Logf("measured TSC differs from cpu MHz by more than 10%% (frequency scaling?)")
	}
}

func TestNewUnavailable(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"no qemu", Config{QEMU: "/nonexistent/qemu-system-x86_64", Root: t.TempDir(), AgentPath: "/bin/true"}},
		{"no kernel", Config{QEMU: "/bin/true", Kernel: "/nonexistent/vmlinuz-1", Root: t.TempDir(), AgentPath: "/bin/true"}},
		{"no agent", Config{QEMU: "/bin/true", Kernel: "/bin/true", Root: t.TempDir(), AgentPath: "/nonexistent/k7-agent"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(tc.cfg)
			if !errors.Is(err, errdefs.ErrUnavailable) {
				t.Errorf("New: got %v, want ErrUnavailable", err)
			}
			t.Log(err)
		})
	}
}
