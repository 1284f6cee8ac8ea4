// Package access authenticates API callers: the operator-managed tokens
// file (one caller a line: name, SHA-256 of its token, scopes, ce source)
// and the sending workers' credentials, derived from a fleet secret and the
// worker id, so that a worker's token is good for its own id only.
//
// The file is reloaded without a restart (Watch: SIGHUP and an mtime poll).
// A reload of a file with invalid lines fails safe (Load): only the callers
// the file's valid lines repeat unchanged stay in force, so a revocation
// takes effect even beside a typo; a file that cannot be read, or holds no
// caller line at all, keeps the callers in force. Either is logged,
// counted and shown by mailplane_access_tokens_file_invalid until a good
// file is loaded. Replace the file atomically (write a new one, rename it
// over): a reload may otherwise read it half-written, and the callers
// after the cut would be out until the next reload. What a caller may do
// is decided by domain.Caller; this package only tells who is calling.
//
// File format, one caller a line, fields separated by white space, # starts
// a comment:
//
//	<name> <sha256 of the token, hex> <scope>[,<scope>...] <source>
//	product 9f86d0...0f00a08 publish:public /product-api
//
// Tokens are random and high-entropy (mailplane token makes them), so one
// fast hash is right: there is nothing to brute-force a dictionary of.
package access

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/promreg"
)

// DefaultPollInterval is how often Watch looks at the file's mtime.
const DefaultPollInterval = 5 * time.Second

// Limits of the file.
const (
	maxFileBytes = 4 << 20
	maxNameLen   = 64
	maxSourceLen = 256
)

