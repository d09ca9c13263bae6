package vmimage

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strings"

	"github.com/ulikunitz/xz"
)

// File is one entry of an initramfs.
type File struct {
	Path   string      // absolute path inside the guest
	Mode   os.FileMode // permission bits, plus os.ModeDir, os.ModeSymlink or os.ModeCharDevice
	Source string      // regular files: host file to copy (ignored if Data is set)
	Data   []byte      // regular files: contents; symlinks: target
	Major  uint32      // character devices
	Minor  uint32
}

// Initramfs is an uncompressed newc cpio archive under construction. Parent
// directories are added automatically. Uncompressed, because decompressing
// in the guest is slow under TCG.
type Initramfs struct {
	files map[string]File
}

// NewInitramfs returns an archive holding /dev/console and the usual mount
// points.
func NewInitramfs() *Initramfs {
	r := &Initramfs{files: map[string]File{}}
	r.Add(File{Path: "/dev/console", Mode: os.ModeCharDevice | os.ModeDevice | 0o600, Major: 5, Minor: 1})
	for _, d := range []string{"/proc", "/sys", "/dev", "/newroot", "/lower", "/rw", "/etc", "/tmp"} {
		r.Add(File{Path: d, Mode: os.ModeDir | 0o755})
	}
	return r
}

// Add adds f (replacing an entry with the same path) and its parents.
func (r *Initramfs) Add(f File) {
	f.Path = path.Clean("/" + f.Path)
	r.files[f.Path] = f
	for d := path.Dir(f.Path); d != "/"; d = path.Dir(d) {
		if _, ok := r.files[d]; !ok {
			r.files[d] = File{Path: d, Mode: os.ModeDir | 0o755}
		}
	}
}

// AddModules adds the resolved module files of ms under /lib/modules/ (xz
// compressed ones decompressed) and returns their guest paths in load order.
func (r *Initramfs) AddModules(ms *ModuleSet, rel []string) ([]string, error) {
	var out []string
	for _, p := range rel {
		src := path.Join(ms.Dir, p)
		guest := "/lib/modules/" + ModName(p) + ".ko"
		data, err := os.ReadFile(src)
		if err != nil {
			return nil, err
		}
		switch {
		case strings.HasSuffix(p, ".ko"):
		case strings.HasSuffix(p, ".ko.xz"):
			xr, err := xz.NewReader(bytes.NewReader(data))
			if err != nil {
				return nil, fmt.Errorf("decompressing %s: %w", p, err)
			}
			if data, err = io.ReadAll(xr); err != nil {
				return nil, fmt.Errorf("decompressing %s: %w", p, err)
			}
		default:
			return nil, fmt.Errorf("kernel module %s: unsupported compression", p)
		}
		r.Add(File{Path: guest, Mode: 0o644, Data: StripModuleSignature(data)})
		out = append(out, guest)
	}
	return out, nil
}

const moduleSigMagic = "~Module signature appended~\n"

// StripModuleSignature removes the signature appended to a kernel module.
// The kernel then skips verifying it (an RSA check per module that costs
// tens of milliseconds under TCG) and only notes a taint, unless it
// enforces signatures (module.sig_enforce, lockdown), where loading fails.
func StripModuleSignature(ko []byte) []byte {
	if !bytes.HasSuffix(ko, []byte(moduleSigMagic)) {
		return ko
	}
	end := len(ko) - len(moduleSigMagic)
	if end < 12 {
		return ko
	}
	info := ko[end-12 : end] // struct module_signature
	signer, keyID := int(info[3]), int(info[4])
	sigLen := int(info[8])<<24 | int(info[9])<<16 | int(info[10])<<8 | int(info[11])
	n := end - 12 - sigLen - signer - keyID
	if n <= 0 {
		return ko
	}
	return ko[:n]
}

// WriteTo writes the archive to w in newc format, parents before children.
func (r *Initramfs) WriteTo(w io.Writer) (int64, error) {
	names := make([]string, 0, len(r.files))
	for n := range r.files {
		names = append(names, n)
	}
	sort.Strings(names) // a parent sorts before its children
	cw := &countWriter{w: w}
	for i, n := range names {
		f := r.files[n]
		var data []byte
		mode := uint32(f.Mode.Perm())
		switch {
		case f.Mode&os.ModeDir != 0:
			mode |= 0o040000
		case f.Mode&os.ModeSymlink != 0:
			mode |= 0o120000
			data = f.Data
		case f.Mode&os.ModeCharDevice != 0:
			mode |= 0o020000
		default:
			mode |= 0o100000
			data = f.Data
			if data == nil && f.Source != "" {
				b, err := os.ReadFile(f.Source)
				if err != nil {
					return cw.n, err
				}
				data = b
			}
		}
		if err := writeNewc(cw, strings.TrimPrefix(n, "/"), uint32(i+1), mode, f.Major, f.Minor, data); err != nil {
			return cw.n, err
		}
	}
	err := writeNewc(cw, "TRAILER!!!", 0, 0, 0, 0, nil)
	return cw.n, err
}

// WriteFile writes the archive to dst atomically.
func (r *Initramfs) WriteFile(dst string) error {
	return writeAtomic(dst, 0o644, func(f *os.File) error {
		_, err := r.WriteTo(f)
		return err
	})
}

func writeNewc(w io.Writer, name string, ino, mode, rmaj, rmin uint32, data []byte) error {
	nlink := uint32(1)
	if mode&0o170000 == 0o040000 {
		nlink = 2
	}
	hdr := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		ino, mode, 0, 0, nlink, 0, len(data), 0, 0, rmaj, rmin, len(name)+1, 0)
	buf := make([]byte, 0, len(hdr)+len(name)+8)
	buf = append(buf, hdr...)
	buf = append(buf, name...)
	buf = append(buf, 0)
	buf = append(buf, make([]byte, pad4(len(buf)))...)
	if _, err := w.Write(buf); err != nil {
		return err
	}
	if len(data) > 0 {
		if _, err := w.Write(data); err != nil {
			return err
		}
		if _, err := w.Write(make([]byte, pad4(len(data)))); err != nil {
			return err
		}
	}
	return nil
}

func pad4(n int) int { return (4 - n%4) % 4 }

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}
