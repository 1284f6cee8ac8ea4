package cli

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/config"
	"github.com/mailplane/mailplane/internal/importer"
)

const importUsage = `usage: mailplane import [FILE | -] --api URL [flags]

Streams a fleet of mailboxes to a running mailplane's ingest API as
mailbox.added events (the API validates them and seals their credentials, as
for any producer), in batches, with bounded concurrency. FILE (or stdin) is
JSON lines, one mailbox.added CloudEvent or one plain mailbox object (the
event's data) a line, or CSV with a header of these columns:
  ` + "%s" + `
Plain rows get an event id derived from the row without its credentials, so
re-running an import sends the same ids and changes nothing already applied.
Credentials are never printed. Exit 0: every row accepted; 5: some rows were
refused (the summary lists them by code and line); 1: some rows were not
delivered, or the import could not run.

Flags:
`

// Import is `mailplane import`: a customer's fleet through the ingest API.
func Import(ctx context.Context, args []string, stdin io.Reader, stdout, stderr *os.File) error {
	fs := flag.NewFlagSet("import", flag.ContinueOnError)
	fs.SetOutput(stderr)
	input := fs.String("input", "auto", "input format: jsonl, csv, or auto (by the file's extension, else by its first byte)")
	batch := fs.Int("batch", 500, "events per request (at most the API's batch limit)")
	concurrency := fs.Int("concurrency", 4, "requests in flight at once")
	seed := fs.String("id-seed", "", "mixed into plain rows' event ids: another seed re-sends the same rows as new events (changed credentials)")
	retries := fs.Int("retries", 5, "resends of a request that failed in transport or got 429/5xx (same event ids)")
	format := fs.String("format", FormatText, "summary format: text or json")
	plainHTTP := fs.Bool("insecure-http", false, "allow an http:// API on another host than this one (the rows' credentials then cross the network in clear)")
	apiURL := config.APIURL.String(fs)
	tokens := config.APITokens.String(fs)
	source := config.Source.String(fs)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), importUsage, strings.Join(importer.Columns, ","))
		fs.PrintDefaults()
	}
	// The file may come before the flags.
	var file string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") || len(args) > 0 && args[0] == "-" {
		file, args = args[0], args[1:]
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return usageError(err.Error())
	}
	if fs.NArg() > 0 {
		if file != "" || fs.NArg() > 1 {
			return usageError("one input file at most (or - for stdin)")
		}
		file = fs.Arg(0)
	}
	if err := checkFormat(*format); err != nil {
		return err
	}
	if *apiURL == "" {
		return usageError("--api is required: the URL of a running mailplane API (e.g. http://127.0.0.1:8080)")
	}
	if err := checkImportURL(*apiURL, *plainHTTP); err != nil {
		return err
	}
	token := firstToken(*tokens)
	if token == "" {
		return usageError("--api-token is required: a token with the publish scope for mailbox.added")
	}
	if *batch <= 0 || *concurrency <= 0 || *retries < 0 {
		return usageError("--batch and --concurrency must be positive, --retries not negative")
	}

	in, size := stdin, int64(0)
	if file != "" && file != "-" {
		f, err := os.Open(file)
		if err != nil {
			return err
		}
		defer f.Close()
		if st, err := f.Stat(); err == nil && st.Mode().IsRegular() {
			size = st.Size()
		}
		in = f
	}
	br := bufio.NewReaderSize(in, 64<<10)
	f, err := inputFormat(*input, file, br)
	if err != nil {
		return err
	}

	prog := newImportProgress(stderr, size)
	cfg := importer.Config{
		API: *apiURL, Token: token, Source: *source, Format: f, IDSeed: *seed,
		Batch: *batch, Concurrency: *concurrency, Retries: *retries, Progress: prog.update,
	}
	if *retries == 0 {
		cfg.Retries = -1 // none at all (the importer's zero is its default)
	}
	s, runErr := importer.Run(ctx, br, cfg)
	prog.done(s)
	if *format == FormatJSON {
		if err := writeJSON(stdout, s); err != nil {
			return err
		}
	} else {
		printImportSummary(stdout, s)
	}
	switch {
	case runErr != nil:
		return runErr
	case s.Failed > 0:
		return fmt.Errorf("%d of %d rows were not delivered (listed above); re-running the import is safe", s.Failed, s.Rows)
	case s.Refused > 0:
		return &ExitCodeError{Code: ExitPartial, Err: fmt.Errorf("%d of %d rows were refused (listed above)", s.Refused, s.Rows)}
	}
	return nil
}

// checkImportURL refuses an API URL that is not http(s), and plain http to
// another host than this one unless allowed: the input holds passwords.
func checkImportURL(raw string, plainHTTP bool) error {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return usageError(fmt.Sprintf("--api must be an http(s) URL such as https://mailplane.example.com, not %q", raw))
	}
	if u.Scheme == "https" || plainHTTP {
		return nil
	}
	host := u.Hostname()
	if ip := net.ParseIP(host); host == "localhost" || (ip != nil && ip.IsLoopback()) {
		return nil
	}
	return usageError("--api is plain http to another host: the rows' credentials would cross the network in clear; use https, or --insecure-http if the network is yours")
}

