package api

import (
	"errors"
	"io"
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/mailplane/mailplane/domain"
)

// Request bodies are memory the caller decides to spend, so no body is
// read before the server knows whose budget it comes from: a route behind
// bearer auth authenticates first (a header, no body), a route without it
// says which class its callers belong to (RouteLimits.Classify, again on
// the headers alone). Each class of callers has its own in-flight byte
// budget, so anonymous and console traffic can never take the bytes of
// workers' heartbeats, producers or Stripe; and every body must arrive at
// a minimum rate and within its class's deadline, so a trickling body
// cannot hold its reservation for long (docs/architecture.md §4, api).

// Class is a class of callers: request bodies of each class are reserved
// from that class's own in-flight budget. The classes are a fixed set
// (a bounded metric label).
type Class string

// The caller classes.
const (
	// ClassAnonymous: requests with no credential checked before their body
	// (the console login form; a console post without a live session is
	// refused from its headers).
	ClassAnonymous Class = "anonymous"
	// ClassConsole: posts of a live console session.
	ClassConsole Class = "console"
	// ClassProducer: bearer-token callers (POST /v1/events and every route
	// behind bearer auth that declares no other class).
	ClassProducer Class = "producer"
	// ClassBilling: the Stripe webhook, whose signature header was well
	// formed and fresh before its body was read.
	ClassBilling Class = "billing"
	// ClassHeartbeat: sending workers' heartbeats, authenticated with the
	// worker's own credential.
	ClassHeartbeat Class = "heartbeat"
)

// Classes lists every class.
func Classes() []Class {
	return []Class{ClassAnonymous, ClassConsole, ClassProducer, ClassBilling, ClassHeartbeat}
}

// ClassLimits bound the request bodies of one class.
type ClassLimits struct {
	// Budget is the bytes of bodies of the class being read at once; a
	// body that would go beyond it gets 503 unavailable with Retry-After
	// before it is read. A body of unknown length counts as its route's
	// cap.
	Budget int64
	// Deadline is how long after its headers a body of the class must
	// have arrived whole; past it the request is cut (408 request_timeout).
	Deadline time.Duration
}

// Default class limits. Producers keep the 64 MiB of the former
// server-wide budget and the server's 30 s read timeout (a 1 MiB batch on
// a slow link); the other classes send bodies of a few hundred bytes to a
// few KiB that arrive in one packet.
const (
	DefaultAnonymousBudget = 1 << 20  // 256 login forms of 4 KiB
	DefaultConsoleBudget   = 1 << 20  // 256 console posts of 4 KiB
	DefaultBillingBudget   = 8 << 20  // 32 Stripe events of 256 KiB
	DefaultHeartbeatBudget = 16 << 20 // 1,024 chunked heartbeats of 16 KiB; tens of thousands of declared ones
	DefaultSmallDeadline   = 10 * time.Second
	DefaultProducerTimeout = 30 * time.Second
)

// DefaultClassLimits returns the limits of every class.
func DefaultClassLimits() map[Class]ClassLimits {
	return map[Class]ClassLimits{
		ClassAnonymous: {DefaultAnonymousBudget, DefaultSmallDeadline},
		ClassConsole:   {DefaultConsoleBudget, DefaultSmallDeadline},
		ClassProducer:  {DefaultMaxInflightBytes, DefaultProducerTimeout},
		ClassBilling:   {DefaultBillingBudget, DefaultSmallDeadline},
		ClassHeartbeat: {DefaultHeartbeatBudget, DefaultSmallDeadline},
	}
}

// BodyRate is the minimum rate of a request body: after Grace from its
// headers, the bytes received must keep up with Min bytes a second on
// average, or the request is cut (408 request_timeout) and its
// reservation released.
type BodyRate struct {
	Min   int64
	Grace time.Duration
}

// Default minimum body rate: a body slower than 1 KiB/s after 2 s holds
// a 4 KiB reservation for at most 6 s.
const (
	DefaultMinBodyRate   = 1 << 10
	DefaultBodyRateGrace = 2 * time.Second
)

// CodeRequestTimeout is the stable code of a 408: the request body came
// slower than the minimum rate, or not whole within its deadline.
const CodeRequestTimeout domain.Code = "request_timeout"

