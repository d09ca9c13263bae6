package gvisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Destroy removes what the engine keeps on the host besides its sandboxes:
// the fork pool, runsc's persistent null network namespace mount
// (<runsc root>/null-netns, made for --network=none) and the engine's root
// directory. Delete every sandbox first; Destroy refuses while any is left.
// The engine must not be used afterwards.
func (e *Engine) Destroy(ctx context.Context) error {
	ids, err := e.List(ctx)
	if err != nil {
		return err
	}
	if len(ids) > 0 {
		return fmt.Errorf("destroying the gvisor engine: %d sandboxes left", len(ids))
	}
	var errs []error
	if err := e.Close(); err != nil {
		errs = append(errs, err)
	}
	nullNS := filepath.Join(e.runscRoot, "null-netns")
	for {
		if err := unix.Unmount(nullNS, unix.MNT_DETACH); err != nil {
			if !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
				errs = append(errs, fmt.Errorf("unmounting %s: %w", nullNS, err))
			}
			break
		}
	}
	if err := os.RemoveAll(e.cfg.Root); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
