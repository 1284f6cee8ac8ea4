package importer

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/api"
	"github.com/mailplane/mailplane/internal/backoff"
)

// Config is an import's settings.
type Config struct {
	API    string // base URL of the ingest API
	Token  string // bearer token with the publish scope for mailbox.added
	Source string // ce_source of plain rows: the token's source or a path below it
	Format Format
	// IDSeed goes into the ids of plain rows: another seed sends the
	// same rows as new events (changed credentials, say).
	IDSeed string
	// Batch is the most events a request carries (default 500), and
	// BatchBytes the most bytes (default 768 KiB, under the API's 1 MiB).
	Batch      int
	BatchBytes int
	// Concurrency is how many requests are in flight at once (default 4).
	Concurrency int
	// Retries is how often a request that failed in transport, or was
	// answered 429 or 5xx, is sent again (same event ids) before its rows
	// count as not delivered (default 5); Backoff the first wait (500 ms),
	// doubled each time up to 10 s and half jittered (the requests in
	// flight do not come back together), or the server's Retry-After.
	Retries int
	Backoff time.Duration
	// Timeout bounds each request (default 60 s).
	Timeout time.Duration
	HTTP    *http.Client
	Log     *slog.Logger
	// Progress, when set, is called after each batch (from Run's goroutine).
	Progress func(Progress)
}

// Progress is how far an import is.
type Progress struct {
	Rows     int   // rows read
	Accepted int   // rows the API accepted
	Refused  int   // rows refused, here or by the API
	Failed   int   // rows not delivered
	Bytes    int64 // input bytes read
	Elapsed  time.Duration
}

// Summary is the outcome of an import.
type Summary struct {
	Rows     int `json:"rows"`
	Accepted int `json:"accepted"`
	Refused  int `json:"refused"`
	Failed   int `json:"failed"`
	// RefusedByCode counts refused rows per code; a row with problems of
	// several codes counts under each.
	RefusedByCode map[domain.Code]int `json:"refused_by_code"`
	// Problems of the refused rows, by line.
	Problems []Problem `json:"problems"`
	// NotDelivered lists the rows not delivered (transport errors,
	// retries spent), by line, with the last error's code.
	NotDelivered []Problem `json:"not_delivered"`
	Elapsed      float64   `json:"elapsed_seconds"`
	EventsPerSec float64   `json:"events_per_second"`
}

func (c *Config) defaults() {
	if c.Batch <= 0 {
		c.Batch = 500
	}
	if c.BatchBytes <= 0 {
		c.BatchBytes = 768 << 10
	}
	if c.Concurrency <= 0 {
		c.Concurrency = 4
	}
	if c.Retries < 0 {
		c.Retries = 0
	} else if c.Retries == 0 {
		c.Retries = 5
	}
	if c.Backoff <= 0 {
		c.Backoff = 500 * time.Millisecond
	}
	if c.Timeout <= 0 {
		c.Timeout = time.Minute
	}
	if c.HTTP == nil {
		c.HTTP = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: c.Concurrency}}
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
}

// outcome is what became of a batch's rows.
type outcome struct {
	rows     int
	accepted int
	refused  []Problem // by the API or here
	failed   []Problem
	fatal    error // the import cannot go on (unauthorized, say)
}

