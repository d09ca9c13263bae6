package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"io/fs"
	"log"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	ggcrv1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	v1 "github.com/k7-dev/k7/api/v1"
	"github.com/k7-dev/k7/internal/errdefs"
	"github.com/k7-dev/k7/internal/testutil"
)

// entry is one tar entry of a handmade layer.
type entry struct {
	name, data, link string
	typ              byte
	mode             int64
	uid, gid         int
}

func tarBytes(t *testing.T, entries []entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: e.mode, Uid: e.uid, Gid: e.gid, Linkname: e.link, ModTime: time.Unix(1700000000, 0)}
		if h.Typeflag == 0 {
			h.Typeflag = tar.TypeReg
		}
		if h.Mode == 0 {
			h.Mode = 0o644
			if h.Typeflag == tar.TypeDir {
				h.Mode = 0o755
			}
		}
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(e.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(e.data)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func layerOf(t *testing.T, entries []entry) ggcrv1.Layer {
	t.Helper()
	b := tarBytes(t, entries)
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// testImage has two layers: the second deletes gone.txt, makes dir/ opaque
// and adds files.
func testImage(t *testing.T) ggcrv1.Image {
	t.Helper()
	base := layerOf(t, []entry{
		{name: "etc/", typ: tar.TypeDir},
		{name: "etc/hello", data: "hello\n", mode: 0o640, uid: 1000, gid: 1001},
		{name: "gone.txt", data: "bye"},
		{name: "dir/", typ: tar.TypeDir},
		{name: "dir/a", data: "a"},
		{name: "bin/", typ: tar.TypeDir},
		{name: "bin/tool", data: "#!/bin/sh\n", mode: 0o4755},
	})
	top := layerOf(t, []entry{
		{name: ".wh.gone.txt"},
		{name: "dir/", typ: tar.TypeDir},
		{name: "dir/.wh..wh..opq"},
		{name: "dir/c", data: "c"},
		{name: "link", typ: tar.TypeSymlink, link: "etc/hello"},
		{name: "etc/hard", typ: tar.TypeLink, link: "etc/hello"},
	})
	img, err := mutate.AppendLayers(empty.Image, base, top)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config.Env = []string{"PATH=/bin", "FOO=bar"}
	cf.Config.Cmd = []string{"/bin/tool"}
	cf.Config.WorkingDir = "/etc"
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func newStore(t *testing.T) (*Store, string) {
	t.Helper()
	testutil.RequiresRoot(t)
	dir := filepath.Join(t.TempDir(), "images")
	s, err := Open(dir, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	return s, dir
}

func startRegistry(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

func push(t *testing.T, ref string, img ggcrv1.Image) {
	t.Helper()
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img); err != nil {
		t.Fatal(err)
	}
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func mustNotExist(t *testing.T, p string) {
	t.Helper()
	if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("%s: got err %v, want it not to exist", p, err)
	}
}

// checkTestImage checks the rootfs of testImage.
func checkTestImage(t *testing.T, root string) {
	t.Helper()
	if got, want := readFile(t, filepath.Join(root, "etc/hello")), "hello\n"; got != want {
		t.Errorf("etc/hello: got %q, want %q", got, want)
	}
	fi, err := os.Lstat(filepath.Join(root, "etc/hello"))
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if st.Uid != 1000 || st.Gid != 1001 || fi.Mode().Perm() != 0o640 {
		t.Errorf("etc/hello: got uid %d gid %d mode %v, want 1000 1001 -rw-r-----", st.Uid, st.Gid, fi.Mode())
	}
	if fi, err := os.Stat(filepath.Join(root, "bin/tool")); err != nil || fi.Mode()&fs.ModeSetuid == 0 {
		t.Errorf("bin/tool: got %v, %v; want setuid", fi, err)
	}
	mustNotExist(t, filepath.Join(root, "gone.txt"))
	mustNotExist(t, filepath.Join(root, "dir/a"))
	if got := readFile(t, filepath.Join(root, "dir/c")); got != "c" {
		t.Errorf("dir/c: got %q, want %q", got, "c")
	}
	if got, err := os.Readlink(filepath.Join(root, "link")); err != nil || got != "etc/hello" {
		t.Errorf("link: got %q, %v; want etc/hello", got, err)
	}
	hard, err := os.Stat(filepath.Join(root, "etc/hard"))
	if err != nil || !os.SameFile(hard, fi) {
		t.Errorf("etc/hard: got %v, %v; want a hardlink of etc/hello", hard, err)
	}
}

func TestPull(t *testing.T) {
	s, dir := newStore(t)
	host := startRegistry(t)
	img := testImage(t)
	push(t, host+"/test/app:v1", img)
	wantID, _ := img.ConfigName()

	var mu sync.Mutex
	var reports []v1.PullProgress
	got, err := s.Pull(context.Background(), host+"/test/app:v1", PullOptions{Insecure: true, Progress: func(p v1.PullProgress) {
		mu.Lock()
		reports = append(reports, p)
		mu.Unlock()
	}})
	if err != nil {
		t.Fatalf("Pull: %v", err)
	}
	if got.ID != wantID.String() {
		t.Errorf("ID: got %s, want %s", got.ID, wantID)
	}
	if want := []string{host + "/test/app:v1"}; len(got.Refs) != 1 || got.Refs[0] != want[0] {
		t.Errorf("Refs: got %v, want %v", got.Refs, want)
	}
	if got.WorkDir != "/etc" || len(got.Cmd) != 1 || got.Cmd[0] != "/bin/tool" || len(got.Env) != 2 || got.SizeBytes == 0 {
		t.Errorf("image: got %+v, want config from the image and a size", got)
	}
	if len(reports) < 2 {
		t.Fatalf("progress: got %d reports, want at least 2", len(reports))
	}
	last := reports[len(reports)-1]
	if last.TotalBytes == 0 || last.DoneBytes != last.TotalBytes || last.Image == nil {
		t.Errorf("last progress: got %+v, want done == total > 0 and the image", last)
	}
	var sawBytes bool
	for _, r := range reports[:len(reports)-1] {
		sawBytes = sawBytes || r.DoneBytes > 0
	}
	if !sawBytes {
		t.Errorf("progress: got %+v, want byte counts before the end", reports)
	}

	_, root, err := s.Rootfs(context.Background(), host+"/test/app:v1")
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(dir, "rootfs", strings.TrimPrefix(got.ID, "sha256:")); root != want {
		t.Errorf("rootfs: got %s, want %s", root, want)
	}
	checkTestImage(t, root)

	// By ID, by short ID, and again: no second unpack.
	for _, ref := range []string{got.ID, strings.TrimPrefix(got.ID, "sha256:")[:8]} {
		if g, err := s.Get(context.Background(), ref); err != nil || g.ID != got.ID {
			t.Errorf("Get(%q): got %v, %v; want %s", ref, g, err, got.ID)
		}
	}
	if _, err := s.Pull(context.Background(), host+"/test/app:v1", PullOptions{Insecure: true}); err != nil {
		t.Fatal(err)
	}
	if n := s.unpacks.Load(); n != 1 {
		t.Errorf("unpacks: got %d, want 1", n)
	}

	// The index survives a reopen.
	s2, err := Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	list, err := s2.List(context.Background())
	if err != nil || len(list) != 1 || list[0].ID != got.ID {
		t.Errorf("List after reopen: got %+v, %v; want the pulled image", list, err)
	}
}

func TestPullErrors(t *testing.T) {
	s, _ := newStore(t)
	host := startRegistry(t)
	closed := httptest.NewServer(nil)
	closedHost := strings.TrimPrefix(closed.URL, "http://")
	closed.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, tc := range []struct {
		ref  string
		want error
	}{
		{"Bad Ref!", errdefs.ErrInvalidArgument},
		{host + "/no/such:latest", errdefs.ErrNotFound},
		{closedHost + "/x/y:latest", errdefs.ErrUnavailable},
	} {
		t.Run(tc.ref, func(t *testing.T) {
			_, err := s.Pull(ctx, tc.ref, PullOptions{Insecure: true})
			if !errors.Is(err, tc.want) {
				t.Fatalf("Pull(%q): got %v, want %v", tc.ref, err, tc.want)
			}
			if !strings.Contains(err.Error(), tc.ref) {
				t.Errorf("Pull(%q): got %q, want the ref in the message", tc.ref, err)
			}
		})
	}
}

func TestGetErrors(t *testing.T) {
	s, _ := newStore(t)
	for _, tc := range []struct {
		ref  string
		want error
	}{
		{"alpine", errdefs.ErrNotFound},
		{"abcdef", errdefs.ErrNotFound},
		{"Bad Ref!", errdefs.ErrInvalidArgument},
	} {
		if _, err := s.Get(context.Background(), tc.ref); !errors.Is(err, tc.want) {
			t.Errorf("Get(%q): got %v, want %v", tc.ref, err, tc.want)
		}
		if _, _, err := s.Rootfs(context.Background(), tc.ref); !errors.Is(err, tc.want) {
			t.Errorf("Rootfs(%q): got %v, want %v", tc.ref, err, tc.want)
		}
		if err := s.Remove(context.Background(), tc.ref); !errors.Is(err, tc.want) {
			t.Errorf("Remove(%q): got %v, want %v", tc.ref, err, tc.want)
		}
	}
}

func TestImportDockerSave(t *testing.T) {
	s, _ := newStore(t)
	img := testImage(t)
	tag, err := name.NewTag("example.com/app:2")
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := tarball.Write(tag, img, &buf); err != nil {
		t.Fatal(err)
	}
	var last v1.PullProgress
	got, err := s.Import(context.Background(), &buf, "", func(p v1.PullProgress) { last = p })
	if err != nil {
		t.Fatalf("Import: %v", err)
	}
	if wantID, _ := img.ConfigName(); got.ID != wantID.String() || len(got.Refs) != 1 || got.Refs[0] != "example.com/app:2" {
		t.Errorf("Import: got %+v, want ID %s named example.com/app:2", got, wantID)
	}
	if last.Image == nil || last.DoneBytes == 0 || last.DoneBytes != last.TotalBytes {
		t.Errorf("last progress: got %+v, want done == total > 0", last)
	}
	_, root, err := s.Rootfs(context.Background(), "example.com/app:2")
	if err != nil {
		t.Fatal(err)
	}
	checkTestImage(t, root)
}

// tarDir tars dir's regular files and dirs.
func tarDir(t *testing.T, dir string) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		h, err := tar.FileInfoHeader(fi, "")
		if err != nil {
			return err
		}
		h.Name, _ = filepath.Rel(dir, p)
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if d.Type().IsRegular() {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = io.Copy(tw, f)
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestImportOCILayout(t *testing.T) {
	s, _ := newStore(t)
	img := testImage(t)
	dir := t.TempDir()
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{annotationRefName: "example.com/oci:1"})); err != nil {
		t.Fatal(err)
	}
	archive := tarDir(t, dir)
	wantID, _ := img.ConfigName()

	// Named by the archive.
	got, err := s.Import(context.Background(), bytes.NewReader(archive), "", nil)
	if err != nil {
		t.Fatalf("Import: %v", err)
	}
	if got.ID != wantID.String() || len(got.Refs) != 1 || got.Refs[0] != "example.com/oci:1" {
		t.Errorf("Import: got %+v, want ID %s named example.com/oci:1", got, wantID)
	}
	// Named by the caller, gzip-compressed: same image, one unpack.
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, _ = zw.Write(archive)
	_ = zw.Close()
	got, err = s.Import(context.Background(), &gz, "mine", nil)
	if err != nil {
		t.Fatalf("Import: %v", err)
	}
	if got.ID != wantID.String() || len(got.Refs) != 2 {
		t.Errorf("Import: got %+v, want ID %s with two refs", got, wantID)
	}
	_, root, err := s.Rootfs(context.Background(), "mine")
	if err != nil {
		t.Fatal(err)
	}
	checkTestImage(t, root)
	if n := s.unpacks.Load(); n != 1 {
		t.Errorf("unpacks: got %d, want 1", n)
	}
}

func gzipBytes(b []byte) []byte {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	_, _ = zw.Write(b)
	_ = zw.Close()
	return buf.Bytes()
}

func TestImportRootfsAndRemove(t *testing.T) {
	s, dir := newStore(t)
	ctx := context.Background()
	rootfs := tarBytes(t, []entry{
		{name: "./", typ: tar.TypeDir},
		{name: "./bin/", typ: tar.TypeDir},
		{name: "./bin/app", data: "app", mode: 0o755},
		{name: "./dev/null", typ: tar.TypeChar, mode: 0o666},
	})
	if _, err := s.Import(ctx, bytes.NewReader(gzipBytes(rootfs)), "", nil); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("Import without a name: got %v, want ErrInvalidArgument", err)
	}
	a, err := s.Import(ctx, bytes.NewReader(gzipBytes(rootfs)), "a", nil)
	if err != nil {
		t.Fatalf("Import: %v", err)
	}
	b, err := s.Import(ctx, bytes.NewReader(rootfs), "b:1", nil)
	if err != nil {
		t.Fatalf("Import: %v", err)
	}
	if a.ID != b.ID || len(b.Refs) != 2 || len(b.Env) == 0 {
		t.Errorf("imports: got %+v and %+v, want one image, two refs, default env", a, b)
	}
	_, root, err := s.Rootfs(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, filepath.Join(root, "bin/app")); got != "app" {
		t.Errorf("bin/app: got %q, want %q", got, "app")
	}
	mustNotExist(t, filepath.Join(root, "dev/null"))

	if err := s.Remove(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "a"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Get(a) after Remove: got %v, want ErrNotFound", err)
	}
	if _, err := os.Stat(root); err != nil {
		t.Errorf("rootfs after removing one of two refs: %v", err)
	}
	if err := s.Remove(ctx, "b:1"); err != nil {
		t.Fatal(err)
	}
	mustNotExist(t, root)
	if list, _ := s.List(ctx); len(list) != 0 {
		t.Errorf("List: got %+v, want none", list)
	}

	if _, err := s.Import(ctx, bytes.NewReader(rootfs), "c", nil); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Rootfs(ctx, "busybox"); err != nil {
		t.Fatal(err)
	}
	if err := s.RemoveAll(ctx); err != nil {
		t.Fatal(err)
	}
	if list, _ := s.List(ctx); len(list) != 0 {
		t.Errorf("List after RemoveAll: got %+v, want none", list)
	}
	if ents, _ := os.ReadDir(filepath.Join(dir, "rootfs")); len(ents) != 0 {
		t.Errorf("rootfs dirs after RemoveAll: got %v, want none", ents)
	}
}

func TestBusybox(t *testing.T) {
	if err := checkStatic(HostBusybox); err != nil {
		t.Skipf("no static busybox: %v", err)
	}
	s, _ := newStore(t)
	ctx := context.Background()

	const n = 10
	var wg sync.WaitGroup
	roots := make([]string, n)
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() { _, roots[i], errs[i] = s.Rootfs(ctx, "busybox") })
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil || roots[i] != roots[0] {
			t.Fatalf("Rootfs #%d: got %q, %v; want %q", i, roots[i], errs[i], roots[0])
		}
	}
	if got := s.unpacks.Load(); got != 1 {
		t.Errorf("unpacks: got %d, want 1", got)
	}
	root := roots[0]
	if got, err := os.Readlink(filepath.Join(root, "bin/sh")); err != nil || got != "busybox" {
		t.Errorf("bin/sh: got %q, %v; want a link to busybox", got, err)
	}
	if fi, err := os.Stat(filepath.Join(root, "usr/bin/env")); err != nil || !fi.Mode().IsRegular() {
		t.Errorf("usr/bin/env: got %v, %v; want it to resolve to busybox", fi, err)
	}
	if fi, err := os.Lstat(filepath.Join(root, "bin/busybox")); err != nil || fi.Mode().Perm() != 0o755 || !fi.Mode().IsRegular() {
		t.Errorf("bin/busybox: got %v, %v; want an executable", fi, err)
	}
	if fi, err := os.Lstat(filepath.Join(root, "tmp")); err != nil || fi.Mode()&fs.ModeSticky == 0 || fi.Mode().Perm() != 0o777 {
		t.Errorf("tmp: got %v, %v; want 1777", fi, err)
	}
	if got := readFile(t, filepath.Join(root, "etc/passwd")); !strings.Contains(got, "nobody:x:65534") {
		t.Errorf("etc/passwd: got %q, want nobody", got)
	}
	for _, d := range []string{"proc", "sys", "dev", "root", "home", "usr/sbin", "sbin"} {
		if fi, err := os.Stat(filepath.Join(root, d)); err != nil || !fi.IsDir() {
			t.Errorf("%s: got %v, %v; want a dir", d, fi, err)
		}
	}

	img, err := s.Get(ctx, "busybox:latest")
	if err != nil {
		t.Fatal(err)
	}
	if len(img.Refs) != 1 || img.Refs[0] != BusyboxRef || len(img.Env) == 0 {
		t.Errorf("Get(busybox): got %+v, want %s with PATH", img, BusyboxRef)
	}
	// Deterministic: a second store builds the same ID.
	s2, _ := newStore(t)
	img2, err := s2.Get(ctx, "busybox")
	if err != nil || img2.ID != img.ID {
		t.Errorf("second store: got %v, %v; want ID %s", img2, err, img.ID)
	}
}

