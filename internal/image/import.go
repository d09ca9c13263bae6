package image

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	ggcrv1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	v1 "github.com/k7-dev/k7/api/v1"
	"github.com/k7-dev/k7/internal/errdefs"
)

// Import reads an image from r and names it name. r holds, possibly
// gzip-compressed, one of (detected from its contents):
//   - an OCI image layout as a tar (it has "oci-layout"),
//   - a `docker save` tarball (it has "manifest.json"),
//   - a plain rootfs tarball; the image's ID is then the sha256 of the
//     uncompressed tar.
//
// name is required unless the archive names the image (RepoTags, or an
// org.opencontainers.image.ref.name / io.containerd.image.name annotation
// holding a full reference); when given, it replaces the archive's names.
// Of a multi-image archive only the first image is imported. progress, when
// set, gets the bytes read from r.
func (s *Store) Import(ctx context.Context, r io.Reader, name string, progress func(v1.PullProgress)) (*v1.Image, error) {
	img, err := s.importArchive(ctx, r, name, progress)
	if err != nil {
		if name != "" {
			return nil, fmt.Errorf("importing image %q: %w", name, err)
		}
		return nil, fmt.Errorf("importing image: %w", err)
	}
	return img, nil
}

type archiveKind int

const (
	kindRootfs archiveKind = iota
	kindDocker
	kindOCI
)

func (s *Store) importArchive(ctx context.Context, r io.Reader, refName string, progressFn func(v1.PullProgress)) (*v1.Image, error) {
	var refs []string
	if refName != "" {
		norm, err := normalizeRef(refName)
		if err != nil {
			return nil, err
		}
		refs = []string{norm}
	}
	tmp, err := os.MkdirTemp(s.tmpDir(), "import-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)

	p := newProgress(progressFn)
	p.status = "reading"
	archive := filepath.Join(tmp, "archive.tar")
	if err := copyArchive(ctx, archive, &countingReader{ReadCloser: io.NopCloser(r), p: p}); err != nil {
		return nil, err
	}
	kind, err := detect(archive)
	if err != nil {
		return nil, err
	}
	opener := func() (io.ReadCloser, error) { return os.Open(archive) }

	var img ggcrv1.Image
	var archiveRefs []string
	switch kind {
	case kindDocker:
		mf, err := tarball.LoadManifest(opener)
		if err != nil {
			return nil, fmt.Errorf("reading manifest.json: %w: %w", errdefs.ErrInvalidArgument, err)
		}
		if len(mf) == 0 {
			return nil, fmt.Errorf("manifest.json lists no image: %w", errdefs.ErrInvalidArgument)
		}
		var tag *name.Tag
		if len(mf) > 1 {
			if len(mf[0].RepoTags) == 0 {
				return nil, fmt.Errorf("archive holds %d untagged images: %w", len(mf), errdefs.ErrInvalidArgument)
			}
			t, err := name.NewTag(mf[0].RepoTags[0])
			if err != nil {
				return nil, fmt.Errorf("%w: %w", errdefs.ErrInvalidArgument, err)
			}
			tag = &t
		}
		archiveRefs = mf[0].RepoTags
		if img, err = tarball.Image(opener, tag); err != nil {
			return nil, fmt.Errorf("reading docker archive: %w: %w", errdefs.ErrInvalidArgument, err)
		}
	case kindOCI:
		dir := filepath.Join(tmp, "layout")
		if err := os.Mkdir(dir, 0o700); err != nil {
			return nil, err
		}
		f, err := os.Open(archive)
		if err != nil {
			return nil, err
		}
		_, err = extractTar(ctx, f, dir, s.log)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("unpacking oci layout: %w", err)
		}
		var ref string
		img, ref, err = fromLayout(dir)
		if err != nil {
			return nil, fmt.Errorf("reading oci layout: %w: %w", errdefs.ErrInvalidArgument, err)
		}
		if ref != "" {
			archiveRefs = []string{ref}
		}
	case kindRootfs:
		return s.importRootfs(ctx, opener, refs, p)
	}

	if refs == nil {
		for _, ar := range archiveRefs {
			norm, err := normalizeRef(ar)
			if err != nil {
				return nil, err
			}
			refs = append(refs, norm)
		}
	}
	if len(refs) == 0 {
		return nil, fmt.Errorf("archive names no image; give a name: %w", errdefs.ErrInvalidArgument)
	}
	cfgName, err := img.ConfigName()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errdefs.ErrInvalidArgument, err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("reading image config: %w: %w", errdefs.ErrInvalidArgument, err)
	}
	layers, err := img.Layers()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errdefs.ErrInvalidArgument, err)
	}
	m := meta{Created: cfg.Created.UTC(), Env: cfg.Config.Env, Cmd: append(cfg.Config.Entrypoint, cfg.Config.Cmd...), WorkDir: cfg.Config.WorkingDir}
	if len(m.Cmd) == 0 {
		m.Cmd = nil
	}
	out, err := s.ensure(ctx, cfgName.String(), refs, m, func(ctx context.Context, dst string) (int64, error) {
		return unpackLayers(ctx, layers, dst, s.log)
	})
	if err != nil {
		return nil, err
	}
	p.finish(out)
	s.log.Info("imported image", "refs", refs, "image", out.ID)
	return out, nil
}

