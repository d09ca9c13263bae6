package qemu

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/k7-dev/k7/internal/engine"
	"github.com/k7-dev/k7/internal/errdefs"
)

// vmState is a sandbox's record, state.json in its dir. It is written once
// the sandbox runs and never changes after.
type vmState struct {
	ID          string    `json:"id"`
	PID         int       `json:"pid"`
	StartTime   uint64    `json:"start_time"` // /proc/PID/stat field 22: guards against PID reuse
	MemoryBytes int64     `json:"memory_bytes"`
	CPUs        int       `json:"cpus"`
	Disk        string    `json:"disk,omitempty"`     // read-only root disk image
	MemFile     string    `json:"mem_file,omitempty"` // RAM file owned by this sandbox (share=on)
	Frozen      string    `json:"frozen,omitempty"`   // RAM file of a capture, mapped share=off
	SockDir     string    `json:"sock_dir"`
	Hostname    string    `json:"hostname,omitempty"`
	Env         []string  `json:"env,omitempty"`
	Netns       string    `json:"netns,omitempty"` // sandbox netns the guest's NIC is wired into
	Net         *guestNet `json:"net,omitempty"`   // the guest's NIC; nil: loopback only
	Incoming    string    `json:"-"`               // device state to load (restore)
	poolDir     string    // set for a fork-pool process: its dir; it starts in preconfig without RAM
}

// dir returns where st's files are: its sandbox dir, or its pool dir.
func (e *Engine) stDir(st *vmState) string {
	if st.poolDir != "" {
		return st.poolDir
	}
	return e.dir(st.ID)
}

func (st *vmState) qmpSock() string   { return filepath.Join(st.SockDir, "qmp.sock") }
func (st *vmState) agentSock() string { return filepath.Join(st.SockDir, "agent.sock") }

const stateFile = "state.json"

func (e *Engine) readState(id string) (*vmState, error) {
	b, err := os.ReadFile(filepath.Join(e.dir(id), stateFile))
	if err != nil {
		if os.IsNotExist(err) {
			return nil, errNoSandbox
		}
		return nil, err
	}
	var st vmState
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("reading sandbox state: %w", err)
	}
	return &st, nil
}

func (e *Engine) writeState(st *vmState) error {
	b, _ := json.MarshalIndent(st, "", "  ")
	p := filepath.Join(e.dir(st.ID), stateFile)
	if err := os.WriteFile(p+".tmp", b, 0o644); err != nil {
		return err
	}
	return os.Rename(p+".tmp", p)
}

// sockDir returns where a sandbox's unix sockets live: its own dir, or a
// short directory under the temp dir when that path would be too long for
// a socket address (108 bytes).
func (e *Engine) sockDir(id string) string {
	d := e.dir(id)
	if len(d)+len("/agent.sock") < 100 {
		return d
	}
	sum := sha256.Sum256([]byte(d))
	return filepath.Join(os.TempDir(), "k7q-"+hex.EncodeToString(sum[:8]))
}

func (e *Engine) newState(id string, req *engine.CreateRequest) *vmState {
	st := &vmState{ID: id, MemoryBytes: req.Resources.MemoryBytes, Hostname: req.Hostname,
		Env: req.Env, SockDir: e.sockDir(id), Netns: req.Netns}
	if st.MemoryBytes <= 0 {
		st.MemoryBytes = DefaultMemoryBytes
	}
	st.MemoryBytes = (st.MemoryBytes + 1<<20 - 1) &^ (1<<20 - 1)
	st.CPUs = int(math.Ceil(req.Resources.CPUs))
	if st.CPUs < 1 {
		st.CPUs = DefaultCPUs
	}
	return st
}

