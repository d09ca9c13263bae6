package network

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// netnsDir is where named namespaces live (as with `ip netns`).
const netnsDir = "/run/netns"

// ensureNetnsDir makes netnsDir a shared mount, as `ip netns add` does, so
// that unmounting a namespace there also drops the copies in mount
// namespaces created later (runsc's, for one).
func ensureNetnsDir() error {
	if err := os.MkdirAll(netnsDir, 0o755); err != nil {
		return err
	}
	err := unix.Mount("", netnsDir, "none", unix.MS_SHARED|unix.MS_REC, "")
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("making %s shared: %w", netnsDir, err)
	}
	if err := unix.Mount(netnsDir, netnsDir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind-mounting %s: %w", netnsDir, err)
	}
	if err := unix.Mount("", netnsDir, "none", unix.MS_SHARED|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("making %s shared: %w", netnsDir, err)
	}
	return nil
}

// inNS runs fn on an OS thread switched into ns. If the thread cannot be
// switched back it stays locked, so the runtime discards it.
func inNS(ns netns.NsHandle, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer orig.Close()
		if err := netns.Set(ns); err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		ferr := fn()
		if err := netns.Set(orig); err != nil {
			errc <- errors.Join(ferr, fmt.Errorf("returning to the original netns: %w", err))
			return // thread stays locked and dies with the goroutine
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// createNS creates the named namespace name under netnsDir and returns a
// handle to it. The caller closes the handle and deletes the namespace.
func createNS(name string) (netns.NsHandle, error) {
	type result struct {
		h   netns.NsHandle
		err error
	}
	resc := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			resc <- result{netns.None(), err}
			return
		}
		defer orig.Close()
		h, err := netns.NewNamed(name)
		if err != nil {
			// NewNamed may have switched the thread already; a failed
			// switch back keeps the thread locked.
			if serr := netns.Set(orig); serr == nil {
				runtime.UnlockOSThread()
			}
			os.Remove(filepath.Join(netnsDir, name))
			resc <- result{netns.None(), fmt.Errorf("creating netns %s: %w", name, err)}
			return
		}
		if err := netns.Set(orig); err != nil {
			h.Close()
			resc <- result{netns.None(), fmt.Errorf("returning to the original netns: %w", err)}
			return
		}
		runtime.UnlockOSThread()
		resc <- result{h, nil}
	}()
	r := <-resc
	return r.h, r.err
}

// deleteNS unmounts and removes the named namespace; a missing one is not an
// error.
func deleteNS(name string) error {
	p := filepath.Join(netnsDir, name)
	if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("unmounting netns %s: %w", name, err)
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing netns %s: %w", name, err)
	}
	return nil
}

// openNS opens the named namespace.
func openNS(name string) (netns.NsHandle, error) {
	h, err := netns.GetFromPath(filepath.Join(netnsDir, name))
	if err != nil {
		return netns.None(), fmt.Errorf("opening netns %s: %w", name, err)
	}
	return h, nil
}

// writeSysctls writes key (a path under /proc/sys) = value pairs inside ns
// (or in the current netns when ns is None).
func writeSysctls(ns netns.NsHandle, kv ...string) error {
	write := func() error {
		for i := 0; i+1 < len(kv); i += 2 {
			if err := os.WriteFile(filepath.Join("/proc/sys", kv[i]), []byte(kv[i+1]), 0o644); err != nil {
				return fmt.Errorf("setting sysctl %s: %w", kv[i], err)
			}
		}
		return nil
	}
	if ns == netns.None() {
		return write()
	}
	return inNS(ns, write)
}
