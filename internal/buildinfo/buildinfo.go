// Package buildinfo says which build of mailplane is running: the version
// stamped at build time (make build and the image pass it with -ldflags
// "-X github.com/mailplane/mailplane/internal/buildinfo.version=..."), else
// the VCS revision Go recorded, and the Go version. Every role exports it as
// the mailplane_build_info metric, so a dashboard shows what runs where.
package buildinfo

import (
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mailplane/mailplane/internal/promreg"
)

// version is set at build time; empty in a plain go build or go run.
var version string

// Info is what a binary knows of its build.
type Info struct {
	// Version is the stamped version, else "dev".
	Version string
	// Revision is the VCS revision Go recorded ("" when built outside a
	// checkout), with "+dirty" when the tree had uncommitted changes.
	Revision string
	// GoVersion is the toolchain that built the binary.
	GoVersion string
}

// Read returns this binary's build information.
func Read() Info {
	return read(version, debug.ReadBuildInfo)
}

func read(stamped string, buildInfo func() (*debug.BuildInfo, bool)) Info {
	info := Info{Version: stamped, GoVersion: runtime.Version()}
	if bi, ok := buildInfo(); ok {
		info.GoVersion = bi.GoVersion
		dirty := false
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				info.Revision = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
		if dirty && info.Revision != "" {
			info.Revision += "+dirty"
		}
	}
	if info.Version == "" {
		info.Version = "dev"
	}
	return info
}

// String is the version line `mailplane version` prints.
func (i Info) String() string {
	s := "mailplane " + i.Version
	if i.Revision != "" {
		s += " (" + i.Revision + ")"
	}
	return s + " " + i.GoVersion
}

// Register exports the build as mailplane_build_info{version, revision,
// go_version} = 1 on reg (once per registry; a second call reuses it).
func Register(reg prometheus.Registerer) error {
	i := Read()
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "mailplane_build_info",
		Help: "The running build: always 1, labelled with the version, the VCS revision and the Go version.",
	}, []string{"version", "revision", "go_version"})
	g, err := promreg.Register(reg, g)
	if err != nil {
		return err
	}
	g.WithLabelValues(i.Version, i.Revision, i.GoVersion).Set(1)
	return nil
}
