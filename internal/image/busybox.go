package image

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"sort"
	"strings"
	"time"

	ggcrv1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	v1 "github.com/k7-dev/k7/api/v1"
	"github.com/k7-dev/k7/internal/errdefs"
)

// HostBusybox is the static busybox the built-in image is made from
// (Debian's busybox-static).
var HostBusybox = "/bin/busybox"

// DefaultPath is PATH for images that do not set one.
const DefaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

func isBusybox(ref string) bool {
	switch ref {
	case "busybox", "busybox:latest", BusyboxRef:
		return true
	}
	return false
}

// ensureBusybox returns the built-in busybox image, assembling it from the
// host's static busybox on first use. Its ID is the sha256 of the layer it
// builds, so it is stable for one host busybox.
func (s *Store) ensureBusybox(ctx context.Context) (*v1.Image, error) {
	s.mu.Lock()
	r, err := s.findLocked(BusyboxRef)
	s.mu.Unlock()
	if err == nil {
		return r.wire(), nil
	}
	layer, err := busyboxLayer(HostBusybox)
	if err != nil {
		return nil, fmt.Errorf("assembling built-in busybox: %w", err)
	}
	sum := sha256.Sum256(layer)
	id := "sha256:" + hex.EncodeToString(sum[:])
	m := meta{Env: []string{DefaultPath}, Cmd: []string{"/bin/sh"}, WorkDir: "/"}
	img, err := s.ensure(ctx, id, []string{BusyboxRef}, m, func(ctx context.Context, dst string) (int64, error) {
		l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(layer)), nil })
		if err != nil {
			return 0, err
		}
		return unpackLayers(ctx, []ggcrv1.Layer{l}, dst, s.log)
	})
	if err != nil {
		return nil, fmt.Errorf("assembling built-in busybox: %w", err)
	}
	return img, nil
}

// busyboxLayer builds the built-in image's only layer: a deterministic tar
// with the host's busybox, its applet links, and a minimal /etc.
func busyboxLayer(bin string) ([]byte, error) {
	if err := checkStatic(bin); err != nil {
		return nil, err
	}
	exe, err := os.ReadFile(bin)
	if err != nil {
		return nil, fmt.Errorf("reading %s (install busybox-static): %w: %w", bin, errdefs.ErrFailedPrecondition, err)
	}
	out, err := exec.Command(bin, "--list-full").Output()
	if err != nil {
		return nil, fmt.Errorf("listing busybox applets: %w: %w", errdefs.ErrFailedPrecondition, err)
	}

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	epoch := time.Unix(0, 0).UTC()
	add := func(h *tar.Header, data []byte) error {
		h.ModTime, h.Format = epoch, tar.FormatPAX
		h.Uname, h.Gname = "root", "root"
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	dir := func(name string, mode int64) error {
		return add(&tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: mode}, nil)
	}
	file := func(name string, mode int64, data string) error {
		return add(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode}, []byte(data))
	}
	for _, d := range []struct {
		name string
		mode int64
	}{
		{"bin", 0o755}, {"dev", 0o755}, {"etc", 0o755}, {"home", 0o755}, {"proc", 0o555},
		{"root", 0o700}, {"sbin", 0o755}, {"sys", 0o555}, {"tmp", 0o1777},
		{"usr", 0o755}, {"usr/bin", 0o755}, {"usr/sbin", 0o755},
		{"var", 0o755}, {"var/tmp", 0o1777},
	} {
		if err := dir(d.name, d.mode); err != nil {
			return nil, err
		}
	}
	if err := add(&tar.Header{Typeflag: tar.TypeReg, Name: "bin/busybox", Mode: 0o755}, exe); err != nil {
		return nil, err
	}
	for _, f := range []struct{ name, data string }{
		{"etc/passwd", "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"},
		{"etc/group", "root:x:0:\nnogroup:x:65534:\n"},
		{"etc/hostname", "localhost\n"},
		{"etc/hosts", "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"},
	} {
		if err := file(f.name, 0o644, f.data); err != nil {
			return nil, err
		}
	}
	var applets []string
	for _, line := range strings.Split(string(out), "\n") {
		a := path.Clean(strings.TrimSpace(line))
		if a == "." || a == "bin/busybox" || strings.Contains(a, "..") || strings.HasPrefix(a, "/") {
			continue
		}
		switch path.Dir(a) {
		case "bin", "sbin", "usr/bin", "usr/sbin":
			applets = append(applets, a)
		}
	}
	sort.Strings(applets)
	for _, a := range applets {
		// Relative, so the links also resolve when the rootfs is looked at from the host.
		target := strings.Repeat("../", strings.Count(a, "/")) + "bin/busybox"
		if path.Dir(a) == "bin" {
			target = "busybox"
		}
		if err := add(&tar.Header{Typeflag: tar.TypeSymlink, Name: a, Linkname: target, Mode: 0o777}, nil); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// checkStatic fails unless bin is a statically linked ELF executable (no
// program interpreter): a dynamic busybox would not run in the sandbox.
func checkStatic(bin string) error {
	f, err := elf.Open(bin)
	if err != nil {
		return fmt.Errorf("opening %s (install busybox-static): %w: %w", bin, errdefs.ErrFailedPrecondition, err)
	}
	defer func() { _ = f.Close() }()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked; the built-in busybox image needs a static one (Debian: apt-get install busybox-static): %w", bin, errdefs.ErrFailedPrecondition)
		}
	}
	return nil
}