// inputFormat resolves --input: auto reads the file's extension, else the
// first byte that is not white space ('{' is JSON lines).
func inputFormat(flagValue, file string, br *bufio.Reader) (importer.Format, error) {
	switch flagValue {
	case "jsonl":
		return importer.JSONL, nil
	case "csv":
		return importer.CSV, nil
	case "auto":
	default:
		return "", usageError(fmt.Sprintf("--input must be jsonl, csv or auto, not %q", flagValue))
	}
	switch strings.ToLower(filepath.Ext(file)) {
	case ".csv":
		return importer.CSV, nil
	case ".jsonl", ".ndjson", ".json":
		return importer.JSONL, nil
	}
	for n := 1; n <= 4096; n++ {
		b, err := br.Peek(n)
		if len(b) < n {
			if err != nil {
				break
			}
			continue
		}
		if c := b[n-1]; c != ' ' && c != '\t' && c != '\r' && c != '\n' {
			if c == '{' {
				return importer.JSONL, nil
			}
			return importer.CSV, nil
		}
	}
	return importer.JSONL, nil
}

// importProgress draws a progress bar on a terminal (stderr), redrawn at
// most ten times a second, or writes a plain line every 5 s otherwise.
type importProgress struct {
	w     io.Writer
	tty   bool
	size  int64
	last  time.Time
	every time.Duration
	drawn bool
}

func newImportProgress(stderr *os.File, size int64) *importProgress {
	p := &importProgress{w: stderr, tty: isTerminal(stderr), size: size, every: 5 * time.Second}
	if p.tty {
		p.every = 100 * time.Millisecond
	}
	return p
}

func (p *importProgress) update(pr importer.Progress) {
	if time.Since(p.last) < p.every {
		return
	}
	p.last = time.Now()
	p.drawn = true
	fmt.Fprint(p.w, renderImportProgress(pr, p.size, p.tty, false))
}

func (p *importProgress) done(s importer.Summary) {
	if !p.drawn && !p.tty {
		return // a short import: the summary says it all
	}
	pr := importer.Progress{Rows: s.Rows, Accepted: s.Accepted, Refused: s.Refused, Failed: s.Failed,
		Bytes: p.size, Elapsed: time.Duration(s.Elapsed * float64(time.Second))}
	fmt.Fprint(p.w, renderImportProgress(pr, p.size, p.tty, true))
}

// renderImportProgress renders one progress line; the bar shows the share
// of the input read when its size is known.
func renderImportProgress(p importer.Progress, size int64, tty, final bool) string {
	rate := 0.0
	if p.Elapsed > 0 {
		rate = float64(p.Accepted) / p.Elapsed.Seconds()
	}
	bar := ""
	if size > 0 {
		const width = 30
		f := min(float64(p.Bytes)/float64(size), 1)
		n := int(f * width)
		bar = "[" + strings.Repeat("=", n)
		if n < width {
			bar += ">" + strings.Repeat(" ", width-n-1)
		}
		bar += fmt.Sprintf("] %5.1f%%  ", 100*f)
	}
	line := fmt.Sprintf("import %s%d rows  %d accepted  %d refused  %d not delivered  %.0f/s  %s",
		bar, p.Rows, p.Accepted, p.Refused, p.Failed, rate, p.Elapsed.Round(100*time.Millisecond))
	switch {
	case tty && final:
		return "\r" + line + "\x1b[K\n"
	case tty:
		return "\r" + line + "\x1b[K"
	}
	return line + "\n"
}

// maxListed bounds the problems the text summary lists (--format json
// lists them all).
const maxListed = 50

func printImportSummary(w io.Writer, s importer.Summary) {
	fmt.Fprintf(w, "imported %d of %d rows: %d refused, %d not delivered (%.1f s, %.0f events/s)\n",
		s.Accepted, s.Rows, s.Refused, s.Failed, s.Elapsed, s.EventsPerSec)
	if len(s.RefusedByCode) > 0 {
		fmt.Fprintln(w, "refused rows by code:")
		codes := make([]domain.Code, 0, len(s.RefusedByCode))
		for c := range s.RefusedByCode {
			codes = append(codes, c)
		}
		slices.Sort(codes)
		for _, c := range codes {
			fmt.Fprintf(w, "  %-28s %6d  lines %s\n", c, s.RefusedByCode[c], lineList(s.Problems, c))
		}
	}
	list := func(title string, ps []importer.Problem) {
		if len(ps) == 0 {
			return
		}
		fmt.Fprintln(w, title)
		for i, p := range ps {
			if i == maxListed {
				fmt.Fprintf(w, "  ... and %d more (--format json lists them all)\n", len(ps)-maxListed)
				break
			}
			field := p.Field
			if field == "" {
				field = "-"
			}
			fmt.Fprintf(w, "  line %-7d %-28s %-24s %s\n", p.Line, field, p.Code, p.Message)
		}
	}
	list("problems:", s.Problems)
	list("not delivered:", s.NotDelivered)
}

// lineList is the lines of the rows refused with code, the first ten.
func lineList(ps []importer.Problem, code domain.Code) string {
	var lines []string
	last := -1
	for _, p := range ps {
		if p.Code != code || p.Line == last {
			continue
		}
		last = p.Line
		lines = append(lines, strconv.Itoa(p.Line))
	}
	if len(lines) > 10 {
		return strings.Join(lines[:10], ", ") + fmt.Sprintf(", ... (%d more)", len(lines)-10)
	}
	return strings.Join(lines, ", ")
}
