package qemu

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"github.com/k7-dev/k7/internal/errdefs"
	"github.com/k7-dev/k7/internal/vmimage"
)

// rootDisk returns the read-only ext4 image of rootfs, building it on first
// use. Images are cached under Root/disks, keyed by the rootfs's path,
// inode and modification time (image rootfs dirs are immutable), and
// shared by every sandbox of the image; they are never removed by Delete.
func (e *Engine) rootDisk(ctx context.Context, rootfs string) (string, error) {
	abs, err := filepath.Abs(rootfs)
	if err != nil {
		return "", err
	}
	fi, err := os.Stat(abs)
	if err != nil || !fi.IsDir() {
		return "", fmt.Errorf("rootfs %s is not a directory: %w", rootfs, errdefs.ErrInvalidArgument)
	}
	var ino uint64
	if s, ok := fi.Sys().(*syscall.Stat_t); ok {
		ino = s.Ino
	}
	sum := sha256.Sum256([]byte(fmt.Sprintf("%s\x00%d\x00%d", abs, ino, fi.ModTime().UnixNano())))
	key := hex.EncodeToString(sum[:12])
	img := filepath.Join(e.cfg.Root, "disks", key+".ext4")
	defer e.lock("disk:" + key)()
	if _, err := os.Stat(img); err == nil {
		return img, nil
	}
	if err := vmimage.BuildExt4(ctx, "", abs, img); err != nil {
		return "", fmt.Errorf("building root disk: %w", err)
	}
	e.log.Info("built root disk", "rootfs", abs, "image", img)
	return img, nil
}
