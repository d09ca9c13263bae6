package sdktest

import (
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	v1 "github.com/k7-dev/k7/api/v1"
)

// forkRoutes serves forks, snapshots, restores and the fork tree.
func (s *Server) forkRoutes(mux *http.ServeMux) {
	mux.HandleFunc("POST /v1/sandboxes/{id}/fork", s.withSandbox(func(w http.ResponseWriter, r *http.Request, sb *v1.Sandbox) {
		var req v1.ForkRequest
		if !decode(w, r, &req) || !validCount(w, req.Count) {
			return
		}
		count := max(req.Count, 1)
		for _, p := range req.Ports {
			if count > 1 && p.HostPort != 0 {
				WriteError(w, 400, v1.CodeInvalidArgument, "host ports must be 0 when forking more than one child")
				return
			}
		}
		tmpl := *sb
		tmpl.Parent, tmpl.Stats = sb.ID, nil
		if req.Ports != nil {
			tmpl.Ports = req.Ports
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		if !running(w, sb) {
			return
		}
		res, ok := s.startChildren(w, s.childNames(req.Name, sb.Name+"-fork", count, ""), tmpl, s.filesOf(sb.ID))
		if ok {
			res.Source, res.SourcePauseNS = sb.ID, 100
			writeJSON(w, 201, res)
		}
	}))
	mux.HandleFunc("POST /v1/sandboxes/{id}/snapshots", s.withSandbox(func(w http.ResponseWriter, r *http.Request, sb *v1.Sandbox) {
		var req v1.SnapshotRequest
		if !decode(w, r, &req) {
			return
		}
		if req.Name == "" {
			WriteError(w, 400, v1.CodeInvalidArgument, "a snapshot needs a name")
			return
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		if _, ok := s.snapshots[req.Name]; ok {
			WriteError(w, 409, v1.CodeAlreadyExists, fmt.Sprintf("snapshot %q already exists", req.Name))
			return
		}
		if !running(w, sb) {
			return
		}
		files := s.filesOf(sb.ID)
		size := int64(1 << 20)
		for _, b := range files {
			size += int64(len(b))
		}
		sn := &v1.Snapshot{Name: req.Name, Sandbox: sb.ID, SandboxName: sb.Name, Parent: sb.Parent,
			Engine: sb.Engine, EngineVersion: Version, Image: sb.Image, ImageID: sb.ImageID,
			Env: sb.Env, Resources: sb.Resources, Created: time.Now().UTC(), SizeBytes: size,
			Checksum: fmt.Sprintf("sha256-chunked:%064x", len(s.snapshots)+1), SourcePauseNS: 100,
			Network: sb.Network, Ports: sb.Ports}
		s.snapshots[req.Name] = sn
		s.snapFiles[req.Name] = files
		out := *sn
		out.LatencyNS = 1000
		writeJSON(w, 201, out)
	}))
	mux.HandleFunc("GET /v1/snapshots", func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		defer s.mu.Unlock()
		l := v1.SnapshotList{Snapshots: s.sortedSnapshots()}
		for _, sn := range l.Snapshots {
			l.TotalBytes += sn.SizeBytes
		}
		writeJSON(w, 200, l)
	})
	mux.HandleFunc("GET /v1/snapshots/{name}", s.withSnapshot(func(w http.ResponseWriter, r *http.Request, sn *v1.Snapshot) {
		writeJSON(w, 200, sn)
	}))
	mux.HandleFunc("DELETE /v1/snapshots/{name}", s.withSnapshot(func(w http.ResponseWriter, r *http.Request, sn *v1.Snapshot) {
		s.mu.Lock()
		defer s.mu.Unlock()
		delete(s.snapshots, sn.Name)
		delete(s.snapFiles, sn.Name)
		writeJSON(w, 200, v1.OpResult{ID: sn.Name, State: "deleted"})
	}))
	mux.HandleFunc("POST /v1/snapshots/{name}/restore", s.withSnapshot(func(w http.ResponseWriter, r *http.Request, sn *v1.Snapshot) {
		var req v1.RestoreRequest
		if !decode(w, r, &req) || !validCount(w, req.Count) {
			return
		}
		tmpl := v1.Sandbox{Image: sn.Image, ImageID: sn.ImageID, Engine: sn.Engine, Env: sn.Env,
			Resources: sn.Resources, Network: sn.Network, Ports: sn.Ports, Parent: sn.Name}
		s.mu.Lock()
		defer s.mu.Unlock()
		res, ok := s.startChildren(w, s.childNames("", sn.Name+"-restore", max(req.Count, 1), req.Name), tmpl, s.snapFiles[sn.Name])
		if ok {
			res.Source = sn.Name
			writeJSON(w, 201, res)
		}
	}))
	mux.HandleFunc("POST /v1/snapshots/prune", func(w http.ResponseWriter, r *http.Request) {
		var req v1.SnapshotPruneRequest
		if !decode(w, r, &req) {
			return
		}
		if req.KeepLast < 0 || req.OlderThanNS < 0 {
			WriteError(w, 400, v1.CodeInvalidArgument, "keep_last and older_than_ns must not be negative")
			return
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		res := v1.SnapshotPruneResult{Removed: []string{}, LatencyNS: 10}
		all := s.sortedSnapshots()
		for i := range all { // newest first
			sn := all[len(all)-1-i]
			if i < req.KeepLast || req.OlderThanNS > 0 && time.Since(sn.Created) < time.Duration(req.OlderThanNS) {
				continue
			}
			delete(s.snapshots, sn.Name)
			delete(s.snapFiles, sn.Name)
			res.Removed = append(res.Removed, sn.Name)
			res.FreedBytes += sn.SizeBytes
		}
		writeJSON(w, 200, res)
	})
	mux.HandleFunc("GET /v1/tree", func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		defer s.mu.Unlock()
		t, ok := s.tree(r.URL.Query().Get("root"))
		if !ok {
			notFound(w, "sandbox or snapshot", r.URL.Query().Get("root"))
			return
		}
		writeJSON(w, 200, t)
	})
}

func validCount(w http.ResponseWriter, n int) bool {
	if n < 0 {
		WriteError(w, 400, v1.CodeInvalidArgument, fmt.Sprintf("invalid count %d", n))
		return false
	}
	return true
}

func running(w http.ResponseWriter, sb *v1.Sandbox) bool {
	if sb.State != v1.StateRunning {
		WriteError(w, 412, v1.CodeFailedPrecondition, fmt.Sprintf("sandbox %s is %s, not running", sb.ID, sb.State))
		return false
	}
	return true
}

// withSnapshot resolves {name} and passes h a copy of the snapshot.
func (s *Server) withSnapshot(h func(w http.ResponseWriter, r *http.Request, sn *v1.Snapshot)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		sn, ok := s.snapshots[r.PathValue("name")]
		var cp v1.Snapshot
		if ok {
			cp = *sn
		}
		s.mu.Unlock()
		if !ok {
			notFound(w, "snapshot", r.PathValue("name"))
			return
		}
		h(w, r, &cp)
	}
}

