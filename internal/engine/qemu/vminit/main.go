// Command vminit is PID 1 of a k7 QEMU guest until the k7-agent takes over.
//
// The QEMU engine builds it (static) into the initramfs as /init, next to
// the agent (/k7-agent) and kernel modules listed in /etc/k7-modules. It
// loads the modules in order, mounts the read-only root disk under a tmpfs
// overlay (the sandbox's writable layer, which lives in guest RAM and so is
// carried by a fork), mounts /proc, /sys, /dev, /dev/pts, /dev/shm and /run
// there, switches root, opens the virtio-serial port named "agent" as
// stdin/stdout and execs the agent as PID 1. The console (ttyS0, the sandbox
// log) stays on stderr. It brings lo up and, with k7.net, configures eth0.
//
// Kernel command line parameters it reads:
//
//	k7.root=/dev/vda   the root disk (absent: the initramfs is the root)
//	k7.host=NAME       host name
//	k7.env=B64         base64 (raw URL) of NUL-separated KEY=VALUE pairs
//	k7.net=X/N,G       the network interface: eth0 gets X/N and the default
//	                   route via G, after the modules in /etc/k7-net-modules
//	                   (virtio_net) are loaded; absent: loopback only
//	k7.port=NAME       virtio-serial port name (default "agent")
package main

import (
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "k7-vminit: %v\n", err)
		// PID 1 exiting panics the kernel; panic=-1 turns that into a
		// reboot, which -no-reboot turns into QEMU exiting.
		os.Exit(1)
	}
}

func run() error {
	t0 := time.Now()
	if err := unix.Mount("devtmpfs", "/dev", "devtmpfs", 0, ""); err != nil {
		return fmt.Errorf("mounting /dev: %w", err)
	}
	if fd, err := unix.Open("/dev/console", unix.O_RDWR, 0); err == nil {
		for i := 0; i < 3; i++ {
			_ = unix.Dup2(fd, i)
		}
		if fd > 2 {
			_ = unix.Close(fd)
		}
	}
	if err := unix.Mount("proc", "/proc", "proc", 0, ""); err != nil {
		return fmt.Errorf("mounting /proc: %w", err)
	}
	if err := unix.Mount("sysfs", "/sys", "sysfs", 0, ""); err != nil {
		return fmt.Errorf("mounting /sys: %w", err)
	}
	args := cmdline()
	if err := loadModules("/etc/k7-modules"); err != nil {
		return err
	}
	if err := setupNet(args["k7.net"]); err != nil {
		return err
	}
	if h := args["k7.host"]; h != "" {
		if err := unix.Sethostname([]byte(h)); err != nil {
			return fmt.Errorf("setting host name: %w", err)
		}
	}
	env := []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "TERM=xterm"}
	if e := args["k7.env"]; e != "" {
		b, err := base64.RawURLEncoding.DecodeString(e)
		if err != nil {
			return fmt.Errorf("decoding k7.env: %w", err)
		}
		for _, kv := range strings.Split(string(b), "\x00") {
			if kv != "" {
				env = append(env, kv)
			}
		}
	}
	port := args["k7.port"]
	if port == "" {
		port = "agent"
	}
	portDev, err := waitPort(port)
	if err != nil {
		return err
	}
	agent, err := unix.Open("/k7-agent", unix.O_PATH, 0)
	if err != nil {
		return fmt.Errorf("opening agent: %w", err)
	}
	if root := args["k7.root"]; root != "" {
		if err := mountRoot(root); err != nil {
			return err
		}
	} else if err := mountSpecial(""); err != nil {
		return err
	}
	pfd, err := unix.Open(portDev, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opening %s: %w", portDev, err)
	}
	for _, fd := range []int{0, 1} {
		if err := unix.Dup2(pfd, fd); err != nil {
			return fmt.Errorf("connecting the agent to %s: %w", portDev, err)
		}
	}
	_ = unix.Close(pfd)
	fmt.Fprintf(os.Stderr, "k7-vminit: starting agent after %v\n", time.Since(t0).Round(time.Millisecond))
	return execveat(agent, []string{"k7-agent"}, env)
}

func cmdline() map[string]string {
	m := map[string]string{}
	b, _ := os.ReadFile("/proc/cmdline")
	for _, f := range strings.Fields(string(b)) {
		if k, v, ok := strings.Cut(f, "="); ok && strings.HasPrefix(k, "k7.") {
			m[k] = v
		}
	}
	return m
}

