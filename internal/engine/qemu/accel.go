package qemu

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Accelerator names.
const (
	AccelKVM = "kvm"
	AccelTCG = "tcg"
)

// probeLoop is the number of iterations of the probe's busy loop (two
// instructions each): ~10 ms on hardware KVM, well under a second with TCG,
// ~20 s on a hypervisor that emulates its guests (nested PVM).
const probeLoop = 0x00980000

// probeTimeout bounds the KVM probe run.
const probeTimeout = 1500 * time.Millisecond

type accelChoice struct {
	Name   string `json:"name"`
	Reason string `json:"reason"`
	BootID string `json:"boot_id"`
	QEMU   string `json:"qemu"`
}

// chooseAccel returns the configured accelerator, or probes for one: KVM
// when a tiny firmware-only guest running a busy loop finishes under KVM
// at least as fast as under TCG, TCG otherwise. The result is cached in
// dir (keyed by the host's boot ID and QEMU path).
func chooseAccel(ctx context.Context, qemuBin, dir, configured string) (accelChoice, error) {
	switch configured {
	case AccelKVM, AccelTCG:
		return accelChoice{Name: configured, Reason: "configured"}, nil
	case "":
	default:
		return accelChoice{}, fmt.Errorf("unknown accelerator %q", configured)
	}
	bootID, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	key := accelChoice{BootID: strings.TrimSpace(string(bootID)), QEMU: qemuBin}
	cache := filepath.Join(dir, "accel.json")
	if b, err := os.ReadFile(cache); err == nil {
		var c accelChoice
		if json.Unmarshal(b, &c) == nil && c.BootID == key.BootID && c.QEMU == key.QEMU && c.Name != "" {
			return c, nil
		}
	}
	c := probeAccel(ctx, qemuBin, dir)
	c.BootID, c.QEMU = key.BootID, key.QEMU
	b, _ := json.Marshal(c)
	tmp := cache + ".tmp"
	if os.WriteFile(tmp, b, 0o644) == nil {
		_ = os.Rename(tmp, cache)
	}
	return c, nil
}

func probeAccel(ctx context.Context, qemuBin, dir string) accelChoice {
	if err := unix.Access("/dev/kvm", unix.R_OK|unix.W_OK); err != nil {
		return accelChoice{Name: AccelTCG, Reason: fmt.Sprintf("/dev/kvm not usable: %v", err)}
	}
	fw := filepath.Join(dir, "probe-fw.bin")
	if err := writeFile(fw, probeFirmware()); err != nil {
		return accelChoice{Name: AccelTCG, Reason: fmt.Sprintf("writing probe firmware: %v", err)}
	}
	tcg, tcgErr := runProbe(ctx, qemuBin, fw, AccelTCG, 5*time.Second)
	kvm, kvmErr := runProbe(ctx, qemuBin, fw, AccelKVM, probeTimeout)
	return decideAccel(kvm, kvmErr, tcg, tcgErr)
}

// decideAccel picks KVM when its probe ran at least as fast as TCG's.
func decideAccel(kvm time.Duration, kvmErr error, tcg time.Duration, tcgErr error) accelChoice {
	switch {
	case kvmErr != nil:
		return accelChoice{Name: AccelTCG, Reason: fmt.Sprintf("KVM probe: %v", kvmErr)}
	case tcgErr == nil && kvm > tcg:
		return accelChoice{Name: AccelTCG, Reason: fmt.Sprintf(
			"KVM is emulated: a %d-instruction loop took %v under KVM, %v under TCG", 2*probeLoop, kvm.Round(time.Millisecond), tcg.Round(time.Millisecond))}
	default:
		return accelChoice{Name: AccelKVM, Reason: fmt.Sprintf(
			"a %d-instruction loop took %v under KVM, %v under TCG", 2*probeLoop, kvm.Round(time.Millisecond), tcg.Round(time.Millisecond))}
	}
}

// probeFirmware is a 64 KiB firmware image whose reset vector runs a
// real-mode busy loop and then writes 0x10 to the isa-debug-exit port
// (QEMU exits with status 0x21).
func probeFirmware() []byte {
	b := bytes.Repeat([]byte{0xF4}, 64<<10) // hlt
	n := uint32(probeLoop)
	code := []byte{
		0x66, 0xB9, byte(n), byte(n >> 8), byte(n >> 16), byte(n >> 24), // mov ecx, probeLoop
		0x66, 0x49, // dec ecx
		0x75, 0xFC, // jnz dec
		0xB0, 0x10, // mov al, 0x10
		0xE6, 0xF4, // out 0xf4, al
		0xF4, // hlt
	}
	copy(b[0xFFF0:], code)
	return b
}

// runProbe runs the probe firmware under accel and returns how long QEMU
// ran, start-up included. It does not wait for a QEMU that ignores SIGKILL
// (a vCPU stuck in a broken hypervisor) longer than a moment.
func runProbe(ctx context.Context, qemuBin, fw, accel string, timeout time.Duration) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.Command(qemuBin, "-accel", accel,
		"-M", "microvm,x-option-roms=off,rtc=off,pit=off,pic=off,isa-serial=off",
		"-nodefaults", "-no-user-config", "-display", "none", "-m", "16M",
		"-bios", fw, "-device", "isa-debug-exit,iobase=0xf4")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var err error
	select {
	case err = <-done:
	case <-ctx.Done():
		_ = cmd.Process.Kill()
		select {
		case <-done:
		case <-time.After(200 * time.Millisecond):
		}
		return time.Since(start), fmt.Errorf("the guest did not finish a %d-instruction loop in %v", 2*probeLoop, timeout)
	}
	d := time.Since(start)
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee) && ee.ExitCode() == 0x21:
		return d, nil
	case err == nil:
		return d, errors.New("QEMU exited without the probe's exit code")
	default:
		return d, fmt.Errorf("%w: %s", err, strings.TrimSpace(stderr.String()))
	}
}

func writeFile(p string, b []byte) error { return os.WriteFile(p, b, 0o644) }
