// Package memlimit sets a process's soft memory limit (the Go runtime's,
// debug.SetMemoryLimit) from a setting, the container's cgroup memory
// limit or a documented default, unless GOMEMLIMIT already set one. A soft
// limit makes the collector run harder as the heap nears it, and return
// free memory to the OS, rather than let the heap grow to twice the live
// set (GOGC=100): after a sync worker's ramp that is the difference between
// 0.9 and 2 GiB of RSS for the same 20,000 hot mailboxes (docs/capacity.md,
// "Sync worker memory").
package memlimit

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math"
	"os"
	"path"
	"runtime/debug"
	"strconv"
	"strings"
	"unicode"
)

// Fraction of a container's memory limit taken as the soft limit by
// Auto: the rest is for memory the Go runtime does not count (the
// binary's text, C libraries, the kernel's socket buffers charged to the
// cgroup) and for the collector to catch up before the container is killed.
const Fraction = 0.9

// Fallback is Auto's limit without a container limit: a sync worker of the
// documented size (20,000 hot mailboxes, 0.7 GiB live) fits under 1 GiB.
const Fallback = 900 << 20

// Spec is a parsed memory-limit setting.
type Spec struct {
	// Off: no limit is set (the runtime's default, none, or GOMEMLIMIT).
	Off bool
	// Bytes: this limit; 0 with Off false is Auto.
	Bytes int64
}

// Auto is the default: Fraction of the container's limit, else Fallback.
var Auto = Spec{}

// ErrInvalid is the error of a setting that does not parse.
var ErrInvalid = errors.New("invalid memory limit")

// Parse reads a setting: "auto", "off", or a size in bytes with an
// optional unit B, KiB, MiB, GiB or TiB (as GOMEMLIMIT takes it), at least
// 64 MiB.
func Parse(s string) (Spec, error) {
	if strings.ContainsFunc(s, unicode.IsControl) {
		return Spec{}, fmt.Errorf("%w %q: control characters", ErrInvalid, printable(s))
	}
	t := strings.TrimSpace(s)
	switch strings.ToLower(t) {
	case "auto", "":
		return Auto, nil
	case "off", "none":
		return Spec{Off: true}, nil
	}
	n, err := parseSize(t)
	if err != nil {
		return Spec{}, fmt.Errorf("%w %q: %v; want auto, off, or a size such as 900MiB or 2GiB", ErrInvalid, printable(s), err)
	}
	if n < 64<<20 {
		return Spec{}, fmt.Errorf("%w %q: below 64MiB, the process would do little but collect garbage", ErrInvalid, printable(s))
	}
	return Spec{Bytes: n}, nil
}

// printable quotes at most 64 bytes of a hostile setting.
func printable(s string) string {
	if len(s) > 64 {
		s = s[:64] + "..."
	}
	q := strconv.QuoteToASCII(s)
	return q[1 : len(q)-1]
}

func parseSize(s string) (int64, error) {
	units := []struct {
		suffix string
		mul    int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"B", 1}}
	mul := int64(1)
	for _, u := range units {
		if rest, ok := strings.CutSuffix(s, u.suffix); ok {
			s, mul = rest, u.mul
			break
		}
	}
	if s == "" || strings.TrimLeft(s, "0123456789") != "" {
		return 0, errors.New("not a whole number of bytes with a unit B, KiB, MiB, GiB or TiB")
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n > math.MaxInt64/mul {
		return 0, errors.New("too large")
	}
	return n * mul, nil
}

// Choice is the limit Apply chose, and why.
type Choice struct {
	// Bytes is the limit in effect (math.MaxInt64: none).
	Bytes int64
	// Source: "GOMEMLIMIT", "setting", "cgroup", "default" or "off".
	Source string
	// Container is the container's memory limit found (0: none).
	Container int64
}

// Choose works out the limit for spec without applying it. env is
// GOMEMLIMIT's value, root the file system holding /proc and /sys.
func Choose(spec Spec, env string, root fs.FS) (Choice, error) {
	if env != "" {
		// The runtime read it at start; it is the operator's explicit word.
		return Choice{Bytes: debug.SetMemoryLimit(-1), Source: "GOMEMLIMIT"}, nil
	}
	if spec.Off {
		return Choice{Bytes: math.MaxInt64, Source: "off"}, nil
	}
	if spec.Bytes > 0 {
		return Choice{Bytes: spec.Bytes, Source: "setting"}, nil
	}
	limit, err := CgroupLimit(root)
	if err != nil {
		return Choice{}, err
	}
	if limit > 0 {
		return Choice{Bytes: int64(float64(limit) * Fraction), Source: "cgroup", Container: limit}, nil
	}
	return Choice{Bytes: Fallback, Source: "default"}, nil
}

