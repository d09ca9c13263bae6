// Package image is the node's image store: it pulls images from registries,
// imports image archives and rootfs tarballs, and keeps one unpacked,
// read-only rootfs per image that every sandbox using the image shares.
//
// On disk, under the store's directory:
//
//	index.json          refs → image records, written atomically
//	rootfs/<id-hex>/    the unpacked rootfs of image sha256:<id-hex>
//	tmp/                unpacks in progress, downloads, trash; emptied by Open
//
// Compressed layers are not kept: a layer is streamed from the registry or
// archive straight into the unpacked rootfs.
package image

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/go-containerregistry/pkg/name"

	v1 "github.com/k7-dev/k7/api/v1"
	"github.com/k7-dev/k7/internal/errdefs"
)

// Store is the node's image store. It is safe for concurrent use.
type Store struct {
	dir string
	log *slog.Logger

	mu     sync.Mutex
	images map[string]*record // by ID ("sha256:<hex>")
	locks  map[string]chan struct{}

	unpacks atomic.Int64 // rootfs unpacks done; tests read it
}

// record is one image in index.json.
type record struct {
	ID        string    `json:"id"`
	Refs      []string  `json:"refs"`
	SizeBytes int64     `json:"size_bytes"`
	Created   time.Time `json:"created"`
	Env       []string  `json:"env,omitempty"`
	Cmd       []string  `json:"cmd,omitempty"`
	WorkDir   string    `json:"workdir,omitempty"`
}

type indexFile struct {
	Version int       `json:"version"`
	Images  []*record `json:"images"`
}

const indexVersion = 1

// Open opens the store in dir (<state-dir>/images), creating it when needed.
// It drops index records whose rootfs is gone and deletes rootfs dirs that
// no record names and leftovers of interrupted unpacks.
func Open(dir string, log *slog.Logger) (*Store, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Store{
		dir:    dir,
		log:    log,
		images: map[string]*record{},
		locks:  map[string]chan struct{}{},
	}
	if err := os.RemoveAll(s.tmpDir()); err != nil {
		return nil, fmt.Errorf("opening image store %q: %w", dir, err)
	}
	for _, d := range []string{dir, s.tmpDir(), filepath.Join(dir, "rootfs")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("opening image store %q: %w", dir, err)
		}
	}
	if err := s.load(); err != nil {
		return nil, fmt.Errorf("opening image store %q: %w", dir, err)
	}
	return s, nil
}

func (s *Store) tmpDir() string { return filepath.Join(s.dir, "tmp") }

func (s *Store) rootfsDir(id string) string {
	return filepath.Join(s.dir, "rootfs", strings.TrimPrefix(id, "sha256:"))
}