// TestMaliciousTar checks that no archive writes outside the rootfs: names
// with "..", and writes through symlinks (to absolute targets, to "/", or
// relative ones that climb out).
func TestMaliciousTar(t *testing.T) {
	s, _ := newStore(t)
	outside := t.TempDir()
	ctx := context.Background()
	rel := strings.Repeat("../", 20) + strings.TrimPrefix(outside, "/")
	cases := []struct {
		name    string
		entries []entry
		// rejected: Import fails with ErrInvalidArgument. Otherwise the
		// image's own flattening (mutate.Extract) drops the bad entries
		// and the import may succeed; either way nothing lands outside.
		rejected bool
	}{
		{"dotdot", []entry{{name: "../../../../../../../../" + outside + "/dotdot", data: "x"}}, true},
		{"dotdot-inner", []entry{{name: "a/../../escape", data: "x"}}, true},
		{"abs-symlink-dir", []entry{
			{name: "evil", typ: tar.TypeSymlink, link: outside},
			{name: "evil/pwned", data: "x"},
		}, false},
		{"symlink-to-root", []entry{
			{name: "up", typ: tar.TypeSymlink, link: "/"},
			{name: "up/" + outside + "/pwned2", data: "x"},
		}, false},
		{"rel-symlink", []entry{
			{name: "rel", typ: tar.TypeSymlink, link: rel},
			{name: "rel/pwned3", data: "x"},
		}, false},
		{"hardlink-out", []entry{{name: "h", typ: tar.TypeLink, link: "../../../../../../../../etc/passwd"}}, false},
	}
	for _, tc := range cases {
		t.Run("import/"+tc.name, func(t *testing.T) {
			img, err := s.Import(ctx, bytes.NewReader(tarBytes(t, tc.entries)), "evil-"+tc.name, nil)
			switch {
			case tc.rejected && !errors.Is(err, errdefs.ErrInvalidArgument):
				t.Errorf("Import: got %v, want ErrInvalidArgument", err)
			case !tc.rejected && err == nil:
				_, root, _ := s.Rootfs(ctx, img.ID)
				mustNotExist(t, filepath.Join(root, "h"))
				for _, l := range []string{"evil", "up", "rel"} {
					if fi, err := os.Lstat(filepath.Join(root, l)); err == nil && fi.Mode()&fs.ModeSymlink != 0 {
						if _, err := os.Lstat(filepath.Join(root, l, "pwned")); err == nil {
							t.Errorf("%s: written through a symlink", l)
						}
					}
				}
			}
			if ents, err := os.ReadDir(outside); err != nil || len(ents) != 0 {
				t.Errorf("outside dir: got %v, %v; want it empty", ents, err)
			}
		})
	}
	// The extractor itself (used raw for OCI layouts) rejects them all.
	for _, tc := range cases {
		t.Run("extract/"+tc.name, func(t *testing.T) {
			dst := filepath.Join(t.TempDir(), "root")
			if err := os.Mkdir(dst, 0o755); err != nil {
				t.Fatal(err)
			}
			_, err := extractTar(ctx, bytes.NewReader(tarBytes(t, tc.entries)), dst, s.log)
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("extractTar: got %v, want ErrInvalidArgument", err)
			}
			if ents, err := os.ReadDir(outside); err != nil || len(ents) != 0 {
				t.Errorf("outside dir: got %v, %v; want it empty", ents, err)
			}
			mustNotExist(t, filepath.Join(filepath.Dir(dst), "escape"))
		})
	}
	mustNotExist(t, "/escape")
	mustNotExist(t, "/dotdot")
}

// TestSymlinkInLowerLayer: a later layer cannot write through a symlink an
// earlier layer planted.
func TestSymlinkInLowerLayer(t *testing.T) {
	s, _ := newStore(t)
	outside := t.TempDir()
	lower := layerOf(t, []entry{{name: "evil", typ: tar.TypeSymlink, link: outside}})
	upper := layerOf(t, []entry{{name: "evil/pwned", data: "x"}, {name: "ok", data: "ok"}})
	img, err := mutate.AppendLayers(empty.Image, lower, upper)
	if err != nil {
		t.Fatal(err)
	}
	tag, _ := name.NewTag("example.com/evil:1")
	var buf bytes.Buffer
	if err := tarball.Write(tag, img, &buf); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Import(context.Background(), &buf, "", nil); err != nil && !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("Import: got %v, want success or ErrInvalidArgument", err)
	}
	if ents, err := os.ReadDir(outside); err != nil || len(ents) != 0 {
		t.Errorf("outside dir: got %v, %v; want it empty", ents, err)
	}
}
