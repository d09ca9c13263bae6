//go:build !amd64

package qemu

func measureTSCkHz() int64 { return 0 }
