package image

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	ggcrv1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/google/go-containerregistry/pkg/v1/types"

	v1 "github.com/k7-dev/k7/api/v1"
	"github.com/k7-dev/k7/internal/errdefs"
)

// PullOptions configures Pull.
type PullOptions struct {
	// Insecure allows plain HTTP (and unverified TLS) registries.
	Insecure bool
	// Progress, when set, is called (from one goroutine at a time) as the
	// pull advances: bytes are compressed layer bytes. The last call has
	// DoneBytes == TotalBytes and Image set.
	Progress func(v1.PullProgress)
}

// Platform is the only platform the store pulls.
var Platform = ggcrv1.Platform{OS: "linux", Architecture: "amd64"}

// Pull fetches ref (linux/amd64) from its registry, unpacks it into the
// rootfs cache unless an image with the same ID is there already, and points
// ref at it. An unknown repository or manifest is ErrNotFound, refused
// credentials ErrUnauthorized, an unreachable registry ErrUnavailable.
// Concurrent pulls of one image download and unpack it once. When ref
// named another image before, that image stays (it may have sandboxes
// running on it), without the ref, until removed by ID or RemoveAll.
func (s *Store) Pull(ctx context.Context, ref string, opts PullOptions) (*v1.Image, error) {
	if isBusybox(ref) {
		img, err := s.ensureBusybox(ctx)
		if err == nil && opts.Progress != nil {
			opts.Progress(v1.PullProgress{Status: "built-in", Image: img})
		}
		return img, err
	}
	var nopts []name.Option
	if opts.Insecure {
		nopts = append(nopts, name.Insecure)
	}
	norm, err := normalizeRef(ref, nopts...)
	if err != nil {
		return nil, fmt.Errorf("pulling image: %w", err)
	}
	img, err := s.pull(ctx, ref, norm, nopts, opts)
	if err != nil {
		return nil, fmt.Errorf("pulling image %q: %w", ref, err)
	}
	return img, nil
}

func (s *Store) pull(ctx context.Context, ref, norm string, nopts []name.Option, opts PullOptions) (*v1.Image, error) {
	pr, err := name.ParseReference(ref, nopts...)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errdefs.ErrInvalidArgument, err)
	}
	progress := newProgress(opts.Progress)
	progress.send(v1.PullProgress{Status: "resolving"})

	ropts := []remote.Option{
		remote.WithContext(ctx),
		remote.WithPlatform(Platform),
		remote.WithAuthFromKeychain(authn.DefaultKeychain),
	}
	if opts.Insecure {
		tr := remote.DefaultTransport.(*http.Transport).Clone()
		tr.TLSClientConfig.InsecureSkipVerify = true //nolint:gosec // asked for by the caller
		ropts = append(ropts, remote.WithTransport(tr))
	}
	img, err := remote.Image(pr, ropts...)
	if err != nil {
		return nil, classifyRemote(err)
	}
	digest, err := img.ConfigName()
	if err != nil {
		return nil, classifyRemote(err)
	}
	id := digest.String()
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, classifyRemote(err)
	}
	if cfg.OS != "" && cfg.OS != Platform.OS || cfg.Architecture != "" && cfg.Architecture != Platform.Architecture {
		return nil, fmt.Errorf("image is %s/%s, not %s/%s: %w", cfg.OS, cfg.Architecture, Platform.OS, Platform.Architecture, errdefs.ErrInvalidArgument)
	}
	layers, err := img.Layers()
	if err != nil {
		return nil, classifyRemote(err)
	}
	var total int64
	for _, l := range layers {
		n, err := l.Size()
		if err != nil {
			return nil, classifyRemote(err)
		}
		total += n
	}
	progress.total = total

	m := meta{Created: cfg.Created.UTC(), Env: cfg.Config.Env, Cmd: append(cfg.Config.Entrypoint, cfg.Config.Cmd...), WorkDir: cfg.Config.WorkingDir}
	if len(m.Cmd) == 0 {
		m.Cmd = nil
	}
	out, err := s.ensure(ctx, id, []string{norm}, m, func(ctx context.Context, dst string) (int64, error) {
		counted := make([]ggcrv1.Layer, len(layers))
		for i, l := range layers {
			cl, err := partial.CompressedToLayer(&countingLayer{l: l, p: progress})
			if err != nil {
				return 0, err
			}
			counted[i] = cl
		}
		progress.send(v1.PullProgress{Status: "downloading"})
		n, err := unpackLayers(ctx, counted, dst, s.log)
		if err != nil {
			return 0, classifyRemote(err)
		}
		return n, nil
	})
	if err != nil {
		return nil, err
	}
	progress.finish(out)
	s.log.Info("pulled image", "ref", norm, "image", id)
	return out, nil
}

