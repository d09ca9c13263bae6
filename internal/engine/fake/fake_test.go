package fake

import (
	"testing"

	"github.com/k7-dev/k7/internal/engine"
	"github.com/k7-dev/k7/internal/engine/enginetest"
)

func TestConformance(t *testing.T) {
	enginetest.Run(t, func(t *testing.T) engine.Engine {
		e, err := New(Config{Root: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		return e
	}, enginetest.Config{})
}
