package gvisor

import (
	"encoding/json"
	"os"
	"path/filepath"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/k7-dev/k7/internal/engine"
)

const defaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// cpuPeriod is the CFS period in µs.
const cpuPeriod = 100000

// defaultCaps is the capability set of the agent and its commands: Docker's
// default set plus CAP_SYS_ADMIN, which the agent needs as init (mounts,
// sethostname after a fork). The capabilities are gVisor's, not the host's.
var defaultCaps = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD",
	"CAP_NET_RAW", "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP",
	"CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
	"CAP_SYS_ADMIN",
}

// spec builds the OCI runtime spec of a sandbox.
func (e *Engine) spec(req *engine.CreateRequest) *specs.Spec {
	args := []string{agentDest}
	if e.cfg.initArgs != nil {
		args = e.cfg.initArgs
	}
	env := append([]string(nil), req.Env...)
	hasPath := false
	for _, kv := range env {
		if len(kv) >= 5 && kv[:5] == "PATH=" {
			hasPath = true
		}
	}
	if !hasPath {
		env = append(env, defaultPath)
	}
	hostname := req.Hostname
	if hostname == "" {
		hostname = req.ID
	}
	caps := &specs.LinuxCapabilities{
		Bounding:  defaultCaps,
		Effective: defaultCaps,
		Permitted: defaultCaps,
	}
	mounts := []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc"},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
		{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777"}},
		{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
		{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "mode=1777"}},
	}
	if e.cfg.initArgs == nil {
		mounts = append(mounts, specs.Mount{
			Destination: agentDest, Type: "bind", Source: e.cfg.AgentPath,
			Options: []string{"rbind", "ro"},
		})
	}
	res := &specs.LinuxResources{}
	if r := req.Resources; r.CPUs > 0 {
		q := int64(r.CPUs * cpuPeriod)
		p := uint64(cpuPeriod)
		res.CPU = &specs.LinuxCPU{Quota: &q, Period: &p}
	}
	if m := req.Resources.MemoryBytes; m > 0 {
		res.Memory = &specs.LinuxMemory{Limit: &m}
	}
	if p := req.Resources.PIDs; p > 0 {
		res.Pids = &specs.LinuxPids{Limit: &p}
	}
	return &specs.Spec{
		Version: specs.Version,
		Process: &specs.Process{
			User:         specs.User{UID: 0, GID: 0},
			Args:         args,
			Env:          env,
			Cwd:          "/",
			Capabilities: caps,
			Rlimits:      []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Hard: 1 << 20, Soft: 1 << 20}},
		},
		Root:     &specs.Root{Path: req.Rootfs, Readonly: false},
		Hostname: hostname,
		Mounts:   mounts,
		Linux: &specs.Linux{
			CgroupsPath: e.cgroupsPath(req.ID),
			Resources:   res,
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace},
				{Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace},
				{Type: specs.MountNamespace},
				{Type: specs.NetworkNamespace, Path: req.Netns},
			},
		},
	}
}

func writeSpec(dir string, s *specs.Spec) error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "config.json"), b, 0o600)
}
