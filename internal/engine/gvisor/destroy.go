package gvisor

import (
	"context"
	"fmt"
	"os"
)

// Destroy removes what the engine keeps on the host besides its sandboxes
// (the fork pool, parent cgroups and runsc's null-netns mount: see Close)
// and the engine's root directory. Delete every sandbox first; Destroy
// refuses while any is left. The engine must not be used afterwards.
func (e *Engine) Destroy(ctx context.Context) error {
	ids, err := e.List(ctx)
	if err != nil {
		return err
	}
	if len(ids) > 0 {
		return fmt.Errorf("destroying the gvisor engine: %d sandboxes left", len(ids))
	}
	if err := e.Close(); err != nil {
		return err
	}
	return os.RemoveAll(e.cfg.Root)
}