// Apply chooses the limit for spec (GOMEMLIMIT from the environment, the
// cgroup from this machine's /proc and /sys), sets it and logs it. An
// unreadable cgroup is logged and the fallback taken: a worker that cannot
// tell its container's size still runs.
func Apply(spec Spec, log *slog.Logger) Choice {
	c, err := Choose(spec, os.Getenv("GOMEMLIMIT"), os.DirFS("/"))
	if err != nil {
		log.Warn("memory limit: the container's limit could not be read; taking the default", "err", err, "default_bytes", Fallback)
		c = Choice{Bytes: Fallback, Source: "default"}
	}
	if c.Source != "GOMEMLIMIT" {
		debug.SetMemoryLimit(c.Bytes)
	}
	if c.Bytes == math.MaxInt64 {
		log.Info("memory limit: none", "source", c.Source)
		return c
	}
	log.Info("memory limit", "bytes", c.Bytes, "mib", c.Bytes>>20, "source", c.Source, "container_bytes", c.Container)
	return c
}

// CgroupLimit returns the memory limit of the cgroup this process is in,
// the smallest along its path up to the hierarchy's root (cgroup v2
// memory.max, else v1 memory.limit_in_bytes); 0 if there is none. root is
// the file system holding proc/self and the cgroup mounts.
func CgroupLimit(root fs.FS) (int64, error) {
	mounts, err := readMounts(root)
	if err != nil {
		return 0, err
	}
	groups, err := fs.ReadFile(root, "proc/self/cgroup")
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil // not Linux, or no cgroups
	}
	if err != nil {
		return 0, err
	}
	v1, v2 := "", ""
	v2seen, v1seen := false, false
	sc := bufio.NewScanner(bytes.NewReader(groups))
	for sc.Scan() {
		// hierarchy-ID:controllers:path
		f := strings.SplitN(sc.Text(), ":", 3)
		if len(f) != 3 {
			continue
		}
		switch {
		case f[0] == "0" && f[1] == "":
			v2, v2seen = f[2], true
		case hasField(f[1], "memory"):
			v1, v1seen = f[2], true
		}
	}
	if m, ok := mounts["cgroup2"]; ok && v2seen {
		if l, found, err := walkLimit(root, m, v2, "memory.max"); err != nil || found {
			return l, err
		}
	}
	if m, ok := mounts["memory"]; ok && v1seen {
		if l, found, err := walkLimit(root, m, v1, "memory.limit_in_bytes"); err != nil || found {
			return l, err
		}
	}
	return 0, nil
}

func hasField(list, want string) bool {
	for f := range strings.SplitSeq(list, ",") {
		if f == want {
			return true
		}
	}
	return false
}

// mount is a cgroup hierarchy's mount: the cgroup path at its root and
// where it is mounted.
type mount struct{ root, point string }

// readMounts finds the cgroup v2 mount ("cgroup2") and the cgroup v1
// memory controller's ("memory") in proc/self/mountinfo.
func readMounts(root fs.FS) (map[string]mount, error) {
	b, err := fs.ReadFile(root, "proc/self/mountinfo")
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	out := map[string]mount{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		// id parent major:minor root mount-point options [optional...] - fstype source super-options
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		f, g := strings.Fields(pre), strings.Fields(post)
		if len(f) < 5 || len(g) < 3 {
			continue
		}
		m := mount{root: unescape(f[3]), point: unescape(f[4])}
		switch {
		case g[0] == "cgroup2":
			if _, dup := out["cgroup2"]; !dup {
				out["cgroup2"] = m
			}
		case g[0] == "cgroup" && hasField(g[2], "memory"):
			if _, dup := out["memory"]; !dup {
				out["memory"] = m
			}
		}
	}
	return out, sc.Err()
}

// unescape undoes mountinfo's octal escapes (\040 for a space).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// noLimit: v1 reports "no limit" as the largest page-aligned int64.
const noLimit = 1 << 62

// walkLimit reads file in the process's cgroup directory and each parent
// up to the mount, returning the smallest limit and whether the directory
// was found. A process in a cgroup namespace, or a container whose own
// cgroup is mounted at the mount point (Docker on v1), sees its cgroup at
// the mount point itself: that is tried when the path is not there.
func walkLimit(root fs.FS, m mount, cgPath, file string) (int64, bool, error) {
	rel, ok := strings.CutPrefix(path.Clean(cgPath), path.Clean(m.root))
	if !ok {
		rel = ""
	}
	point := strings.TrimPrefix(path.Clean(m.point), "/")
	dir := path.Join(point, rel)
	if _, err := fs.Stat(root, path.Join(dir, file)); err != nil {
		dir, rel = point, ""
		if _, err := fs.Stat(root, path.Join(dir, file)); err != nil {
			return 0, false, nil
		}
	}
	best := int64(0)
	for {
		b, err := fs.ReadFile(root, path.Join(dir, file))
		if err == nil {
			l, err := parseLimit(string(b))
			if err != nil {
				return 0, true, fmt.Errorf("%s: %w", path.Join(dir, file), err)
			}
			if l > 0 && (best == 0 || l < best) {
				best = l
			}
		} else if !errors.Is(err, fs.ErrNotExist) {
			return 0, true, err
		}
		if dir == point || dir == "." || dir == "" {
			return best, true, nil
		}
		dir = path.Dir(dir)
	}
}

// parseLimit reads a memory.max or memory.limit_in_bytes value: "max" or
// a huge number is no limit (0).
func parseLimit(s string) (int64, error) {
	s = strings.TrimSpace(s)
	if s == "max" {
		return 0, nil
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("not a memory limit: %q", printable(s))
	}
	if n >= noLimit {
		return 0, nil
	}
	return int64(n), nil
}
