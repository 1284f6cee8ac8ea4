package roles

import (
	"context"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/mailplane/mailplane/internal/mailplanetest"
)

// This file runs docker-compose.yml's mailplane services as processes on
// one host, for TestProductionShape: each service's command and
// environment as compose gives them (anchors and merge keys resolved,
// ${VAR} interpolated), `replicas` processes of it, one-shot jobs first.
// Only what must differ on one host is substituted (see newRoleProc).

// composeDoc is the part of a compose file the test runs.
type composeDoc struct {
	Services map[string]composeEntry `yaml:"services"`
	Secrets  map[string]struct {
		File string `yaml:"file"`
	} `yaml:"secrets"`
}

type composeEntry struct {
	Image       string            `yaml:"image"`
	Command     []string          `yaml:"command"`
	Environment map[string]string `yaml:"environment"`
	Secrets     []string          `yaml:"secrets"`
	DependsOn   dependsOn         `yaml:"depends_on"`
	Deploy      struct {
		Replicas int `yaml:"replicas"`
	} `yaml:"deploy"`
}

// dependsOn is compose's depends_on in either form: a list of names, or
// names mapped to {condition}. Values are the conditions ("" for a list).
type dependsOn map[string]string

func (d *dependsOn) UnmarshalYAML(n *yaml.Node) error {
	*d = dependsOn{}
	if n.Kind == yaml.SequenceNode {
		var names []string
		if err := n.Decode(&names); err != nil {
			return err
		}
		for _, name := range names {
			(*d)[name] = ""
		}
		return nil
	}
	var m map[string]struct {
		Condition string `yaml:"condition"`
	}
	if err := n.Decode(&m); err != nil {
		return err
	}
	for name, c := range m {
		(*d)[name] = c.Condition
	}
	return nil
}

// composeService is one mailplane service, interpolated.
type composeService struct {
	name     string
	command  []string
	env      map[string]string
	replicas int
	job      bool // one-shot: others wait for it to complete
}

// loadCompose reads the compose file's mailplane services (those built
// from the image the one-shot job uses), interpolating vars as compose
// would: jobs first, then the roles, each in name order.
func loadCompose(t *testing.T, file string, vars map[string]string) []composeService {
	t.Helper()
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var doc composeDoc
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	jobs := map[string]bool{}
	for _, s := range doc.Services {
		for dep, cond := range s.DependsOn {
			jobs[dep] = jobs[dep] || cond == "service_completed_successfully"
		}
	}
	image := ""
	for name := range jobs {
		if jobs[name] && strings.HasPrefix(doc.Services[name].Image, "mailplane") {
			image = doc.Services[name].Image
		}
	}
	if image == "" {
		t.Fatalf("%s: no mailplane one-shot job (a service others wait on with service_completed_successfully)", file)
	}
	var out []composeService
	for _, name := range slices.Sorted(maps.Keys(doc.Services)) {
		e := doc.Services[name]
		if e.Image != image {
			continue
		}
		s := composeService{name: name, env: map[string]string{}, replicas: max(e.Deploy.Replicas, 1), job: jobs[name]}
		for _, a := range e.Command {
			s.command = append(s.command, mustInterpolate(t, name, a, vars))
		}
		for k, v := range e.Environment {
			v = mustInterpolate(t, name, v, vars)
			// A compose secret is a file at /run/secrets/<name>; on one
			// host it is the file the secret names.
			for _, sec := range e.Secrets {
				if v == "/run/secrets/"+sec {
					v = mustInterpolate(t, name, doc.Secrets[sec].File, vars)
				}
			}
			s.env[k] = v
		}
		out = append(out, s)
	}
	slices.SortStableFunc(out, func(a, b composeService) int {
		switch {
		case a.job == b.job:
			return 0
		case a.job:
			return -1
		}
		return 1
	})
	return out
}

// interpolation is compose's ${NAME}, ${NAME:-default}, ${NAME-default},
// ${NAME:?error} and ${NAME?error}; $$ is a dollar.
var interpolation = regexp.MustCompile(`\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}`)

func mustInterpolate(t *testing.T, service, s string, vars map[string]string) string {
	t.Helper()
	var failed error
	out := interpolation.ReplaceAllStringFunc(s, func(m string) string {
		if m == "$$" {
			return "$"
		}
		g := interpolation.FindStringSubmatch(m)
		v, set := vars[g[1]]
		unset := !set || (strings.HasPrefix(g[2], ":") && v == "")
		switch strings.TrimPrefix(g[2], ":") {
		case "-":
			if unset {
				return g[3]
			}
		case "?":
			if unset && failed == nil {
				failed = fmt.Errorf("%s: %s", g[1], g[3])
			}
		}
		return v
	})
	if failed != nil {
		t.Fatalf("compose service %s: %v (the test must set it)", service, failed)
	}
	return out
}

// roleProc is one process of a service, restartable.
type roleProc struct {
	name  string // service-N
	bin   string
	args  []string
	env   []string
	addrs map[string]string // listen flag (e.g. --ops-http) → address
	out   *mailplanetest.Output

	cmd  *exec.Cmd
	done chan struct{}
	err  error // the exit, once done is closed
}

