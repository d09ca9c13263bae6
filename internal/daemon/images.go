package daemon

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	v1 "github.com/k7-dev/k7/api/v1"
	"github.com/k7-dev/k7/internal/errdefs"
	"github.com/k7-dev/k7/internal/image"
)

// imageStore adapts *image.Store to ImageStore.
type imageStore struct{ s *image.Store }

func openImageStore(dir string, log *slog.Logger) (ImageStore, error) {
	s, err := image.Open(dir, log.With("component", "images"))
	if err != nil {
		return nil, fmt.Errorf("opening image store: %w", err)
	}
	return imageStore{s}, nil
}

func (i imageStore) Pull(ctx context.Context, ref string, insecure bool, progress func(v1.PullProgress)) (*v1.Image, error) {
	return i.s.Pull(ctx, ref, image.PullOptions{Insecure: insecure, Progress: progress})
}

func (i imageStore) Import(ctx context.Context, r io.Reader, name string, progress func(v1.PullProgress)) (*v1.Image, error) {
	return i.s.Import(ctx, r, name, progress)
}

func (i imageStore) Get(ctx context.Context, ref string) (*v1.Image, error) { return i.s.Get(ctx, ref) }

func (i imageStore) Rootfs(ctx context.Context, ref string) (*v1.Image, string, error) {
	return i.s.Rootfs(ctx, ref)
}

func (i imageStore) List(ctx context.Context) ([]v1.Image, error) { return i.s.List(ctx) }

func (i imageStore) Remove(ctx context.Context, ref string) error { return i.s.Remove(ctx, ref) }

// ListImages returns every image of the node.
func (d *Daemon) ListImages(ctx context.Context) ([]v1.Image, error) {
	l, err := d.images.List(ctx)
	if l == nil {
		l = []v1.Image{}
	}
	return l, err
}

// GetImage returns one image by reference or ID.
func (d *Daemon) GetImage(ctx context.Context, ref string) (*v1.Image, error) {
	return d.images.Get(ctx, ref)
}

// RemoveImage removes an image unless a live sandbox uses it
// (errdefs.ErrConflict).
func (d *Daemon) RemoveImage(ctx context.Context, ref string) error {
	img, err := d.images.Get(ctx, ref)
	if err != nil {
		return err
	}
	recs, err := d.store.ListSandboxes()
	if err != nil {
		return err
	}
	for _, r := range recs {
		if r.State == v1.StateDead || r.State == v1.StateStopped {
			continue
		}
		if r.ImageID == img.ID || r.Image == ref {
			return fmt.Errorf("image %q is used by sandbox %s (%s): %w", ref, r.ID, r.Name, errdefs.ErrConflict)
		}
	}
	return d.images.Remove(ctx, ref)
}

// PullImage pulls ref, reporting progress.
func (d *Daemon) PullImage(ctx context.Context, req *v1.PullRequest, progress func(v1.PullProgress)) (*v1.Image, error) {
	if req.Ref == "" {
		return nil, fmt.Errorf("pull: empty image reference: %w", errdefs.ErrInvalidArgument)
	}
	return d.images.Pull(ctx, req.Ref, req.Insecure, progress)
}

// ImportImage imports an archive as image name, reporting progress.
func (d *Daemon) ImportImage(ctx context.Context, r io.Reader, name string, progress func(v1.PullProgress)) (*v1.Image, error) {
	return d.images.Import(ctx, r, name, progress)
}
