package enginetest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// HostBusybox is the static busybox BusyboxRootfs copies (Debian's
// busybox-static).
const HostBusybox = "/usr/bin/busybox"

// BusyboxRootfs builds a minimal busybox root filesystem (static busybox,
// its applet links, /etc/passwd, /etc/group, /etc/hosts) in a temporary
// directory removed when t ends, and returns its path. It skips t when the
// host has no static busybox.
func BusyboxRootfs(t testing.TB) string {
	t.Helper()
	if _, err := os.Stat(HostBusybox); err != nil {
		t.Skipf("no %s (install busybox-static): %v", HostBusybox, err)
	}
	root := filepath.Join(t.TempDir(), "rootfs")
	for _, d := range []string{"bin", "dev", "etc", "proc", "root", "sbin", "sys", "tmp", "usr/bin", "usr/sbin", "var/tmp"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	_ = os.Chmod(filepath.Join(root, "tmp"), 0o1777)
	b, err := os.ReadFile(HostBusybox)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "bin/busybox"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(HostBusybox, "--list-full").Output()
	if err != nil {
		t.Fatalf("listing busybox applets: %v", err)
	}
	for _, a := range strings.Fields(string(out)) {
		if a == "bin/busybox" || strings.Contains(a, "..") || strings.HasPrefix(a, "/") {
			continue
		}
		switch filepath.Dir(a) {
		case "bin", "sbin", "usr/bin", "usr/sbin":
		default:
			continue
		}
		target := strings.Repeat("../", strings.Count(a, "/")) + "bin/busybox"
		if filepath.Dir(a) == "bin" {
			target = "busybox"
		}
		_ = os.Symlink(target, filepath.Join(root, a))
	}
	for name, data := range map[string]string{
		"etc/passwd": "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
		"etc/group":  "root:x:0:\nnogroup:x:65534:\n",
		"etc/hosts":  "127.0.0.1\tlocalhost\n",
	} {
		if err := os.WriteFile(filepath.Join(root, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}
