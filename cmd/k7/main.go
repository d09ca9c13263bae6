// Command k7 is the command line client of the k7 sandbox platform.
package main

import (
	"os"

	"github.com/k7-dev/k7/internal/cli"
)

func main() { os.Exit(cli.Run(os.Args[1:])) }
