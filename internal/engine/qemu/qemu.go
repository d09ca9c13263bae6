// Package qemu is k7's hardware-VM engine: every sandbox is a QEMU microvm
// guest (Debian kernel, uncompressed and booted through its PVH note) whose
// initramfs holds a small init (vminit) and the k7-agent. The image's root
// filesystem is a read-only ext4 disk shared by every sandbox of the image,
// under a tmpfs overlay in guest RAM; the agent speaks over a virtio-serial
// port that QEMU exposes as a unix socket.
//
// Fork: a source's RAM is a shared file on tmpfs. A checkpoint stops the
// guest, saves the device state with x-ignore-shared (kilobytes), copies
// the RAM file ("freezes" it) and continues. Children map the frozen file
// privately (copy-on-write), so the pages they do not touch are shared
// between all of them, and load the device state.
//
// Network: a sandbox with CreateRequest.Netns gets a virtio-net NIC whose
// tap is wired to eth0 of that namespace; the guest takes over eth0's
// address, route and MAC (see net.go). Without it the guest has loopback
// only.
//
// Acceleration is KVM when a timed probe shows it runs guests at hardware
// speed, TCG otherwise (see Accel).
//
// QEMU processes belong to the engine's state dir, not to the calling
// process: they run in their own session and a new Engine on the same Root
// finds them again.
package qemu

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/k7-dev/k7/internal/engine"
	"github.com/k7-dev/k7/internal/errdefs"
	"github.com/k7-dev/k7/internal/vmimage"
)

// Name is the engine's registered name.
const Name = "qemu"

// Defaults.
const (
	DefaultMemoryBytes = 256 << 20
	DefaultCPUs        = 1
)

// GuestModules are the kernel modules the initramfs carries and vminit
// loads, with their dependencies, when the kernel does not have them built in.
var GuestModules = []string{"virtio_mmio", "virtio_console", "virtio_blk", "crc32c_generic", "ext4", "overlay"}

// Config configures an Engine.
type Config struct {
	// QEMU is the qemu-system-x86_64 binary; default: found in PATH.
	QEMU string
	// Kernel is the guest kernel (a bzImage, or an uncompressed ELF
	// vmlinux); default: the newest /boot/vmlinuz-*. Its modules are read
	// from /lib/modules/<release>.
	Kernel string
	// Root is the engine's state dir (sandboxes, boot artifacts, disk
	// images). Required.
	Root string
	// AgentPath is the static k7-agent binary put into the initramfs. Required.
	AgentPath string
	// InitPath is the static vminit binary (package .../qemu/vminit);
	// default: k7-vminit next to AgentPath, else built with "go build"
	// from the source tree this engine was compiled from.
	InitPath string
	// ShmDir holds the guest RAM files of forkable sandboxes; it must be a
	// tmpfs. Default /dev/shm.
	ShmDir string
	// Accel is "kvm", "tcg" or "" (probe once, see Engine.Accel).
	Accel string
	// ForkPool is how many idle QEMU processes Restore keeps ready per
	// capture shape (RAM size, vCPUs, root disk); 0, the default, keeps
	// none. Each costs ~40 MB and saves QEMU's start-up (~100 ms) on a
	// restore. Close stops them; a new Engine on the same Root stops
	// those a previous one left.
	ForkPool int
	// Log receives the engine's log; default: discarded.
	Log *slog.Logger
}

// Engine runs sandboxes as QEMU microvms. It is safe for concurrent use.
type Engine struct {
	cfg      Config
	log      *slog.Logger
	accel    accelChoice
	qemuVer  string
	release  string
	vmlinux  string
	initrd   string
	version  string // EngineVersion of captures
	tscKHz   int64
	rootHash string // distinguishes this Root's files in ShmDir

	pool *forkPool
	mons monitors // kept QMP connections (monitor.go)

	mu    sync.Mutex
	locks map[string]*sync.Mutex // per sandbox and per disk image
}

var (
	_ engine.Engine = (*Engine)(nil)
	_ engine.Forker = (*Engine)(nil)
)

