// Package opsaudit writes the operator audit (issue 25, point 5): one
// domain.OpsAction record per operator action on topics.OpsAudit, keyed by
// the actor. docs/architecture.md (opsaudit) says who calls it.
//
// A record that cannot be written is logged and counted
// (mailplane_ops_audit_failures_total) and Record returns the error; what
// the action does then is its caller's choice: the console refuses a login
// it cannot audit (the session is not issued), so "who did this" is always
// answerable for what is done through it; the CLI, which holds the
// brokers' and the database's own credentials and could act without
// mailplane at all, warns and keeps its result.
package opsaudit

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/user"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/promreg"
	"github.com/mailplane/mailplane/topics"
)

// Timeout bounds one record's write (the producer's retries included).
const Timeout = 10 * time.Second

// Actor is who did an action.
type Actor struct {
	Name string
	Kind domain.OpsActorKind
}

// Caller is an API or console caller, by its name in the tokens file.
func Caller(name string) Actor { return Actor{Name: name, Kind: domain.OpsActorCaller} }

// ClientAddress is an unauthenticated client (a refused console login), by
// its address.
func ClientAddress(addr string) Actor { return Actor{Name: addr, Kind: domain.OpsActorClientAddress} }

// Process is the process itself (a tokens-file reload it noticed).
func Process(name string) Actor { return Actor{Name: name, Kind: domain.OpsActorProcess} }

// CLI is the actor of a CLI command acting with cfg's credentials: its
// Kafka SASL user when it has one (the principal the brokers authorised),
// else the OS user and host ("user@host"), which nothing authenticated.
func CLI(cfg kafka.Config) Actor {
	if cfg.SASL.Enabled() && cfg.SASL.User != "" {
		return Actor{Name: cfg.SASL.User, Kind: domain.OpsActorKafkaPrincipal}
	}
	name := "unknown"
	if u, err := user.Current(); err == nil && u.Username != "" {
		name = u.Username
	}
	if h, err := os.Hostname(); err == nil && h != "" {
		name += "@" + h
	}
	return Actor{Name: name, Kind: domain.OpsActorOSUser}
}

// Entry is one action to record.
type Entry struct {
	Actor  Actor
	Action domain.OpsActionName
	// Params are the action's parameters: names, positions, counts; never
	// a token, password or credential.
	Params *domain.OpsParams
	// Err is nil when the action went well.
	Err error
	// Refused, with Err, says the action was refused before it changed
	// anything; otherwise it failed.
	Refused bool
	// Code, when set, is the stable code recorded for Err (otherwise
	// domain.ErrorCode of it).
	Code domain.Code
}

// Recorder writes audit records through its own producer.
type Recorder struct {
	cl       *kgo.Client
	topic    string
	source   string
	log      *slog.Logger
	now      func() time.Time
	timeout  time.Duration
	owned    bool // the producer is the recorder's (New), closed with it
	failures *prometheus.CounterVec
	records  *prometheus.CounterVec
}

// New returns a recorder writing to cfg's ops audit topic as source (the
// records' ce_source, e.g. "mailplane/cli", "mailplane/api") through a
// producer of its own, with its metrics on reg. Close it.
func New(cfg kafka.Config, source string, reg prometheus.Registerer, log *slog.Logger) (*Recorder, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	cl, err := kafka.NewProducer(cfg.WithLogger(log), kgo.ProduceRequestTimeout(Timeout), kgo.RecordDeliveryTimeout(Timeout))
	if err != nil {
		return nil, fmt.Errorf("opsaudit: %w", err)
	}
	r := NewOn(cl, cfg.Namespace, source, reg, log)
	r.owned = true
	return r, nil
}

