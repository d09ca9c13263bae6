package agent

import (
	"bufio"
	"log/slog"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// mount is a file system init provides when the runtime did not.
type mount struct {
	target, fstype, data string
	flags                uintptr
}

var initMounts = []mount{
	{"/proc", "proc", "", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC},
	{"/dev", "devtmpfs", "mode=0755", unix.MS_NOSUID},
	{"/dev/pts", "devpts", "newinstance,ptmxmode=0666,mode=0620", unix.MS_NOSUID | unix.MS_NOEXEC},
	{"/dev/shm", "tmpfs", "mode=1777", unix.MS_NOSUID | unix.MS_NODEV},
	{"/tmp", "tmpfs", "mode=1777", unix.MS_NOSUID | unix.MS_NODEV},
}

// setupMounts mounts what initMounts lists and is not mounted yet. gVisor
// mounts what the OCI spec lists; a QEMU initramfs has nothing. Failures
// are logged, not fatal. /dev is mounted only when /dev/null is missing.
func setupMounts(log *slog.Logger) {
	for _, m := range initMounts {
		if m.target == "/dev" {
			if _, err := os.Stat("/dev/null"); err == nil {
				continue
			}
		} else if mounted(m.target) {
			continue
		}
		if err := os.MkdirAll(m.target, 0o755); err != nil {
			log.Warn("creating mount point", "target", m.target, "err", err)
			continue
		}
		if err := unix.Mount(m.fstype, m.target, m.fstype, m.flags, m.data); err != nil {
			log.Warn("mounting", "target", m.target, "fstype", m.fstype, "err", err)
			continue
		}
		log.Info("mounted", "target", m.target, "fstype", m.fstype)
	}
	if _, err := os.Lstat("/dev/ptmx"); err != nil {
		if err := os.Symlink("pts/ptmx", "/dev/ptmx"); err != nil {
			log.Warn("linking /dev/ptmx", "err", err)
		}
	}
}

// mounted reports whether target is a mount point, from
// /proc/self/mountinfo (for /proc itself: whether /proc/self exists).
func mounted(target string) bool {
	if target == "/proc" {
		_, err := os.Stat("/proc/self/mountinfo")
		return err == nil
	}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && unescapeMount(fields[4]) == target {
			return true
		}
	}
	return false
}

func unescapeMount(s string) string {
	return strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`).Replace(s)
}

func sleep() { _ = unix.Nanosleep(&unix.Timespec{Nsec: 100e6}, nil) }
