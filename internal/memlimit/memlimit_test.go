package memlimit

import (
	"errors"
	"io"
	"log/slog"
	"math"
	"runtime/debug"
	"strings"
	"testing"
	"testing/fstest"
	"unicode"
)

func TestParse(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]Spec{
		"auto": Auto, "": Auto, " AUTO ": Auto, "off": {Off: true}, "none": {Off: true},
		"900MiB": {Bytes: 900 << 20}, "2GiB": {Bytes: 2 << 30}, "1073741824": {Bytes: 1 << 30},
		"1073741824B": {Bytes: 1 << 30}, "65536KiB": {Bytes: 64 << 20}, "1TiB": {Bytes: 1 << 40},
	} {
		got, err := Parse(in)
		if err != nil || got != want {
			t.Errorf("Parse(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
}

// TestParseRefuses: sizes that do not parse, or that would leave the
// process collecting garbage all the time, are refused with ErrInvalid and
// a message free of the input's control characters.
func TestParseRefuses(t *testing.T) {
	t.Parallel()
	for _, in := range []string{"10MiB", "0", "1.5GiB", "-1GiB", "9GB", "1 GiB", "GiB", "99999999999TiB",
		"99999999999999999999", "2GiB\x1b[31m", "auto\n", "\u202e900MiB", strings.Repeat("9", 500)} {
		_, err := Parse(in)
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("Parse(%q) = %v, want ErrInvalid", in, err)
			continue
		}
		if strings.IndexFunc(err.Error(), func(r rune) bool { return unicode.IsControl(r) || r > unicode.MaxASCII }) >= 0 {
			t.Errorf("Parse(%q): the error repeats raw input: %q", in, err)
		}
		if len(err.Error()) > 300 {
			t.Errorf("Parse(%q): error of %d bytes", in, len(err.Error()))
		}
	}
}

func mountinfo(lines ...string) *fstest.MapFile {
	return &fstest.MapFile{Data: []byte(strings.Join(lines, "\n") + "\n")}
}

const (
	v2Mount     = "30 22 0:27 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate"
	v1Memory    = "34 30 0:31 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory"
	v1CPU       = "31 30 0:28 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu"
	v1Unlimited = "9223372036854771712\n"
)

func TestCgroupLimit(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		fs   fstest.MapFS
		want int64
	}{
		{"v2 in its own namespace", fstest.MapFS{
			"proc/self/mountinfo":      mountinfo(v2Mount),
			"proc/self/cgroup":         {Data: []byte("0::/\n")},
			"sys/fs/cgroup/memory.max": {Data: []byte("1073741824\n")},
		}, 1 << 30},
		{"v2 nested: the parent's limit binds", fstest.MapFS{
			"proc/self/mountinfo":                        mountinfo(v2Mount),
			"proc/self/cgroup":                           {Data: []byte("0::/kubepods/pod1/ctr\n")},
			"sys/fs/cgroup/kubepods/pod1/ctr/memory.max": {Data: []byte("max\n")},
			"sys/fs/cgroup/kubepods/pod1/memory.max":     {Data: []byte("2147483648\n")},
			"sys/fs/cgroup/kubepods/memory.max":          {Data: []byte("8589934592\n")},
		}, 2 << 30},
		{"v2 without a limit", fstest.MapFS{
			"proc/self/mountinfo":      mountinfo(v2Mount),
			"proc/self/cgroup":         {Data: []byte("0::/\n")},
			"sys/fs/cgroup/memory.max": {Data: []byte("max\n")},
		}, 0},
		{"v1, Docker: the container's cgroup at the mount point", fstest.MapFS{
			"proc/self/mountinfo":                        mountinfo(v1CPU, strings.Replace(v1Memory, " / ", " /docker/abc ", 1)),
			"proc/self/cgroup":                           {Data: []byte("5:cpu:/docker/abc\n4:memory:/docker/abc\n0::/\n")},
			"sys/fs/cgroup/memory/memory.limit_in_bytes": {Data: []byte("536870912\n")},
		}, 512 << 20},
		{"v1 hybrid (this development machine's shape): unlimited", fstest.MapFS{
			"proc/self/mountinfo": mountinfo(v1CPU, v1Memory, "40 30 0:37 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw"),
			"proc/self/cgroup":    {Data: []byte("4:memory:/process_api/66cf\n0::/\n")},
			"sys/fs/cgroup/memory/process_api/66cf/memory.limit_in_bytes": {Data: []byte(v1Unlimited)},
			"sys/fs/cgroup/memory/process_api/memory.limit_in_bytes":      {Data: []byte(v1Unlimited)},
			"sys/fs/cgroup/memory/memory.limit_in_bytes":                  {Data: []byte(v1Unlimited)},
		}, 0},
		{"v1 hybrid with a limit on the process's group", fstest.MapFS{
			"proc/self/mountinfo": mountinfo(v1CPU, v1Memory, "40 30 0:37 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw"),
			"proc/self/cgroup":    {Data: []byte("4:memory:/process_api/66cf\n0::/\n")},
			"sys/fs/cgroup/memory/process_api/66cf/memory.limit_in_bytes": {Data: []byte("3221225472\n")},
			"sys/fs/cgroup/memory/memory.limit_in_bytes":                  {Data: []byte(v1Unlimited)},
		}, 3 << 30},
		{"no cgroups at all", fstest.MapFS{}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := CgroupLimit(tc.fs)
			if err != nil || got != tc.want {
				t.Fatalf("CgroupLimit = %d, %v; want %d", got, err, tc.want)
			}
		})
	}
}