func (s *Store) load() error {
	b, err := os.ReadFile(filepath.Join(s.dir, "index.json"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err == nil {
		var idx indexFile
		if err := json.Unmarshal(b, &idx); err != nil {
			return fmt.Errorf("reading index.json: %w", err)
		}
		for _, r := range idx.Images {
			if !validID(r.ID) {
				s.log.Warn("dropping image with bad id from index", "image", r.ID)
				continue
			}
			if _, err := os.Stat(s.rootfsDir(r.ID)); err != nil {
				s.log.Warn("dropping image whose rootfs is gone", "image", r.ID, "err", err)
				continue
			}
			s.images[r.ID] = r
		}
	}
	ents, err := os.ReadDir(filepath.Join(s.dir, "rootfs"))
	if err != nil {
		return err
	}
	for _, e := range ents {
		if _, ok := s.images["sha256:"+e.Name()]; ok {
			continue
		}
		s.log.Warn("removing rootfs of unknown image", "dir", e.Name())
		if err := os.RemoveAll(filepath.Join(s.dir, "rootfs", e.Name())); err != nil {
			return err
		}
	}
	return s.saveLocked()
}

// saveLocked writes index.json atomically. s.mu must be held (or s unshared).
func (s *Store) saveLocked() error {
	idx := indexFile{Version: indexVersion, Images: []*record{}}
	for _, r := range s.images {
		idx.Images = append(idx.Images, r)
	}
	sort.Slice(idx.Images, func(i, j int) bool { return idx.Images[i].ID < idx.Images[j].ID })
	b, err := json.MarshalIndent(idx, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(filepath.Join(s.dir, "index.json"), b)
}

func writeFileAtomic(path string, b []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name()) // fails harmlessly after the rename
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return err
	}
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

func (r *record) wire() *v1.Image {
	return &v1.Image{
		ID:        r.ID,
		Refs:      slices.Clone(r.Refs),
		SizeBytes: r.SizeBytes,
		Created:   r.Created,
		Env:       slices.Clone(r.Env),
		Cmd:       slices.Clone(r.Cmd),
		WorkDir:   r.WorkDir,
	}
}

// Built-in image names. "busybox" and "busybox:latest" always mean the
// built-in image, never Docker Hub's.
const BusyboxRef = "k7.local/busybox:latest"

// normalizeRef returns the canonical form of ref: the built-in busybox ref,
// or go-containerregistry's full name ("alpine" →
// "index.docker.io/library/alpine:latest").
func normalizeRef(ref string, opts ...name.Option) (string, error) {
	switch ref {
	case "busybox", "busybox:latest", BusyboxRef:
		return BusyboxRef, nil
	}
	r, err := name.ParseReference(ref, opts...)
	if err != nil {
		return "", fmt.Errorf("parsing image reference %q: %w: %w", ref, errdefs.ErrInvalidArgument, err)
	}
	return r.Name(), nil
}

func validID(id string) bool {
	h, ok := strings.CutPrefix(id, "sha256:")
	return ok && len(h) == 64 && isHex(h)
}

func isHex(s string) bool {
	for _, c := range s {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// findLocked resolves ref to a record: by ref first, then by full ID or
// unique ID prefix (at least 6 hex digits, "sha256:" optional).
func (s *Store) findLocked(ref string) (*record, error) {
	norm, perr := normalizeRef(ref)
	if perr == nil {
		for _, r := range s.images {
			if slices.Contains(r.Refs, norm) {
				return r, nil
			}
		}
	}
	hexPart := strings.TrimPrefix(ref, "sha256:")
	if len(hexPart) >= 6 && isHex(hexPart) {
		var found *record
		for id, r := range s.images {
			if strings.HasPrefix(strings.TrimPrefix(id, "sha256:"), hexPart) {
				if found != nil {
					return nil, fmt.Errorf("image id prefix %q is ambiguous: %w", ref, errdefs.ErrInvalidArgument)
				}
				found = r
			}
		}
		if found != nil {
			return found, nil
		}
	}
	if perr != nil {
		return nil, perr
	}
	return nil, fmt.Errorf("image %q: %w", ref, errdefs.ErrNotFound)
}

// Get returns the image that ref names, by ref, full ID or unique ID prefix
// (>= 6 hex digits). The built-in "busybox" is assembled on first use.
func (s *Store) Get(ctx context.Context, ref string) (*v1.Image, error) {
	if isBusybox(ref) {
		img, err := s.ensureBusybox(ctx)
		if err != nil {
			return nil, fmt.Errorf("getting image %q: %w", ref, err)
		}
		return img, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r, err := s.findLocked(ref)
	if err != nil {
		return nil, fmt.Errorf("getting image: %w", err)
	}
	return r.wire(), nil
}

// Rootfs resolves ref (as Get does) and returns the image and the host path
// of its unpacked rootfs. The rootfs is shared by every caller and must be
// treated as read-only; it stays until the image is removed.
func (s *Store) Rootfs(ctx context.Context, ref string) (*v1.Image, string, error) {
	img, err := s.Get(ctx, ref)
	if err != nil {
		return nil, "", err
	}
	return img, s.rootfsDir(img.ID), nil
}

// List returns every image, sorted by first ref, then ID.
func (s *Store) List(ctx context.Context) ([]v1.Image, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]v1.Image, 0, len(s.images))
	for _, r := range s.images {
		out = append(out, *r.wire())
	}
	key := func(i v1.Image) string {
		if len(i.Refs) > 0 {
			return i.Refs[0]
		}
		return "~" + i.ID
	}
	sort.Slice(out, func(i, j int) bool { return key(out[i]) < key(out[j]) })
	return out, nil
}

// Remove removes a name. Given a ref, it removes that ref and, when the
// image has no ref left, the image and its rootfs; given an ID or ID prefix,
// it removes the image with all its refs. The caller makes sure no sandbox
// still runs on the rootfs.
func (s *Store) Remove(ctx context.Context, ref string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, err := s.findLocked(ref)
	if err != nil {
		return fmt.Errorf("removing image: %w", err)
	}
	norm, perr := normalizeRef(ref)
	if perr == nil && slices.Contains(r.Refs, norm) {
		r.Refs = slices.DeleteFunc(r.Refs, func(x string) bool { return x == norm })
	} else {
		r.Refs = nil
	}
	if len(r.Refs) == 0 {
		if _, busy := s.locks[r.ID]; busy {
			return fmt.Errorf("removing image %q: being unpacked: %w", ref, errdefs.ErrConflict)
		}
		delete(s.images, r.ID)
		if err := s.saveLocked(); err != nil {
			return fmt.Errorf("removing image %q: %w", ref, err)
		}
		if err := s.removeRootfs(r.ID); err != nil {
			return fmt.Errorf("removing image %q: %w", ref, err)
		}
		s.log.Info("removed image", "image", r.ID)
		return nil
	}
	if err := s.saveLocked(); err != nil {
		return fmt.Errorf("removing image %q: %w", ref, err)
	}
	return nil
}

// removeRootfs moves the rootfs out of the way first, so a crash never
// leaves a partial rootfs under its final name.
func (s *Store) removeRootfs(id string) error {
	trash, err := os.MkdirTemp(s.tmpDir(), "trash-")
	if err != nil {
		return err
	}
	if err := os.Rename(s.rootfsDir(id), filepath.Join(trash, "rootfs")); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return os.RemoveAll(trash)
}

// RemoveAll removes every image and its rootfs. Unpacks in progress finish
// and their images stay.
func (s *Store) RemoveAll(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	for id := range s.images {
		if _, busy := s.locks[id]; busy {
			continue
		}
		delete(s.images, id)
		if err := s.removeRootfs(id); err != nil {
			errs = append(errs, err)
		}
	}
	if err := s.saveLocked(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("removing all images: %w", err)
	}
	return nil
}

// Prune is RemoveAll: `k7 system prune` removes every image.
func (s *Store) Prune(ctx context.Context) error { return s.RemoveAll(ctx) }

// lock takes the per-image lock for key, waiting for ctx.
func (s *Store) lock(ctx context.Context, key string) (unlock func(), err error) {
	for {
		s.mu.Lock()
		ch, held := s.locks[key]
		if !held {
			ch = make(chan struct{})
			s.locks[key] = ch
			s.mu.Unlock()
			return func() {
				s.mu.Lock()
				delete(s.locks, key)
				s.mu.Unlock()
				close(ch)
			}, nil
		}
		s.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// meta is what an unpack learns about an image besides its rootfs.
type meta struct {
	Created time.Time
	Env     []string
	Cmd     []string
	WorkDir string
}

// ensure makes sure image id is unpacked and indexed, calling unpack (into a
// fresh dir) only when it is not, at most once at a time per id; then it
// points refs at it (taking them from any other image).
func (s *Store) ensure(ctx context.Context, id string, refs []string, m meta, unpack func(ctx context.Context, dst string) (int64, error)) (*v1.Image, error) {
	unlock, err := s.lock(ctx, id)
	if err != nil {
		return nil, err
	}
	defer unlock()

	s.mu.Lock()
	_, have := s.images[id]
	s.mu.Unlock()

	var size int64
	if !have {
		tmp, err := os.MkdirTemp(s.tmpDir(), "unpack-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(tmp)
		dst := filepath.Join(tmp, "rootfs")
		if err := os.Mkdir(dst, 0o755); err != nil {
			return nil, err
		}
		start := time.Now()
		size, err = unpack(ctx, dst)
		if err != nil {
			return nil, err
		}
		if err := syncDir(dst); err != nil {
			return nil, err
		}
		final := s.rootfsDir(id)
		_ = os.RemoveAll(final) // an orphan Open would have removed
		if err := os.Rename(dst, final); err != nil {
			return nil, err
		}
		s.unpacks.Add(1)
		s.log.Info("unpacked image", "image", id, "size_bytes", size, "took", time.Since(start))
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.images[id]
	if !ok {
		created := m.Created
		if created.IsZero() {
			created = time.Now().UTC()
		}
		r = &record{ID: id, SizeBytes: size, Created: created, Env: m.Env, Cmd: m.Cmd, WorkDir: m.WorkDir, Refs: []string{}}
		s.images[id] = r
	}
	for _, ref := range refs {
		for _, o := range s.images {
			if o != r {
				o.Refs = slices.DeleteFunc(o.Refs, func(x string) bool { return x == ref })
			}
		}
		if !slices.Contains(r.Refs, ref) {
			r.Refs = append(r.Refs, ref)
		}
	}
	if err := s.saveLocked(); err != nil {
		return nil, err
	}
	return r.wire(), nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
