package enginetest

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/k7-dev/k7/internal/engine"
	"github.com/k7-dev/k7/internal/errdefs"
)

// restore restores a child from capture and deletes it when t ends.
func (s *suite) restore(t *testing.T, ctx context.Context, f engine.Forker, from string) *sandbox {
	t.Helper()
	id := NewID()
	req := &engine.RestoreRequest{CreateRequest: *s.request(id), From: from}
	start := time.Now()
	if err := f.Restore(ctx, req); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	s.cleanupDelete(t, id)
	c := s.connect(t, ctx, id)
	if err := c.Configure(ctx, req.Hostname); err != nil {
		t.Fatalf("Configure: %v", err)
	}
	t.Logf("child %s answered %v after Restore began", id, time.Since(start))
	return &sandbox{id: id, c: c}
}

func (s *suite) testFork(t *testing.T, ctx context.Context) {
	f, ok := s.e.(engine.Forker)
	if !ok || !s.e.Capabilities().Fork {
		t.Skip("engine does not fork")
	}
	parent := s.create(t, ctx)
	sh(t, ctx, parent.c, "echo tmpfs-marker > tmp/marker; echo rootfs-marker > etc/k7-marker")
	detach(t, ctx, parent.c, counterScript)
	atFork := waitCounter(t, ctx, parent.c, 3)

	capture := filepath.Join(t.TempDir(), "capture")
	res, err := f.Checkpoint(ctx, &engine.CheckpointRequest{ID: parent.id, Dir: capture})
	if err != nil {
		t.Fatalf("Checkpoint: %v", err)
	}
	if res.SizeBytes <= 0 || res.EngineVersion == "" || res.SourcePause <= 0 {
		t.Errorf("Checkpoint result: got %+v, want a size, a version and a pause", res)
	}
	if v, ok := s.e.(interface{ Version() string }); ok && v.Version() != res.EngineVersion {
		t.Errorf("EngineVersion: got %q, engine's Version() %q", res.EngineVersion, v.Version())
	}
	t.Logf("checkpoint: pause %v, %d bytes", res.SourcePause, res.SizeBytes)

	// The parent keeps running on its own.
	pn := waitCounter(t, ctx, parent.c, atFork+2)

	// Three children at once.
	children := make([]*sandbox, 3)
	ids := make([]string, len(children))
	errs := make([]error, len(children))
	var wg sync.WaitGroup
	for i := range children {
		ids[i] = NewID()
		s.cleanupDelete(t, ids[i])
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			errs[i] = f.Restore(ctx, &engine.RestoreRequest{CreateRequest: *s.request(ids[i]), From: capture})
			t.Logf("child %d restored in %v", i, time.Since(start))
		}()
	}
	wg.Wait()
	for i := range children {
		if errs[i] != nil {
			t.Fatalf("Restore child %d: %v", i, errs[i])
		}
		c := s.connect(t, ctx, ids[i])
		if err := c.Configure(ctx, "h-"+ids[i][:8]); err != nil {
			t.Fatalf("Configure: %v", err)
		}
		children[i] = &sandbox{id: ids[i], c: c}
	}
	for i, ch := range children {
		if got := sh(t, ctx, ch.c, "cat tmp/marker etc/k7-marker"); got != "tmpfs-marker\nrootfs-marker\n" {
			t.Errorf("child %d markers: got %q", i, got)
		}
		if s.cfg.IsolatedHostname {
			if got, want := sh(t, ctx, ch.c, "hostname"), "h-"+ch.id[:8]+"\n"; got != want {
				t.Errorf("child %d hostname: got %q, want %q", i, got, want)
			}
		}
		if s.cfg.CarriesProcesses {
			n := waitCounter(t, ctx, ch.c, atFork)
			waitCounter(t, ctx, ch.c, n+2)
		}
	}
	// Each child's files are its own.
	sh(t, ctx, children[0].c, "echo mine > tmp/only-child0; echo mine > etc/only-child0")
	for _, sb := range []*sandbox{parent, children[1], children[2]} {
		// test -e, not ls: ls races with the counter loop's rename in tmp.
		if out := sh(t, ctx, sb.c, "for f in tmp/only-child0 etc/only-child0; do test -e $f && echo $f; done; true"); strings.Contains(out, "only-child0") {
			t.Errorf("sandbox %s sees child 0's files:\n%s", sb.id, out)
		}
	}
	waitCounter(t, ctx, parent.c, pn+2)

	// A capture outlives its source.
	if err := s.e.Delete(ctx, parent.id); err != nil {
		t.Fatalf("Delete(parent): %v", err)
	}
	orphan := s.restore(t, ctx, f, capture)
	if got := sh(t, ctx, orphan.c, "cat tmp/marker"); got != "tmpfs-marker\n" {
		t.Errorf("child of a deleted source: marker %q", got)
	}
	if s.cfg.CarriesProcesses {
		waitCounter(t, ctx, orphan.c, atFork+2)
	}

	// A capture of another engine version is refused.
	bad := filepath.Join(t.TempDir(), "bad")
	if err := os.CopyFS(bad, os.DirFS(capture)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bad, VersionFile), []byte("some-other-build\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	id := NewID()
	err = f.Restore(ctx, &engine.RestoreRequest{CreateRequest: *s.request(id), From: bad})
	if err == nil {
		s.cleanupDelete(t, id)
	}
	if !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("Restore of another version: got %v, want ErrFailedPrecondition", err)
	}
	listed, err := s.e.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(listed, id) {
		t.Errorf("List after a refused Restore contains %s", id)
	}
}
