package cli

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
)

func newCpCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "cp SRC DST",
		Short: "Copy a file between the local machine and a sandbox",
		Long: `Copy one file into or out of a sandbox. One of SRC and DST is
SANDBOX:/absolute/path; the other is a local file, or "-" for stdin (when it
is SRC) or stdout (when it is DST). Directories are not supported yet.

A sandbox path must be absolute and must not contain ".." segments. A
sandbox path ending in "/" gets the local file's name appended; a local DST
that is a directory gets the sandbox file's name. A file copied in keeps
the local file's permission bits (0644 from stdin).`,
		Example: `  k7 cp ./script.sh web:/tmp/script.sh
  k7 cp web:/var/log/app.log ./app.log
  tar cz src | k7 cp - web:/tmp/src.tgz
  k7 cp web:/etc/os-release -`,
		Args: usageArgs(cobra.ExactArgs(2)),
		RunE: func(cmd *cobra.Command, args []string) error {
			srcID, srcPath, srcRemote, err := parseCpArg(args[0])
			if err != nil {
				return err
			}
			dstID, dstPath, dstRemote, err := parseCpArg(args[1])
			if err != nil {
				return err
			}
			if srcRemote == dstRemote {
				return &usageError{errors.New("exactly one of SRC and DST must be SANDBOX:/path")}
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			ctx := ctxOf(cmd)
			if dstRemote { // local → sandbox
				r := g.streams.In
				mode := fs.FileMode(0o644)
				if srcPath != "-" {
					f, err := os.Open(srcPath)
					if err != nil {
						return err
					}
					defer f.Close()
					fi, err := f.Stat()
					if err != nil {
						return err
					}
					if !fi.Mode().IsRegular() {
						return fmt.Errorf("%s is not a regular file: only files can be copied", srcPath)
					}
					r, mode = f, fi.Mode().Perm()
					if strings.HasSuffix(dstPath, "/") {
						dstPath += filepath.Base(srcPath)
					}
				} else if strings.HasSuffix(dstPath, "/") {
					return fmt.Errorf("sandbox path %q is a directory: name the file when copying from stdin", dstPath)
				}
				return c.CopyTo(ctx, dstID, dstPath, mode, r)
			}
			// sandbox → local
			if dstPath == "-" {
				_, err := c.CopyFrom(ctx, srcID, srcPath, g.streams.Out)
				return err
			}
			if fi, err := os.Stat(dstPath); err == nil && fi.IsDir() {
				dstPath = filepath.Join(dstPath, path.Base(srcPath))
			}
			f, err := os.Create(dstPath)
			if err != nil {
				return err
			}
			if _, err := c.CopyFrom(ctx, srcID, srcPath, f); err != nil {
				f.Close()
				os.Remove(dstPath)
				return err
			}
			return f.Close()
		},
	}
}

// parseCpArg splits a cp argument. It is remote when it has the form
// SANDBOX:PATH, with no "/" before the colon (so ./a:b and /x:y are local).
func parseCpArg(arg string) (id, p string, remote bool, err error) {
	before, after, ok := strings.Cut(arg, ":")
	if !ok || before == "" || strings.Contains(before, "/") {
		if arg == "" {
			return "", "", false, &usageError{errors.New("empty path")}
		}
		return "", arg, false, nil
	}
	if !strings.HasPrefix(after, "/") {
		return "", "", true, fmt.Errorf("sandbox path %q must be absolute", after)
	}
	for _, seg := range strings.Split(after, "/") {
		if seg == ".." {
			return "", "", true, fmt.Errorf("sandbox path %q must not contain \"..\"", after)
		}
	}
	return before, after, true, nil
}
