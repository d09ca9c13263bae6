// Package sdk is the Go client of the k7 daemon (k7d) HTTP/JSON API.
//
// A Client talks to one daemon over a unix socket (the default,
// unix:///run/k7/k7.sock) or over HTTP(S) with a bearer token. It is safe
// for concurrent use by multiple goroutines and holds no resources that need
// closing beyond its http.Client's idle connections.
//
// Errors that the daemon reports are returned as *APIError values that match
// the sentinels of this package with errors.Is (ErrNotFound, ErrConflict,
// ...); a daemon that cannot be reached yields an error matching
// ErrDaemonUnavailable. The package imports only the wire types of api/v1.
//
// The API is split by area: system.go (info, health, prune), sandbox.go,
// exec.go, files.go (copy, logs), image.go. Forks and snapshots will get
// their own files.
package sdk