// RouteLimits is how a route's request bodies are admitted (HandleLimited).
type RouteLimits struct {
	// Class whose budget the body is reserved from. Default: ClassProducer
	// behind bearer auth, ClassAnonymous without it.
	Class Class
	// MaxBody is the most the route reads (default: WithMaxBodyBytes's). A
	// body declared longer is refused 413 too_large before it is read;
	// one of unknown length is cut there.
	MaxBody int64
	// Classify, when set, runs on the headers alone before any budget is
	// reserved: it returns the class to charge, or answers the request
	// itself and returns false (a rate limit per client address, a
	// malformed signature header).
	Classify func(w http.ResponseWriter, r *http.Request) (Class, bool)
}

// WithClassLimits overrides the limits of the classes given (the others
// keep DefaultClassLimits; WithMaxInflightBytes sets the producers'
// budget).
func WithClassLimits(m map[Class]ClassLimits) Option {
	return func(c *config) {
		for k, v := range m {
			c.classes[k] = v
		}
	}
}

// WithBodyRate sets the minimum body rate (default DefaultMinBodyRate
// after DefaultBodyRateGrace).
func WithBodyRate(r BodyRate) Option { return func(c *config) { c.rate = r } }

// One authenticated caller (a tokens-file caller, a worker id) holds at
// most a quarter of its class's budget, and at most callerBodies bodies
// of its route's cap: a class is shared by many callers (every sending
// worker's heartbeats, every producer), and without a share of its own
// one worker credential, or one producer token, trickling bodies held the
// whole class budget and every other caller of the class got 503.
const (
	callerShareDivisor = 4
	callerBodies       = 16
)

// budget counts the bytes of request bodies of one class being read, in
// all and by caller.
type budget struct {
	max     int64
	mu      sync.Mutex
	n       int64
	callers map[string]int64 // bytes held by each caller with any held
}

// acquire reserves n bytes for caller (a key, "" for a caller not
// authenticated before its body), of which the caller may hold at most
// perCaller (but always one body); it reports whether it did, and whether a refusal is the
// caller's own share being spent.
func (b *budget) acquire(n int64, caller string, perCaller int64) (ok, own bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	// A caller holding nothing may always take one body (the class
	// budget permitting), whatever its share.
	if held := b.callers[caller]; caller != "" && held > 0 && held+n > perCaller {
		return false, true
	}
	if b.n+n > b.max {
		return false, false
	}
	b.n += n
	if caller != "" {
		if b.callers == nil {
			b.callers = map[string]int64{}
		}
		b.callers[caller] += n
	}
	return true, false
}

func (b *budget) release(n int64, caller string) {
	b.mu.Lock()
	b.n -= n
	if caller != "" {
		if b.callers[caller] -= n; b.callers[caller] <= 0 {
			delete(b.callers, caller)
		}
	}
	b.mu.Unlock()
}

// callerShareKey names the authenticated caller of r for its share of a
// class's budget: a worker credential by its worker id, a tokens-file
// caller by its name; "" when the route does not authenticate before
// the body.
func callerShareKey(r *http.Request) string {
	c := CallerFrom(r.Context())
	switch {
	case c == nil:
		return ""
	case c.WorkerID != "":
		return "worker " + c.WorkerID
	default:
		return "caller " + c.Name
	}
}

func (c *config) validLimits() error {
	for _, k := range Classes() {
		l, ok := c.classes[k]
		if !ok || l.Budget <= 0 || l.Deadline <= 0 {
			return errors.New("api: every class needs a positive budget and deadline")
		}
	}
	if len(c.classes) != len(Classes()) {
		return errors.New("api: unknown caller class")
	}
	if c.rate.Min <= 0 || c.rate.Grace <= 0 {
		return errors.New("api: the minimum body rate and its grace must be positive")
	}
	return nil
}

