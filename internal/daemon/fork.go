package daemon

import (
	"context"
	"fmt"

	v1 "github.com/k7-dev/k7/api/v1"
	"github.com/k7-dev/k7/internal/errdefs"
)

var errNotYet = fmt.Errorf("not implemented yet: %w", errdefs.ErrUnavailable)

func (d *Daemon) Fork(ctx context.Context, ref string, req *v1.ForkRequest) (*v1.ForkResult, error) {
	return nil, errNotYet
}

func (d *Daemon) CreateSnapshot(ctx context.Context, ref string, req *v1.SnapshotRequest) (*v1.Snapshot, error) {
	return nil, errNotYet
}

func (d *Daemon) ListSnapshots(ctx context.Context) (*v1.SnapshotList, error) { return nil, errNotYet }

func (d *Daemon) GetSnapshot(ctx context.Context, name string) (*v1.Snapshot, error) {
	return nil, errNotYet
}

func (d *Daemon) DeleteSnapshot(ctx context.Context, name string) error { return errNotYet }

func (d *Daemon) RestoreSnapshot(ctx context.Context, name string, req *v1.RestoreRequest) (*v1.ForkResult, error) {
	return nil, errNotYet
}

func (d *Daemon) PruneSnapshots(ctx context.Context, req *v1.SnapshotPruneRequest) (*v1.SnapshotPruneResult, error) {
	return nil, errNotYet
}

func (d *Daemon) Tree(ctx context.Context, root string) (*v1.Tree, error) { return nil, errNotYet }
