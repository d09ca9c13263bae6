// Package vmimage builds the boot artifacts of k7's QEMU engine from what a
// Debian host already has: the uncompressed kernel (extracted from
// /boot/vmlinuz-*), an initramfs in newc cpio format holding the guest's
// init, agent and kernel modules (resolved with their dependencies from
// /lib/modules/<version>/modules.dep), and read-only ext4 images of root
// filesystem directories (mkfs.ext4 -d).
//
// Every builder writes to a temporary file next to its destination and
// renames it into place, so a cache entry is either complete or absent.
package vmimage
