// Package testutil holds helpers shared by k7's tests: skipping tests whose
// requirements are missing, and finding or building the binaries they run.
//
// A test that needs root, runsc or QEMU skips with a reason when the thing is
// missing. CI sets K7_REQUIRE_ALL=1, which turns every such skip into a
// failure, so that a broken setup cannot pass as skipped tests.
package testutil

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
)

// skip skips t, or fails it when K7_REQUIRE_ALL=1.
func skip(t testing.TB, why string) {
	t.Helper()
	if os.Getenv("K7_REQUIRE_ALL") == "1" {
		t.Fatal("K7_REQUIRE_ALL=1 but: " + why)
	}
	t.Skip(why)
}

// RequiresRoot skips t unless it runs as root.
func RequiresRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		skip(t, "needs root")
	}
}

// RequiresQEMU skips t unless it runs as root with qemu-system-x86_64 in
// PATH and a guest kernel in /boot: what the qemu engine needs.
func RequiresQEMU(t testing.TB) {
	t.Helper()
	RequiresRoot(t)
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		skip(t, "no qemu-system-x86_64 (apt install qemu-system-x86)")
	}
	if m, _ := filepath.Glob("/boot/vmlinuz-*"); len(m) == 0 {
		skip(t, "no /boot/vmlinuz-* (apt install linux-image-amd64)")
	}
}

// RepoRoot returns the root of the k7 source tree.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// Runsc returns the path of the runsc binary ($K7_RUNSC, the tree's
// bin/runsc, or PATH), skipping t when there is none.
func Runsc(t testing.TB) string {
	t.Helper()
	if p := FindRunsc(); p != "" {
		return p
	}
	skip(t, "runsc not found: run scripts/setup.sh or set K7_RUNSC")
	return ""
}

// FindRunsc is Runsc without a test: "" when there is none.
func FindRunsc() string {
	if p := os.Getenv("K7_RUNSC"); p != "" {
		return p
	}
	if p := filepath.Join(RepoRoot(), "bin", "runsc"); isExec(p) {
		return p
	}
	if p, err := exec.LookPath("runsc"); err == nil {
		return p
	}
	return ""
}

func isExec(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

var (
	buildMu  sync.Mutex
	buildDir string
	built    = map[string]string{}
)

// Binary builds ./cmd/NAME (static, CGO_ENABLED=0) once per test process and
// returns its path. The files live in a temporary directory removed by
// Cleanup in TestMain, or left to the OS's tmp cleaning otherwise.
func Binary(t testing.TB, name string) string {
	t.Helper()
	buildMu.Lock()
	defer buildMu.Unlock()
	if p, ok := built[name]; ok {
		return p
	}
	if buildDir == "" {
		d, err := os.MkdirTemp("", "k7-test-bin-")
		if err != nil {
			t.Fatal(err)
		}
		buildDir = d
	}
	out := filepath.Join(buildDir, name)
	cmd := exec.Command("go", "build", "-o", out, "./cmd/"+name)
	cmd.Dir = RepoRoot()
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building %s: %v\n%s", name, err, b)
	}
	built[name] = out
	return out
}

// Cleanup removes the binaries built by Binary. Call it from TestMain after
// m.Run.
func Cleanup() {
	buildMu.Lock()
	defer buildMu.Unlock()
	if buildDir != "" {
		os.RemoveAll(buildDir)
		buildDir = ""
		built = map[string]string{}
	}
}
