package roles

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/access"
	"github.com/mailplane/mailplane/internal/api"
	"github.com/mailplane/mailplane/internal/health"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/mailsync"
	"github.com/mailplane/mailplane/internal/opshttp"
	"github.com/mailplane/mailplane/internal/placement"
	"github.com/mailplane/mailplane/internal/projections"
	"github.com/mailplane/mailplane/topics"
)

const (
	psOrg  = "0190a5b2-4c5e-7b1a-9c3d-0000000d0001"
	psUser = "0190a5b2-4c5e-7b1a-9c3d-0000000d0002"
)

// TestProductionShape runs docker-compose.yml's mailplane services as
// separate processes wired as compose wires them (the topics job first,
// then api, two projectors, two engines, the state processor, three sync
// workers), drives the health loop end to end through the API, kills
// (SIGKILL) and restarts an engine, a projector and a sync worker, stops a
// projector gracefully, and stops Postgres for 10 s: every role outlives
// the outage, the API answers 503 with a code meanwhile, and events flow
// again afterwards without a restart.
//
// Not parallel: ten role processes, and failover asserted within seconds,
// want the package's share of the CPU to themselves.
func TestProductionShape(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: runs every role as a process against Postgres and Dovecot")
	}
	start := time.Now()
	e := startProdShape(t)
	t.Logf("started in %s: %d processes", time.Since(start).Round(time.Millisecond), len(e.f.procs))
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	e.workers = []string{"0190a5b2-4c5e-7b1a-9c3d-0000000d0f01", "0190a5b2-4c5e-7b1a-9c3d-0000000d0f02", "0190a5b2-4c5e-7b1a-9c3d-0000000d0f03"}
	e.heartbeat(ctx)

	e.schemasServed(ctx)
	e.healthLoop(ctx)
	e.engineFailover(ctx)
	e.projectorFailover(ctx)
	e.syncFailover(ctx)
	e.postgresOutage(ctx)
	e.brokerRestart(ctx)
	e.apiOutage(ctx)
	e.workerKilled(ctx)
	e.f.alive(t, e.jobs)
	e.stopAll()
	t.Logf("production shape: %s in all", time.Since(start).Round(time.Millisecond))
}

// healthLoop: warmup mail sent by ann lands in bob's Junk; bob's runner
// reports it, the scorer quarantines ann, the engine moves her to a
// worker of the quarantine pool, which the assignments API shows.
func (e *prodShape) healthLoop(ctx context.Context) {
	t := e.t
	const (
		ann = "0190a5b2-4c5e-7b1a-9c3d-0000000d00a1"
		bob = "0190a5b2-4c5e-7b1a-9c3d-0000000d00b1"
	)
	e.dc.AddUser(t, "ann", "ann-secret-1")
	e.dc.AddUser(t, "bob", "bob-secret-2")
	// Signed with the warmup key compose gives sync; delivered before bob
	// is synced, so his first sync reads them all.
	deliverWarmup(t, e.dc, ann, "bob", e.warmup)
	e.mustPublish(ctx, &domain.OrgPlanChanged{OrgID: psOrg, Plan: domain.PlanFree, Source: "test"})
	e.mustPublish(ctx, e.mailbox(ann, psOrg, psUser, "ann", "ann-secret-1"), e.mailbox(bob, psOrg, psUser, "bob", "bob-secret-2"))

	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	// Ann may be quarantined and moved before the first poll sees her
	// placed (her warmup mail is delivered before she is added): where
	// she was first placed comes from the decision log.
	start := time.Now()
	checkWarmupObserved(t, kafka.Config{Brokers: e.brokers, Namespace: e.ns}, ann, bob)
	t.Logf("health loop: bob's runner reported ann's warmup mail %s after they were added", time.Since(start).Round(10*time.Millisecond))
	kcfg := kafka.Config{Brokers: e.brokers, Namespace: e.ns, ClientID: "prodshape-test"}
	t.Cleanup(func() {
		if t.Failed() {
			e.logDecisions(kcfg)
		}
	})
	var annWorker string
	waitUntil(wctx, t, "ann on a quarantine-pool worker (assignments API)", func(ctx context.Context) bool {
		w, band := e.placedOn(ctx, ann)
		annWorker = w
		return w != "" && band == domain.RiskQuarantine
	})
	t.Logf("health loop: ann on a quarantine-pool worker %s after she was added", time.Since(start).Round(10*time.Millisecond))
	var first, moved string
	e.decisionsSince(ctx, kcfg, 0, func(d domain.PlacementDecision) {
		switch d := d.(type) {
		case *domain.PlacementAssigned:
			if d.MailboxID == ann && first == "" {
				first = d.WorkerID
			}
		case *domain.PlacementMigrated:
			if d.MailboxID == ann && d.Reason == domain.ReasonBandChanged {
				moved = d.ToWorker
			}
		}
	})
	if first == "" || first == annWorker || moved != annWorker {
		t.Errorf("ann first placed on %q, moved for her band to %q, now on %q: want a move off her first worker to the one she is on", first, moved, annWorker)
	}
	waitUntil(wctx, t, "the registry shows ann quarantined", func(ctx context.Context) bool {
		var s *string
		_ = e.db.QueryRow(ctx, `SELECT health_state FROM mailboxes WHERE mailbox_id = $1`, ann).Scan(&s)
		return s != nil && *s == string(domain.HealthQuarantined)
	})
}