// New prepares the boot artifacts (cached under cfg.Root) and chooses the
// accelerator. A host that cannot run the engine gets an error wrapping
// errdefs.ErrUnavailable with the reason.
func New(cfg Config) (*Engine, error) {
	ctx := context.Background()
	if cfg.Root == "" {
		return nil, fmt.Errorf("qemu engine: no state dir: %w", errdefs.ErrInvalidArgument)
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.ShmDir == "" {
		cfg.ShmDir = "/dev/shm"
	}
	unavailable := func(format string, args ...any) error {
		return fmt.Errorf("qemu engine: %s: %w", fmt.Sprintf(format, args...), errdefs.ErrUnavailable)
	}
	if cfg.QEMU == "" {
		p, err := exec.LookPath("qemu-system-x86_64")
		if err != nil {
			return nil, unavailable("no qemu-system-x86_64 in PATH (apt install qemu-system-x86)")
		}
		cfg.QEMU = p
	}
	out, err := exec.Command(cfg.QEMU, "--version").Output()
	if err != nil {
		return nil, unavailable("running %s --version: %v", cfg.QEMU, err)
	}
	qemuVer := strings.TrimSpace(strings.SplitN(string(out), "\n", 2)[0])
	var release string
	if cfg.Kernel == "" {
		cfg.Kernel, release, err = vmimage.NewestKernel("/boot")
		if err != nil {
			return nil, unavailable("no guest kernel (apt install linux-image-amd64): %v", err)
		}
	} else {
		release = strings.TrimPrefix(filepath.Base(cfg.Kernel), "vmlinuz-")
		release = strings.TrimPrefix(release, "vmlinux-")
	}
	if _, err := os.Stat(cfg.Kernel); err != nil {
		return nil, unavailable("guest kernel: %v", err)
	}
	if cfg.AgentPath == "" {
		return nil, fmt.Errorf("qemu engine: no agent binary: %w", errdefs.ErrInvalidArgument)
	}
	if _, err := os.Stat(cfg.AgentPath); err != nil {
		return nil, unavailable("agent binary: %v", err)
	}
	for _, d := range []string{cfg.Root, filepath.Join(cfg.Root, "boot"), filepath.Join(cfg.Root, "disks"), filepath.Join(cfg.Root, "sandboxes")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("qemu engine: %w", err)
		}
	}
	absRoot, _ := filepath.Abs(cfg.Root)
	cfg.Root = absRoot
	sum := sha256.Sum256([]byte(absRoot))
	e := &Engine{cfg: cfg, log: cfg.Log, qemuVer: qemuVer, release: release,
		rootHash: hex.EncodeToString(sum[:4]), locks: map[string]*sync.Mutex{},
		pool: &forkPool{size: max(cfg.ForkPool, 0)}}
	e.cleanStalePool()
	e.tscKHz = hostTSCkHz()

	step := func(name string, fn func() error) error {
		t := time.Now()
		err := fn()
		e.log.Debug("qemu engine setup", "step", name, "took", time.Since(t), "err", err)
		return err
	}
	if err := step("accel", func() (err error) {
		e.accel, err = chooseAccel(ctx, cfg.QEMU, filepath.Join(cfg.Root, "boot"), cfg.Accel)
		return err
	}); err != nil {
		return nil, fmt.Errorf("qemu engine: %w", err)
	}
	if err := step("vmlinux", e.prepareKernel); err != nil {
		return nil, unavailable("preparing kernel: %v", err)
	}
	if err := step("initramfs", e.prepareInitramfs); err != nil {
		return nil, unavailable("preparing initramfs: %v", err)
	}
	e.log.Info("qemu engine ready", "accel", e.accel.Name, "accel_reason", e.accel.Reason,
		"kernel", e.vmlinux, "initrd", e.initrd, "version", e.version)
	return e, nil
}

// Name returns "qemu".
func (e *Engine) Name() string { return Name }

// Capabilities reports Fork and Network.
func (e *Engine) Capabilities() engine.Capabilities {
	return engine.Capabilities{Fork: true, Network: true}
}

// Accel returns the accelerator sandboxes run under ("kvm" or "tcg") and
// why it was chosen.
func (e *Engine) Accel() (name, reason string) { return e.accel.Name, e.accel.Reason }

// Version identifies QEMU, kernel, initramfs and accelerator; captures
// restore only into an engine with the same Version.
func (e *Engine) Version() string { return e.version }

func (e *Engine) prepareKernel() error {
	f, err := os.Open(e.cfg.Kernel)
	if err != nil {
		return err
	}
	magic := make([]byte, 4)
	_, _ = io.ReadFull(f, magic)
	fi, _ := f.Stat()
	_ = f.Close()
	if string(magic) == "\x7fELF" {
		e.vmlinux = e.cfg.Kernel
		return nil
	}
	e.vmlinux = filepath.Join(e.cfg.Root, "boot", fmt.Sprintf("vmlinux-%s-%d", e.release, fi.Size()))
	if _, err := os.Stat(e.vmlinux); err == nil {
		return nil
	}
	return vmimage.ExtractVmlinux(e.cfg.Kernel, e.vmlinux)
}

