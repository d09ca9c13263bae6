// Command k7d is the k7 node daemon. See internal/daemon.
package main

import (
	"os"

	"github.com/k7-dev/k7/internal/daemon"
)

func main() { os.Exit(daemon.Main(os.Args[1:])) }
