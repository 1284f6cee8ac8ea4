package api

import (
	"context"
	"errors"
	"maps"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/access"
	"github.com/mailplane/mailplane/internal/mailplanetest"
	"github.com/mailplane/mailplane/internal/migrations"
	"github.com/mailplane/mailplane/internal/ownership"
	"github.com/mailplane/mailplane/internal/pgtest"
	"github.com/mailplane/mailplane/producer"
)

const (
	tokAlpha = "tok-alpha-6b1f0e9d8c7b6a5f4e3d2c1b0a9f8e7d"
	tokBeta  = "tok-beta-1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f"
	tokOps   = "tok-ops-9f8e7d6c5b4a39281706f5e4d3c2b1a0"
)

// ownersEnv is a server whose ingest checks ownership against a real
// Postgres: producers alpha (/alpha) and beta (/beta), publish:public
// only, and an operator (/ops) who may transfer.
type ownersEnv struct {
	*env
	store *ownership.Store
}

func ownershipAuth(t testing.TB) *access.Authenticator {
	t.Helper()
	opsScopes := []string{domain.ScopeOps, domain.ScopePublishPublic,
		domain.PublishScope(domain.TypeMailboxOwnerTransferred), domain.PublishScope(domain.TypeOrgOwnerTransferred)}
	a, err := access.FromBytes([]byte(
		access.Line("alpha", tokAlpha, []string{domain.ScopePublishPublic}, "/alpha") + "\n" +
			access.Line("beta", tokBeta, []string{domain.ScopePublishPublic}, "/beta") + "\n" +
			access.Line("ops", tokOps, opsScopes, "/ops") + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func migratedPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	db := pgtest.New(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := migrations.Apply(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}
	return db.Pool
}

func newOwnersEnv(t *testing.T, pool *pgxpool.Pool) *ownersEnv {
	t.Helper()
	store := ownership.NewStore(pool)
	g := ownership.NewGuard(store)
	e := newEnv(t, envOpts{
		wrap: func(p Producer) Producer { return OwnershipProducer(p, g) },
		opts: []Option{WithAuthenticator(ownershipAuth(t)), WithAdmission(Admissions(OwnershipAdmission(g)))},
	})
	return &ownersEnv{env: e, store: store}
}

// register is a mailbox.added of mailbox into org at host, with password.
func register(src, mailbox, org, host, password string) map[string]any {
	ev := mailboxAdded()
	ev = with(ev, "source", src)
	ev = with(ev, "subject", mailbox)
	ev = with(ev, "data.mailbox_id", mailbox)
	ev = with(ev, "data.org_id", org)
	ev = with(ev, "data.imap.host", host)
	return with(ev, "data.credentials.password", password)
}

func unregister(src, mailbox string) map[string]any {
	ev := with(mailboxRemoved(), "source", src)
	ev = with(ev, "subject", mailbox)
	return with(ev, "data.mailbox_id", mailbox)
}

func transfer(typ, idField, id, to string) map[string]any {
	return envelope(typ, id, map[string]any{idField: id, "owner": to, "comment": "ticket OPS-1"})
}

func (o *ownersEnv) post(token string, evs ...map[string]any) (*http.Response, []byte) {
	o.t.Helper()
	if len(evs) == 1 {
		return o.Do(req{ContentType: ContentTypeStructured, Body: mailplanetest.MustJSON(o.t, evs[0]), Token: token})
	}
	return o.postBatchAs(token, evs...)
}

func (o *ownersEnv) accept(what, token string, evs ...map[string]any) {
	o.t.Helper()
	if resp, body := o.post(token, evs...); resp.StatusCode != http.StatusAccepted {
		o.t.Fatalf("%s: %d %s", what, resp.StatusCode, body)
	}
}

// refuse posts evs and wants 403 not_owner naming the events at idx, and
// no topic grown.
func (o *ownersEnv) refuse(what, token string, idx []int, evs ...map[string]any) {
	o.t.Helper()
	before := o.watermarks()
	resp, body := o.post(token, evs...)
	er := decodeErr(o.t, body)
	if resp.StatusCode != http.StatusForbidden || er.Error.Code != domain.CodeNotOwner {
		o.t.Fatalf("%s: %d %s, want 403 not_owner", what, resp.StatusCode, body)
	}
	if len(er.Problems) != len(idx) {
		o.t.Fatalf("%s: problems %+v, want events %v", what, er.Problems, idx)
	}
	for i, p := range er.Problems {
		if p.Index != idx[i] || p.Code != domain.CodeNotOwner || strings.Contains(p.Message, "/alpha") || strings.Contains(p.Message, "/beta") {
			o.t.Errorf("%s: problem %+v, want event %d, not naming the owner", what, p, idx[i])
		}
	}
	after := o.watermarks()
	for tp, ps := range before {
		if !maps.Equal(ps, after[tp]) {
			o.t.Errorf("%s: %s grew from %v to %v: something was produced", what, tp, ps, after[tp])
		}
	}
}

func (o *ownersEnv) owner(kind domain.OwnedKind, id string) string {
	o.t.Helper()
	k := ownership.Key{Kind: kind, ID: id}
	cs, err := o.store.Claims(o.t.Context(), k)
	if err != nil {
		o.t.Fatal(err)
	}
	return cs[k].Owner
}

// TestOwnershipMatrix: re-add, move to another org, rotate (re-add with
// new credentials and endpoint) and remove, each by the owner (accepted),
// by another producer (403 not_owner, nothing on the log) and by an
// operator (accepted); an add into another tenant's org is refused; the
// tenant is the caller's configured source, whatever path below it the
// event names.
func TestOwnershipMatrix(t *testing.T) {
	t.Parallel()
	o := newOwnersEnv(t, migratedPool(t))
	mb, org := newUUID(), newUUID()
	o.accept("alpha registers", tokAlpha, register("/alpha/sessions", mb, org, "imap.alpha.example", "pw-1"))
	if got := o.owner(domain.OwnedMailbox, mb); got != "/alpha" {
		t.Fatalf("mailbox owner %q, want the tenant /alpha", got)
	}
	if got := o.owner(domain.OwnedOrg, org); got != "/alpha" {
		t.Fatalf("org owner %q", got)
	}
	betaOrg := newUUID()
	o.accept("beta registers its own", tokBeta, register("/beta", newUUID(), betaOrg, "imap.beta.example", "pw-b"))

	type change struct {
		name string
		ev   func(src string) map[string]any
	}
	for _, c := range []change{
		{"re-add", func(src string) map[string]any { return register(src, mb, org, "imap.alpha.example", "pw-1") }},
		{"move to another org", func(src string) map[string]any {
			if src == "/beta" {
				return register(src, mb, betaOrg, "imap.alpha.example", "pw-1")
			}
			return register(src, mb, newUUID(), "imap.alpha.example", "pw-1")
		}},
		{"rotate credentials and endpoint", func(src string) map[string]any {
			return register(src, mb, org, "imap."+strings.Trim(src, "/")+".example", "pw-"+newUUID()[:8])
		}},
	} {
		o.refuse(c.name+" by another producer", tokBeta, []int{0}, c.ev("/beta"))
		o.accept(c.name+" by the owner", tokAlpha, c.ev("/alpha"))
		o.accept(c.name+" by ops", tokOps, c.ev("/ops"))
		if got := o.owner(domain.OwnedMailbox, mb); got != "/alpha" {
			t.Fatalf("after %s: owner %q", c.name, got)
		}
	}
	// Binary mode is refused the same way.
	ev := register("/beta", mb, betaOrg, "imap.beta.example", "pw-x")
	h := binaryHeadersOf(ev)
	h["Authorization"] = "Bearer " + tokBeta
	before := o.watermarks()
	if resp, body := o.Do(req{ContentType: ContentTypeBinary, Body: mailplanetest.MustJSON(t, ev["data"]), NoAuth: true, Headers: h}); resp.StatusCode != http.StatusForbidden {
		t.Fatalf("binary re-add by beta: %d %s", resp.StatusCode, body)
	}
	if after := o.watermarks(); !maps.EqualFunc(before, after, maps.Equal) {
		t.Fatal("binary refusal produced")
	}

	// An add into another tenant's org.
	o.refuse("beta adds into alpha's org", tokBeta, []int{0}, register("/beta", newUUID(), org, "imap.beta.example", "pw-b"))

	// Remove.
	o.refuse("removal by another producer", tokBeta, []int{0}, unregister("/beta", mb))
	o.accept("removal by the owner", tokAlpha, unregister("/alpha", mb))
	if got := o.owner(domain.OwnedMailbox, mb); got != "" {
		t.Fatalf("a removed mailbox is still claimed by %q", got)
	}
	mb2 := newUUID()
	o.accept("alpha registers another", tokAlpha, register("/alpha", mb2, org, "imap.alpha.example", "pw-2"))
	o.accept("removal by ops", tokOps, unregister("/ops", mb2))

	// Removal released the claim: another tenant registers the mailbox
	// (into its own org); the org stays alpha's.
	o.accept("beta registers the removed mailbox", tokBeta, register("/beta", mb, betaOrg, "imap.beta.example", "pw-b"))
	if got := o.owner(domain.OwnedMailbox, mb); got != "/beta" {
		t.Fatalf("after beta's add: owner %q", got)
	}
	o.refuse("alpha re-adds it now", tokAlpha, []int{0}, register("/alpha", mb, org, "imap.alpha.example", "pw-1"))
	if got := o.owner(domain.OwnedOrg, org); got != "/alpha" {
		t.Fatalf("org after the removals: %q", got)
	}
}

// TestOwnershipBatchRefusedWhole: a batch with one foreign event (among
// events of the caller's own) is refused whole, naming that event;
// nothing is produced and the caller's own new mailbox is not claimed.
func TestOwnershipBatchRefusedWhole(t *testing.T) {
	t.Parallel()
	o := newOwnersEnv(t, migratedPool(t))
	theirs := newUUID()
	o.accept("alpha registers", tokAlpha, register("/alpha", theirs, newUUID(), "imap.alpha.example", "pw-1"))
	mine := newUUID()
	o.refuse("batch with one foreign event", tokBeta, []int{2},
		register("/beta", mine, newUUID(), "imap.beta.example", "pw-b"), with(userActive(), "source", "/beta"),
		unregister("/beta", theirs))
	if got := o.owner(domain.OwnedMailbox, mine); got != "" {
		t.Fatalf("the refused batch claimed %s for %q", mine, got)
	}
	// Without the foreign event it goes through.
	o.accept("the rest", tokBeta, register("/beta", mine, newUUID(), "imap.beta.example", "pw-b"), with(userActive(), "source", "/beta"))
}

// TestOwnershipTransfer: an operator transfers a mailbox and an org; the
// new owner acts, the old one is refused. A producer cannot transfer.
func TestOwnershipTransfer(t *testing.T) {
	t.Parallel()
	o := newOwnersEnv(t, migratedPool(t))
	mb, org := newUUID(), newUUID()
	o.accept("alpha registers", tokAlpha, register("/alpha", mb, org, "imap.alpha.example", "pw-1"))

	mt := transfer(domain.TypeMailboxOwnerTransferred, "mailbox_id", mb, "/beta")
	resp, body := o.post(tokBeta, with(mt, "source", "/beta"))
	if er := decodeErr(t, body); resp.StatusCode != http.StatusForbidden || er.Error.Code != domain.CodeForbidden {
		t.Fatalf("transfer by a producer: %d %s", resp.StatusCode, body)
	}
	o.accept("ops transfers the mailbox", tokOps, with(mt, "source", "/ops"))
	if got := o.owner(domain.OwnedMailbox, mb); got != "/beta" {
		t.Fatalf("after the transfer: owner %q", got)
	}
	betaOrg := newUUID()
	o.accept("the new owner moves it to its org", tokBeta, register("/beta", mb, betaOrg, "imap.beta.example", "pw-b"))
	o.refuse("the old owner re-adds it", tokAlpha, []int{0}, register("/alpha", mb, org, "imap.alpha.example", "pw-1"))
	o.refuse("the old owner removes it", tokAlpha, []int{0}, unregister("/alpha", mb))

	// The org: beta may not register into it until it is transferred.
	o.refuse("beta adds into alpha's org", tokBeta, []int{0}, register("/beta", newUUID(), org, "imap.beta.example", "pw-b"))
	o.accept("ops transfers the org", tokOps, with(transfer(domain.TypeOrgOwnerTransferred, "org_id", org, "/beta"), "source", "/ops"))
	o.accept("beta adds into its new org", tokBeta, register("/beta", newUUID(), org, "imap.beta.example", "pw-b"))
	o.refuse("alpha adds into its old org", tokAlpha, []int{0}, register("/alpha", newUUID(), org, "imap.alpha.example", "pw-1"))
}

// TestOwnershipRacingAdds: two producers add the same new mailbox at
// once, over and over: exactly one is accepted each time, and the log
// holds exactly the winners' records.
func TestOwnershipRacingAdds(t *testing.T) {
	t.Parallel()
	o := newOwnersEnv(t, migratedPool(t))
	before := o.watermarks()
	const rounds = 15
	for round := range rounds {
		mb, org := newUUID(), newUUID()
		codes := make([]int, 2)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i, tc := range []struct{ tok, src string }{{tokAlpha, "/alpha"}, {tokBeta, "/beta"}} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				resp, _ := o.post(tc.tok, register(tc.src, mb, org, "imap.example.com", "pw"))
				codes[i] = resp.StatusCode
			}()
		}
		close(start)
		wg.Wait()
		won := 0
		for _, c := range codes {
			switch c {
			case http.StatusAccepted:
				won++
			case http.StatusForbidden:
			default:
				t.Fatalf("round %d: status %d", round, c)
			}
		}
		if won != 1 {
			t.Fatalf("round %d: %d winners (%v)", round, won, codes)
		}
	}
	var grew int64
	for tp, ps := range o.watermarks() {
		for p, off := range ps {
			grew += off - before[tp][p]
		}
	}
	if grew != rounds {
		t.Fatalf("the log grew by %d records, want one per round (%d)", grew, rounds)
	}
}

// TestOwnershipWithoutPostgres: with the database down, an event that
// needs a claim is 503 unavailable and nothing is produced; heartbeats
// and user.active do not need it.
func TestOwnershipWithoutPostgres(t *testing.T) {
	t.Parallel()
	pool := migratedPool(t)
	o := newOwnersEnv(t, pool)
	pool.Close()
	before := o.watermarks()
	resp, body := o.post(tokAlpha, register("/alpha", newUUID(), newUUID(), "imap.alpha.example", "pw"))
	if er := decodeErr(t, body); resp.StatusCode != http.StatusServiceUnavailable || er.Error.Code != domain.CodeUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("add with Postgres down: %d %s", resp.StatusCode, body)
	}
	if after := o.watermarks(); !maps.EqualFunc(before, after, maps.Equal) {
		t.Fatal("produced with Postgres down")
	}
	o.accept("user.active with Postgres down", tokAlpha, with(userActive(), "source", "/alpha"))
	// A heartbeat from a caller allowed to send one (testAuth's tokenA).
	e := newEnv(t, envOpts{
		wrap: func(p Producer) Producer { return OwnershipProducer(p, ownership.NewGuard(ownership.NewStore(pool))) },
		opts: []Option{WithAdmission(Admissions(OwnershipAdmission(ownership.NewGuard(ownership.NewStore(pool)))))},
	})
	if resp, body := e.postStructured(heartbeat()); resp.StatusCode != http.StatusAccepted {
		t.Fatalf("heartbeat with Postgres down: %d %s", resp.StatusCode, body)
	}
}