func (s *Store) importRootfs(ctx context.Context, opener tarball.Opener, refs []string, p *progress) (*v1.Image, error) {
	if len(refs) == 0 {
		return nil, fmt.Errorf("a rootfs tarball needs a name: %w", errdefs.ErrInvalidArgument)
	}
	layer, err := tarball.LayerFromOpener(opener)
	if err != nil {
		return nil, err
	}
	diffID, err := layer.DiffID()
	if err != nil {
		return nil, fmt.Errorf("reading rootfs tarball: %w: %w", errdefs.ErrInvalidArgument, err)
	}
	m := meta{Env: []string{DefaultPath}, Cmd: []string{"/bin/sh"}}
	out, err := s.ensure(ctx, diffID.String(), refs, m, func(ctx context.Context, dst string) (int64, error) {
		return unpackLayers(ctx, []ggcrv1.Layer{layer}, dst, s.log)
	})
	if err != nil {
		return nil, err
	}
	p.finish(out)
	s.log.Info("imported rootfs", "refs", refs, "image", out.ID)
	return out, nil
}

// copyArchive copies r into path, gunzipping it when it is gzip-compressed.
func copyArchive(ctx context.Context, dst string, r io.Reader) error {
	br := bufio.NewReader(r)
	var src io.Reader = br
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return fmt.Errorf("reading gzip: %w: %w", errdefs.ErrInvalidArgument, err)
		}
		defer func() { _ = zr.Close() }()
		src = zr
	}
	f, err := os.Create(dst)
	if err != nil {
		return err
	}
	_, err = io.Copy(f, ctxReader{ctx, src})
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("reading archive: %w", err)
	}
	return nil
}

type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(b []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(b)
}

// detect tells an OCI layout tar from a docker-save tar from a rootfs tar.
func detect(archive string) (archiveKind, error) {
	f, err := os.Open(archive)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	var oci, docker bool
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return 0, fmt.Errorf("reading tar: %w: %w", errdefs.ErrInvalidArgument, err)
		}
		switch strings.TrimPrefix(path.Clean("/"+h.Name), "/") {
		case "oci-layout":
			oci = true
		case "manifest.json":
			docker = true
		}
	}
	// Docker 25+ writes both; its manifest.json carries the names.
	switch {
	case docker:
		return kindDocker, nil
	case oci:
		return kindOCI, nil
	}
	return kindRootfs, nil
}

// Annotations that name an image in an OCI layout's index.
const (
	annotationRefName        = "org.opencontainers.image.ref.name"
	annotationContainerdName = "io.containerd.image.name"
)

// fromLayout picks the linux/amd64 image (or the only image) of the layout
// in dir, and the full reference its index annotations give, if any.
func fromLayout(dir string) (ggcrv1.Image, string, error) {
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, "", err
	}
	return pickImage(idx, "", 0)
}

func pickImage(idx ggcrv1.ImageIndex, ref string, depth int) (ggcrv1.Image, string, error) {
	if depth > 4 {
		return nil, "", errors.New("image indexes nested too deep")
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, "", err
	}
	for _, d := range im.Manifests {
		if d.Platform != nil && !d.Platform.Satisfies(Platform) {
			continue
		}
		r := ref
		if r == "" {
			r = annotatedRef(d.Annotations)
		}
		switch {
		case d.MediaType.IsIndex():
			child, err := idx.ImageIndex(d.Digest)
			if err != nil {
				return nil, "", err
			}
			img, cr, err := pickImage(child, r, depth+1)
			if err == nil {
				return img, cr, nil
			}
		case d.MediaType.IsImage():
			img, err := idx.Image(d.Digest)
			if err != nil {
				return nil, "", err
			}
			cfg, err := img.ConfigFile()
			if err != nil {
				return nil, "", err
			}
			if cfg.OS != "" && cfg.OS != Platform.OS || cfg.Architecture != "" && cfg.Architecture != Platform.Architecture {
				continue
			}
			return img, r, nil
		}
	}
	return nil, "", fmt.Errorf("no %s/%s image in the layout", Platform.OS, Platform.Architecture)
}

// annotatedRef returns the full reference an index entry's annotations
// give; a bare tag ("latest") is not a name.
func annotatedRef(a map[string]string) string {
	if n := a[annotationContainerdName]; n != "" {
		return n
	}
	if n := a[annotationRefName]; strings.ContainsAny(n, "/:") {
		return n
	}
	return ""
}
