package daemon

import (
	"context"
	"fmt"
	"io"
	"time"

	v1 "github.com/k7-dev/k7/api/v1"
	"github.com/k7-dev/k7/internal/errdefs"
)

// testImages is an image store that knows one image, "busybox".
type testImages struct{ dir string }

var testImage = v1.Image{ID: "sha256:0000000000000000000000000000000000000000000000000000000000000001", Refs: []string{"busybox"}, Created: time.Unix(0, 0).UTC(), Env: []string{"PATH=/bin"}}

func (i testImages) Pull(ctx context.Context, ref string, insecure bool, progress func(v1.PullProgress)) (*v1.Image, error) {
	progress(v1.PullProgress{Status: "resolving " + ref})
	if ref == "busybox" {
		img := testImage
		return &img, nil
	}
	return nil, fmt.Errorf("image %q not found: %w", ref, errdefs.ErrNotFound)
}

func (i testImages) Import(ctx context.Context, r io.Reader, name string, progress func(v1.PullProgress)) (*v1.Image, error) {
	n, err := io.Copy(io.Discard, r)
	if err != nil {
		return nil, err
	}
	progress(v1.PullProgress{Status: "importing", DoneBytes: n})
	img := testImage
	img.Refs = []string{name}
	return &img, nil
}

func (i testImages) Get(ctx context.Context, ref string) (*v1.Image, error) {
	if ref == "busybox" || ref == testImage.ID {
		img := testImage
		return &img, nil
	}
	return nil, fmt.Errorf("image %q not found: %w", ref, errdefs.ErrNotFound)
}

func (i testImages) Rootfs(ctx context.Context, ref string) (*v1.Image, string, error) {
	img, err := i.Get(ctx, ref)
	if err != nil {
		return nil, "", err
	}
	return img, i.dir, nil
}

func (i testImages) List(ctx context.Context) ([]v1.Image, error) {
	return []v1.Image{testImage}, nil
}

func (i testImages) Remove(ctx context.Context, ref string) error {
	_, err := i.Get(ctx, ref)
	return err
}
