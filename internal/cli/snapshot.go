package cli

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	v1 "github.com/k7-dev/k7/api/v1"
)

func newSnapshotCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "snapshot SANDBOX NAME | snapshot COMMAND",
		Short: "Take and manage named snapshots",
		Long: `k7 snapshot SANDBOX NAME captures a running sandbox (memory, processes,
writable layer) as a named snapshot; the sandbox keeps running. Snapshots live
under the daemon's state dir, survive the deletion of their sandbox and
restarts of the daemon, and are checksummed; k7 restore starts sandboxes from
them.`,
		Example: `  k7 snapshot web before-upgrade
  k7 snapshot ls
  k7 restore before-upgrade
  k7 snapshot prune --keep-last 5`,
		Args: usageArgs(cobra.ExactArgs(2)),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			s, err := c.CreateSnapshot(ctxOf(cmd), args[0], v1.SnapshotRequest{Name: args[1]})
			if err != nil {
				return err
			}
			if g.json() {
				return printJSON(g.streams.Out, s)
			}
			fmt.Fprintln(g.streams.Out, s.Name)
			return nil
		},
	}
	cmd.AddCommand(newSnapshotLsCmd(g), newSnapshotInspectCmd(g), newSnapshotRmCmd(g), newSnapshotPruneCmd(g))
	return cmd
}

func newSnapshotLsCmd(g *globals) *cobra.Command {
	var quiet bool
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List snapshots with their disk usage",
		Args:  usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			l, err := c.ListSnapshots(ctxOf(cmd))
			if err != nil {
				return err
			}
			switch {
			case quiet:
				for _, s := range l.Snapshots {
					fmt.Fprintln(g.streams.Out, s.Name)
				}
				return nil
			case g.json():
				return printJSON(g.streams.Out, l)
			}
			t := newTable(g.streams.Out, "NAME", "SANDBOX", "ENGINE", "IMAGE", "SIZE", "CREATED")
			for _, s := range l.Snapshots {
				t.row(s.Name, s.SandboxName, s.Engine, s.Image, humanBytes(s.SizeBytes), ago(s.Created))
			}
			if err := t.flush(); err != nil {
				return err
			}
			fmt.Fprintf(g.streams.Out, "total %s in %d snapshots\n", humanBytes(l.TotalBytes), len(l.Snapshots))
			return nil
		},
	}
	cmd.Flags().BoolVarP(&quiet, "quiet", "q", false, "print only names")
	return cmd
}

func newSnapshotInspectCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "inspect NAME...",
		Short: "Show snapshot manifests (JSON)",
		Args:  usageArgs(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			var out []*v1.Snapshot
			err = forEach(g, args, func(name string) error {
				s, err := c.GetSnapshot(ctxOf(cmd), name)
				if err == nil {
					out = append(out, s)
				}
				return err
			})
			if len(out) > 0 {
				if perr := printJSON(g.streams.Out, out); perr != nil {
					return perr
				}
			}
			return err
		},
	}
}

func newSnapshotRmCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "rm NAME...",
		Short: "Remove snapshots",
		Args:  usageArgs(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			return forEach(g, args, func(name string) error {
				if err := c.DeleteSnapshot(ctxOf(cmd), name); err != nil {
					return err
				}
				fmt.Fprintln(g.streams.Out, name)
				return nil
			})
		},
	}
}

func newSnapshotPruneCmd(g *globals) *cobra.Command {
	var (
		keepLast  int
		olderThan time.Duration
		all       bool
	)
	cmd := &cobra.Command{
		Use:   "prune [--keep-last N] [--older-than DURATION] [--all]",
		Short: "Remove old snapshots",
		Long: `Remove snapshots outside the retention: with --keep-last N the N newest stay;
with --older-than D only snapshots older than D go (both may be combined).
--all removes every snapshot. Prints the names removed and the space freed.`,
		Example: `  k7 snapshot prune --keep-last 5
  k7 snapshot prune --older-than 72h
  k7 snapshot prune --all`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if keepLast < 0 || olderThan < 0 {
				return &usageError{fmt.Errorf("--keep-last and --older-than must not be negative")}
			}
			if !all && keepLast == 0 && olderThan == 0 {
				return &usageError{fmt.Errorf("say what to remove: --keep-last, --older-than or --all")}
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			res, err := c.PruneSnapshots(ctxOf(cmd), v1.SnapshotPruneRequest{KeepLast: keepLast, OlderThanNS: int64(olderThan)})
			if err != nil {
				return err
			}
			if g.json() {
				return printJSON(g.streams.Out, res)
			}
			for _, n := range res.Removed {
				fmt.Fprintln(g.streams.Out, n)
			}
			fmt.Fprintf(g.streams.Err, "freed %s\n", humanBytes(res.FreedBytes))
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&keepLast, "keep-last", 0, "keep the N newest snapshots")
	f.DurationVar(&olderThan, "older-than", 0, "remove only snapshots older than this (e.g. 24h)")
	f.BoolVar(&all, "all", false, "remove every snapshot")
	return cmd
}

func newRestoreCmd(g *globals) *cobra.Command {
	var (
		req   v1.RestoreRequest
		quiet bool
	)
	cmd := &cobra.Command{
		Use:   "restore [flags] SNAPSHOT",
		Short: "Start sandboxes from a named snapshot",
		Long: `Start N sandboxes from a snapshot; each continues where the snapshot was taken
(processes, memory, files). The snapshot's checksum is verified first: a
corrupted snapshot, or one taken by another engine build, is refused.`,
		Example: `  k7 restore before-upgrade
  k7 restore -n 3 --name replay before-upgrade
  id=$(k7 restore -q before-upgrade)`,
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			if req.Count < 1 {
				return &usageError{fmt.Errorf("invalid -n %d: must be at least 1", req.Count)}
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			res, err := c.RestoreSnapshot(ctxOf(cmd), args[0], req)
			if err != nil {
				return err
			}
			return printForkResult(g, res, quiet)
		},
	}
	f := cmd.Flags()
	f.IntVarP(&req.Count, "count", "n", 1, "number of sandboxes")
	f.StringVar(&req.Name, "name", "", "name (one sandbox) or name prefix")
	f.BoolVarP(&quiet, "quiet", "q", false, "print only the IDs")
	return cmd
}