// kernelArgs is the guest kernel command line.
func (e *Engine) kernelArgs(st *vmState) (string, error) {
	a := []string{"console=ttyS0", "panic=-1", "quiet", "mitigations=off", "no_timer_check",
		"cryptomgr.notests", "audit=0", "random.trust_cpu=on", "8250.nr_uarts=1", "pci=off"}
	if e.tscKHz > 0 {
		a = append(a, fmt.Sprintf("tsc_early_khz=%d", e.tscKHz))
	}
	if st.Disk != "" {
		a = append(a, "k7.root=/dev/vda")
	}
	if st.Hostname != "" {
		if strings.ContainsAny(st.Hostname, " \t\n\"") {
			return "", fmt.Errorf("host name %q has spaces: %w", st.Hostname, errdefs.ErrInvalidArgument)
		}
		a = append(a, "k7.host="+st.Hostname)
	}
	if st.Net != nil {
		a = append(a, "k7.net="+st.Net.String())
	}
	if len(st.Env) > 0 {
		a = append(a, "k7.env="+base64.RawURLEncoding.EncodeToString([]byte(strings.Join(st.Env, "\x00"))))
	}
	s := strings.Join(a, " ")
	if len(s) > 2000 {
		return "", fmt.Errorf("environment too large for the kernel command line (%d bytes, at most ~2000): %w", len(s), errdefs.ErrInvalidArgument)
	}
	return s, nil
}

// qemuArgs is the QEMU command line. A child's differs from its source's
// only in its sockets, log and RAM backend, so that device state loads.
func (e *Engine) qemuArgs(st *vmState) ([]string, error) {
	dir := e.stDir(st)
	kargs, err := e.kernelArgs(st)
	if err != nil {
		return nil, err
	}
	mem := fmt.Sprintf("%dM", st.MemoryBytes>>20)
	a := []string{"-name", "k7-" + st.ID, "-accel", e.accel.Name}
	if e.accel.Name == AccelKVM {
		a = append(a, "-cpu", "host")
	}
	a = append(a,
		"-M", "microvm,acpi=on",
		"-m", mem, "-smp", strconv.Itoa(st.CPUs),
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot", "-S",
		// seccomp: no obsolete syscalls, no setuid/setgid, no scheduler or
		// CPU-affinity changes; spawning stays allowed for "migrate exec:".
		"-sandbox", "on,obsolete=deny,elevateprivileges=deny,resourcecontrol=deny",
		"-chardev", "file,id=con,path="+filepath.Join(dir, "console.log")+",append=on",
		"-serial", "chardev:con",
		"-device", "virtio-serial-device,id=vser",
		"-chardev", "socket,id=ag,path="+st.agentSock()+",server=on,wait=off",
		"-device", "virtserialport,chardev=ag,name=agent,id=agentport",
		"-qmp", "unix:"+st.qmpSock()+",server=on,wait=off",
	)
	switch {
	case st.poolDir != "":
		// The RAM backend is added in preconfig when the process is used.
		a = append(a, "-preconfig")
	case st.MemFile != "":
		a = append(a, "-object", fmt.Sprintf("memory-backend-file,id=mem,size=%s,mem-path=%s,share=on", mem, st.MemFile))
	case st.Frozen != "":
		a = append(a, "-object", fmt.Sprintf("memory-backend-file,id=mem,size=%s,mem-path=%s,share=off", mem, st.Frozen))
	default:
		a = append(a, "-object", fmt.Sprintf("memory-backend-ram,id=mem,size=%s", mem))
	}
	if st.poolDir == "" {
		a = append(a, "-machine", "memory-backend=mem")
	}
	if st.Disk != "" {
		a = append(a,
			"-drive", "file="+st.Disk+",if=none,id=root,format=raw,readonly=on,cache=unsafe",
			"-device", "virtio-blk-device,drive=root,id=rootdisk")
	}
	if st.Net != nil {
		// QEMU runs in a netns of its own (see launch), where it creates
		// the tap; the engine moves it into the sandbox netns.
		a = append(a,
			"-netdev", "tap,id=net0,ifname="+tapIf+",script=no,downscript=no",
			"-device", "virtio-net-device,netdev=net0,id=nic,mac="+st.Net.MAC)
	}
	if st.Incoming != "" {
		// The kernel is in the guest RAM already: loading it again
		// would only cost start-up time and memory.
		a = append(a, "-incoming", "defer")
	} else {
		a = append(a, "-kernel", e.vmlinux, "-initrd", e.initrd, "-append", kargs)
	}
	for _, s := range a {
		if strings.Contains(s, ",,") {
			return nil, fmt.Errorf("QEMU argument %q: paths must not contain commas", s)
		}
	}
	return a, nil
}

