package access

import "slices"

// Reload is what a reload of the tokens file changed, by caller name:
// never a token or its hash. The api role records it in the operator
// audit (WithReloadHook).
type Reload struct {
	Path string
	// Added, Removed and Changed are the caller names the reload added,
	// removed, or gave another token, scopes or source, sorted.
	Added, Removed, Changed []string
	// InvalidLines counts the file's lines that did not parse (the
	// callers they name are out until the file is fixed, see Load).
	InvalidLines int
	// Failed: the file was not loaded at all; the callers in force stay.
	Failed bool
}

// diff is the Reload from the callers in force to next.
func diff(path string, inForce, next []entry, invalid int) Reload {
	r := Reload{Path: path, InvalidLines: invalid}
	for _, n := range next {
		i := slices.IndexFunc(inForce, func(e entry) bool { return e.caller.Name == n.caller.Name })
		switch {
		case i < 0:
			r.Added = append(r.Added, n.caller.Name)
		case !sameEntry(inForce[i], n):
			r.Changed = append(r.Changed, n.caller.Name)
		}
	}
	for _, e := range inForce {
		if !slices.ContainsFunc(next, func(n entry) bool { return n.caller.Name == e.caller.Name }) {
			r.Removed = append(r.Removed, e.caller.Name)
		}
	}
	for _, l := range [][]string{r.Added, r.Removed, r.Changed} {
		slices.Sort(l)
	}
	r.Added, r.Removed, r.Changed = slices.Compact(r.Added), slices.Compact(r.Removed), slices.Compact(r.Changed)
	return r
}

// reported hands r to the reload hook, for reloads after the start (the
// load at start is the process starting, not an operator's change).
func (a *Authenticator) reported(started bool, r Reload) {
	if a.onLoad != nil && started {
		a.onLoad(r)
	}
}
