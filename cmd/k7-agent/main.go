// Command k7-agent is the init process of every k7 sandbox; see package
// internal/agent.
package main

import (
	"os"

	"github.com/k7-dev/k7/internal/agent"
)

func main() { os.Exit(agent.Run(os.Args[1:])) }
