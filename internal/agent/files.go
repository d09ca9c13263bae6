package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/k7-dev/k7/internal/agent/proto"
	"github.com/k7-dev/k7/internal/errdefs"
)

// root is the directory "/" maps to.
func (s *Server) root() string {
	if s.opts.Root == "" {
		return "/"
	}
	return s.opts.Root
}

// resolve maps an absolute sandbox path to a host path.
func (s *Server) resolve(p string) (string, error) {
	if !filepath.IsAbs(p) || strings.ContainsRune(p, 0) {
		return "", fmt.Errorf("%w: path %q is not absolute", errdefs.ErrInvalidArgument, p)
	}
	return filepath.Join(s.root(), filepath.Clean(p)), nil
}

// putFile is a file being written: a temporary file renamed into place at
// the end.
type putFile struct {
	path string // sandbox path, for messages
	dst  string
	tmp  *os.File
	mode os.FileMode
	err  error // first error; reported once, later data is dropped
	sent bool  // the result was sent
}

func (p *putFile) abort() {
	if p.tmp != nil {
		p.tmp.Close()
		os.Remove(p.tmp.Name())
		p.tmp = nil
	}
}

// putFile handles TPutFile, TData and TEnd frames. File writes happen on
// the read loop: the disk is not a slow consumer.
func (s *Server) putFile(epoch uint64, f proto.Frame) {
	s.mu.Lock()
	p := s.puts[f.Channel]
	s.mu.Unlock()
	switch f.Type {
	case proto.TPutFile:
		var m proto.PutFile
		if err := f.Unmarshal(&m); err != nil {
			s.result(epoch, f.Channel, invalid(err))
			return
		}
		p = &putFile{path: m.Path, mode: os.FileMode(m.Mode) & os.ModePerm}
		if p.mode == 0 {
			p.mode = 0o644
		}
		p.err = s.openPut(p, m.Path)
		s.mu.Lock()
		s.puts[f.Channel] = p
		s.mu.Unlock()
	case proto.TData:
		if p == nil || p.err != nil {
			break
		}
		if _, err := p.tmp.Write(f.Payload); err != nil {
			p.err = classify(fmt.Errorf("writing %s: %w", p.path, err))
		}
	case proto.TEnd:
		if p == nil {
			return
		}
		s.mu.Lock()
		delete(s.puts, f.Channel)
		s.mu.Unlock()
		if p.err == nil {
			p.err = p.commit()
		}
		if p.err != nil {
			p.abort()
		}
		if !p.sent {
			s.result(epoch, f.Channel, p.err)
		}
		return
	}
	// An early error is reported at once so that the client stops sending.
	if p != nil && p.err != nil && !p.sent {
		p.sent = true
		p.abort()
		s.result(epoch, f.Channel, p.err)
	}
}

func (s *Server) openPut(p *putFile, path string) error {
	dst, err := s.resolve(path)
	if err != nil {
		return err
	}
	if filepath.Clean(path) == "/" {
		return fmt.Errorf("%w: %s is a directory", errdefs.ErrInvalidArgument, path)
	}
	p.dst = dst
	if fi, err := os.Stat(dst); err == nil && fi.IsDir() {
		return fmt.Errorf("%w: %s is a directory", errdefs.ErrInvalidArgument, path)
	}
	dir := filepath.Dir(dst)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return classify(fmt.Errorf("creating parents of %s: %w", path, err))
	}
	tmp, err := os.CreateTemp(dir, ".k7-put-*")
	if err != nil {
		return classify(fmt.Errorf("creating %s: %w", path, err))
	}
	p.tmp = tmp
	return nil
}

func (p *putFile) commit() error {
	tmp := p.tmp
	if err := tmp.Chmod(p.mode); err != nil {
		return classify(fmt.Errorf("setting mode of %s: %w", p.path, err))
	}
	if err := tmp.Close(); err != nil {
		return classify(fmt.Errorf("writing %s: %w", p.path, err))
	}
	if err := os.Rename(tmp.Name(), p.dst); err != nil {
		return classify(fmt.Errorf("renaming into %s: %w", p.path, err))
	}
	p.tmp = nil
	return nil
}

// getFile is a file being sent.
type getFile struct {
	credit *proto.Credit
}

// getFile opens the file on the read loop and streams it from a goroutine
// under flow control, then sends TResult.
func (s *Server) getFile(ctx context.Context, epoch uint64, f proto.Frame) {
	var m proto.GetFile
	if err := f.Unmarshal(&m); err != nil {
		s.result(epoch, f.Channel, invalid(err))
		return
	}
	file, err := s.openGet(m.Path)
	if err != nil {
		s.result(epoch, f.Channel, err)
		return
	}
	g := &getFile{credit: proto.NewCredit(proto.Window)}
	s.mu.Lock()
	s.gets[f.Channel] = g
	s.mu.Unlock()
	go func() {
		defer file.Close()
		err := s.streamFile(ctx, epoch, f.Channel, file, g)
		s.mu.Lock()
		delete(s.gets, f.Channel)
		s.mu.Unlock()
		if err != nil {
			err = classify(fmt.Errorf("reading %s: %w", m.Path, err))
		}
		s.result(epoch, f.Channel, err)
	}()
}

var errCanceled = errors.New("canceled")

func (s *Server) streamFile(ctx context.Context, epoch uint64, ch uint32, r io.Reader, g *getFile) error {
	buf := make([]byte, proto.ChunkSize)
	for {
		want, ok := g.credit.Take(ctx.Done(), len(buf))
		if !ok {
			return errCanceled
		}
		n, err := r.Read(buf[:want])
		if n > 0 && !s.send(epoch, proto.Frame{Type: proto.TData, Channel: ch, Payload: append([]byte(nil), buf[:n]...)}) {
			return errCanceled
		}
		g.credit.Add(want - n)
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

func (s *Server) openGet(path string) (*os.File, error) {
	p, err := s.resolve(path)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(p)
	if err != nil {
		return nil, classify(fmt.Errorf("opening %s: %w", path, unwrapPathErr(err)))
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, classify(fmt.Errorf("opening %s: %w", path, err))
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("%w: %s is not a regular file", errdefs.ErrInvalidArgument, path)
	}
	return f, nil
}
