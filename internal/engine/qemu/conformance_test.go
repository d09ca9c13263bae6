package qemu

import (
	"os"
	"testing"

	"github.com/k7-dev/k7/internal/engine"
	"github.com/k7-dev/k7/internal/engine/enginetest"
	"github.com/k7-dev/k7/internal/testutil"
)

func TestConformance(t *testing.T) {
	requireQEMU(t)
	enginetest.Run(t, func(t *testing.T) engine.Engine {
		e, err := New(Config{Root: t.TempDir(), AgentPath: testutil.Binary(t, "k7-agent"), Accel: os.Getenv("K7_QEMU_ACCEL")})
		if err != nil {
			t.Fatal(err)
		}
		return e
	}, enginetest.Config{
		CarriesProcesses: true,
		IsolatedHostname: true,
	})
}
