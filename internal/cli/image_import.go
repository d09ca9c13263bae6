package cli

import (
	"archive/tar"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
)

func newImageImportCmd(g *globals) *cobra.Command {
	var name string
	cmd := &cobra.Command{
		Use:   "import [--name NAME] PATH|-",
		Short: "Import an image from an archive or an OCI layout",
		Long: `Import an image into the node's image store. PATH is a tar archive (of an
OCI image layout, or a rootfs tarball), "-" for such an archive on stdin,
or a directory holding an OCI image layout, which is streamed as a tar
archive without a temporary file. The image ID goes to stdout.`,
		Example: `  k7 image import ./alpine-oci --name alpine:local
  k7 image import rootfs.tar --name mybase:1
  skopeo copy docker://alpine:3 oci-archive:/dev/stdout | k7 image import - --name alpine:3`,
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			r := g.streams.In
			if p := args[0]; p != "-" {
				fi, err := os.Stat(p)
				if err != nil {
					return err
				}
				if fi.IsDir() {
					if _, err := os.Stat(filepath.Join(p, "oci-layout")); err != nil {
						return fmt.Errorf("directory %s is not an OCI image layout (no oci-layout file)", p)
					}
					pr, pw := io.Pipe()
					go func() { pw.CloseWithError(tarDir(pw, p)) }()
					defer func() { _ = pr.Close() }()
					r = pr
				} else {
					f, err := os.Open(p)
					if err != nil {
						return err
					}
					defer f.Close()
					r = f
				}
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			pv := newProgressView(g.streams.Err)
			img, err := c.ImportImage(ctxOf(cmd), name, r, pv.update)
			if err != nil {
				pv.clear()
				return err
			}
			pv.done(img, "Imported")
			return printImageResult(g, img)
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "reference to give the image, e.g. mytool:1 (default: the daemon's choice)")
	return cmd
}

// tarDir writes the tree under dir to w as a tar archive with paths
// relative to dir. Symlinks are stored as links; other special files are
// skipped.
func tarDir(w io.Writer, dir string) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil || rel == "." {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		link := ""
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		case fi.Mode().IsRegular(), fi.IsDir():
		default:
			return nil
		}
		h, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		h.Name = filepath.ToSlash(rel)
		if fi.IsDir() {
			h.Name += "/"
		}
		h.Uname, h.Gname = "", ""
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if !fi.Mode().IsRegular() {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.Copy(tw, f)
		return err
	})
	if err != nil {
		return fmt.Errorf("archiving %s: %w", dir, err)
	}
	return tw.Close()
}
