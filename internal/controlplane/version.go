package controlplane

import (
	"fmt"
	"strconv"
	"strings"
)

// release is a parsed release version, vMAJOR.MINOR.PATCH[-PRE][+BUILD].
type release struct{ major, minor int }

// parseRelease parses a release version; ok is false for what is not one
// (empty, "devel", a Go pseudo-version of an untagged build).
func parseRelease(v string) (r release, ok bool) {
	s := strings.TrimPrefix(v, "v")
	if i := strings.IndexAny(s, "-+"); i >= 0 {
		s = s[:i]
	}
	parts := strings.Split(s, ".")
	if len(parts) != 3 {
		return r, false
	}
	var n [3]int
	for i, p := range parts {
		x, err := strconv.Atoi(p)
		if err != nil || x < 0 {
			return r, false
		}
		n[i] = x
	}
	if n == [3]int{0, 0, 0} { // v0.0.0-…: an untagged build
		return r, false
	}
	return release{n[0], n[1]}, true
}

// CheckAgentVersion decides whether a control plane of version server
// accepts an agent of version agent: one of the same major version and
// the same or the previous minor version, so that a rack is upgraded
// control plane first, then agents (docs/operations.md). An agent newer
// than the control plane, or older than the previous minor, is refused
// with an error naming both versions. Versions that are not releases
// (an agent that sends none, as those before this check did; "devel";
// an untagged build) are accepted: there is nothing to compare.
func CheckAgentVersion(server, agent string) error {
	s, sok := parseRelease(server)
	a, aok := parseRelease(agent)
	if !sok || !aok {
		return nil
	}
	switch {
	case a.major != s.major:
		return fmt.Errorf("%w: agent version %s is another major version than the control plane's %s: run agents of v%d.%d or v%d.%d",
			ErrInvalid, agent, server, s.major, s.minor, s.major, max(s.minor-1, 0))
	case a.minor > s.minor:
		return fmt.Errorf("%w: agent version %s is newer than the control plane's %s: upgrade the control plane first",
			ErrInvalid, agent, server)
	case a.minor < s.minor-1:
		return fmt.Errorf("%w: agent version %s is too old for the control plane's %s, which accepts agents of v%d.%d and v%d.%d: upgrade the agent",
			ErrInvalid, agent, server, s.major, s.minor, s.major, s.minor-1)
	}
	return nil
}
