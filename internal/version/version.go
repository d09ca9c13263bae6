// Package version holds the build's version, set at link time with
// -ldflags "-X github.com/k7-dev/k7/internal/version.Version=...".
package version

// Version is the k7 release or "dev".
var Version = "dev"
