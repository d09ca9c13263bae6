package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/k7-dev/k7/api/v1"
	"github.com/k7-dev/k7/sdk/sdktest"
)

// k7 runs one command line against host and returns stdout, stderr and the
// exit code.
func k7(t *testing.T, host, stdin string, args ...string) (string, string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	code := run(ctx, Streams{In: strings.NewReader(stdin), Out: &out, Err: &errb}, append([]string{"--host", host}, args...))
	return out.String(), errb.String(), code
}

// mustK7 is k7 that fails the test unless the exit code is 0.
func mustK7(t *testing.T, host string, args ...string) string {
	t.Helper()
	out, errs, code := k7(t, host, "", args...)
	if code != 0 {
		t.Fatalf("k7 %v: exit %d, stderr %q", args, code, errs)
	}
	return out
}

// oneErrorLine checks that stderr is exactly one "k7: ..." line containing want.
func oneErrorLine(t *testing.T, stderr, want string) {
	t.Helper()
	if !strings.HasPrefix(stderr, "k7: ") || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, want) {
		t.Errorf("stderr = %q, want one line \"k7: ...%s...\"", stderr, want)
	}
}

func TestCreateAndList(t *testing.T) {
	host := sdktest.NewServer(t).Host
	out := mustK7(t, host, "create", "-q", "--name", "web", "--memory", "1.5GiB", "--cpus", "2", "-e", "A=1", "alpine:3")
	id := strings.TrimSpace(out)
	if out != id+"\n" || !strings.HasPrefix(id, "sb") {
		t.Fatalf("create -q printed %q, want only the ID", out)
	}
	out = mustK7(t, host, "create", "alpine:3")
	id2 := strings.TrimSpace(out)

	if got, want := mustK7(t, host, "ls", "-q"), id+"\n"+id2+"\n"; got != want {
		t.Errorf("ls -q = %q, want %q", got, want)
	}
	table := mustK7(t, host, "ls")
	if !strings.HasPrefix(table, "ID") || !strings.Contains(table, "web") || !strings.Contains(table, "running") {
		t.Errorf("ls table = %q", table)
	}

	var sbs []v1.Sandbox
	if err := json.Unmarshal([]byte(mustK7(t, host, "ls", "-o", "json")), &sbs); err != nil || len(sbs) != 2 {
		t.Fatalf("ls -o json: %v, %d sandboxes", err, len(sbs))
	}
	var sb v1.Sandbox
	if err := json.Unmarshal([]byte(mustK7(t, host, "-o", "json", "create", "alpine:3")), &sb); err != nil || sb.ID == "" {
		t.Errorf("create -o json: %v, %+v", err, sb)
	}
	var insp []v1.Sandbox
	if err := json.Unmarshal([]byte(mustK7(t, host, "inspect", "-o", "json", "web")), &insp); err != nil || len(insp) != 1 {
		t.Fatalf("inspect -o json: %v, %+v", err, insp)
	}
	if r := insp[0].Resources; r.MemoryBytes != 3<<29 || r.CPUs != 2 || insp[0].Env[0] != "A=1" {
		t.Errorf("inspect resources = %+v env %v, want 1.5GiB, 2 cpus, A=1", r, insp[0].Env)
	}
	if out := mustK7(t, host, "inspect", "web"); !strings.Contains(out, "memory=1.5GiB") {
		t.Errorf("inspect = %q", out)
	}

	if got := mustK7(t, host, "pause", "web"); got != id+"\n" {
		t.Errorf("pause printed %q", got)
	}
	mustK7(t, host, "resume", id)
	if got := mustK7(t, host, "rm", "-f", id, id2); got != id+"\n"+id2+"\n" {
		t.Errorf("rm printed %q", got)
	}
}

