// Package integration runs k7 end to end: real k7d processes (gvisor engine,
// runsc) on temporary state dirs and sockets, driven through the k7 CLI and
// the Go SDK. Tests skip without root or runsc, and fail instead under
// K7_REQUIRE_ALL=1 (CI).
package integration

import (
	"os"
	"testing"

	"github.com/k7-dev/k7/internal/testutil"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testutil.Cleanup()
	os.Exit(code)
}
