package vmimage

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// ModuleSet is a kernel's module index, read from
// /lib/modules/<release>/modules.{dep,softdep,alias,builtin}.
type ModuleSet struct {
	Dir     string              // /lib/modules/<release>
	path    map[string]string   // name -> path relative to Dir
	deps    map[string][]string // name -> names it depends on
	pre     map[string][]string // name -> softdep "pre:" names or aliases
	alias   map[string][]string // exact alias -> names
	builtin map[string]bool
}

// ModName normalizes a module name or path: base name without .ko[.xz|.zst|.gz],
// '-' as '_'.
func ModName(s string) string {
	s = filepath.Base(s)
	if i := strings.Index(s, ".ko"); i >= 0 {
		s = s[:i]
	}
	return strings.ReplaceAll(s, "-", "_")
}

// LoadModules reads the module index of dir (/lib/modules/<release>).
func LoadModules(dir string) (*ModuleSet, error) {
	m := &ModuleSet{Dir: dir, path: map[string]string{}, deps: map[string][]string{},
		pre: map[string][]string{}, alias: map[string][]string{}, builtin: map[string]bool{}}
	if err := eachLine(filepath.Join(dir, "modules.dep"), func(line string) {
		p, rest, ok := strings.Cut(line, ":")
		if !ok {
			return
		}
		n := ModName(p)
		m.path[n] = p
		for _, d := range strings.Fields(rest) {
			m.deps[n] = append(m.deps[n], ModName(d))
		}
	}); err != nil {
		return nil, err
	}
	_ = eachLine(filepath.Join(dir, "modules.builtin"), func(line string) { m.builtin[ModName(line)] = true })
	_ = eachLine(filepath.Join(dir, "modules.softdep"), func(line string) {
		f := strings.Fields(line)
		if len(f) < 3 || f[0] != "softdep" {
			return
		}
		n, pre := ModName(f[1]), false
		for _, w := range f[2:] {
			switch w {
			case "pre:":
				pre = true
			case "post:":
				pre = false
			default:
				if pre {
					m.pre[n] = append(m.pre[n], w)
				}
			}
		}
	})
	_ = eachLine(filepath.Join(dir, "modules.alias"), func(line string) {
		f := strings.Fields(line)
		if len(f) == 3 && f[0] == "alias" && !strings.ContainsAny(f[1], "*?[") {
			k := strings.ReplaceAll(f[1], "-", "_")
			m.alias[k] = append(m.alias[k], ModName(f[2]))
		}
	})
	return m, nil
}

// Resolve returns the module files (relative to Dir) needed to load names,
// dependencies and softdep "pre:" modules first, in load order, without
// duplicates. Built-in modules are skipped; unknown names are an error.
func (m *ModuleSet) Resolve(names ...string) ([]string, error) {
	var out []string
	seen := map[string]bool{}
	var visit func(n string, stack []string) error
	visit = func(n string, stack []string) error {
		n = ModName(n)
		if as, ok := m.alias[n]; ok && m.path[n] == "" {
			// Every module providing the alias: the guest loads those its
			// CPU supports.
			for _, a := range as {
				if err := visit(a, stack); err != nil {
					return err
				}
			}
			return nil
		}
		if seen[n] || m.builtin[n] {
			return nil
		}
		p, ok := m.path[n]
		if !ok {
			return fmt.Errorf("kernel module %q not in %s/modules.dep", n, m.Dir)
		}
		seen[n] = true
		for _, s := range m.pre[n] {
			if err := visit(s, append(stack, n)); err != nil {
				return err
			}
		}
		deps := m.deps[n]
		// modules.dep lists the deepest dependency last; load it first.
		for i := len(deps) - 1; i >= 0; i-- {
			if err := visit(deps[i], append(stack, n)); err != nil {
				return err
			}
		}
		out = append(out, p)
		return nil
	}
	for _, n := range names {
		if err := visit(n, nil); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func eachLine(path string, fn func(string)) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" && !strings.HasPrefix(l, "#") {
			fn(l)
		}
	}
	return sc.Err()
}
