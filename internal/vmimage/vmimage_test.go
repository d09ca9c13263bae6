package vmimage

import (
	"crypto/sha256"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestExtractVmlinux(t *testing.T) {
	kernel, _, err := NewestKernel("/boot")
	if err != nil {
		t.Skip(err)
	}
	dst := filepath.Join(t.TempDir(), "vmlinux")
	if err := ExtractVmlinux(kernel, dst); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(dst)
	if _, err := exec.LookPath("xz"); err != nil {
		return
	}
	// xz(1) decodes the same stream (it complains about the trailer).
	b, _ := os.ReadFile(kernel)
	i := strings.Index(string(b), string(xzMagic))
	cmd := exec.Command("xz", "-dc")
	cmd.Stdin = strings.NewReader(string(b[i:]))
	want, _ := cmd.Output()
	if sha256.Sum256(got) != sha256.Sum256(want) {
		t.Errorf("extracted %d bytes differ from xz -dc's %d", len(got), len(want))
	}
}

func TestResolveModules(t *testing.T) {
	_, rel, err := NewestKernel("/boot")
	if err != nil {
		t.Skip(err)
	}
	ms, err := LoadModules(filepath.Join("/lib/modules", rel))
	if err != nil {
		t.Skip(err)
	}
	got, err := ms.Resolve("virtio_console", "ext4")
	if err != nil {
		t.Fatal(err)
	}
	pos := map[string]int{}
	for i, p := range got {
		pos[ModName(p)] = i
	}
	t.Logf("load order: %v", got)
	for _, pair := range [][2]string{{"virtio_ring", "virtio"}, {"virtio", "virtio_console"}, {"jbd2", "ext4"}, {"mbcache", "ext4"}} {
		a, aok := pos[pair[0]]
		b, bok := pos[pair[1]]
		if aok && bok && a > b {
			t.Errorf("%s loads after %s", pair[0], pair[1])
		}
	}
	if _, err := ms.Resolve("no_such_module"); err == nil {
		t.Error("unknown module resolved")
	}
}

func TestVersionLess(t *testing.T) {
	if !versionLess("vmlinuz-5.10.0-9-amd64", "vmlinuz-6.1.0-10-amd64") || !versionLess("vmlinuz-6.1.0-9-amd64", "vmlinuz-6.1.0-10-amd64") {
		t.Error("versionLess order wrong")
	}
}