var engineActiveLine = regexp.MustCompile(`(?m)^mailplane_placement_engine_active(\{[^}]*\})? 1$`)

// activeEngines returns the engines whose metrics say they are active.
func (e *prodShape) activeEngines(ctx context.Context) []*roleProc {
	var out []*roleProc
	for _, p := range e.f.service("engine") {
		if done, _ := p.exited(); done {
			continue
		}
		code, body := e.call(ctx, http.MethodGet, "http://"+p.addrs["--ops-http"]+"/metrics", "", "", nil, nil)
		if code == http.StatusOK && engineActiveLine.Match(body) {
			out = append(out, p)
		}
	}
	return out
}

// engineFailover kills the active engine: the standby takes over within
// the session, and a new mailbox is placed, projected and synced.
func (e *prodShape) engineFailover(ctx context.Context) {
	t := e.t
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var active []*roleProc
	waitUntil(wctx, t, "one active engine", func(ctx context.Context) bool {
		active = e.activeEngines(ctx)
		return len(active) == 1
	})
	victim := active[0]
	at := time.Now()
	_ = victim.signal(t, syscall.SIGKILL, 10*time.Second)
	waitUntil(wctx, t, "the standby engine active", func(ctx context.Context) bool {
		return len(e.activeEngines(ctx)) == 1
	})
	d := time.Since(at)
	t.Logf("engine: SIGKILL of the active %s, standby active after %s", victim.name, d.Round(10*time.Millisecond))
	if d > roleSession+failoverSlack {
		t.Errorf("engine failover took %s, want at most %s", d, roleSession+failoverSlack)
	}
	victim.start(t)
	id := e.addMailbox(ctx, psOrg, psUser)
	t.Logf("engine: a new mailbox flowed end to end %s after it was added", e.waitFlowed(ctx, id, "after the engine kill").Round(10*time.Millisecond))
}

// groupShares returns whether group (outside the namespace) is stable and
// the partitions each member holds.
func (e *prodShape) groupShares(ctx context.Context, group string) (bool, []int) {
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	group = e.ns.Group(group)
	dg, err := e.adm.DescribeGroups(dctx, group)
	if err != nil || dg[group].Err != nil {
		return false, nil
	}
	var shares []int
	for _, m := range dg[group].Members {
		n := 0
		if c, ok := m.Assigned.AsConsumer(); ok {
			for _, tp := range c.Topics {
				n += len(tp.Partitions)
			}
		}
		shares = append(shares, n)
	}
	return dg[group].State == "Stable", shares
}