// Run reads r and imports its rows. The error is for an import that could
// not run to its end (unreadable input, a refused token); rows refused or
// not delivered are in the summary.
func Run(ctx context.Context, r io.Reader, cfg Config) (Summary, error) {
	cfg.defaults()
	start := time.Now()
	rd, err := newReader(r, cfg.Format, cfg.Source, cfg.IDSeed)
	if err != nil {
		return Summary{}, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	batches := make(chan []row, cfg.Concurrency)
	outcomes := make(chan outcome, cfg.Concurrency)
	var readErr error
	var wg sync.WaitGroup
	// The reader: rows into batches; rows refused here go straight out.
	wg.Go(func() {
		defer close(batches)
		readErr = readBatches(ctx, rd, cfg, batches, outcomes)
	})
	// The senders.
	var senders sync.WaitGroup
	for range cfg.Concurrency {
		senders.Go(func() {
			for b := range batches {
				o := send(ctx, cfg, b)
				outcomes <- o
				if o.fatal != nil {
					cancel()
				}
			}
		})
	}
	go func() {
		wg.Wait()
		senders.Wait()
		close(outcomes)
	}()

	var s Summary
	s.RefusedByCode = map[domain.Code]int{}
	var fatal error
	for o := range outcomes {
		s.Rows += o.rows
		s.Accepted += o.accepted
		s.Problems = append(s.Problems, o.refused...)
		s.NotDelivered = append(s.NotDelivered, o.failed...)
		if o.fatal != nil && fatal == nil {
			fatal = o.fatal
		}
		if cfg.Progress != nil {
			cfg.Progress(Progress{Rows: s.Rows, Accepted: s.Accepted, Refused: countLines(s.Problems), Failed: len(s.NotDelivered),
				Bytes: rd.bytesRead(), Elapsed: time.Since(start)})
		}
	}
	slices.SortStableFunc(s.Problems, func(a, b Problem) int { return a.Line - b.Line })
	slices.SortStableFunc(s.NotDelivered, func(a, b Problem) int { return a.Line - b.Line })
	s.Refused = countLines(s.Problems)
	s.Failed = len(s.NotDelivered)
	seen := map[[2]any]bool{}
	for _, p := range s.Problems {
		if k := [2]any{p.Line, p.Code}; !seen[k] {
			seen[k] = true
			s.RefusedByCode[p.Code]++
		}
	}
	el := time.Since(start)
	s.Elapsed = el.Seconds()
	if el > 0 {
		s.EventsPerSec = float64(s.Accepted) / el.Seconds()
	}
	if fatal != nil {
		return s, fatal
	}
	if readErr != nil {
		return s, fmt.Errorf("reading the input: %w", readErr)
	}
	return s, ctx.Err()
}

func (rd *reader) bytesRead() int64 { return rd.bytes.Load() }

func countLines(ps []Problem) int {
	lines := map[int]bool{}
	for _, p := range ps {
		lines[p.Line] = true
	}
	return len(lines)
}

// readBatches reads rows until the input ends, refusing duplicate ids
// (the API would only see those in the same batch) and rows refused while
// reading, and hands full batches to the senders.
func readBatches(ctx context.Context, rd *reader, cfg Config, batches chan<- []row, outcomes chan<- outcome) error {
	first := map[string]int{}
	var b []row
	size := 0
	flush := func() bool {
		if len(b) == 0 {
			return true
		}
		select {
		case batches <- b:
			b, size = nil, 0
			return true
		case <-ctx.Done():
			return false
		}
	}
	for {
		r, ok, err := rd.read()
		if err != nil || !ok {
			flush()
			return err
		}
		if r.refusal == nil && r.id != "" {
			if l, dup := first[r.id]; dup {
				r = refused(r.line, "id", domain.CodeConflict, "duplicate event id: line "+strconv.Itoa(l)+" has the same id")
			} else {
				first[r.id] = r.line
			}
		}
		if r.refusal != nil {
			select {
			case outcomes <- outcome{rows: 1, refused: []Problem{*r.refusal}}:
			case <-ctx.Done():
				return nil
			}
			continue
		}
		if len(b) > 0 && (len(b) == cfg.Batch || size+len(r.event)+1 > cfg.BatchBytes) {
			if !flush() {
				return nil
			}
		}
		b = append(b, r)
		size += len(r.event) + 1
	}
}

// maxBackoff caps the wait between attempts of a batch.
const maxBackoff = 10 * time.Second

// send delivers a batch. The API takes a batch whole or not at all: rows it
// refuses are set aside and the rest sent again, until it accepts what is
// left. Transport errors, 429 and 5xx are retried with the same ids.
func send(ctx context.Context, cfg Config, rows []row) outcome {
	o := outcome{rows: len(rows)}
	pending := rows
	b := backoff.New(backoff.Policy{Floor: cfg.Backoff, Cap: maxBackoff, Jitter: backoff.Half}, nil)
	for len(pending) > 0 {
		status, resp, retryAfter, err := post(ctx, cfg, pending)
		switch {
		case err == nil && status == http.StatusAccepted:
			o.accepted += len(pending)
			return o
		case err == nil && (status == http.StatusBadRequest || status == http.StatusForbidden) && len(resp.Problems) > 0:
			bad := map[int]bool{}
			for _, p := range resp.Problems {
				if p.Index < 0 || p.Index >= len(pending) {
					continue
				}
				bad[p.Index] = true
				r := pending[p.Index]
				o.refused = append(o.refused, Problem{Line: r.line, ID: r.id, Field: p.Field, Code: p.Code, Message: withheld(p.Field, p.Message)})
			}
			if len(bad) == 0 {
				return o.failAll(pending, resp.Error.Code, "the API refused the batch: "+resp.Error.Message)
			}
			rest := pending[:0:0]
			for i, r := range pending {
				if !bad[i] {
					rest = append(rest, r)
				}
			}
			pending = rest
			continue
		case err == nil && status == http.StatusUnauthorized:
			o = o.failAll(pending, domain.CodeUnauthorized, "the API refused the token")
			o.fatal = domain.Errorf(domain.CodeUnauthorized, "the API refused the token: %s", resp.Error.Message)
			return o
		case err == nil && status == http.StatusForbidden:
			o = o.failAll(pending, resp.Error.Code, "the API refused the caller")
			o.fatal = domain.Errorf(resp.Error.Code, "the API refused the caller: %s", resp.Error.Message)
			return o
		case err == nil && status != http.StatusTooManyRequests && status < 500:
			// The request itself (too large, say): not the rows'.
			return o.failAll(pending, resp.Error.Code, fmt.Sprintf("the API answered %d: %s", status, resp.Error.Message))
		}
		// Transport error, 429 or 5xx: the same events again, later.
		code, msg := domain.CodeUnavailable, ""
		if err != nil {
			msg = err.Error()
		} else {
			code, msg = resp.Error.Code, fmt.Sprintf("the API answered %d: %s", status, resp.Error.Message)
		}
		if b.Failures() >= cfg.Retries || ctx.Err() != nil {
			return o.failAll(pending, code, msg)
		}
		wait := b.Next()
		if retryAfter > 0 {
			wait = retryAfter
		}
		cfg.Log.Info("import: retrying a batch", "events", len(pending), "attempt", b.Failures(), "wait", wait, "err", msg)
		if backoff.Sleep(ctx, wait) != nil {
			return o.failAll(pending, domain.CodeUnavailable, "the import was stopped")
		}
	}
	return o
}

func (o outcome) failAll(rows []row, code domain.Code, msg string) outcome {
	if code == "" {
		code = domain.CodeUnavailable
	}
	for _, r := range rows {
		o.failed = append(o.failed, Problem{Line: r.line, ID: r.id, Code: code, Message: msg})
	}
	return o
}

// withheld keeps messages about credentials out of the output: the API's
// messages do not quote secrets, but a summary is often pasted around.
func withheld(field, msg string) string {
	if strings.HasPrefix(field, "data.credentials") {
		return "(message withheld: credentials)"
	}
	return msg
}

// post sends rows as one batch.
func post(ctx context.Context, cfg Config, rows []row) (int, api.ErrorResponse, time.Duration, error) {
	var body bytes.Buffer
	body.WriteByte('[')
	for i, r := range rows {
		if i > 0 {
			body.WriteByte(',')
		}
		body.Write(r.event)
	}
	body.WriteByte(']')
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(cfg.API, "/")+"/v1/events", &body)
	if err != nil {
		return 0, api.ErrorResponse{}, 0, err
	}
	req.Header.Set("Content-Type", api.ContentTypeBatch)
	req.Header.Set("Authorization", "Bearer "+cfg.Token)
	resp, err := cfg.HTTP.Do(req)
	if err != nil {
		return 0, api.ErrorResponse{}, 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return 0, api.ErrorResponse{}, 0, err
	}
	var er api.ErrorResponse
	if resp.StatusCode != http.StatusAccepted {
		if err := json.Unmarshal(b, &er); err != nil {
			er.Error.Message = http.StatusText(resp.StatusCode)
		}
	}
	var ra time.Duration
	if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s > 0 {
		ra = min(time.Duration(s)*time.Second, time.Minute)
	}
	return resp.StatusCode, er, ra, nil
}
