package image

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"strings"
	"syscall"
	"time"

	ggcrv1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"

	"github.com/k7-dev/k7/internal/errdefs"
)

// layersImage is just enough of a v1.Image for mutate.Extract, which only
// calls Layers: it lets us hand it wrapped (progress-counting) layers.
type layersImage struct {
	ggcrv1.Image
	layers []ggcrv1.Layer
}

func (i layersImage) Layers() ([]ggcrv1.Layer, error) { return i.layers, nil }

// unpackLayers flattens layers (bottom first; whiteouts and opaque dirs
// applied by mutate.Extract) into dst and returns the size of the regular
// files written.
func unpackLayers(ctx context.Context, layers []ggcrv1.Layer, dst string, log *slog.Logger) (int64, error) {
	rc := mutate.Extract(layersImage{layers: layers})
	defer rc.Close()
	n, err := extractTar(ctx, rc, dst, log)
	if err == nil {
		// mutate.Extract ends the tar stream before it reports an error
		// (a layer that failed to download, an unsafe path): the error
		// comes after the end-of-archive marker.
		_, err = io.Copy(io.Discard, rc)
	}
	if err != nil && strings.Contains(err.Error(), "unsafe tar path") {
		return 0, fmt.Errorf("%w: %w", errdefs.ErrInvalidArgument, err)
	}
	return n, err
}

// extractTar writes the tar stream r under dst. Every write goes through an
// os.Root, so no entry (by "..", an absolute name, or a symlink written
// earlier) can create or change anything outside dst: such entries fail the
// whole extraction with ErrInvalidArgument. Owners and modes come from the
// tar (the store runs as root); device nodes, FIFOs and sockets are skipped
// with a log line. Entries are expected in mutate.Extract's order (upper
// layers first), so a directory's header may follow its contents and a
// hardlink may precede its target: directory metadata and hardlinks are
// applied at the end.
func extractTar(ctx context.Context, r io.Reader, dst string, log *slog.Logger) (int64, error) {
	root, err := os.OpenRoot(dst)
	if err != nil {
		return 0, err
	}
	defer func() { _ = root.Close() }()

	type dirMeta struct {
		name string
		hdr  *tar.Header
	}
	var dirs []dirMeta
	var links []*tar.Header
	var size int64
	skipped := 0

	tr := tar.NewReader(r)
	for {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return 0, fmt.Errorf("reading layer: %w", err)
		}
		name, ok := cleanName(hdr.Name)
		if !ok {
			return 0, fmt.Errorf("tar entry %q escapes the rootfs: %w", hdr.Name, errdefs.ErrInvalidArgument)
		}
		if name == "." {
			if hdr.Typeflag == tar.TypeDir {
				dirs = append(dirs, dirMeta{".", hdr})
			}
			continue
		}
		if dir := path.Dir(name); dir != "." {
			if err := root.MkdirAll(dir, 0o755); err != nil {
				return 0, entryErr(hdr.Name, err)
			}
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			if fi, err := root.Lstat(name); err == nil && !fi.IsDir() {
				if err := root.Remove(name); err != nil {
					return 0, entryErr(hdr.Name, err)
				}
			}
			if err := root.Mkdir(name, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
				return 0, entryErr(hdr.Name, err)
			}
			dirs = append(dirs, dirMeta{name, hdr})
		case tar.TypeReg, tar.TypeRegA: //nolint:staticcheck // TypeRegA appears in old layers
			if !replaceable(root, name, log) {
				continue
			}
			f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
			if err != nil {
				return 0, entryErr(hdr.Name, err)
			}
			n, err := io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return 0, entryErr(hdr.Name, err)
			}
			size += n
			if err := setMeta(root, name, hdr); err != nil {
				return 0, entryErr(hdr.Name, err)
			}
		case tar.TypeSymlink:
			if !replaceable(root, name, log) {
				continue
			}
			if err := root.Symlink(hdr.Linkname, name); err != nil {
				return 0, entryErr(hdr.Name, err)
			}
			if err := root.Lchown(name, hdr.Uid, hdr.Gid); err != nil {
				return 0, entryErr(hdr.Name, err)
			}
		case tar.TypeLink:
			h := *hdr
			h.Name = name
			links = append(links, &h)
		case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
			skipped++
			log.Debug("skipping special file in image", "name", hdr.Name, "type", string(hdr.Typeflag))
		case tar.TypeXGlobalHeader:
		default:
			skipped++
			log.Debug("skipping tar entry of unknown type", "name", hdr.Name, "type", string(hdr.Typeflag))
		}
	}
	for _, h := range links {
		target, ok := cleanName(h.Linkname)
		if !ok || target == "." {
			return 0, fmt.Errorf("hardlink %q to %q escapes the rootfs: %w", h.Name, h.Linkname, errdefs.ErrInvalidArgument)
		}
		if !replaceable(root, h.Name, log) {
			continue
		}
		if err := root.Link(target, h.Name); err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				log.Warn("skipping hardlink to missing file", "name", h.Name, "target", h.Linkname)
				continue
			}
			return 0, entryErr(h.Name, err)
		}
	}
	// Deepest first, so setting a parent's mtime is not undone by its children.
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := setMeta(root, dirs[i].name, dirs[i].hdr); err != nil {
			return 0, entryErr(dirs[i].hdr.Name, err)
		}
	}
	if skipped > 0 {
		log.Info("skipped special files while unpacking", "count", skipped)
	}
	return size, nil
}

// cleanName makes a tar name relative to the root; ok is false when it
// would leave the root.
func cleanName(n string) (string, bool) {
	for _, part := range strings.Split(n, "/") {
		if part == ".." {
			return "", false
		}
	}
	c := path.Clean("/" + n)
	if c == "/" {
		return ".", true
	}
	return c[1:], true
}

// replaceable removes whatever non-directory sits at name so a new entry can
// take its place; it returns false (and logs) when a directory is there.
func replaceable(root *os.Root, name string, log *slog.Logger) bool {
	fi, err := root.Lstat(name)
	if err != nil {
		return true
	}
	if fi.IsDir() {
		log.Warn("skipping tar entry that would replace a directory", "name", name)
		return false
	}
	_ = root.Remove(name)
	return true
}

// setMeta sets owner, mode (with setuid/setgid/sticky) and mtime; chown
// first, as it clears setuid bits.
func setMeta(root *os.Root, name string, hdr *tar.Header) error {
	if err := root.Lchown(name, hdr.Uid, hdr.Gid); err != nil {
		return err
	}
	if err := root.Chmod(name, hdr.FileInfo().Mode()&(fs.ModePerm|fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky)); err != nil {
		return err
	}
	mt := hdr.ModTime
	if mt.IsZero() {
		mt = time.Unix(0, 0)
	}
	return root.Chtimes(name, mt, mt)
}

// entryErr classifies an error writing one entry: leaving the root (through
// a symlink) is the archive's fault.
func entryErr(name string, err error) error {
	if strings.Contains(err.Error(), "escapes from parent") || errors.Is(err, syscall.ELOOP) {
		return fmt.Errorf("tar entry %q escapes the rootfs: %w: %w", name, errdefs.ErrInvalidArgument, err)
	}
	return fmt.Errorf("writing %q: %w", name, err)
}