func (e *Engine) prepareInitramfs() error {
	initPath := e.cfg.InitPath
	if p := filepath.Join(filepath.Dir(e.cfg.AgentPath), "k7-vminit"); initPath == "" && isFile(p) {
		initPath = p
	}
	if initPath == "" {
		var err error
		if initPath, err = e.buildVMInit(); err != nil {
			return err
		}
	}
	ms, err := vmimage.LoadModules(filepath.Join("/lib/modules", e.release))
	if err != nil {
		return fmt.Errorf("reading kernel modules of %s: %w", e.release, err)
	}
	mods, err := ms.Resolve(GuestModules...)
	if err != nil {
		return err
	}
	netMods, err := ms.Resolve(NetModules...)
	if err != nil {
		return err
	}
	h := sha256.New()
	for _, p := range []string{initPath, e.cfg.AgentPath} {
		if err := hashFile(h, p); err != nil {
			return err
		}
	}
	_, _ = fmt.Fprintln(h, e.release, strings.Join(mods, " "), "net:", strings.Join(netMods, " "))
	sum := hex.EncodeToString(h.Sum(nil))[:16]
	e.initrd = filepath.Join(e.cfg.Root, "boot", "initrd-"+sum+".cpio")
	e.version = fmt.Sprintf("%s; kernel %s; initrd %s; accel %s", e.qemuVer, e.release, sum, e.accel.Name)
	if _, err := os.Stat(e.initrd); err == nil {
		return nil
	}
	r := vmimage.NewInitramfs()
	r.Add(vmimage.File{Path: "/init", Mode: 0o755, Source: initPath})
	r.Add(vmimage.File{Path: "/k7-agent", Mode: 0o755, Source: e.cfg.AgentPath})
	guest, err := r.AddModules(ms, mods)
	if err != nil {
		return err
	}
	r.Add(vmimage.File{Path: "/etc/k7-modules", Mode: 0o644, Data: []byte(strings.Join(guest, "\n") + "\n")})
	guestNet, err := r.AddModules(ms, netMods)
	if err != nil {
		return err
	}
	r.Add(vmimage.File{Path: netModules, Mode: 0o644, Data: []byte(strings.Join(guestNet, "\n") + "\n")})
	return r.WriteFile(e.initrd)
}

// buildVMInit builds package vminit from the source tree this engine was
// compiled from.
func (e *Engine) buildVMInit() (string, error) {
	_, file, _, _ := runtime.Caller(0)
	src := filepath.Join(filepath.Dir(file), "vminit")
	if _, err := os.Stat(filepath.Join(src, "main.go")); err != nil {
		return "", fmt.Errorf("no vminit binary configured and no source at %s", src)
	}
	out := filepath.Join(e.cfg.Root, "boot", "vminit")
	tmp := out + ".tmp"
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", tmp, ".")
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building vminit: %w: %s", err, b)
	}
	return out, os.Rename(tmp, out)
}

func isFile(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular()
}

func hashFile(h io.Writer, p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }()
	_, err = io.Copy(h, f)
	return err
}

// hostTSCkHz returns the host's TSC frequency in kHz, for the guest's
// tsc_early_khz (microvm has no HPET or PM timer to calibrate against):
// measured, or else /proc/cpuinfo's "cpu MHz" (which is the current core
// frequency, not always the TSC's).
func hostTSCkHz() int64 {
	if khz := measureTSCkHz(); khz > 100_000 {
		return khz
	}
	return cpuinfoMHz()
}

func cpuinfoMHz() int64 {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return 0
	}
	defer func() { _ = f.Close() }()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == "cpu MHz" {
			mhz, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err == nil {
				return int64(mhz * 1000)
			}
		}
	}
	return 0
}

var idRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,62}$`)

func (e *Engine) lock(key string) func() {
	e.mu.Lock()
	l, ok := e.locks[key]
	if !ok {
		l = &sync.Mutex{}
		e.locks[key] = l
	}
	e.mu.Unlock()
	l.Lock()
	return l.Unlock
}

func (e *Engine) dir(id string) string { return filepath.Join(e.cfg.Root, "sandboxes", id) }

func checkID(id string) error {
	if !idRE.MatchString(id) {
		return fmt.Errorf("sandbox ID %q: %w", id, errdefs.ErrInvalidArgument)
	}
	return nil
}

var errNoSandbox = errors.New("no such sandbox")
