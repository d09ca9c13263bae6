package vmimage

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
)

// BuildExt4 writes a sparse ext4 image of dir's tree to dst with mkfs.ext4
// -d (e2fsprogs ≥ 1.43), sized to the tree plus headroom. Ownership, modes
// and extended attributes are copied. The image is meant to be attached
// read-only.
func BuildExt4(ctx context.Context, mkfs, dir, dst string) error {
	if mkfs == "" {
		mkfs = "mkfs.ext4"
	}
	var size, inodes int64
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		inodes++
		if d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				size += (fi.Size() + 4095) &^ 4095
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("sizing %s: %w", dir, err)
	}
	size += size/5 + inodes*512 + 32<<20
	return writeAtomic(dst, 0o644, func(f *os.File) error {
		if err := f.Truncate(size); err != nil {
			return err
		}
		cmd := exec.CommandContext(ctx, mkfs, "-q", "-F", "-d", dir,
			"-N", fmt.Sprint(inodes+1024), "-m", "0", "-O", "^has_journal",
			"-E", "lazy_itable_init=0,lazy_journal_init=0,root_owner=0:0", f.Name())
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("%s: %w: %s", mkfs, err, out)
		}
		return nil
	})
}