// launch starts QEMU (stopped, -S) in its own session (and, with st.Net,
// in a new, empty network namespace) and records its PID in st. The returned channel is closed when the process exits (while this
// Engine lives).
func (e *Engine) launch(st *vmState) (<-chan struct{}, error) {
	args, err := e.qemuArgs(st)
	if err != nil {
		return nil, err
	}
	dir := e.stDir(st)
	stderr, err := os.OpenFile(filepath.Join(dir, "qemu.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer func() { _ = stderr.Close() }()
	cmd := exec.Command(e.cfg.QEMU, args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = stderr, stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if st.Net != nil {
		// An empty network namespace for QEMU's tap until attachTap moves
		// it; QEMU itself never gets a network.
		cmd.SysProcAttr.Cloneflags = syscall.CLONE_NEWNET
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting QEMU: %w", err)
	}
	exited := make(chan struct{})
	children.Store(cmd.Process.Pid, exited)
	go func() {
		_ = cmd.Wait()
		close(exited)
		children.Delete(cmd.Process.Pid)
	}()
	st.PID = cmd.Process.Pid
	st.StartTime = procStartTime(st.PID)
	_ = os.WriteFile(filepath.Join(dir, "qemu.pid"), []byte(strconv.Itoa(st.PID)), 0o644)
	return exited, nil
}

// dialMonitor waits for QEMU's QMP socket and connects to it.
func (e *Engine) dialMonitor(ctx context.Context, st *vmState, exited <-chan struct{}) (*qmp, error) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		q, err := dialQMP(ctx, st.qmpSock())
		if err == nil {
			return q, nil
		}
		select {
		case <-exited:
			return nil, fmt.Errorf("QEMU exited: %s", e.tail(st.ID, "qemu.log"))
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("QEMU monitor: %w", err)
		}
	}
}

// dialAgent connects to the agent's socket.
func dialAgent(ctx context.Context, st *vmState) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", st.agentSock())
	if err != nil {
		return nil, fmt.Errorf("connecting to agent: %w", err)
	}
	return c, nil
}

// tail returns the end of a file in the sandbox dir, for error messages.
func (e *Engine) tail(id, name string) string { return e.tailN(id, name, 1500) }

func (e *Engine) tailN(id, name string, n int) string {
	b, _ := os.ReadFile(filepath.Join(e.dir(id), name))
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return strings.TrimSpace(string(b))
}

// procStartTime returns field 22 of /proc/PID/stat, 0 if the process is gone.
func procStartTime(pid int) uint64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 || f[0] == "Z" || f[0] == "X" {
		return 0
	}
	v, _ := strconv.ParseUint(f[19], 10, 64)
	return v
}

// alive reports whether st's QEMU process still runs.
func alive(st *vmState) bool {
	return st.PID > 0 && procStartTime(st.PID) == st.StartTime && st.StartTime != 0
}

// kill stops st's QEMU: quit over QMP, then SIGKILL, and waits until it is gone.
func (e *Engine) kill(ctx context.Context, st *vmState) {
	if !alive(st) {
		return
	}
	e.mons.drop(st.ID) // QEMU answers one client at a time
	qctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	if q, err := dialQMP(qctx, st.qmpSock()); err == nil {
		_, _ = q.Execute(qctx, "quit", nil)
		_ = q.Close()
	}
	cancel()
	for i := 0; alive(st); i++ {
		if i == 50 || i == 0 && ctx.Err() != nil {
			_ = syscall.Kill(st.PID, syscall.SIGKILL)
		}
		if i > 3000 {
			e.log.Warn("QEMU does not exit", "sandbox", st.ID, "pid", st.PID)
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
	// Our own child: wait until it is reaped, so that no zombie is left
	// to a parent that does not reap (PID 1 in some containers).
	if ch, ok := children.Load(st.PID); ok {
		select {
		case <-ch.(chan struct{}):
		case <-time.After(time.Second):
		}
	}
}

// children are the QEMU processes this process started, by PID, with a
// channel closed when each is reaped.
var children sync.Map

// cleanup is a stack of undo functions for a half-done operation.
type cleanup []func()

func (c *cleanup) add(f func()) { *c = append(*c, f) }
func (c *cleanup) run() {
	for i := len(*c) - 1; i >= 0; i-- {
		(*c)[i]()
	}
	*c = nil
}
