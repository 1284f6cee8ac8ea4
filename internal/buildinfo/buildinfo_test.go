package buildinfo

import (
	"runtime/debug"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestRead(t *testing.T) {
	t.Parallel()
	bi := func(settings ...debug.BuildSetting) func() (*debug.BuildInfo, bool) {
		return func() (*debug.BuildInfo, bool) {
			return &debug.BuildInfo{GoVersion: "go1.26.8", Settings: settings}, true
		}
	}
	for name, c := range map[string]struct {
		stamped string
		info    func() (*debug.BuildInfo, bool)
		want    Info
		line    string
	}{
		"stamped": {"1.4.0", bi(debug.BuildSetting{Key: "vcs.revision", Value: "abc123"}),
			Info{"1.4.0", "abc123", "go1.26.8"}, "mailplane 1.4.0 (abc123) go1.26.8"},
		"dirty checkout": {"", bi(debug.BuildSetting{Key: "vcs.revision", Value: "abc123"}, debug.BuildSetting{Key: "vcs.modified", Value: "true"}),
			Info{"dev", "abc123+dirty", "go1.26.8"}, "mailplane dev (abc123+dirty) go1.26.8"},
		"outside a checkout": {"", bi(), Info{"dev", "", "go1.26.8"}, "mailplane dev go1.26.8"},
	} {
		got := read(c.stamped, c.info)
		if got != c.want || got.String() != c.line {
			t.Errorf("%s: %+v %q, want %+v %q", name, got, got.String(), c.want, c.line)
		}
	}
}

func TestRegister(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	for range 2 { // a second role in the process reuses the gauge
		if err := Register(reg); err != nil {
			t.Fatal(err)
		}
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(mfs) != 1 || mfs[0].GetName() != "mailplane_build_info" || len(mfs[0].GetMetric()) != 1 {
		t.Fatalf("gathered %v, want one mailplane_build_info series", mfs)
	}
	m := mfs[0].GetMetric()[0]
	labels := map[string]string{}
	for _, l := range m.GetLabel() {
		labels[l.GetName()] = l.GetValue()
	}
	i := Read()
	if m.GetGauge().GetValue() != 1 || labels["version"] != i.Version || labels["revision"] != i.Revision || labels["go_version"] != i.GoVersion {
		t.Fatalf("mailplane_build_info %v = %v, want %+v = 1", labels, m.GetGauge().GetValue(), i)
	}
}