// waitGroup waits until group is stable with members members, each
// holding partitions, together total (0: any); it returns the total.
func (e *prodShape) waitGroup(ctx context.Context, group string, members, total int) int {
	ctx, cancel := context.WithTimeout(ctx, 45*time.Second)
	defer cancel()
	sum := 0
	waitUntil(ctx, e.t, fmt.Sprintf("group %s stable with %d busy members", group, members), func(ctx context.Context) bool {
		stable, shares := e.groupShares(ctx, group)
		sum = 0
		for _, n := range shares {
			if n == 0 {
				return false
			}
			sum += n
		}
		return stable && len(shares) == members && (total == 0 || sum == total)
	})
	return sum
}

// moved kills (or stops) victim, a member of groups, and reports how long
// each group took to give its partitions to the members left.
func (e *prodShape) moved(ctx context.Context, victim *roleProc, sig syscall.Signal, groups map[string]int, limit time.Duration) {
	t := e.t
	name := map[syscall.Signal]string{syscall.SIGKILL: "SIGKILL", syscall.SIGTERM: "SIGTERM"}[sig]
	at := time.Now()
	if err := victim.signal(t, sig, 30*time.Second); err != nil && sig == syscall.SIGTERM {
		t.Errorf("%s exited with %v on SIGTERM, want 0", victim.name, err)
	}
	for group, members := range groups {
		e.waitGroup(ctx, group, members-1, 0)
		d := time.Since(at)
		t.Logf("%s of %s: %s's partitions moved after %s", name, victim.name, group, d.Round(10*time.Millisecond))
		if d > limit {
			t.Errorf("%s of %s: %s's partitions moved after %s, want at most %s", name, victim.name, group, d, limit)
		}
	}
}

// projectorFailover kills a projector (its registry and health partitions
// move within the session; the placement projection's lead passes on) and
// then stops the other with SIGTERM (it leaves its groups: they hand over
// at once).
func (e *prodShape) projectorFailover(ctx context.Context) {
	t := e.t
	groups := map[string]int{projections.GroupName(projections.RegistryName): 2, projections.GroupName(health.Name): 2}
	for g := range groups {
		e.waitGroup(ctx, g, 2, 0)
	}
	// The victim is the one leading the placement projection: its lead
	// (an advisory lock) must pass to the other.
	const leading = "placement projector leading"
	victim, other := e.f.get(t, "projector-1"), e.f.get(t, "projector-2")
	if strings.Count(other.out.String(), leading) > strings.Count(victim.out.String(), leading) {
		victim, other = other, victim
	}
	led := strings.Count(other.out.String(), leading)
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	leadAt := make(chan time.Time, 1)
	go func() {
		// Ends when the lead passed or wctx is done.
		for wctx.Err() == nil && strings.Count(other.out.String(), leading) == led {
			time.Sleep(20 * time.Millisecond)
		}
		leadAt <- time.Now()
	}()
	at := time.Now()
	e.moved(ctx, victim, syscall.SIGKILL, groups, roleSession+failoverSlack)
	if took := (<-leadAt).Sub(at); wctx.Err() != nil || took > roleSession+failoverSlack {
		t.Errorf("SIGKILL of %s: %s did not take the placement projection's lead within %s", victim.name, other.name, roleSession+failoverSlack)
	} else {
		t.Logf("SIGKILL of %s: %s leads the placement projection after %s", victim.name, other.name, took.Round(10*time.Millisecond))
	}
	id := e.addMailbox(ctx, psOrg, psUser)
	t.Logf("projector: a new mailbox flowed end to end %s after it was added", e.waitFlowed(ctx, id, "after the projector kill").Round(10*time.Millisecond))
	victim.start(t)
	for g := range groups {
		e.waitGroup(ctx, g, 2, 0)
	}
	e.moved(ctx, other, syscall.SIGTERM, groups, 3*time.Second)
	other.start(t)
	for g := range groups {
		e.waitGroup(ctx, g, 2, 0)
	}
}

