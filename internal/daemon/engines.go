package daemon

import (
	"log/slog"
	"path/filepath"

	"github.com/k7-dev/k7/internal/engine"
	"github.com/k7-dev/k7/internal/engine/fake"
	"github.com/k7-dev/k7/internal/engine/gvisor"
	"github.com/k7-dev/k7/internal/engine/qemu"
)

// engineReg is one row of the engine table.
type engineReg struct {
	name string
	// open builds the engine with its root under root. An engine the host
	// cannot run returns an error wrapping errdefs.ErrUnavailable with the
	// reason.
	open func(cfg *Config, root string, log *slog.Logger) (engine.Engine, error)
}

// engineTable lists every engine k7d knows, in the order /v1/info reports
// them. It is the only place engines are registered.
var engineTable = []engineReg{
	{name: "gvisor", open: openGvisor},
	{name: "qemu", open: openQEMU},
	{name: "fake", open: openFake},
}

func engineNames() []string {
	var n []string
	for _, r := range engineTable {
		n = append(n, r.name)
	}
	return n
}

// engineRoot is the directory an engine keeps its sandboxes in, under the
// daemon's state dir, so that daemons with different state dirs never see
// each other's sandboxes.
func engineRoot(stateDir, name string) string {
	return filepath.Join(stateDir, "engines", name)
}

func openGvisor(cfg *Config, root string, log *slog.Logger) (engine.Engine, error) {
	return gvisor.New(gvisor.Config{Runsc: cfg.Runsc, Root: root, AgentPath: cfg.Agent, Platform: cfg.Platform, Log: log})
}

func openQEMU(cfg *Config, root string, log *slog.Logger) (engine.Engine, error) {
	return qemu.New(qemu.Config{Root: root, AgentPath: cfg.Agent, Log: log})
}

func openFake(cfg *Config, root string, log *slog.Logger) (engine.Engine, error) {
	return fake.New(fake.Config{Root: root, Log: log})
}
