package qemu

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/k7-dev/k7/internal/engine"
	"github.com/k7-dev/k7/internal/engine/enginetest"
	"github.com/k7-dev/k7/internal/testutil"
)

func TestConformance(t *testing.T) {
	requireQEMU(t)
	enginetest.Run(t, func(t *testing.T) engine.Engine {
		// The package's shared root: the kernel is extracted once.
		e, err := New(Config{Root: filepath.Join(testRoot, "engine"), AgentPath: testutil.Binary(t, "k7-agent"), Accel: os.Getenv("K7_QEMU_ACCEL")})
		if err != nil {
			t.Fatal(err)
		}
		return e
	}, enginetest.Config{
		CarriesProcesses: true,
		IsolatedHostname: true,
		Concurrent:       3, // TCG boots are CPU-bound: 2 cores
	})
}