// newRoleProc prepares replica i of s: listen addresses (0.0.0.0:port in
// the command) move to free loopback ports, and host overrides the
// environment where a single host must differ from compose's network.
func newRoleProc(t *testing.T, bin string, s composeService, i int, host map[string]string) *roleProc {
	t.Helper()
	p := &roleProc{name: fmt.Sprintf("%s-%d", s.name, i+1), bin: bin, addrs: map[string]string{}, out: &mailplanetest.Output{}}
	for j, a := range s.command {
		if h, _, err := net.SplitHostPort(a); err == nil && h == "0.0.0.0" && j > 0 {
			a = freeAddr(t)
			p.addrs[s.command[j-1]] = a
		}
		p.args = append(p.args, a)
	}
	env := maps.Clone(s.env)
	maps.Copy(env, host)
	for _, kv := range os.Environ() {
		// Nothing of the test's own environment configures a role.
		if name, _, _ := strings.Cut(kv, "="); !configEnv(name) {
			p.env = append(p.env, kv)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(env)) {
		p.env = append(p.env, k+"="+env[k])
	}
	return p
}

// configEnv reports whether name is (or may be) a mailplane setting's
// environment variable, the former names without MAILPLANE_ included
// (still read, internal/config deprecated.go).
func configEnv(name string) bool {
	for _, pre := range []string{"MAILPLANE_", "DATABASE_URL", "IMAP_", "POLL_", "TIER_", "HOT_BUDGET"} {
		if strings.HasPrefix(name, pre) {
			return true
		}
	}
	return false
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// start starts the process; its output goes on after what earlier runs
// wrote.
func (p *roleProc) start(t *testing.T) {
	t.Helper()
	fmt.Fprintf(p.out, "=== %s: start %s\n", time.Now().Format(time.TimeOnly), strings.Join(p.args, " "))
	p.cmd = exec.Command(p.bin, p.args...)
	p.cmd.Env, p.cmd.Stdout, p.cmd.Stderr = p.env, p.out, p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("%s: %v", p.name, err)
	}
	p.done = make(chan struct{})
	cmd, done := p.cmd, p.done
	go func() {
		// Owned by the process: returns when it exits (cleanup kills it).
		err := cmd.Wait()
		p.err = err
		close(done)
	}()
}

// exited reports whether the process has exited, and how.
func (p *roleProc) exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// signal sends sig and waits for the process to exit, up to timeout.
func (p *roleProc) signal(t *testing.T, sig syscall.Signal, timeout time.Duration) error {
	t.Helper()
	if done, err := p.exited(); done {
		t.Fatalf("%s had exited already: %v", p.name, err)
	}
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
		return p.err
	case <-time.After(timeout):
		t.Fatalf("%s did not exit within %s of %s", p.name, timeout, sig)
		return nil
	}
}

// fleet is every process the test started, killed at cleanup, their
// output printed when the test failed.
type fleet struct {
	procs []*roleProc
}

func newFleet(t *testing.T) *fleet {
	f := &fleet{}
	t.Cleanup(func() {
		for _, p := range f.procs {
			if done, _ := p.exited(); !done {
				_ = p.cmd.Process.Kill()
				<-p.done
			}
		}
		if t.Failed() {
			for _, p := range f.procs {
				out := p.out.String()
				t.Logf("--- output of %s (last 12 KB of %d bytes):\n%s", p.name, len(out), out[max(0, len(out)-12<<10):])
			}
		}
	})
	return f
}

// get returns the process named name (service-N).
func (f *fleet) get(t *testing.T, name string) *roleProc {
	t.Helper()
	for _, p := range f.procs {
		if p.name == name {
			return p
		}
	}
	t.Fatalf("no process %s", name)
	return nil
}

// service returns the processes of one service.
func (f *fleet) service(name string) []*roleProc {
	var out []*roleProc
	for _, p := range f.procs {
		if strings.HasPrefix(p.name, name+"-") {
			out = append(out, p)
		}
	}
	return out
}

// runJob runs a one-shot service to completion, as compose does before
// starting what depends on it.
func (f *fleet) runJob(t *testing.T, p *roleProc, timeout time.Duration) {
	t.Helper()
	f.procs = append(f.procs, p)
	p.start(t)
	select {
	case <-p.done:
		if p.err != nil {
			t.Fatalf("job %s: %v\n%s", p.name, p.err, p.out)
		}
	case <-time.After(timeout):
		t.Fatalf("job %s did not complete within %s\n%s", p.name, timeout, p.out)
	}
}

// alive fails t if any role process (not a job) has exited.
func (f *fleet) alive(t *testing.T, jobs map[string]bool) {
	t.Helper()
	for _, p := range f.procs {
		if jobs[p.name] {
			continue
		}
		if done, err := p.exited(); done {
			t.Fatalf("%s exited (%v); output:\n%s", p.name, err, tail(p.out.String(), 8<<10))
		}
	}
}

func tail(s string, n int) string { return s[max(0, len(s)-n):] }

// composeFile is the repository's compose file.
func composeFile(t *testing.T) string {
	t.Helper()
	f, err := filepath.Abs("../../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// waitUntil polls cond every 100 ms until it holds or ctx ends.
func waitUntil(ctx context.Context, t *testing.T, what string, cond func(context.Context) bool) {
	t.Helper()
	for !cond(ctx) {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
