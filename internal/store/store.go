// Package store keeps the daemon's records (sandboxes, their lineage and
// snapshots) in a bbolt database under the daemon's state directory.
//
// Records are JSON values keyed by sandbox ID or snapshot name. Sandbox
// names are unique through an index bucket. Deleted sandboxes leave a
// tombstone so that the fork tree stays connected. A Store is safe for
// concurrent use; Close releases the database file.
package store

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sort"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/k7-dev/k7/internal/errdefs"
)

var (
	bucketSandboxes  = []byte("sandboxes")
	bucketNames      = []byte("sandbox_names")
	bucketTombstones = []byte("tombstones")
	bucketSnapshots  = []byte("snapshots")
)

// IDLen is the length of a sandbox ID: lower-case hex, fixed width.
const IDLen = 16

// NewID returns a random sandbox ID of IDLen lower-case hex characters.
func NewID() string {
	var b [IDLen / 2]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	return hex.EncodeToString(b[:])
}

// Resources are a sandbox's limits; zero means the engine default.
type Resources struct {
	CPUs        float64 `json:"cpus,omitempty"`         // vCPUs
	MemoryBytes int64   `json:"memory_bytes,omitempty"` // bytes
	PIDs        int64   `json:"pids,omitempty"`         // tasks
}

// Sandbox is the stored record of one sandbox.
type Sandbox struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	Image     string    `json:"image"`
	ImageID   string    `json:"image_id"`
	Engine    string    `json:"engine"`
	State     string    `json:"state"`
	Reason    string    `json:"reason,omitempty"`
	Hostname  string    `json:"hostname"`
	Env       []string  `json:"env,omitempty"`
	Resources Resources `json:"resources"`
	Parent    string    `json:"parent,omitempty"` // sandbox ID or "snapshot:NAME"
	Created   time.Time `json:"created"`
	Deleted   time.Time `json:"deleted,omitzero"`  // set on tombstones only
	Network   *Network  `json:"network,omitempty"` // nil: policy none
}

// Network is a sandbox's network as set up by the daemon's network manager.
type Network struct {
	Policy  string   `json:"policy"`
	Address string   `json:"address,omitempty"` // in-sandbox address with its prefix length
	Gateway string   `json:"gateway,omitempty"`
	Outer   string   `json:"outer,omitempty"`
	Allow   []string `json:"allow,omitempty"`
	Ports   []Port   `json:"ports,omitempty"`
}

// Port is a published port: 127.0.0.1:HostPort reaches the sandbox's Port.
type Port struct {
	HostPort int    `json:"host_port"`
	Port     int    `json:"port"`
	Protocol string `json:"protocol,omitempty"`
}

// Snapshot is the stored record of a named snapshot. Its files live under
// Dir, with a manifest.json of the same content.
type Snapshot struct {
	Name          string    `json:"name"`
	Sandbox       string    `json:"sandbox"`
	SandboxName   string    `json:"sandbox_name"`
	Parent        string    `json:"parent,omitempty"`
	Engine        string    `json:"engine"`
	EngineVersion string    `json:"engine_version"`
	Image         string    `json:"image"`
	ImageID       string    `json:"image_id"`
	Hostname      string    `json:"hostname,omitempty"`
	Env           []string  `json:"env,omitempty"`
	Resources     Resources `json:"resources"`
	Created       time.Time `json:"created"`
	SizeBytes     int64     `json:"size_bytes"`
	Checksum      string    `json:"checksum"`
	SourcePauseNS int64     `json:"source_pause_ns"`
	Network       *Network  `json:"network,omitempty"`
}

// Store is the daemon's database.
type Store struct {
	db *bolt.DB
}

// Open opens (creating if needed) the database at path. It fails quickly
// if another process holds the file.
func Open(path string) (*Store, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		return nil, fmt.Errorf("opening store %s: %w", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketSandboxes, bucketNames, bucketTombstones, bucketSnapshots} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("initializing store %s: %w", path, err)
	}
	return &Store{db: db}, nil
}