// flakyProducer fails the next fail produces (nothing lands).
type flakyProducer struct {
	Producer
	mu   sync.Mutex
	fail int
}

func (p *flakyProducer) ProduceRecords(ctx context.Context, events []domain.Event, recs []*kgo.Record) ([]producer.Receipt, error) {
	p.mu.Lock()
	failing := p.fail > 0
	if failing {
		p.fail--
	}
	p.mu.Unlock()
	if failing {
		return nil, errors.New("the broker is down")
	}
	return p.Producer.ProduceRecords(ctx, events, recs)
}

func (p *flakyProducer) failNext() { p.mu.Lock(); p.fail = 1; p.mu.Unlock() }

// TestOwnershipWhenProduceFails: an add whose produce failed after its
// claim is retried by its owner (accepted) and refused to another tenant
// meanwhile; a removal that did not reach the log frees nothing, its
// retry does. Refused events are counted per caller.
func TestOwnershipWhenProduceFails(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	store := ownership.NewStore(migratedPool(t))
	g := ownership.NewGuard(store, ownership.WithRegisterer(reg))
	var flaky *flakyProducer
	e := newEnv(t, envOpts{
		wrap: func(p Producer) Producer { flaky = &flakyProducer{Producer: p}; return OwnershipProducer(flaky, g) },
		opts: []Option{WithAuthenticator(ownershipAuth(t)), WithAdmission(OwnershipAdmission(g))},
	})
	o := &ownersEnv{env: e, store: store}
	mb, org := newUUID(), newUUID()
	add := register("/alpha", mb, org, "imap.alpha.example", "pw-1")
	flaky.failNext()
	if resp, body := o.post(tokAlpha, add); resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("add with the broker down: %d %s", resp.StatusCode, body)
	}
	o.refuse("beta takes the id meanwhile", tokBeta, []int{0}, register("/beta", mb, newUUID(), "imap.beta.example", "pw-b"))
	o.accept("alpha retries (same event id)", tokAlpha, add)

	rm := unregister("/alpha", mb)
	flaky.failNext()
	if resp, body := o.post(tokAlpha, rm); resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("removal with the broker down: %d %s", resp.StatusCode, body)
	}
	o.refuse("beta during the removal that did not land", tokBeta, []int{0}, register("/beta", mb, newUUID(), "imap.beta.example", "pw-b"))
	o.accept("alpha retries the removal", tokAlpha, rm)
	o.accept("beta registers the removed mailbox", tokBeta, register("/beta", mb, newUUID(), "imap.beta.example", "pw-b"))
	if got := o.owner(domain.OwnedMailbox, mb); got != "/beta" {
		t.Fatalf("owner at the end: %q", got)
	}

	var buf strings.Builder
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "mailplane_ownership_refused_events_total" {
			for _, m := range mf.GetMetric() {
				buf.WriteString(m.GetLabel()[0].GetValue() + "=" + strconv.Itoa(int(m.GetCounter().GetValue())) + ";")
			}
		}
	}
	if buf.String() != "beta=2;" {
		t.Errorf("refused events by caller: %q, want beta=2", buf.String())
	}
}
