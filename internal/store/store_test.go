package store

import (
	"errors"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/k7-dev/k7/internal/errdefs"
)

func openTemp(t *testing.T) (*Store, string) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "k7.db")
	s, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s, p
}

func TestNewID(t *testing.T) {
	re := regexp.MustCompile(`^[0-9a-f]{16}$`)
	seen := map[string]bool{}
	for range 1000 {
		id := NewID()
		if !re.MatchString(id) {
			t.Fatalf("NewID() = %q, want 16 lower-hex chars", id)
		}
		if seen[id] {
			t.Fatalf("NewID() repeated %q", id)
		}
		seen[id] = true
	}
}

func TestSandboxCRUD(t *testing.T) {
	s, p := openTemp(t)
	now := time.Now().UTC()
	a := &Sandbox{ID: "0123456789abcdef", Name: "alpha", Image: "busybox", State: "running", Created: now, Env: []string{"A=1"}, Resources: Resources{MemoryBytes: 64 << 20}}
	b := &Sandbox{ID: "0123ffff00000000", Name: "beta", Created: now.Add(time.Second)}
	for _, sb := range []*Sandbox{a, b} {
		if err := s.CreateSandbox(sb); err != nil {
			t.Fatal(err)
		}
	}

	tests := []struct {
		name    string
		sb      *Sandbox
		wantErr error
	}{
		{"duplicate id", &Sandbox{ID: a.ID, Name: "other"}, errdefs.ErrAlreadyExists},
		{"duplicate name", &Sandbox{ID: "ffffffffffffffff", Name: "alpha"}, errdefs.ErrAlreadyExists},
		{"empty name", &Sandbox{ID: "eeeeeeeeeeeeeeee"}, errdefs.ErrInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := s.CreateSandbox(tt.sb); !errors.Is(err, tt.wantErr) {
				t.Fatalf("CreateSandbox() = %v, want %v", err, tt.wantErr)
			}
		})
	}

	finds := []struct {
		ref     string
		wantID  string
		wantErr error
	}{
		{a.ID, a.ID, nil},
		{"alpha", a.ID, nil},
		{"0123456", a.ID, nil},
		{"0123", "", errdefs.ErrInvalidArgument}, // ambiguous
		{"012", "", errdefs.ErrNotFound},         // too short for a prefix
		{"nope", "", errdefs.ErrNotFound},
	}
	for _, tt := range finds {
		t.Run("find "+tt.ref, func(t *testing.T) {
			got, err := s.FindSandbox(tt.ref)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("FindSandbox(%q) error = %v, want %v", tt.ref, err, tt.wantErr)
			}
			if err == nil && got.ID != tt.wantID {
				t.Fatalf("FindSandbox(%q) = %s, want %s", tt.ref, got.ID, tt.wantID)
			}
		})
	}

	a.State = "paused"
	if err := s.UpdateSandbox(a); err != nil {
		t.Fatal(err)
	}
	if err := s.UpdateSandbox(&Sandbox{ID: "1111111111111111", Name: "x"}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("UpdateSandbox(unknown) = %v, want ErrNotFound", err)
	}
	if err := s.DeleteSandbox(b.ID, true); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteSandbox(b.ID, true); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("second DeleteSandbox = %v, want ErrNotFound", err)
	}
	// The name is free again.
	if err := s.CreateSandbox(&Sandbox{ID: "2222222222222222", Name: "beta", Created: now.Add(2 * time.Second)}); err != nil {
		t.Fatalf("reusing a deleted name: %v", err)
	}

	// Everything survives a reopen.
	_ = s.Close()
	s2, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s2.Close() }()
	list, err := s2.ListSandboxes()
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 || list[0].ID != a.ID || list[1].Name != "beta" {
		t.Fatalf("ListSandboxes() = %+v, want alpha then beta", list)
	}
	if list[0].State != "paused" || list[0].Resources.MemoryBytes != 64<<20 || len(list[0].Env) != 1 {
		t.Fatalf("record not kept: %+v", list[0])
	}
	tomb, err := s2.ListTombstones()
	if err != nil {
		t.Fatal(err)
	}
	if len(tomb) != 1 || tomb[0].ID != b.ID || tomb[0].State != "deleted" {
		t.Fatalf("ListTombstones() = %+v, want one deleted beta", tomb)
	}
}

func TestSnapshots(t *testing.T) {
	s, _ := openTemp(t)
	sn := &Snapshot{Name: "snap1", Sandbox: "0123456789abcdef", Created: time.Now(), SizeBytes: 10, Checksum: "abc"}
	if err := s.PutSnapshot(sn); err != nil {
		t.Fatal(err)
	}
	if err := s.PutSnapshot(sn); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Fatalf("PutSnapshot(dup) = %v, want ErrAlreadyExists", err)
	}
	got, err := s.GetSnapshot("snap1")
	if err != nil || got.Checksum != "abc" || got.SizeBytes != 10 {
		t.Fatalf("GetSnapshot() = %+v, %v", got, err)
	}
	if _, err := s.GetSnapshot("nope"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("GetSnapshot(unknown) = %v, want ErrNotFound", err)
	}
	if err := s.DeleteSnapshot("snap1"); err != nil {
		t.Fatal(err)
	}
	if l, _ := s.ListSnapshots(); len(l) != 0 {
		t.Fatalf("ListSnapshots() after delete = %v", l)
	}
}