func TestErrors(t *testing.T) {
	host := sdktest.NewServer(t).Host
	for _, tc := range []struct {
		name     string
		args     []string
		wantCode int
		wantErr  string
	}{
		{"bad memory", []string{"create", "--memory", "12X", "alpine:3"}, 1, `invalid memory size "12X"`},
		{"unknown sandbox", []string{"inspect", "nope"}, 1, `sandbox "nope" not found`},
		{"rm unknown", []string{"rm", "nope"}, 1, "not found"},
		{"exec unknown", []string{"exec", "nope", "--", "echo"}, 1, "not found"},
		{"missing image", []string{"create", "nope:1"}, 1, `image "nope:1" not found`},
		{"relative cp path", []string{"cp", "web:tmp/x", "-"}, 1, "must be absolute"},
		{"dotdot cp path", []string{"cp", "-", "web:/tmp/../etc/passwd"}, 1, `must not contain ".."`},
		{"prune not confirmed", []string{"system", "prune"}, 1, "prune cancelled"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, errs, code := k7(t, host, "", tc.args...)
			if code != tc.wantCode {
				t.Errorf("exit code = %d, want %d", code, tc.wantCode)
			}
			if tc.name == "prune not confirmed" { // the prompt comes first
				if i := strings.Index(errs, "k7: "); i >= 0 {
					errs = errs[i:]
				}
			}
			oneErrorLine(t, errs, tc.wantErr)
			if out != "" {
				t.Errorf("stdout = %q, want nothing", out)
			}
		})
	}
}

func TestUsageErrors(t *testing.T) {
	host := sdktest.NewServer(t).Host
	for _, args := range [][]string{{"create"}, {"ls", "--bogus"}, {"-o", "yaml", "ls"}, {"cp", "a", "b"}, {"exec", "sb"}, {"nosuch"}} {
		_, errs, code := k7(t, host, "", args...)
		if code != 2 || !strings.HasPrefix(errs, "k7: ") || !strings.Contains(errs, "Usage:") {
			t.Errorf("k7 %v: exit %d, stderr %q; want 2 with usage", args, code, errs)
		}
	}
}

func TestDaemonNotRunning(t *testing.T) {
	host := "unix://" + filepath.Join(t.TempDir(), "k7.sock")
	want := "k7d is not running at " + host + " (dial: no such file or directory)"
	for _, args := range [][]string{{"ls"}, {"exec", "x", "--", "true"}} {
		_, errs, code := k7(t, host, "", args...)
		if code != 1 || errs != "k7: "+want+"\n" {
			t.Errorf("k7 %v: exit %d, stderr %q; want 1, %q", args, code, errs, "k7: "+want)
		}
	}
	out, errs, code := k7(t, host, "", "version")
	if code != 1 || !strings.Contains(out, "Client:") || strings.Contains(out, "Server:") {
		t.Errorf("version without daemon: exit %d, stdout %q", code, out)
	}
	oneErrorLine(t, errs, "k7d is not running")
}

func TestExec(t *testing.T) {
	host := sdktest.NewServer(t).Host
	mustK7(t, host, "create", "--name", "web", "alpine:3")
	for _, tc := range []struct {
		name             string
		stdin            string
		args             []string
		wantOut, wantErr string
		wantCode         int
	}{
		{"echo", "", []string{"web", "--", "echo", "hi", "there"}, "hi there\n", "", 0},
		{"no dashes", "", []string{"web", "echo", "-n"}, "-n\n", "", 0},
		{"exit code", "", []string{"web", "--", "exit", "3"}, "", "", 3},
		{"stderr", "", []string{"web", "--", "stderr", "oops"}, "", "oops\n", 1},
		{"stdin", "line1\nline2\n", []string{"-i", "web", "--", "cat"}, "line1\nline2\n", "", 0},
		{"no stdin without -i", "ignored", []string{"web", "--", "cat"}, "", "", 0},
		{"options", "", []string{"-e", "A=1", "-w", "/srv", "-u", "nobody", "--timeout", "10s", "-t", "web", "--", "env"},
			"env=A=1 cwd=/srv user=nobody tty=true timeout=10000000000\n", "", 0},
		{"not found", "", []string{"web", "--", "x"}, "", "k7: exec: \"x\": executable file not found in $PATH\n", 127},
		{"detach", "", []string{"-d", "web", "--", "sleep", "1"}, "42\n", "", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, errs, code := k7(t, host, tc.stdin, append([]string{"exec"}, tc.args...)...)
			if code != tc.wantCode || out != tc.wantOut || errs != tc.wantErr {
				t.Errorf("exit %d, stdout %q, stderr %q; want %d, %q, %q", code, out, errs, tc.wantCode, tc.wantOut, tc.wantErr)
			}
		})
	}
}

