package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"text/tabwriter"
	"time"

	"github.com/twmb/franz-go/pkg/sr"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/backoff"
	"github.com/mailplane/mailplane/internal/config"
	"github.com/mailplane/mailplane/internal/eventschema"
)

// Deadlines of schemas register: each registry request, and the whole
// command (three requests a type, some thirty types).
const (
	registryRequestTimeout = 10 * time.Second
	registryCommandTimeout = 2 * time.Minute
	// maxRegistryResponse bounds a registry answer read into memory.
	maxRegistryResponse = 4 << 20
)

// Schemas is `mailplane schemas register`: every record type's reader
// schema into the Schema Registry (eventschema.RegisterSchemas), one
// subject per type. Exit 5 when a subject holds a schema the new one is
// incompatible with, 1 on any other failure. Progress and usage go to
// stderr.
func Schemas(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "register" {
		return usageError("usage: mailplane schemas register [--registry URL] [--dry-run] [--format text|json]")
	}
	fs := flag.NewFlagSet("schemas register", flag.ContinueOnError)
	fs.SetOutput(stderr)
	registry := config.SchemaRegistry.String(fs)
	dryRun := fs.Bool("dry-run", false, "look every schema up and check new ones for compatibility; register nothing")
	format := fs.String("format", FormatText, "output: text or json (for scripts)")
	wait := fs.Duration("wait", 30*time.Second, "keep retrying this long while the registry does not answer (compose starts it with Redpanda)")
	if err := fs.Parse(args[1:]); errors.Is(err, flag.ErrHelp) {
		return nil
	} else if err != nil {
		return usageError(err.Error())
	}
	if err := checkFormat(*format); err != nil {
		return err
	}
	if err := checkRegistryURL(*registry); err != nil {
		return err
	}
	cl, err := sr.NewClient(sr.URLs(*registry), sr.UserAgent("mailplane"), sr.HTTPClient(&http.Client{
		Timeout:   registryRequestTimeout,
		Transport: boundedTransport{http.DefaultTransport},
		// A registry does not redirect; one that does is not trusted
		// with where the schemas go.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}))
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, registryCommandTimeout)
	defer cancel()
	regs, err := registerRetrying(ctx, cl, *dryRun, *wait, stderr)
	if err != nil {
		return fmt.Errorf("schema registry %s: %w", *registry, err)
	}
	if *format == FormatJSON {
		if err := writeJSON(stdout, map[string]any{"registry": *registry, "dry_run": *dryRun, "schemas": regs}); err != nil {
			return err
		}
	} else if err := printRegistrations(stdout, regs); err != nil {
		return err
	}
	return registrationsError(regs)
}

// registryRetry paces schemas register while the registry starts: one
// command, no peers, so no jitter.
var registryRetry = backoff.Policy{Floor: 250 * time.Millisecond, Cap: 5 * time.Second}

// registerRetrying is eventschema.RegisterSchemas, run again with backoff
// for up to wait while a registration fails unanswered (code
// unavailable): a registry starting up. Registering is idempotent, so a
// round that got halfway is safe to repeat.
func registerRetrying(ctx context.Context, cl *sr.Client, dryRun bool, wait time.Duration, stderr io.Writer) ([]eventschema.Registration, error) {
	deadline := time.Now().Add(wait)
	b := backoff.New(registryRetry, nil)
	for {
		regs, err := eventschema.RegisterSchemas(ctx, cl, dryRun)
		if err != nil || !anyUnavailable(regs) || time.Now().After(deadline) {
			return regs, err
		}
		d := b.Next()
		fmt.Fprintf(stderr, "schemas register: the registry does not answer; retrying in %s\n", d)
		if backoff.Sleep(ctx, d) != nil {
			return regs, nil
		}
	}
}

func anyUnavailable(regs []eventschema.Registration) bool {
	for _, r := range regs {
		if r.Status == eventschema.StatusFailed && r.Code == domain.CodeUnavailable {
			return true
		}
	}
	return false
}

// checkRegistryURL refuses a registry URL that is not plain http(s) to a
// host, with no credentials in it (they would end up in logs).
func checkRegistryURL(s string) error {
	u, err := url.Parse(s)
	switch {
	case err != nil:
		return usageError(fmt.Sprintf("--registry: %v", err))
	case u.Scheme != "http" && u.Scheme != "https":
		return usageError(fmt.Sprintf("--registry must be an http or https URL, not %q", s))
	case u.Host == "":
		return usageError("--registry has no host")
	case u.User != nil:
		return usageError("--registry must not carry credentials")
	case u.RawQuery != "" || u.Fragment != "":
		return usageError("--registry must not carry a query or fragment")
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return usageError("--registry holds a control character")
		}
	}
	return nil
}

// registrationsError is the command's error: failure (1) when any type
// failed for a reason other than incompatibility, ExitIncompatible when
// the only failures are incompatible schemas.
func registrationsError(regs []eventschema.Registration) error {
	failed, incompatible := 0, 0
	for _, r := range regs {
		if r.Status != eventschema.StatusFailed {
			continue
		}
		failed++
		if r.Code == domain.CodeConflict {
			incompatible++
		}
	}
	switch {
	case failed == 0:
		return nil
	case incompatible == failed:
		return &ExitCodeError{Code: ExitIncompatible, Err: fmt.Errorf("%d of %d schemas are incompatible with the subject's registered version", failed, len(regs))}
	}
	return fmt.Errorf("%d of %d schemas failed to register", failed, len(regs))
}

func printRegistrations(w io.Writer, regs []eventschema.Registration) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SUBJECT\tSTATUS\tID\tVERSION\tCODE\tMESSAGE")
	for _, r := range regs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.Subject, r.Status, orDash(r.ID), orDash(r.Version), r.Code, r.Message)
	}
	return tw.Flush()
}

func orDash(n int) string {
	if n == 0 {
		return "-"
	}
	return fmt.Sprint(n)
}

// boundedTransport cuts every response body at maxRegistryResponse.
type boundedTransport struct{ next http.RoundTripper }

func (b boundedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := b.next.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	resp.Body = &limitedBody{r: io.LimitReader(resp.Body, maxRegistryResponse+1), c: resp.Body}
	return resp, nil
}

type limitedBody struct {
	r io.Reader
	c io.Closer
	n int64
}

func (l *limitedBody) Read(p []byte) (int, error) {
	n, err := l.r.Read(p)
	l.n += int64(n)
	if l.n > maxRegistryResponse {
		return n, fmt.Errorf("%w: larger than %d bytes", eventschema.ErrRegistryResponseTooLarge, maxRegistryResponse)
	}
	return n, err
}

func (l *limitedBody) Close() error { return l.c.Close() }