// admitBody reserves a request's body from its class's budget (refusing
// it 503 when the budget is spent, 413 when declared over the route's cap)
// and holds the body to the minimum rate and the class deadline.
func (s *Server) admitBody(lim RouteLimits, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		class := lim.Class
		if lim.Classify != nil {
			c, ok := lim.Classify(w, r)
			if !ok {
				return
			}
			class = c
		}
		if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
			h.ServeHTTP(w, r)
			return
		}
		if r.ContentLength > lim.MaxBody {
			WriteError(w, http.StatusRequestEntityTooLarge, domain.CodeTooLarge,
				"request body is larger than "+strconv.FormatInt(lim.MaxBody, 10)+" bytes")
			return
		}
		n := r.ContentLength
		if n < 0 {
			n = lim.MaxBody // unknown length: reserve the most the route reads
		}
		b, m := s.budgets[class], s.metrics.classes[class]
		who := callerShareKey(r)
		if ok, own := b.acquire(n, who, min(b.max/callerShareDivisor, callerBodies*lim.MaxBody)); !ok {
			m.shed.Inc()
			msg := "too many request bodies in flight; retry shortly"
			if own {
				msg = "too many request bodies of this caller in flight; retry shortly"
			}
			w.Header().Set("Retry-After", "1")
			w.Header().Set("Connection", "close")
			WriteError(w, http.StatusServiceUnavailable, domain.CodeUnavailable, msg)
			return
		}
		m.inflight.Add(float64(n))
		defer func() {
			b.release(n, who)
			m.inflight.Sub(float64(n))
		}()
		start := time.Now()
		body := &guardedBody{
			src:   http.MaxBytesReader(w, r.Body, lim.MaxBody),
			rc:    http.NewResponseController(w),
			rate:  s.cfg.rate,
			start: start,
			// Never past the server's read timeout, which this deadline
			// replaces on the connection.
			deadline: start.Add(min(s.cfg.classes[class].Deadline, s.cfg.timeouts.Read)),
		}
		r.Body = body
		gw := &guardedWriter{ResponseWriter: w, body: body}
		h.ServeHTTP(gw, r)
		if !body.cut || gw.wrote {
			return
		}
		m.slow.Inc()
		if st := stateFrom(r); st != nil {
			st.cut = true // nothing more is read of it
		}
		w.Header().Set("Connection", "close")
		WriteError(w, http.StatusRequestTimeout, CodeRequestTimeout,
			"the request body came too slowly; send it whole and at once")
	})
}

// errBodyTooSlow is what a cut body reads.
var errBodyTooSlow = errors.New("api: request body too slow")

// guardedBody is a request body held to the minimum rate and the
// deadline: before each read it sets the connection's read deadline to
// the time by which the bytes so far stop keeping up with the rate (or
// the deadline, if sooner). A read that times out cuts the body. Over TLS
// the deadline is the underlying connection's, and a read that timed out
// is never retried, so no half-read record is ever resumed; over HTTP/2
// it is the stream's.
type guardedBody struct {
	src      io.ReadCloser
	rc       *http.ResponseController
	rate     BodyRate
	start    time.Time
	deadline time.Time
	n        int64
	cut      bool
	done     bool
}

func (b *guardedBody) Read(p []byte) (int, error) {
	if b.cut {
		return 0, errBodyTooSlow
	}
	if b.done {
		return b.src.Read(p)
	}
	due := b.start.Add(b.rate.Grace + time.Duration(float64(b.n)/float64(b.rate.Min)*float64(time.Second)))
	if due.After(b.deadline) {
		due = b.deadline
	}
	if !time.Now().Before(due) {
		return 0, b.cutOff()
	}
	checked := b.rc.SetReadDeadline(due) == nil
	n, err := b.src.Read(p)
	b.n += int64(n)
	switch {
	case err == io.EOF:
		b.done = true
		// The body is over: the server's read of the next request (or
		// its check for a closed connection) is not the body's.
		_ = b.rc.SetReadDeadline(time.Time{})
	case err != nil && errors.Is(err, os.ErrDeadlineExceeded):
		return n, b.cutOff()
	case err == nil && !checked && !time.Now().Before(due):
		// A connection without deadlines: cut at the read that came late.
		return n, b.cutOff()
	}
	return n, err
}

// cutOff marks the body cut and makes any further read of the connection
// fail at once.
func (b *guardedBody) cutOff() error {
	b.cut = true
	_ = b.rc.SetReadDeadline(time.Now().Add(-time.Second))
	return errBodyTooSlow
}

func (b *guardedBody) Close() error { return b.src.Close() }

// guardedWriter holds back what a handler writes after its body was cut:
// admitBody answers 408 instead of the handler's read error.
type guardedWriter struct {
	http.ResponseWriter
	body  *guardedBody
	wrote bool // something went out before the cut
}

func (w *guardedWriter) WriteHeader(code int) {
	if w.body.cut && !w.wrote {
		return
	}
	w.wrote = true
	w.ResponseWriter.WriteHeader(code)
}

func (w *guardedWriter) Write(p []byte) (int, error) {
	if w.body.cut && !w.wrote {
		return len(p), nil
	}
	w.wrote = true
	return w.ResponseWriter.Write(p)
}

func (w *guardedWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