func TestCpRoundTrip(t *testing.T) {
	host := sdktest.NewServer(t).Host
	mustK7(t, host, "create", "--name", "web", "alpine:3")
	dir := t.TempDir()
	src := filepath.Join(dir, "in.sh")
	if err := os.WriteFile(src, []byte("#!/bin/sh\necho hi\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	mustK7(t, host, "cp", src, "web:/tmp/")
	dst := filepath.Join(dir, "out")
	mustK7(t, host, "cp", "web:/tmp/in.sh", dst)
	if b, err := os.ReadFile(dst); err != nil || string(b) != "#!/bin/sh\necho hi\n" {
		t.Errorf("round trip: %q, %v", b, err)
	}
	// stdin → sandbox → stdout
	if _, errs, code := k7(t, host, "from stdin", "cp", "-", "web:/tmp/s"); code != 0 {
		t.Fatalf("cp from stdin: %d %s", code, errs)
	}
	if got := mustK7(t, host, "cp", "web:/tmp/s", "-"); got != "from stdin" {
		t.Errorf("cp to stdout = %q", got)
	}
	// a local directory as DST gets the sandbox file's name
	mustK7(t, host, "cp", "web:/tmp/s", dir)
	if b, err := os.ReadFile(filepath.Join(dir, "s")); err != nil || string(b) != "from stdin" {
		t.Errorf("cp into dir: %q, %v", b, err)
	}
	_, errs, code := k7(t, host, "", "cp", "web:/nope", filepath.Join(dir, "nope"))
	oneErrorLine(t, errs, "no such file")
	if _, err := os.Stat(filepath.Join(dir, "nope")); code != 1 || err == nil {
		t.Errorf("failed cp: exit %d, local file left behind: %v", code, err == nil)
	}
}

func TestImages(t *testing.T) {
	host := sdktest.NewServer(t).Host
	out, errs, code := k7(t, host, "", "image", "pull", "docker.io/library/busybox:1")
	if code != 0 || out != "sha256:"+strings.Repeat("b", 64)+"\n" || !strings.Contains(errs, "Pulled docker.io/library/busybox:1") {
		t.Errorf("pull: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	_, errs, code = k7(t, host, "", "image", "pull", "missing:1")
	if code != 1 || !strings.HasSuffix(errs, "k7: manifest for missing:1 not found\n") {
		t.Errorf("pull missing: exit %d, stderr %q", code, errs)
	}
	// import a directory as an OCI layout, streamed as tar
	dir := t.TempDir()
	_ = os.WriteFile(filepath.Join(dir, "oci-layout"), []byte(`{"imageLayoutVersion":"1.0.0"}`), 0o644)
	_ = os.WriteFile(filepath.Join(dir, "index.json"), []byte(`{}`), 0o644)
	if out := mustK7(t, host, "image", "import", "--name", "mine:1", dir); !strings.HasPrefix(out, "sha256:c") {
		t.Errorf("import printed %q", out)
	}
	if _, _, code := k7(t, host, "tarbytes", "image", "import", "--name", "fromstdin", "-"); code != 0 {
		t.Errorf("import from stdin: exit %d", code)
	}
	ids := strings.Fields(mustK7(t, host, "image", "ls", "-q"))
	if len(ids) != 4 {
		t.Errorf("image ls -q = %v, want 4 IDs", ids)
	}
	var imgs []v1.Image
	if err := json.Unmarshal([]byte(mustK7(t, host, "image", "ls", "-o", "json")), &imgs); err != nil || len(imgs) != 4 {
		t.Errorf("image ls -o json: %v, %d", err, len(imgs))
	}
	if got := mustK7(t, host, "image", "rm", "mine:1"); got != "mine:1\n" {
		t.Errorf("image rm printed %q", got)
	}
}

func TestInfoVersionPrune(t *testing.T) {
	f := sdktest.NewServer(t)
	host := f.Host
	if out := mustK7(t, host, "version"); !strings.Contains(out, "Server:\n  Version: fake-1.0") {
		t.Errorf("version = %q", out)
	}
	var info v1.Info
	if err := json.Unmarshal([]byte(mustK7(t, host, "info", "-o", "json")), &info); err != nil || info.DefaultEngine != "fake" {
		t.Errorf("info -o json: %v %+v", err, info)
	}
	id := strings.TrimSpace(mustK7(t, host, "create", "-q", "alpine:3"))
	f.SetState(id, v1.StateDead)
	if got := mustK7(t, host, "ls", "--live", "-q"); got != "" {
		t.Errorf("ls --live -q listed the dead sandbox: %q", got)
	}
	if got := mustK7(t, host, "ls", "-q"); got != id+"\n" {
		t.Errorf("ls -q = %q, want the dead sandbox listed", got)
	}
	out, _, code := k7(t, host, "y\n", "system", "prune")
	if code != 0 || out != id+"\n" {
		t.Errorf("prune: exit %d, stdout %q", code, out)
	}
	if got := mustK7(t, host, "system", "prune", "-f"); got != "" {
		t.Errorf("second prune printed %q", got)
	}
}

func TestParseSize(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		bad  bool
	}{
		{"1048576", 1 << 20, false},
		{"512M", 512 << 20, false},
		{"512m", 512 << 20, false},
		{"1G", 1 << 30, false},
		{"1.5GiB", 3 << 29, false},
		{"64k", 64 << 10, false},
		{"2Gb", 2 << 30, false},
		{"12X", 0, true},
		{"", 0, true},
		{"M", 0, true},
		{"0", 0, true},
		{"-1G", 0, true},
		{"1.5", 0, true},
		{"1.2.3G", 0, true},
		{"99999999999T", 0, true},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := parseSize(tc.in)
			if (err != nil) != tc.bad || got != tc.want {
				t.Errorf("parseSize(%q) = %d, %v; want %d, error %v", tc.in, got, err, tc.want, tc.bad)
			}
		})
	}
}

func TestParseCpArg(t *testing.T) {
	for _, tc := range []struct {
		in          string
		id, path    string
		remote, bad bool
	}{
		{"web:/tmp/x", "web", "/tmp/x", true, false},
		{"./a:b", "", "./a:b", false, false},
		{"/abs/file", "", "/abs/file", false, false},
		{"-", "", "-", false, false},
		{"../local", "", "../local", false, false},
		{"web:rel", "", "", true, true},
		{"web:/a/../b", "", "", true, true},
	} {
		id, p, remote, err := parseCpArg(tc.in)
		if id != tc.id || p != tc.path || remote != tc.remote || (err != nil) != tc.bad {
			t.Errorf("parseCpArg(%q) = %q, %q, %v, %v; want %q, %q, %v, error %v", tc.in, id, p, remote, err, tc.id, tc.path, tc.remote, tc.bad)
		}
	}
}

func TestDaemonCmdPassesArgs(t *testing.T) {
	old := daemonMain
	defer func() { daemonMain = old }()
	var got []string
	daemonMain = func(args []string) int { got = args; return 3 }
	_, errs, code := k7(t, "unix:///nonexistent", "", "daemon", "--listen", "x", "-v")
	if code != 3 || errs != "" || strings.Join(got, " ") != "--listen x -v" {
		t.Errorf("daemon: exit %d, stderr %q, args %q; want 3, nothing, the flags as given", code, errs, got)
	}
}