// NewOn is New writing through cl, a producer (kafka.NewProducer) of a
// process that has one, in namespace ns; Close leaves cl open.
func NewOn(cl *kgo.Client, ns topics.Namespace, source string, reg prometheus.Registerer, log *slog.Logger) *Recorder {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	return &Recorder{
		cl: cl, topic: ns.Topic(topics.OpsAudit), source: source, log: log, now: time.Now, timeout: Timeout,
		failures: promreg.MustRegister(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mailplane_ops_audit_failures_total",
			Help: "Operator audit records that could not be written, by action.",
		}, []string{"action"})),
		records: promreg.MustRegister(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mailplane_ops_audit_records_total",
			Help: "Operator audit records written, by action and outcome.",
		}, []string{"action", "outcome"})),
	}
}

// Close closes the recorder's producer, if it is its own.
func (r *Recorder) Close() {
	if r.owned {
		r.cl.Close()
	}
}

// Record writes e's record at the server's time and waits for the broker
// to acknowledge it (at most Timeout). A failure is logged and counted and
// returned.
func (r *Recorder) Record(ctx context.Context, e Entry) error {
	a := Action(r.now(), e)
	rec, err := topics.EncodeTo(r.topic, domain.Event{
		ID: domain.NewEventID(), Type: domain.TypeOpsAction, Source: r.source, Time: a.At, Subject: a.Actor, Data: &a,
	})
	if err == nil {
		if ps := a.Validate(); len(ps) > 0 {
			err = ps.Err()
		}
	}
	if err == nil {
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.timeout)
		err = r.cl.ProduceSync(pctx, rec).FirstErr()
		cancel()
	}
	if err != nil {
		r.failures.WithLabelValues(string(e.Action)).Inc()
		r.log.Error("operator audit record not written", "action", e.Action, "actor", a.Actor, "outcome", a.Outcome, "err", err)
		return fmt.Errorf("opsaudit: %s by %s not recorded: %w", e.Action, a.Actor, err)
	}
	r.records.WithLabelValues(string(e.Action), string(a.Outcome)).Inc()
	return nil
}

// Action is the record of e at time at: its outcome and code from e.Err,
// its texts cut and cleaned so that it always validates.
func Action(at time.Time, e Entry) domain.OpsAction {
	a := domain.OpsAction{
		At: at.UTC(), Actor: domain.CutOpsText(e.Actor.Name, domain.OpsActorMax), ActorKind: e.Actor.Kind,
		Action: e.Action, Outcome: domain.OpsOK, Params: cleanParams(e.Params),
	}
	if a.Actor == "" {
		a.Actor = "unknown"
	}
	if e.Err != nil {
		a.Outcome = domain.OpsFailed
		if e.Refused {
			a.Outcome = domain.OpsRefused
		}
		code := e.Code
		if code == "" {
			code = domain.ErrorCode(e.Err)
		}
		a.Code = string(code)
		if a.Code == "" {
			a.Code = string(a.Outcome) // an error without a code of its own
		}
		a.Detail = domain.CutOpsText(e.Err.Error(), domain.OpsDetailMax)
	}
	return a
}

func cleanParams(p *domain.OpsParams) *domain.OpsParams {
	if p == nil {
		return nil
	}
	c := *p
	for _, s := range []*string{&c.Target, &c.To, &c.Filter, &c.Added, &c.Removed, &c.Changed} {
		*s = domain.CutOpsText(*s, domain.OpsParamMax)
	}
	c.Count = min(max(c.Count, 0), 1<<31-1)
	if c == (domain.OpsParams{}) {
		return nil
	}
	return &c
}

// Names joins names for a parameter (Added, Removed, Changed), sorted by
// the caller.
func Names(names []string) string { return strings.Join(names, ",") }

// Refusal reports whether err, an action's error, refused it (a domain
// error with a code of its own: bad input, a rule, a missing right)
// rather than failed it (an internal error, a dependency unavailable).
func Refusal(err error) bool {
	c := domain.ErrorCode(err)
	return err != nil && c != domain.CodeInternal && c != domain.CodeUnavailable
}