// TestCgroupLimitRefusesGarbage: a memory.max that is not a number is an
// error (Apply then logs it and takes the fallback), never a limit.
func TestCgroupLimitRefusesGarbage(t *testing.T) {
	t.Parallel()
	_, err := CgroupLimit(fstest.MapFS{
		"proc/self/mountinfo":      mountinfo(v2Mount),
		"proc/self/cgroup":         {Data: []byte("0::/\n")},
		"sys/fs/cgroup/memory.max": {Data: []byte("12\x1b[0mGiB\n")},
	})
	if err == nil || strings.ContainsRune(err.Error(), 0x1b) {
		t.Fatalf("err = %v, want a refusal without the raw bytes", err)
	}
}

func TestChoose(t *testing.T) {
	t.Parallel()
	limited := fstest.MapFS{
		"proc/self/mountinfo":      mountinfo(v2Mount),
		"proc/self/cgroup":         {Data: []byte("0::/\n")},
		"sys/fs/cgroup/memory.max": {Data: []byte("1073741824\n")},
	}
	for _, tc := range []struct {
		name string
		spec Spec
		env  string
		fs   fstest.MapFS
		want Choice
	}{
		{"auto in a 1 GiB container", Auto, "", limited, Choice{Bytes: 966367641, Source: "cgroup", Container: 1 << 30}},
		{"auto without a container limit", Auto, "", fstest.MapFS{}, Choice{Bytes: Fallback, Source: "default"}},
		{"a size wins over the container", Spec{Bytes: 700 << 20}, "", limited, Choice{Bytes: 700 << 20, Source: "setting"}},
		{"off", Spec{Off: true}, "", limited, Choice{Bytes: math.MaxInt64, Source: "off"}},
		{"GOMEMLIMIT wins over everything", Spec{Bytes: 700 << 20}, "123MiB", limited, Choice{Bytes: debug.SetMemoryLimit(-1), Source: "GOMEMLIMIT"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Choose(tc.spec, tc.env, tc.fs)
			if err != nil || got != tc.want {
				t.Fatalf("Choose = %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

// TestApplySetsTheRuntimeLimit: Apply sets what it chose (not parallel:
// the limit is the process's).
func TestApplySetsTheRuntimeLimit(t *testing.T) {
	t.Setenv("GOMEMLIMIT", "")
	prev := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(prev) })
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if c := Apply(Spec{Bytes: 777 << 20}, log); c.Source != "setting" || debug.SetMemoryLimit(-1) != 777<<20 {
		t.Fatalf("Apply = %+v, runtime limit %d; want 777 MiB from the setting", c, debug.SetMemoryLimit(-1))
	}
	if c := Apply(Spec{Off: true}, log); c.Source != "off" || debug.SetMemoryLimit(-1) != math.MaxInt64 {
		t.Fatalf("Apply(off) = %+v, runtime limit %d; want none", c, debug.SetMemoryLimit(-1))
	}
}
