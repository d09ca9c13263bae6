package cli

import (
	"encoding/json"
	"strings"
	"testing"

	v1 "github.com/k7-dev/k7/api/v1"
	"github.com/k7-dev/k7/sdk/sdktest"
)

func TestForkSnapshotRestoreTree(t *testing.T) {
	host := sdktest.NewServer(t).Host
	id := strings.TrimSpace(mustK7(t, host, "create", "-q", "--name", "web", "alpine:3"))

	out := mustK7(t, host, "fork", "-q", "-n", "2", id)
	kids := strings.Fields(out)
	if len(kids) != 2 || out != kids[0]+"\n"+kids[1]+"\n" || kids[0] == kids[1] || kids[0] == id || kids[1] == id {
		t.Fatalf("fork -q -n 2 printed %q, want two new IDs, one a line", out)
	}
	var insp []v1.Sandbox
	if err := json.Unmarshal([]byte(mustK7(t, host, "inspect", "-o", "json", kids[1])), &insp); err != nil || len(insp) != 1 {
		t.Fatalf("inspect -o json: %v, %+v", err, insp)
	}
	if insp[0].Parent != id || insp[0].Name != "web-fork-2" || insp[0].State != v1.StateRunning {
		t.Errorf("child = %+v, want web-fork-2, running, parent %s", insp[0], id)
	}

	if got := mustK7(t, host, "snapshot", id, "snap"); got != "snap\n" {
		t.Errorf("snapshot printed %q, want the name", got)
	}
	_, errs, code := k7(t, host, "", "snapshot", id, "snap")
	if code != 1 {
		t.Errorf("snapshot again: exit %d, want 1", code)
	}
	oneErrorLine(t, errs, `snapshot "snap" already exists`)

	ls := mustK7(t, host, "snapshot", "ls")
	if lines := strings.Split(ls, "\n"); len(lines) != 4 || !strings.HasPrefix(lines[0], "NAME") ||
		!strings.HasPrefix(lines[1], "snap ") || !strings.Contains(lines[1], "web") || !strings.Contains(lines[1], "alpine:3") ||
		!strings.HasSuffix(lines[2], " in 1 snapshots") {
		t.Errorf("snapshot ls = %q", ls)
	}
	if got := mustK7(t, host, "snapshot", "ls", "-q"); got != "snap\n" {
		t.Errorf("snapshot ls -q = %q", got)
	}

	out = mustK7(t, host, "restore", "-q", "snap")
	rid := strings.TrimSpace(out)
	if out != rid+"\n" || !strings.HasPrefix(rid, "sb") || rid == id || rid == kids[0] || rid == kids[1] {
		t.Fatalf("restore -q printed %q, want one new ID", out)
	}
	_, errs, code = k7(t, host, "", "restore", "-q", "nope")
	if code != 1 {
		t.Errorf("restore of a missing snapshot: exit %d, want 1", code)
	}
	oneErrorLine(t, errs, `snapshot "nope" not found`)

	want := "web (" + shortID(id) + ") running\n" +
		"├── web-fork-1 (" + shortID(kids[0]) + ") running\n" +
		"├── web-fork-2 (" + shortID(kids[1]) + ") running\n" +
		"└── snapshot snap\n" +
		"    └── snap-restore-1 (" + shortID(rid) + ") running\n"
	if got := mustK7(t, host, "tree", id); got != want {
		t.Errorf("tree %s:\n%s\nwant:\n%s", id, got, want)
	}
	if got := mustK7(t, host, "tree", "web"); got != want {
		t.Errorf("tree web:\n%s\nwant:\n%s", got, want)
	}
	if got, want := mustK7(t, host, "tree", "snap"), "snapshot snap\n└── snap-restore-1 ("+shortID(rid)+") running\n"; got != want {
		t.Errorf("tree snap:\n%s\nwant:\n%s", got, want)
	}

	// A deleted parent stays in the tree while it has live descendants; a
	// deleted leaf goes.
	mustK7(t, host, "rm", "-f", id, kids[0])
	want = "web (" + shortID(id) + ") deleted\n" +
		"├── web-fork-2 (" + shortID(kids[1]) + ") running\n" +
		"└── snapshot snap\n" +
		"    └── snap-restore-1 (" + shortID(rid) + ") running\n"
	if got := mustK7(t, host, "tree"); got != want {
		t.Errorf("tree after rm:\n%s\nwant:\n%s", got, want)
	}
	_, errs, code = k7(t, host, "", "tree", "nope")
	if code != 1 {
		t.Errorf("tree nope: exit %d, want 1", code)
	}
	oneErrorLine(t, errs, `"nope" not found`)
}