// classifyRemote gives registry errors their errdefs class.
func classifyRemote(err error) error {
	var terr *transport.Error
	if errors.As(err, &terr) {
		for _, d := range terr.Errors {
			switch d.Code {
			case transport.ManifestUnknownErrorCode, transport.NameUnknownErrorCode, transport.BlobUnknownErrorCode:
				return fmt.Errorf("%w: %w", errdefs.ErrNotFound, err)
			case transport.UnauthorizedErrorCode, transport.DeniedErrorCode:
				return fmt.Errorf("%w: %w", errdefs.ErrUnauthorized, err)
			}
		}
		switch terr.StatusCode {
		case http.StatusNotFound:
			return fmt.Errorf("%w: %w", errdefs.ErrNotFound, err)
		case http.StatusUnauthorized, http.StatusForbidden:
			return fmt.Errorf("%w: %w", errdefs.ErrUnauthorized, err)
		case http.StatusTooManyRequests, http.StatusServiceUnavailable, http.StatusBadGateway, http.StatusGatewayTimeout:
			return fmt.Errorf("%w: %w", errdefs.ErrUnavailable, err)
		}
		return err
	}
	var nerr net.Error
	if errors.As(err, &nerr) {
		return fmt.Errorf("%w: %w", errdefs.ErrUnavailable, err)
	}
	var oerr *net.OpError
	if errors.As(err, &oerr) {
		return fmt.Errorf("%w: %w", errdefs.ErrUnavailable, err)
	}
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%w: %w", errdefs.ErrUnavailable, err)
	}
	return err
}

// progress throttles progress reports; it is safe for concurrent use.
type progress struct {
	fn     func(v1.PullProgress)
	total  int64
	status string // of the byte-count reports

	mu       sync.Mutex
	done     int64
	lastDone int64
	lastAt   time.Time
}

func newProgress(fn func(v1.PullProgress)) *progress {
	if fn == nil {
		fn = func(v1.PullProgress) {}
	}
	return &progress{fn: fn, status: "downloading"}
}

func (p *progress) send(u v1.PullProgress) {
	p.mu.Lock()
	defer p.mu.Unlock()
	u.TotalBytes, u.DoneBytes = p.total, p.done
	p.fn(u)
}

func (p *progress) add(n int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done += n
	if p.done-p.lastDone < 1<<20 && time.Since(p.lastAt) < 200*time.Millisecond && p.done != p.total {
		return
	}
	p.lastDone, p.lastAt = p.done, time.Now()
	p.fn(v1.PullProgress{Status: p.status, TotalBytes: p.total, DoneBytes: p.done})
}

// finish sends the last report: all bytes done, the image set.
func (p *progress) finish(img *v1.Image) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.total == 0 {
		p.total = p.done
	}
	p.done = p.total
	p.fn(v1.PullProgress{Status: "done", TotalBytes: p.total, DoneBytes: p.done, Image: img})
}

// countingLayer counts the compressed bytes read from a layer.
type countingLayer struct {
	l ggcrv1.Layer
	p *progress
}

var _ partial.CompressedLayer = (*countingLayer)(nil)

func (l *countingLayer) Digest() (ggcrv1.Hash, error)        { return l.l.Digest() }
func (l *countingLayer) Size() (int64, error)                { return l.l.Size() }
func (l *countingLayer) MediaType() (types.MediaType, error) { return l.l.MediaType() }

func (l *countingLayer) Compressed() (io.ReadCloser, error) {
	rc, err := l.l.Compressed()
	if err != nil {
		return nil, err
	}
	return &countingReader{ReadCloser: rc, p: l.p}, nil
}

type countingReader struct {
	io.ReadCloser
	p *progress
}

func (r *countingReader) Read(b []byte) (int, error) {
	n, err := r.ReadCloser.Read(b)
	if n > 0 {
		r.p.add(int64(n))
	}
	return n, err
}