// Close closes the database. It may be called once.
func (s *Store) Close() error { return s.db.Close() }

// CreateSandbox adds a record. It fails with errdefs.ErrAlreadyExists if the
// ID or the name is taken.
func (s *Store) CreateSandbox(sb *Sandbox) error {
	if sb.ID == "" || sb.Name == "" {
		return fmt.Errorf("creating sandbox record: empty id or name: %w", errdefs.ErrInvalidArgument)
	}
	return s.db.Update(func(tx *bolt.Tx) error {
		b, names := tx.Bucket(bucketSandboxes), tx.Bucket(bucketNames)
		if b.Get([]byte(sb.ID)) != nil {
			return fmt.Errorf("sandbox %s: %w", sb.ID, errdefs.ErrAlreadyExists)
		}
		if names.Get([]byte(sb.Name)) != nil {
			return fmt.Errorf("sandbox name %q is taken: %w", sb.Name, errdefs.ErrAlreadyExists)
		}
		v, err := json.Marshal(sb)
		if err != nil {
			return err
		}
		if err := b.Put([]byte(sb.ID), v); err != nil {
			return err
		}
		return names.Put([]byte(sb.Name), []byte(sb.ID))
	})
}

// UpdateSandbox replaces an existing record (the name cannot change). It
// fails with errdefs.ErrNotFound if there is none.
func (s *Store) UpdateSandbox(sb *Sandbox) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketSandboxes)
		old := b.Get([]byte(sb.ID))
		if old == nil {
			return fmt.Errorf("sandbox %s: %w", sb.ID, errdefs.ErrNotFound)
		}
		var o Sandbox
		if err := json.Unmarshal(old, &o); err != nil {
			return fmt.Errorf("decoding sandbox %s: %w", sb.ID, err)
		}
		if o.Name != sb.Name {
			return fmt.Errorf("renaming sandbox %s: %w", sb.ID, errdefs.ErrInvalidArgument)
		}
		v, err := json.Marshal(sb)
		if err != nil {
			return err
		}
		return b.Put([]byte(sb.ID), v)
	})
}

// GetSandbox returns the record with id, or errdefs.ErrNotFound.
func (s *Store) GetSandbox(id string) (*Sandbox, error) {
	var sb *Sandbox
	err := s.db.View(func(tx *bolt.Tx) error {
		var err error
		sb, err = getSandbox(tx, id)
		return err
	})
	return sb, err
}

func getSandbox(tx *bolt.Tx, id string) (*Sandbox, error) {
	v := tx.Bucket(bucketSandboxes).Get([]byte(id))
	if v == nil {
		return nil, fmt.Errorf("sandbox %q not found: %w", id, errdefs.ErrNotFound)
	}
	var sb Sandbox
	if err := json.Unmarshal(v, &sb); err != nil {
		return nil, fmt.Errorf("decoding sandbox %s: %w", id, err)
	}
	return &sb, nil
}

// FindSandbox resolves ref as an ID, a name, or a unique ID prefix of at
// least 4 characters. It returns errdefs.ErrNotFound if nothing matches and
// errdefs.ErrInvalidArgument if a prefix is ambiguous.
func (s *Store) FindSandbox(ref string) (*Sandbox, error) {
	var sb *Sandbox
	err := s.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketSandboxes)
		if b.Get([]byte(ref)) != nil {
			var err error
			sb, err = getSandbox(tx, ref)
			return err
		}
		if id := tx.Bucket(bucketNames).Get([]byte(ref)); id != nil {
			var err error
			sb, err = getSandbox(tx, string(id))
			return err
		}
		if len(ref) >= 4 && len(ref) < IDLen {
			var match string
			c := b.Cursor()
			for k, _ := c.Seek([]byte(ref)); k != nil && len(k) >= len(ref) && string(k[:len(ref)]) == ref; k, _ = c.Next() {
				if match != "" {
					return fmt.Errorf("sandbox prefix %q is ambiguous: %w", ref, errdefs.ErrInvalidArgument)
				}
				match = string(k)
			}
			if match != "" {
				var err error
				sb, err = getSandbox(tx, match)
				return err
			}
		}
		return fmt.Errorf("sandbox %q not found: %w", ref, errdefs.ErrNotFound)
	})
	return sb, err
}