// sortedSnapshots returns the snapshots, oldest first; s.mu is held.
func (s *Server) sortedSnapshots() []v1.Snapshot {
	return sortedValues(s.snapshots, func(a, b *v1.Snapshot) bool {
		if !a.Created.Equal(b.Created) {
			return a.Created.Before(b.Created)
		}
		return a.Name < b.Name
	})
}

// filesOf returns a sandbox's files by path; s.mu is held.
func (s *Server) filesOf(id string) map[string][]byte {
	files := map[string][]byte{}
	for k, b := range s.files {
		if p, ok := strings.CutPrefix(k, id+":"); ok {
			files[p] = b
		}
	}
	return files
}

// childNames names count children: single for one child when given, else
// PREFIX-1..N (PREFIX being single or prefix), else DEFAULT-n numbered after
// the highest such name used so far; s.mu is held.
func (s *Server) childNames(prefix, def string, count int, single string) []string {
	if single != "" && count == 1 {
		return []string{single}
	}
	if single != "" {
		prefix = single
	}
	next := 1
	if prefix == "" {
		prefix = def
		for _, m := range []map[string]*v1.Sandbox{s.sandboxes, s.deleted} {
			for _, sb := range m {
				if n, err := strconv.Atoi(strings.TrimPrefix(sb.Name, def+"-")); err == nil && n >= next {
					next = n + 1
				}
			}
		}
	}
	names := make([]string, count)
	for i := range names {
		names[i] = fmt.Sprintf("%s-%d", prefix, next+i)
	}
	return names
}