var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,63}$`)

// entry is one caller of the file.
type entry struct {
	hash   [sha256.Size]byte
	caller *domain.Caller
}

// Parse reads a tokens file. Every line is checked and every problem is
// reported (with its line number), so an operator fixes them in one go.
func Parse(b []byte) ([]*domain.Caller, [][sha256.Size]byte, error) {
	if len(b) > maxFileBytes {
		return nil, nil, errTooLarge
	}
	callers, hashes, errs := parseLines(b)
	if len(errs) > 0 {
		return nil, nil, fmt.Errorf("access: tokens file: %w", errors.Join(errs...))
	}
	return callers, hashes, nil
}

var errTooLarge = fmt.Errorf("access: tokens file larger than %d bytes", maxFileBytes)

// parseLines returns the callers of b's valid lines, and a problem for
// each other line. A caller whose name or token hash is also on an
// invalid line (a second line for the same name or token, or a typo on
// it; but not an exact repeat of its line) is left out too: which of the lines the operator meant cannot be
// told, and keeping the valid one would keep a grant that the other
// narrows or revokes (Load keeps only what the valid lines repeat).
func parseLines(b []byte) ([]*domain.Caller, [][sha256.Size]byte, []error) {
	var (
		callers   []*domain.Caller
		hashes    [][sha256.Size]byte
		errs      []error
		names     = map[string]int{}
		seen      = map[[sha256.Size]byte]int{}
		badNames  = map[string]bool{}
		badHashes = map[[sha256.Size]byte]bool{}
	)
	// Split rather than scan: no line is too long to be read, so one
	// invalid line never hides the lines after it.
	for i, raw := range bytes.Split(b, []byte("\n")) {
		n := i + 1
		line := strings.TrimSuffix(string(raw), "\r")
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		var (
			lineName string             // the line's name, once read
			lineHash *[sha256.Size]byte // its token hash, once read
		)
		bad := func(format string, args ...any) {
			errs = append(errs, fmt.Errorf("line %d: "+format, append([]any{n}, args...)...))
			if lineName != "" {
				badNames[lineName] = true
			}
			if lineHash != nil {
				badHashes[*lineHash] = true
			}
		}
		if len(f) != 4 {
			bad("want 4 fields (name, sha256 hex, scopes, source), have %d", len(f))
			continue
		}
		name, hexHash, scopeList, source := f[0], f[1], f[2], f[3]
		if !nameRE.MatchString(name) {
			bad("name %q: want 1-%d of [a-z0-9._-]", truncate(name), maxNameLen)
			continue
		}
		lineName = name
		dupLine, dup := names[name]
		var h [sha256.Size]byte
		if raw, err := hex.DecodeString(strings.TrimPrefix(hexHash, "sha256:")); err != nil || len(raw) != sha256.Size {
			bad("caller %s: the token hash must be 64 hex digits (sha256)", name)
			continue
		} else {
			copy(h[:], raw)
		}
		lineHash = &h
		if j, same := seen[h]; same && !dup {
			bad("caller %s: same token as line %d", name, j)
			continue
		}
		scopes := strings.Split(scopeList, ",")
		slices.Sort(scopes)
		scopes = slices.Compact(scopes)
		if msg := domain.CheckScopes(scopes); msg != "" {
			bad("caller %s: %s", name, msg)
			continue
		}
		if msg := checkSource(source); msg != "" {
			bad("caller %s: %s", name, msg)
			continue
		}
		c := &domain.Caller{Name: name, Scopes: scopes, Source: source}
		if dup {
			// A line repeated exactly (a file appended to itself) says
			// nothing new: refused, but it leaves the caller alone.
			if i := slices.IndexFunc(callers, func(o *domain.Caller) bool { return o.Name == name }); i >= 0 &&
				sameEntry(entry{hashes[i], callers[i]}, entry{h, c}) {
				lineName, lineHash = "", nil
			}
			bad("name %q already used on line %d", name, dupLine)
			continue
		}
		names[name], seen[h] = n, n
		callers = append(callers, c)
		hashes = append(hashes, h)
	}
	if len(badNames) == 0 && len(badHashes) == 0 {
		return callers, hashes, errs
	}
	var okCallers []*domain.Caller
	var okHashes [][sha256.Size]byte
	for i, c := range callers {
		if !badNames[c.Name] && !badHashes[hashes[i]] {
			okCallers, okHashes = append(okCallers, c), append(okHashes, hashes[i])
		}
	}
	return okCallers, okHashes, errs
}

// checkSource refuses sources that are empty, too long or carry control
// characters or white space (they end up in ce_source headers).
func checkSource(s string) string {
	if s == "" || len(s) > maxSourceLen {
		return fmt.Sprintf("source must be 1-%d bytes", maxSourceLen)
	}
	for _, r := range s {
		if r < 0x21 || r == 0x7f || (r >= 0x80 && r < 0xa0) {
			return "source must not contain white space or control characters"
		}
	}
	return ""
}

func truncate(s string) string {
	if len(s) > 32 {
		return s[:32] + "…"
	}
	return s
}

// HashToken is the hex SHA-256 of a token, as the tokens file holds it.
func HashToken(token string) string {
	h := sha256.Sum256([]byte(token))
	return hex.EncodeToString(h[:])
}

// Line is the tokens-file line of a caller holding token.
func Line(name, token string, scopes []string, source string) string {
	return fmt.Sprintf("%s %s %s %s", name, HashToken(token), strings.Join(scopes, ","), source)
}

// Authenticator tells who presents a bearer token: a caller of the tokens
// file, or a sending worker with a fleet-derived credential. It is safe for
// concurrent use; Load and Watch swap the file's callers atomically.
type Authenticator struct {
	mu      sync.RWMutex
	entries []entry
	fleet   []byte // nil: worker credentials refused

	path    string
	mod     time.Time // of the file in force
	size    int64
	badMod  time.Time // of the last file that failed, not retried until it changes
	badSize int64
	log     *slog.Logger
	m       *metrics
	onLoad  func(Reload)
}

// Option configures an Authenticator.
type Option func(*Authenticator)

// WithFleetSecret accepts worker credentials derived from secret
// (WorkerToken). Without one, every worker credential is refused.
func WithFleetSecret(secret []byte) Option {
	return func(a *Authenticator) { a.fleet = slices.Clone(secret) }
}

// WithLogger sets the logger (default: discard). Tokens are never logged.
func WithLogger(l *slog.Logger) Option { return func(a *Authenticator) { a.log = l } }

// WithReloadHook calls f after every reload of the tokens file that read
// it and changed the callers or failed (not at start, nor when the file
// did not change): the operator audit records it (reload.go).
func WithReloadHook(f func(Reload)) Option { return func(a *Authenticator) { a.onLoad = f } }

// WithRegisterer registers the metrics on reg.
func WithRegisterer(reg prometheus.Registerer) Option {
	return func(a *Authenticator) { a.m = newMetrics(reg) }
}

// New returns an authenticator reading callers from the tokens file at
// path ("" for none: only worker credentials, if any). The file must parse
// at start; later reloads that fail keep the previous callers.
func New(path string, opts ...Option) (*Authenticator, error) {
	a := &Authenticator{path: path}
	for _, o := range opts {
		o(a)
	}
	if a.log == nil {
		a.log = slog.New(slog.DiscardHandler)
	}
	if a.m == nil {
		a.m = newMetrics(nil)
	}
	if len(a.fleet) > 0 && len(a.fleet) < MinFleetSecretBytes {
		return nil, fmt.Errorf("access: the worker fleet secret must be at least %d bytes", MinFleetSecretBytes)
	}
	if path != "" {
		if _, err := a.Load(); err != nil {
			return nil, err
		}
	}
	return a, nil
}

// FromBytes returns an authenticator with the callers of a tokens file's
// content b, fixed (no file to reload): for tests and embedding.
func FromBytes(b []byte, opts ...Option) (*Authenticator, error) {
	a, err := New("", opts...)
	if err != nil {
		return nil, err
	}
	callers, hashes, err := Parse(b)
	if err != nil {
		return nil, err
	}
	a.entries = make([]entry, len(callers))
	for i := range callers {
		a.entries[i] = entry{hash: hashes[i], caller: callers[i]}
	}
	a.m.callers.Set(float64(len(callers)))
	return a, nil
}

// Load (re)reads the tokens file. It reports whether the callers in force
// changed.
//
// A file whose lines all parse replaces the callers in force. A file with
// invalid lines fails safe: the callers in force become those that the
// file's valid lines repeat unchanged (same name, token hash, scopes and
// source), and nothing else. So a caller the file no longer names, or
// names with another token, scopes or source, or on an invalid line, is
// refused from this reload on, while untouched callers keep working; a
// caller the file adds, or a change it makes, waits for a file without
// errors. Keeping the previous callers whole (as before) left a revoked
// token working for as long as any other line held a typo; applying the
// valid lines alone would let a typo on the line that narrows a caller
// (the revocation itself) keep its old grant. Only the intersection can
// neither keep nor grant access either version of the file takes away.
// The cost falls on a file written in place and read half-written: the
// callers after the cut are out until the next reload reads it whole.
//
// A file that cannot be read, is too large, or holds no caller line at
// all (an editor's truncation, most likely) keeps the callers in force:
// revoking everyone is stopping the api role. At start (New), any error
// refuses the file. Every failure is logged with each problem, counted
// (mailplane_access_reloads_total{result="partial"|"error"}) and shown by
// mailplane_access_tokens_file_invalid until a good file is loaded.
func (a *Authenticator) Load() (bool, error) {
	if a.path == "" {
		return false, nil
	}
	st, err := os.Stat(a.path)
	if err == nil {
		a.mu.RLock()
		same := st.ModTime().Equal(a.mod) && st.Size() == a.size && a.entries != nil
		failed := st.ModTime().Equal(a.badMod) && st.Size() == a.badSize
		a.mu.RUnlock()
		if same || failed {
			return false, nil
		}
	}
	var b []byte
	if err == nil {
		b, err = os.ReadFile(a.path)
	}
	if err == nil && len(b) > maxFileBytes {
		err = errTooLarge
	}
	var (
		callers []*domain.Caller
		hashes  [][sha256.Size]byte
		lineErr []error
	)
	if err == nil {
		callers, hashes, lineErr = parseLines(b)
		if len(callers) == 0 && len(lineErr) == 0 {
			// Most likely a file caught between truncation and write (an
			// editor writing in place): dropping every caller would be an
			// outage. Revoking everyone is stopping the api role.
			err = errors.New("access: the tokens file has no callers")
		}
	}
	a.mu.RLock()
	started := a.entries != nil
	a.mu.RUnlock()
	if err == nil && len(lineErr) > 0 && !started {
		err = fmt.Errorf("access: tokens file: %w", errors.Join(lineErr...))
	}
	if err != nil {
		if st != nil {
			a.mu.Lock()
			a.badMod, a.badSize = st.ModTime(), st.Size()
			a.mu.Unlock()
		}
		a.m.reloads.WithLabelValues("error").Inc()
		a.m.invalid.Set(1)
		a.log.Error("tokens file not loaded; the previous callers stay in force", "path", a.path, "err", err)
		a.reported(started, Reload{Path: a.path, Failed: true})
		return false, err
	}
	es := make([]entry, len(callers))
	for i := range callers {
		es[i] = entry{hash: hashes[i], caller: callers[i]}
	}
	a.mu.Lock()
	if len(lineErr) > 0 {
		es = unchangedIn(a.entries, es)
	}
	changed := !slices.EqualFunc(a.entries, es, sameEntry)
	rl := diff(a.path, a.entries, es, len(lineErr))
	a.entries, a.mod, a.size = es, st.ModTime(), st.Size()
	a.badMod, a.badSize = time.Time{}, 0
	a.mu.Unlock()
	if changed || len(lineErr) > 0 {
		a.reported(started, rl)
	}
	a.m.callers.Set(float64(len(es)))
	if len(lineErr) > 0 {
		err := fmt.Errorf("access: tokens file: %w", errors.Join(lineErr...))
		a.m.reloads.WithLabelValues("partial").Inc()
		a.m.invalid.Set(1)
		a.log.Error("tokens file has invalid lines: only the callers its valid lines repeat unchanged stay in force; fix the file to apply its other changes",
			"path", a.path, "callers", len(es), "invalid_lines", len(lineErr), "err", err)
		return changed, err
	}
	a.m.reloads.WithLabelValues("ok").Inc()
	a.m.invalid.Set(0)
	a.log.Info("tokens file loaded", "path", a.path, "callers", len(es))
	return changed, nil
}

// unchangedIn returns the entries of inForce that next holds unchanged,
// in inForce's order.
func unchangedIn(inForce, next []entry) []entry {
	out := []entry{}
	for _, e := range inForce {
		if slices.ContainsFunc(next, func(n entry) bool { return sameEntry(e, n) }) {
			out = append(out, e)
		}
	}
	return out
}

func sameEntry(a, b entry) bool {
	return a.hash == b.hash && a.caller.Name == b.caller.Name && a.caller.Source == b.caller.Source &&
		slices.Equal(a.caller.Scopes, b.caller.Scopes)
}

// Watch reloads the file on SIGHUP and whenever its mtime or size changes
// (polled every interval; <= 0 means DefaultPollInterval), until ctx is
// done.
func (a *Authenticator) Watch(ctx context.Context, interval time.Duration) {
	if a.path == "" {
		return
	}
	if interval <= 0 {
		interval = DefaultPollInterval
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			a.mu.Lock()
			// Force a read even if the mtime did not move.
			a.mod, a.badMod = time.Time{}, time.Time{}
			a.mu.Unlock()
		case <-t.C:
		}
		_, _ = a.Load()
	}
}

// Authenticate returns the caller presenting token, or false. File tokens
// are compared in constant time against every entry (the loop never stops
// early); worker credentials are checked against their derived MAC.
func (a *Authenticator) Authenticate(token string) (*domain.Caller, bool) {
	if strings.HasPrefix(token, workerTokenPrefix) {
		c, ok := a.authenticateWorker(token)
		a.m.auth(ok, "worker")
		return c, ok
	}
	sum := sha256.Sum256([]byte(token))
	a.mu.RLock()
	es := a.entries
	a.mu.RUnlock()
	var found *domain.Caller
	for i := range es {
		if subtle.ConstantTimeCompare(sum[:], es[i].hash[:]) == 1 {
			found = es[i].caller
		}
	}
	a.m.auth(found != nil, "file")
	return found, found != nil
}

type metrics struct {
	reloads  *prometheus.CounterVec
	callers  prometheus.Gauge
	invalid  prometheus.Gauge
	refusals *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mailplane_access_reloads_total",
			Help: "Loads of the API tokens file, by result (ok; partial: invalid lines, only the callers the valid lines repeat unchanged stay; error: unreadable or without callers, the previous callers stay in force).",
		}, []string{"result"}),
		invalid: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "mailplane_access_tokens_file_invalid",
			Help: "1 while the API tokens file last read was not applied whole (invalid lines, unreadable, or without callers), 0 once a good file is loaded.",
		}),
		callers: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "mailplane_access_callers",
			Help: "Callers in force from the API tokens file.",
		}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mailplane_access_unauthenticated_total",
			Help: "Bearer tokens refused, by kind (file, worker).",
		}, []string{"kind"}),
	}
	if reg != nil {
		m.reloads = promreg.MustRegister(reg, m.reloads)
		m.callers = promreg.MustRegister(reg, m.callers)
		m.invalid = promreg.MustRegister(reg, m.invalid)
		m.refusals = promreg.MustRegister(reg, m.refusals)
	}
	m.reloads.WithLabelValues("ok")
	m.reloads.WithLabelValues("partial")
	m.reloads.WithLabelValues("error")
	return m
}

func (m *metrics) auth(ok bool, kind string) {
	if !ok {
		m.refusals.WithLabelValues(kind).Inc()
	}
}
