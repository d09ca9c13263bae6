package agent

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// user is a resolved ExecRequest.User.
type user struct {
	name   string
	uid    uint32
	gid    uint32
	groups []uint32 // supplementary groups
	home   string
}

// passwdFile and groupFile are the databases users are looked up in.
var (
	passwdFile = "/etc/passwd"
	groupFile  = "/etc/group"
)

// lookupUser resolves "user[:group]", each part a name or a number. A
// numeric uid without a passwd entry gets gid 0 and home "/", as in Docker.
// Supplementary groups are the groups that list the user's name.
func lookupUser(spec string) (*user, error) {
	uspec, gspec, hasGroup := strings.Cut(spec, ":")
	if uspec == "" {
		return nil, fmt.Errorf("empty user name")
	}
	entries, err := readColonFile(passwdFile, 7)
	if err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	u := &user{home: "/"}
	found := false
	n, numErr := strconv.ParseUint(uspec, 10, 32)
	for _, e := range entries {
		if (numErr == nil && e[2] == uspec) || (numErr != nil && e[0] == uspec) {
			uid, err1 := strconv.ParseUint(e[2], 10, 32)
			gid, err2 := strconv.ParseUint(e[3], 10, 32)
			if err1 != nil || err2 != nil {
				continue
			}
			u.name, u.uid, u.gid, u.home = e[0], uint32(uid), uint32(gid), e[5]
			found = true
			break
		}
	}
	if !found {
		if numErr != nil {
			return nil, fmt.Errorf("no such user in %s", passwdFile)
		}
		u.uid, u.name = uint32(n), uspec
	}
	if u.home == "" {
		u.home = "/"
	}
	groups, err := readColonFile(groupFile, 4)
	if err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	if hasGroup {
		g, err := strconv.ParseUint(gspec, 10, 32)
		if err != nil {
			ok := false
			for _, e := range groups {
				if e[0] == gspec {
					if g, err = strconv.ParseUint(e[2], 10, 32); err == nil {
						ok = true
						break
					}
				}
			}
			if !ok {
				return nil, fmt.Errorf("no such group %q in %s", gspec, groupFile)
			}
		}
		u.gid = uint32(g)
	}
	u.groups = []uint32{u.gid}
	if found {
		for _, e := range groups {
			gid, err := strconv.ParseUint(e[2], 10, 32)
			if err != nil || uint32(gid) == u.gid {
				continue
			}
			for _, m := range strings.Split(e[3], ",") {
				if m == u.name {
					u.groups = append(u.groups, uint32(gid))
					break
				}
			}
		}
	}
	return u, nil
}

// readColonFile reads a passwd-style file, returning lines with at least
// fields fields.
func readColonFile(path string, fields int) ([][]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out [][]string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		parts := strings.Split(line, ":")
		if len(parts) < fields {
			continue
		}
		out = append(out, parts)
	}
	return out, sc.Err()
}