// startChildren starts a sandbox from tmpl for each name, with files; it
// answers 409 if a name is taken. s.mu is held.
func (s *Server) startChildren(w http.ResponseWriter, names []string, tmpl v1.Sandbox, files map[string][]byte) (*v1.ForkResult, bool) {
	for _, n := range names {
		if s.lookup(n) != nil {
			WriteError(w, 409, v1.CodeAlreadyExists, fmt.Sprintf("sandbox name %q already exists", n))
			return nil, false
		}
	}
	res := &v1.ForkResult{Children: []v1.ForkChild{}, LatencyNS: 1000}
	for _, n := range names {
		tmpl.Name = n
		sb := s.newSandbox(tmpl)
		for p, b := range files {
			s.files[sb.ID+":"+p] = b
		}
		res.Children = append(res.Children, v1.ForkChild{Sandbox: *sb, ReadyNS: 500})
	}
	return res, true
}

// tree builds the fork tree, or the subtree under root (a sandbox ID or
// name, or a snapshot name); false if root is unknown. Subtrees that hold
// only deleted sandboxes are left out. s.mu is held.
func (s *Server) tree(root string) (*v1.Tree, bool) {
	type node struct {
		v1.TreeNode
		parent  string
		created time.Time
		kids    []string
	}
	nodes := map[string]*node{}
	for _, m := range []map[string]*v1.Sandbox{s.sandboxes, s.deleted} {
		for _, sb := range m {
			nodes["sb:"+sb.ID] = &node{TreeNode: v1.TreeNode{Kind: "sandbox", ID: sb.ID, Name: sb.Name, State: sb.State}, parent: sb.Parent, created: sb.Created}
		}
	}
	for _, sn := range s.snapshots {
		nodes["sn:"+sn.Name] = &node{TreeNode: v1.TreeNode{Kind: "snapshot", ID: sn.Name, Name: sn.Name}, parent: "sb:" + sn.Sandbox, created: sn.Created}
	}
	keys := make([]string, 0, len(nodes))
	for k, n := range nodes {
		keys = append(keys, k)
		if n.Kind == "sandbox" && n.parent != "" { // a sandbox ID or a snapshot name
			if _, ok := nodes["sb:"+n.parent]; ok {
				n.parent = "sb:" + n.parent
			} else {
				n.parent = "sn:" + n.parent
			}
		}
	}
	sort.Slice(keys, func(i, j int) bool {
		a, b := nodes[keys[i]], nodes[keys[j]]
		if !a.created.Equal(b.created) {
			return a.created.Before(b.created)
		}
		return keys[i] < keys[j]
	})
	var roots []string
	for _, k := range keys {
		if p, ok := nodes[nodes[k].parent]; ok {
			p.kids = append(p.kids, k)
		} else {
			roots = append(roots, k)
		}
	}
	var live func(k string) bool
	live = func(k string) bool {
		if nodes[k].State != "deleted" {
			return true
		}
		for _, c := range nodes[k].kids {
			if live(c) {
				return true
			}
		}
		return false
	}
	var build func(k string) v1.TreeNode
	build = func(k string) v1.TreeNode {
		out := nodes[k].TreeNode
		for _, c := range nodes[k].kids {
			if live(c) {
				out.Children = append(out.Children, build(c))
			}
		}
		return out
	}
	t := &v1.Tree{Roots: []v1.TreeNode{}}
	if root != "" {
		k := ""
		if sb := s.lookup(root); sb != nil {
			k = "sb:" + sb.ID
		} else if _, ok := nodes["sb:"+root]; ok {
			k = "sb:" + root
		} else if _, ok := nodes["sn:"+root]; ok {
			k = "sn:" + root
		} else {
			return nil, false
		}
		t.Roots = append(t.Roots, build(k))
		return t, true
	}
	for _, k := range roots {
		if live(k) {
			t.Roots = append(t.Roots, build(k))
		}
	}
	return t, true
}
