package opsaudit_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/access"
	"github.com/mailplane/mailplane/internal/eventschema"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/kafkatest"
	"github.com/mailplane/mailplane/internal/mailplanetest"
	"github.com/mailplane/mailplane/internal/opsaudit"
	"github.com/mailplane/mailplane/topics"
)

// TestRecordWritesOneRecord: each Record is one record on the ops audit
// topic, keyed by the actor, with the CloudEvents headers, at the
// server's time, conforming to its schema; read back newest first.
func TestRecordWritesOneRecord(t *testing.T) {
	t.Parallel()
	kcfg := kafkatest.Config(t, 4)
	reg := prometheus.NewRegistry()
	rec, err := opsaudit.New(kcfg, "mailplane/test", reg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer rec.Close()
	before := time.Now()
	entries := []opsaudit.Entry{
		{Actor: opsaudit.Caller("ada"), Action: domain.OpsConsoleLogin},
		{Actor: opsaudit.ClientAddress("192.0.2.7"), Action: domain.OpsConsoleLogin, Err: domain.Errorf(domain.CodeUnauthorized, "the token is not valid"), Refused: true},
		{Actor: opsaudit.Actor{Name: "ops", Kind: domain.OpsActorKafkaPrincipal}, Action: domain.OpsProjectorSeek,
			Params: &domain.OpsParams{Target: "registry", Filter: "mailplane.org.events.v1/0", To: "3"}, Err: errors.New("broker down")},
	}
	for _, e := range entries {
		if err := rec.Record(t.Context(), e); err != nil {
			t.Fatal(err)
		}
	}
	got, err := opsaudit.Recent(t.Context(), kcfg, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 {
		t.Fatalf("%d records, want 3: %+v", len(got), got)
	}
	want := []struct {
		actor   string
		kind    domain.OpsActorKind
		action  domain.OpsActionName
		outcome domain.OpsOutcome
		code    string
	}{
		{"ops", domain.OpsActorKafkaPrincipal, domain.OpsProjectorSeek, domain.OpsFailed, "internal"},
		{"192.0.2.7", domain.OpsActorClientAddress, domain.OpsConsoleLogin, domain.OpsRefused, "unauthorized"},
		{"ada", domain.OpsActorCaller, domain.OpsConsoleLogin, domain.OpsOK, ""},
	}
	for i, w := range want {
		g := got[i]
		if g.Actor != w.actor || g.ActorKind != w.kind || g.Action != w.action || g.Outcome != w.outcome || g.Code != w.code || g.Source != "mailplane/test" {
			t.Errorf("record %d: %+v, want %+v", i, g, w)
		}
		if g.At.Before(before.Add(-time.Second)) || g.At.After(time.Now().Add(time.Second)) {
			t.Errorf("record %d at %v: not the server's time", i, g.At)
		}
	}
	if p := got[0].Params; p == nil || p.Target != "registry" || p.To != "3" || got[0].Detail != "broker down" {
		t.Errorf("seek record: params %+v, detail %q", p, got[0].Detail)
	}
	// The records on the log: key the actor, value what the schema says.
	n := 0
	_, err = kafka.ReadToEnd(t.Context(), kcfg, kafka.ReadSpec{Topics: []string{kcfg.Topic(topics.OpsAudit)}}, func(r *kgo.Record) error {
		n++
		typ, _ := topics.Header(r, topics.HeaderType)
		if ps := eventschema.Derived().Validate(typ, r.Value); typ != domain.TypeOpsAction || len(ps) > 0 {
			t.Errorf("record of type %q: %s: %s", typ, r.Value, ps)
		}
		if s, _ := topics.Header(r, topics.HeaderSubject); s != string(r.Key) || !strings.Contains(string(r.Value), `"actor":"`+s+`"`) {
			t.Errorf("key %q, subject %q, value %s", r.Key, s, r.Value)
		}
		return nil
	})
	if err != nil || n != 3 {
		t.Fatalf("read %d records: %v", n, err)
	}
	if v := mailplanetest.Metric(t, reg, "mailplane_ops_audit_records_total", "outcome", "refused"); v != 1 {
		t.Errorf("records_total{outcome=refused} = %v", v)
	}
}

// TestRecordFailureCountedAndReturned: a record the broker does not take
// is logged, counted and returned to the caller, who decides.
func TestRecordFailureCountedAndReturned(t *testing.T) {
	t.Parallel()
	kcfg := kafkatest.Config(t, 4)
	kcfg.Namespace = "nowhere" // its topic does not exist
	reg := prometheus.NewRegistry()
	rec, err := opsaudit.New(kcfg, "mailplane/test", reg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer rec.Close()
	opsaudit.SetTimeout(rec, time.Second)
	if err := rec.Record(t.Context(), opsaudit.Entry{Actor: opsaudit.Caller("ada"), Action: domain.OpsDLQRedrive}); err == nil {
		t.Fatal("a record to a topic that does not exist was taken")
	}
	if v := mailplanetest.Metric(t, reg, "mailplane_ops_audit_failures_total", "action", "dlq_redrive"); v != 1 {
		t.Errorf("failures_total = %v, want 1", v)
	}
}

// TestActionAlwaysValid: whatever text an action's actor, parameters or
// error carry (hostile characters, oversized), its record validates and
// conforms to the schema: cleaned and cut, never refused, never forged.
func TestActionAlwaysValid(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 12, 5, 1, 0, 0, 0, time.UTC)
	hostile := "ada\u001b[2J\r\nroot\u202e" + strings.Repeat("é", 600)
	a := opsaudit.Action(at, opsaudit.Entry{Actor: opsaudit.Caller(hostile), Action: domain.OpsTokensReload,
		Params: &domain.OpsParams{Target: hostile, Added: hostile, Count: -5}, Err: errors.New(hostile)})
	checkValid(t, a)
	if strings.ContainsAny(a.Actor, "\u001b\r\n\u202e") || len([]rune(a.Actor)) != domain.OpsActorMax || a.Params.Count != 0 {
		t.Errorf("not cleaned: actor %q, count %d", a.Actor, a.Params.Count)
	}
	if empty := opsaudit.Action(at, opsaudit.Entry{Action: domain.OpsConsoleLogout, Params: &domain.OpsParams{}}); empty.Actor == "" || empty.Params != nil {
		t.Errorf("empty actor %q, empty params %+v", empty.Actor, empty.Params)
	}
}

func FuzzAction(f *testing.F) {
	f.Add("ada", "registry", "boom", int64(3))
	f.Add("\u0000", "\u2028", "\xff", int64(-1))
	f.Fuzz(func(t *testing.T, actor, target, msg string, count int64) {
		a := opsaudit.Action(time.Unix(1, 0), opsaudit.Entry{Actor: opsaudit.Caller(actor), Action: domain.OpsDLQRedrive,
			Params: &domain.OpsParams{Target: target, Filter: msg, Count: count}, Err: errors.New(msg), Refused: true})
		checkValid(t, a)
	})
}

func checkValid(t *testing.T, a domain.OpsAction) {
	t.Helper()
	if ps := a.Validate(); len(ps) > 0 {
		t.Fatalf("invalid: %s", ps)
	}
	b, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	if ps := eventschema.Derived().Validate(domain.TypeOpsAction, b); len(ps) > 0 {
		t.Fatalf("the schema refuses %s: %s", b, ps)
	}
}

// TestTokensReloadNamesNoToken: a reload's record names callers, never
// their tokens.
func TestTokensReloadNamesNoToken(t *testing.T) {
	t.Parallel()
	e := opsaudit.TokensReload(opsaudit.Process("api"), access.Reload{Path: "/etc/tokens", Added: []string{"bob"}, Removed: []string{"eve"}, InvalidLines: 1})
	a := opsaudit.Action(time.Unix(1, 0), e)
	if a.Outcome != domain.OpsFailed || a.Code != "invalid" || a.Params.Added != "bob" || a.Params.Removed != "eve" || a.ActorKind != domain.OpsActorProcess {
		t.Errorf("%+v %+v", a, a.Params)
	}
	if f := opsaudit.Action(time.Unix(1, 0), opsaudit.TokensReload(opsaudit.Process("api"), access.Reload{Failed: true})); f.Outcome != domain.OpsRefused {
		t.Errorf("a file not loaded: %s", f.Outcome)
	}
}