// ListSandboxes returns every live record ordered by creation time.
func (s *Store) ListSandboxes() ([]Sandbox, error) {
	return s.list(bucketSandboxes)
}

// ListTombstones returns the records of deleted sandboxes.
func (s *Store) ListTombstones() ([]Sandbox, error) {
	return s.list(bucketTombstones)
}

func (s *Store) list(bucket []byte) ([]Sandbox, error) {
	var out []Sandbox
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucket).ForEach(func(k, v []byte) error {
			var sb Sandbox
			if err := json.Unmarshal(v, &sb); err != nil {
				return fmt.Errorf("decoding sandbox %s: %w", k, err)
			}
			out = append(out, sb)
			return nil
		})
	})
	sort.SliceStable(out, func(i, j int) bool {
		if !out[i].Created.Equal(out[j].Created) {
			return out[i].Created.Before(out[j].Created)
		}
		return out[i].ID < out[j].ID
	})
	return out, err
}

// DeleteSandbox removes the record with id and frees its name. With
// tombstone set, a copy is kept for lineage (ListTombstones). Deleting an
// unknown ID returns errdefs.ErrNotFound.
func (s *Store) DeleteSandbox(id string, tombstone bool) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		sb, err := getSandbox(tx, id)
		if err != nil {
			return err
		}
		if err := tx.Bucket(bucketSandboxes).Delete([]byte(id)); err != nil {
			return err
		}
		names := tx.Bucket(bucketNames)
		if string(names.Get([]byte(sb.Name))) == id {
			if err := names.Delete([]byte(sb.Name)); err != nil {
				return err
			}
		}
		if !tombstone {
			return nil
		}
		sb.Deleted = time.Now().UTC()
		sb.State = "deleted"
		v, err := json.Marshal(sb)
		if err != nil {
			return err
		}
		return tx.Bucket(bucketTombstones).Put([]byte(id), v)
	})
}

// PutSnapshot adds a snapshot record; errdefs.ErrAlreadyExists if the name
// is taken.
func (s *Store) PutSnapshot(sn *Snapshot) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketSnapshots)
		if b.Get([]byte(sn.Name)) != nil {
			return fmt.Errorf("snapshot %q: %w", sn.Name, errdefs.ErrAlreadyExists)
		}
		v, err := json.Marshal(sn)
		if err != nil {
			return err
		}
		return b.Put([]byte(sn.Name), v)
	})
}

// GetSnapshot returns the snapshot record name, or errdefs.ErrNotFound.
func (s *Store) GetSnapshot(name string) (*Snapshot, error) {
	var sn Snapshot
	err := s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketSnapshots).Get([]byte(name))
		if v == nil {
			return fmt.Errorf("snapshot %q not found: %w", name, errdefs.ErrNotFound)
		}
		return json.Unmarshal(v, &sn)
	})
	if err != nil {
		return nil, err
	}
	return &sn, nil
}

// ListSnapshots returns every snapshot, oldest first.
func (s *Store) ListSnapshots() ([]Snapshot, error) {
	var out []Snapshot
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketSnapshots).ForEach(func(k, v []byte) error {
			var sn Snapshot
			if err := json.Unmarshal(v, &sn); err != nil {
				return fmt.Errorf("decoding snapshot %s: %w", k, err)
			}
			out = append(out, sn)
			return nil
		})
	})
	sort.SliceStable(out, func(i, j int) bool { return out[i].Created.Before(out[j].Created) })
	return out, err
}

// DeleteSnapshot removes the snapshot record name; errdefs.ErrNotFound if
// there is none.
func (s *Store) DeleteSnapshot(name string) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketSnapshots)
		if b.Get([]byte(name)) == nil {
			return fmt.Errorf("snapshot %q not found: %w", name, errdefs.ErrNotFound)
		}
		return b.Delete([]byte(name))
	})
}