func loadModules(list string) error {
	b, err := os.ReadFile(list)
	if err != nil {
		if os.IsNotExist(err) {
			return nil
		}
		return err
	}
	for _, p := range strings.Fields(string(b)) {
		fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("opening module: %w", err)
		}
		err = unix.FinitModule(fd, "", 0)
		_ = unix.Close(fd)
		if err != nil && err != unix.EEXIST {
			// Some modules do not fit the virtual CPU (crc32c_intel
			// without SSE4.2); a missing driver shows up as a missing
			// device later.
			fmt.Fprintf(os.Stderr, "k7-vminit: loading module %s: %v\n", p, err)
		}
	}
	return nil
}

// waitPort finds the virtio-serial port called name and returns its device.
func waitPort(name string) (string, error) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		ports, _ := filepath.Glob("/sys/class/virtio-ports/*/name")
		for _, p := range ports {
			b, _ := os.ReadFile(p)
			if strings.TrimSpace(string(b)) == name {
				dev := "/dev/" + filepath.Base(filepath.Dir(p))
				if _, err := os.Stat(dev); err == nil {
					return dev, nil
				}
			}
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("no virtio-serial port %q", name)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func mountRoot(dev string) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(dev); err == nil {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no root disk %s", dev)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := unix.Mount(dev, "/lower", "ext4", unix.MS_RDONLY, "noload"); err != nil {
		return fmt.Errorf("mounting %s: %w", dev, err)
	}
	if err := unix.Mount("tmpfs", "/rw", "tmpfs", 0, "mode=0755"); err != nil {
		return fmt.Errorf("mounting writable layer: %w", err)
	}
	_ = os.MkdirAll("/rw/upper", 0o755)
	_ = os.MkdirAll("/rw/work", 0o755)
	if err := unix.Mount("overlay", "/newroot", "overlay", 0,
		"lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work"); err != nil {
		return fmt.Errorf("mounting overlay: %w", err)
	}
	if err := mountSpecial("/newroot"); err != nil {
		return err
	}
	if err := unix.Chdir("/newroot"); err != nil {
		return err
	}
	if err := unix.Mount(".", "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("moving root: %w", err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("chroot: %w", err)
	}
	return unix.Chdir("/")
}

// mountSpecial mounts the kernel file systems under root.
func mountSpecial(root string) error {
	for _, m := range []struct {
		src, dst, typ, opts string
		flags               uintptr
	}{
		{"devtmpfs", "/dev", "devtmpfs", "mode=0755", unix.MS_NOSUID},
		{"proc", "/proc", "proc", "", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC},
		{"sysfs", "/sys", "sysfs", "", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC},
		{"devpts", "/dev/pts", "devpts", "newinstance,ptmxmode=0666,mode=0620", unix.MS_NOSUID | unix.MS_NOEXEC},
		{"tmpfs", "/dev/shm", "tmpfs", "mode=1777", unix.MS_NOSUID | unix.MS_NODEV},
		{"tmpfs", "/run", "tmpfs", "mode=0755", unix.MS_NOSUID | unix.MS_NODEV},
	} {
		dst := root + m.dst
		_ = os.MkdirAll(dst, 0o755)
		if root == "" && (m.dst == "/dev" || m.dst == "/proc" || m.dst == "/sys") {
			continue // already mounted
		}
		if err := unix.Mount(m.src, dst, m.typ, m.flags, m.opts); err != nil {
			return fmt.Errorf("mounting %s: %w", dst, err)
		}
	}
	if root != "" {
		_ = os.Remove(root + "/dev/ptmx")
		_ = os.Symlink("pts/ptmx", root+"/dev/ptmx")
	}
	return nil
}

func execveat(fd int, argv, env []string) error {
	empty, _ := unix.BytePtrFromString("")
	av, err := syscall.SlicePtrFromStrings(argv)
	if err != nil {
		return err
	}
	ev, err := syscall.SlicePtrFromStrings(env)
	if err != nil {
		return err
	}
	_, _, errno := unix.Syscall6(unix.SYS_EXECVEAT, uintptr(fd), uintptr(unsafe.Pointer(empty)),
		uintptr(unsafe.Pointer(&av[0])), uintptr(unsafe.Pointer(&ev[0])), unix.AT_EMPTY_PATH, 0)
	return fmt.Errorf("exec agent: %w", errno)
}