// syncFailover kills a sync worker: its mailbox.state partitions move
// within the session, and a new mailbox is synced.
func (e *prodShape) syncFailover(ctx context.Context) {
	t := e.t
	workers := len(e.f.service("sync"))
	e.waitGroup(ctx, mailsync.DefaultGroup, workers, 0)
	victim := e.f.get(t, "sync-2")
	e.moved(ctx, victim, syscall.SIGKILL, map[string]int{mailsync.DefaultGroup: workers}, roleSession+failoverSlack)
	id := e.addMailbox(ctx, psOrg, psUser)
	t.Logf("sync: a new mailbox flowed end to end %s after it was added", e.waitFlowed(ctx, id, "after the sync kill").Round(10*time.Millisecond))
	victim.start(t)
	e.waitGroup(ctx, mailsync.DefaultGroup, workers, 0)
}

// pgOutage is how long postgresOutage keeps Postgres down: two liveness
// windows of the engine (30 s by default). While the heartbeat path needed
// Postgres, a 28 s outage got every sending worker declared dead.
const pgOutage = 60 * time.Second

// postgresOutage stops Postgres for pgOutage. The API answers 503 where it
// needs the database (assignments, its health), but heartbeats of known
// workers carry on (they go to the log; the engine knows its workers), a
// new worker's heartbeat is admitted on the new-worker bucket, ingest of
// what needs no ownership claim carries on, a role restarted meanwhile
// waits for the database, and the decision log gains no death and no
// refusal: the fleet stays placed. A mailbox.added (its claim needs
// Postgres) is 503 meanwhile and flows end to end once published again.
func (e *prodShape) postgresOutage(ctx context.Context) {
	t := e.t
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	kcfg := kafka.Config{Brokers: e.brokers, Namespace: e.ns, ClientID: "prodshape-test"}
	before := e.decisionsEnd(ctx, kcfg)
	if err := e.pg.Stop(sctx); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	e.hbRefused.Store(0)
	var er api.ErrorResponse
	code, body := e.call(ctx, http.MethodGet, e.apiURL+"/v1/workers/"+e.workers[0]+"/assignments", e.token, "", nil, &er)
	if code != http.StatusServiceUnavailable || er.Error.Code != domain.CodeUnavailable {
		t.Errorf("assignments with Postgres down: %d %s, want 503 %s", code, body, domain.CodeUnavailable)
	}
	// Heartbeats need no database: a worker the API has seen is accepted,
	// and a new one is charged to the new-worker bucket instead of being
	// refused (so an outage does not silence the fleet).
	newWorker := "0190a5b2-4c5e-7b1a-9c3d-0000000d0fff"
	code, body = e.call(ctx, http.MethodPost, e.apiURL+"/v1/workers/heartbeat", access.WorkerToken(e.fleet, newWorker), "application/json",
		fmt.Appendf(nil, `{"worker_id":%q,"tier":"shared_free","egress":"cold_smtp","address":"smtp-new.example.org","stopping":true}`, newWorker), nil)
	if code != http.StatusAccepted {
		t.Errorf("a new worker's heartbeat with Postgres down: %d %s, want 202 (admitted on the new-worker bucket)", code, body)
	}
	var ph opshttp.PublicHealthResponse
	if code, body := e.call(ctx, http.MethodGet, e.apiURL+"/healthz", "", "", nil, &ph); code != http.StatusServiceUnavailable || ph.Checks["database"] != opshttp.HealthUnavailable {
		t.Errorf("the API's /healthz with Postgres down: %d %s", code, body)
	}
	e.healthSaysDown(ctx, "database")
	// Ingest of what needs no ownership claim needs only the broker; a
	// mailbox.added needs its claim (docs/architecture.md §9,
	// "Ownership"): 503 unavailable, and the producer's retry after the
	// outage goes through.
	if code, body := e.publish(ctx, &domain.UserActive{UserID: psUser, Source: domain.ActivityLogin}); code != http.StatusAccepted {
		t.Errorf("user.active with Postgres down: %d %s", code, body)
	}
	id, added := e.newMailbox(psOrg, psUser)
	er = api.ErrorResponse{}
	if code, body := e.publish(ctx, added); code != http.StatusServiceUnavailable || json.Unmarshal(body, &er) != nil || er.Error.Code != domain.CodeUnavailable {
		t.Errorf("mailbox.added with Postgres down: %d %s, want 503 %s", code, body, domain.CodeUnavailable)
	}
	// A role (re)started while Postgres is down waits for it, saying so,
	// instead of exiting.
	restarted := e.f.get(t, "projector-2")
	if err := restarted.signal(t, syscall.SIGKILL, 10*time.Second); err == nil {
		t.Errorf("%s survived SIGKILL", restarted.name)
	}
	restarted.start(t)
	e.waitWaiting(ctx, restarted)
	time.Sleep(time.Until(stopped.Add(pgOutage))) // the outage itself
	e.f.alive(t, e.jobs)
	if n := e.hbRefused.Load(); n != 0 {
		t.Errorf("%d heartbeats of known workers were refused while Postgres was down", n)
	}
	// The stop's context has run out during the outage.
	sctx, cancel = context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := e.pg.Start(sctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("Postgres was down %s", time.Since(stopped).Round(10*time.Millisecond))
	e.retryPublish(ctx, added)
	d := e.waitFlowed(ctx, id, "after the Postgres outage")
	t.Logf("postgres: the mailbox refused during the outage, published again, flowed end to end %s after Postgres started again", d.Round(10*time.Millisecond))
	var died, refused int
	e.decisionsSince(ctx, kcfg, before, func(d domain.PlacementDecision) {
		switch d := d.(type) {
		case *domain.PlacementWorkerDied:
			// The new worker heartbeated once (stopping, holding nothing):
			// its death is liveness working.
			if d.WorkerID != newWorker {
				died++
			}
		case *domain.PlacementRefused:
			refused++
		}
	})
	if died != 0 || refused != 0 {
		t.Errorf("during and after a %s Postgres outage the engine decided %d worker deaths and %d refusals, want none", pgOutage, died, refused)
	}
	e.f.alive(t, e.jobs)
}

// decisionsEnd returns the end offset of the decision log (one partition).
func (e *prodShape) decisionsEnd(ctx context.Context, kcfg kafka.Config) int64 {
	ends, err := e.adm.ListEndOffsets(ctx, kcfg.Topic(topics.PlacementDecisions))
	if err != nil {
		e.t.Fatal(err)
	}
	o, ok := ends.Lookup(kcfg.Topic(topics.PlacementDecisions), 0)
	if !ok || o.Err != nil {
		e.t.Fatalf("the decision log's end: %v", o.Err)
	}
	return o.Offset
}

// decisionsSince calls fn with every decision on the log from offset on.
func (e *prodShape) decisionsSince(ctx context.Context, kcfg kafka.Config, offset int64, fn func(domain.PlacementDecision)) {
	_, err := kafka.ReadToEnd(ctx, kcfg, kafka.ReadSpec{Topics: []string{kcfg.Topic(topics.PlacementDecisions)}, Timeout: 30 * time.Second,
		From: func(kafka.Partition, kafka.Bounds) (int64, error) { return offset, nil }},
		func(r *kgo.Record) error {
			d, err := topics.DecodeDecision(r)
			if err != nil {
				return err
			}
			fn(d.Data)
			return nil
		})
	if err != nil {
		e.t.Fatalf("reading the decision log: %v", err)
	}
}

// brokerRestart stops the broker for 5 s and starts it again on the same
// port with what it persisted: every role's health says the broker is
// down meanwhile, none exits, and a mailbox added after the restart flows
// end to end. Against a real broker (MAILPLANE_TEST_BROKERS) the test
// cannot restart it, and says so.
func (e *prodShape) brokerRestart(ctx context.Context) {
	t := e.t
	if e.broker == nil {
		t.Log("broker: a real broker; its restart is not exercised here")
		return
	}
	addr := e.brokers[0]
	e.broker.Close()
	stopped := time.Now()
	e.healthSaysDown(ctx, "broker")
	time.Sleep(time.Until(stopped.Add(5 * time.Second))) // the outage itself
	e.f.alive(t, e.jobs)
	e.startBroker(t, addr)
	t.Logf("broker: down %s", time.Since(stopped).Round(10*time.Millisecond))
	id := e.addMailbox(ctx, psOrg, psUser)
	d := e.waitFlowed(ctx, id, "after the broker restart")
	t.Logf("broker: a mailbox added after the restart flowed end to end in %s (%s after the broker stopped)", d.Round(10*time.Millisecond), time.Since(stopped).Round(10*time.Millisecond))
	e.f.alive(t, e.jobs)
}

// schemasServed: the API process serves the schemas to a caller with a
// token, and to nobody without one.
func (e *prodShape) schemasServed(ctx context.Context) {
	code, body := e.call(ctx, http.MethodGet, e.apiURL+"/v1/schemas/"+domain.TypeMailboxAdded, e.token, "", nil, nil)
	if code != http.StatusOK || !strings.Contains(string(body), "mailplane.mailbox.added.v1:reader") {
		e.t.Errorf("GET /v1/schemas/%s: %d %.200s", domain.TypeMailboxAdded, code, body)
	}
	if code, _ := e.call(ctx, http.MethodGet, e.apiURL+"/v1/schemas", "", "", nil, nil); code != http.StatusUnauthorized {
		e.t.Errorf("GET /v1/schemas without a token: %d, want 401", code)
	}
}

// healthSaysDown checks that every role's ops /healthz answers 503 with
// check in error.
func (e *prodShape) healthSaysDown(ctx context.Context, check string) {
	for _, p := range e.f.procs {
		if e.jobs[p.name] {
			continue
		}
		var hr opshttp.HealthResponse
		code, body := e.call(ctx, http.MethodGet, "http://"+p.addrs["--ops-http"]+"/healthz", "", "", nil, &hr)
		if code != http.StatusServiceUnavailable || hr.Checks[check].Status != opshttp.HealthError {
			e.t.Errorf("%s's /healthz with the %s down: %d %s", p.name, check, code, body)
		}
	}
}

// waitWaiting waits until p's ops /healthz says it waits for the
// database (p started while Postgres is down).
func (e *prodShape) waitWaiting(ctx context.Context, p *roleProc) {
	t := e.t
	wctx, cancel := context.WithTimeout(ctx, 8*time.Second)
	defer cancel()
	var last string
	for wctx.Err() == nil {
		if done, err := p.exited(); done {
			t.Fatalf("%s, started with Postgres down, exited: %v", p.name, err)
		}
		var hr opshttp.HealthResponse
		code, body := e.call(wctx, http.MethodGet, "http://"+p.addrs["--ops-http"]+"/healthz", "", "", nil, &hr)
		last = fmt.Sprint(code, " ", string(body))
		if code == http.StatusServiceUnavailable && strings.Contains(hr.Checks["database"].Error, "waiting for the database") {
			t.Logf("postgres: %s, started during the outage, waits: %s", p.name, hr.Checks["database"].Error)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Errorf("%s, started with Postgres down, does not say it waits for the database: %s", p.name, last)
}

// stopAll stops every role at once with SIGTERM, as compose down does:
// each must exit 0 within compose's 10 s stop grace period.
// stuckStacks makes p (a Go process that did not stop) dump its
// goroutines with SIGQUIT and returns them, those running mailplane's
// code first: what it is blocked in, and (a Kafka client's own
// goroutines) what may hold what it waits for.
func stuckStacks(p *roleProc) string {
	_ = p.cmd.Process.Signal(syscall.SIGQUIT)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		return "(no dump: the process did not exit on SIGQUIT)"
	}
	out := p.out.String()
	i := strings.LastIndex(out, "SIGQUIT: quit")
	if i < 0 {
		return "(no dump in the output)"
	}
	var ours, others strings.Builder
	for g := range strings.SplitSeq(out[i:], "\n\n") {
		b := &others
		if strings.Contains(g, "github.com/mailplane/mailplane/") {
			b = &ours
		}
		b.WriteString(g)
		b.WriteString("\n\n")
	}
	all := ours.String() + others.String()
	return all[:min(len(all), 256<<10)]
}

func (e *prodShape) stopAll() {
	start := time.Now()
	for _, p := range e.f.procs {
		if !e.jobs[p.name] {
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	for _, p := range e.f.procs {
		if e.jobs[p.name] {
			continue
		}
		select {
		case <-p.done:
			if p.err != nil {
				e.t.Errorf("%s exited with %v on SIGTERM, want 0", p.name, p.err)
			}
		case <-time.After(time.Until(start.Add(10 * time.Second))):
			e.t.Errorf("%s still running 10 s after SIGTERM; where its goroutines are:\n%s", p.name, stuckStacks(p))
		}
	}
	// The 4 s a process waits for its relay is a last resort, and the
	// process still stops within compose's grace (checked above). A relay
	// left running is logged with its goroutines (in the role's output) so
	// that the hang seen once in CI shows where it waits; it does not fail
	// the run while its cause is unknown (docs/runbook.md).
	for _, p := range e.f.procs {
		if out := p.out.String(); strings.Contains(out, "outbox relay did not stop in time") {
			e.t.Logf("RELAY STOP HANG: %s: its outbox relay did not stop within 4 s of SIGTERM; its output:\n%s", p.name, out)
		}
	}
	e.t.Logf("SIGTERM to every role: all stopped within %s", time.Since(start).Round(10*time.Millisecond))
}

// livenessWindow is the engine's liveness window on compose's settings
// (placement's default: three heartbeat intervals).
var livenessWindow = placement.DefaultConfig().LivenessWindow

var livenessHoldingLine = regexp.MustCompile(`(?m)^mailplane_placement_liveness_holding(\{[^}]*\})? 1$`)

// apiOutage stops the API for three liveness windows, so no heartbeat of
// the fleet reaches the log: the observer is blind, not the fleet dead.
// The engine holds liveness (one liveness_held decision, its gauge at 1,
// which the alert MailplanePlacementLivenessHeld watches) instead of
// declaring every worker dead; no mailbox moves or is refused; once the
// API is back and heartbeats flow, liveness resumes.
func (e *prodShape) apiOutage(ctx context.Context) {
	t := e.t
	kcfg := kafka.Config{Brokers: e.brokers, Namespace: e.ns, ClientID: "prodshape-test"}
	id := e.addMailbox(ctx, psOrg, psUser)
	e.waitFlowed(ctx, id, "before the API outage")
	placed, _ := e.placedOn(ctx, id)
	before := e.decisionsEnd(ctx, kcfg)
	apis := e.f.service("api")
	for _, p := range apis {
		if err := p.signal(t, syscall.SIGTERM, 30*time.Second); err != nil {
			t.Errorf("%s on SIGTERM: %v", p.name, err)
		}
	}
	stopped := time.Now()
	wctx, cancel := context.WithTimeout(ctx, 3*livenessWindow)
	defer cancel()
	waitUntil(wctx, t, "the active engine holding liveness", func(ctx context.Context) bool {
		for _, p := range e.activeEngines(ctx) {
			code, body := e.call(ctx, http.MethodGet, "http://"+p.addrs["--ops-http"]+"/metrics", "", "", nil, nil)
			if code == http.StatusOK && livenessHoldingLine.Match(body) {
				return true
			}
		}
		return false
	})
	t.Logf("api: every heartbeat cut; the engine holds liveness %s later", time.Since(stopped).Round(100*time.Millisecond))
	time.Sleep(time.Until(stopped.Add(3 * livenessWindow)))
	for _, p := range apis {
		p.start(t)
	}
	e.waitHealthy()
	var held, resumed, died, moved int
	rctx, rcancel := context.WithTimeout(ctx, 2*livenessWindow)
	defer rcancel()
	waitUntil(rctx, t, "liveness resumed on the decision log", func(ctx context.Context) bool {
		held, resumed, died, moved = 0, 0, 0, 0
		e.decisionsSince(ctx, kcfg, before, func(d domain.PlacementDecision) {
			switch d.(type) {
			case *domain.PlacementLivenessHeld:
				held++
			case *domain.PlacementLivenessResumed:
				resumed++
			case *domain.PlacementWorkerDied:
				died++
			case *domain.PlacementRefused, *domain.PlacementMigrated, *domain.PlacementUnassigned:
				moved++
			}
		})
		return resumed > 0
	})
	t.Logf("api: down %s; heartbeats flowed again and liveness resumed %s after the restart", (3 * livenessWindow).Round(time.Second), time.Since(stopped.Add(3*livenessWindow)).Round(100*time.Millisecond))
	if held != 1 || died != 0 || moved != 0 {
		t.Errorf("API down for three liveness windows: %d liveness_held, %d worker_died, %d mailboxes moved, refused or unassigned; want 1, 0, 0", held, died, moved)
	}
	if w, _ := e.placedOn(ctx, id); w != placed {
		t.Errorf("mailbox %s on %q after the API outage, was on %q", id, w, placed)
	}
}

// workerKilled stops one sending worker's heartbeats, as a SIGKILL of it
// would, while the rest of the fleet heartbeats: one worker of three is no
// outage of the observer, so it dies when its window runs out and its
// mailboxes move to the others within the window (plus a tick).
func (e *prodShape) workerKilled(ctx context.Context) {
	t := e.t
	kcfg := kafka.Config{Brokers: e.brokers, Namespace: e.ns, ClientID: "prodshape-test"}
	id := e.addMailbox(ctx, psOrg, psUser)
	e.waitFlowed(ctx, id, "before the worker kill")
	victim, _ := e.placedOn(ctx, id)
	if victim == "" {
		t.Fatalf("mailbox %s is placed on no worker", id)
	}
	before := e.decisionsEnd(ctx, kcfg)
	e.hbSilenced.Store(victim, true)
	killed := time.Now()
	wctx, cancel := context.WithTimeout(ctx, livenessWindow+failoverSlack+10*time.Second)
	defer cancel()
	var on string
	waitUntil(wctx, t, "the dead worker's mailbox on another worker", func(ctx context.Context) bool {
		on, _ = e.placedOn(ctx, id)
		return on != "" && on != victim
	})
	t.Logf("worker: %s stopped heartbeating; its mailbox moved to %s %s later (liveness window %s)", victim, on, time.Since(killed).Round(100*time.Millisecond), livenessWindow)
	var held, died int
	e.decisionsSince(ctx, kcfg, before, func(d domain.PlacementDecision) {
		switch d := d.(type) {
		case *domain.PlacementLivenessHeld:
			held++
		case *domain.PlacementWorkerDied:
			if d.WorkerID == victim {
				died++
			}
		}
	})
	if held != 0 || died != 1 {
		t.Errorf("one worker of three silenced: %d liveness_held, %d worker_died for it; want 0, 1", held, died)
	}
}

// logDecisions logs the decision log's first 300 decisions, one a line: a
// failed step's story.
func (e *prodShape) logDecisions(kcfg kafka.Config) {
	n := 0
	e.decisionsSince(context.Background(), kcfg, 0, func(d domain.PlacementDecision) {
		if n++; n <= 300 {
			b, _ := json.Marshal(d)
			e.t.Logf("decision %d: %s %s", n, d.EventType(), b)
		}
	})
}
