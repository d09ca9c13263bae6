package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	v1 "github.com/k7-dev/k7/api/v1"
	"github.com/k7-dev/k7/sdk"
)

// printJSON writes v as indented JSON.
func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// table is a tab-aligned table; call flush when done.
type table struct{ tw *tabwriter.Writer }

func newTable(w io.Writer, header ...string) *table {
	t := &table{tw: tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)}
	t.row(header...)
	return t
}

func (t *table) row(cols ...string) { fmt.Fprintln(t.tw, strings.Join(cols, "\t")) }
func (t *table) flush() error       { return t.tw.Flush() }

// shortID cuts an ID (and a sha256: prefix) to 12 characters for tables.
func shortID(id string) string {
	id = strings.TrimPrefix(id, "sha256:")
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// ago renders a past time as "5 minutes ago".
func ago(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := time.Since(t)
	switch {
	case d < time.Minute:
		return "less than a minute ago"
	case d < time.Hour:
		return plural(int(d/time.Minute), "minute") + " ago"
	case d < 48*time.Hour:
		return plural(int(d/time.Hour), "hour") + " ago"
	default:
		return plural(int(d/(24*time.Hour)), "day") + " ago"
	}
}

func plural(n int, unit string) string {
	if n == 1 {
		return "1 " + unit
	}
	return fmt.Sprintf("%d %ss", n, unit)
}

// humanBytes renders a size with binary units.
func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%dB", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f%ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// humanNS renders a nanosecond duration.
func humanNS(ns int64) string {
	return time.Duration(ns).Round(time.Microsecond).String()
}

// eachOp returns the RunE of a command that applies op to every sandbox
// argument (pause, resume, rm), printing each result.
func eachOp(g *globals, op func(ctx context.Context, c *sdk.Client, id string) (*v1.OpResult, error)) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		c, err := g.client()
		if err != nil {
			return err
		}
		return forEach(g, args, func(id string) error {
			r, err := op(ctxOf(cmd), c, id)
			if err != nil {
				return err
			}
			return printOp(g, r)
		})
	}
}

// printOp prints the result of an operation on one sandbox: its ID, or the
// whole result (with the daemon's latency) with -o json.
func printOp(g *globals, r *v1.OpResult) error {
	if g.json() {
		return printJSON(g.streams.Out, r)
	}
	_, err := fmt.Fprintln(g.streams.Out, r.ID)
	return err
}
