package topics_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/mailboxstate"
	"github.com/mailplane/mailplane/internal/placement/engine"
	"github.com/mailplane/mailplane/internal/sealing"
	"github.com/mailplane/mailplane/producer"
	"github.com/mailplane/mailplane/topics"
)

// aclCluster is a kfake cluster with SASL and ACLs on, the topic catalog
// created by the ops superuser, the ACL plan applied, and one SCRAM user
// per role (password "pw-<role>").
func aclCluster(t *testing.T) (brokers []string, principals map[topics.Role]string) {
	t.Helper()
	principals = map[topics.Role]string{}
	opts := []kfake.Opt{
		kfake.NumBrokers(1),
		kfake.EnableSASL(),
		kfake.EnableACLs(),
		kfake.Superuser(kafka.SASLScramSHA256, "ops", "ops-pw"),
	}
	for _, r := range topics.Roles() {
		user := "mailplane-" + string(r)
		principals[r] = user
		opts = append(opts, kfake.User(kafka.SASLScramSHA256, user, "pw-"+string(r)))
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	brokers = c.ListenAddrs()

	ops, err := kafka.NewClient(roleConfig(brokers, "ops", "ops-pw"), kafka.KindAdmin)
	if err != nil {
		t.Fatal(err)
	}
	defer ops.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rep, err := topics.Apply(ctx, ops, topics.Catalog(topics.Config{StatePartitions: 4}))
	if err != nil || rep.Err() != nil {
		t.Fatalf("topics apply as ops: %v %v", err, rep.Err())
	}
	if err := topics.ApplyACLs(ctx, kadm.NewClient(ops), topics.ACLPlan("", principals)); err != nil {
		t.Fatalf("apply ACL plan: %v", err)
	}
	return brokers, principals
}

func roleConfig(brokers []string, user, pass string) kafka.Config {
	return kafka.Config{Brokers: brokers, ClientID: user,
		SASL: kafka.SASL{Mechanism: kafka.SASLScramSHA256, User: user, Password: pass}}
}

func as(brokers []string, r topics.Role) kafka.Config {
	return roleConfig(brokers, "mailplane-"+string(r), "pw-"+string(r))
}

func produce(ctx context.Context, t *testing.T, cfg kafka.Config, topic string) error {
	t.Helper()
	cl, err := kafka.NewProducer(cfg, kgo.RecordRetries(1), kgo.RecordDeliveryTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	return cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Key: []byte("k"), Value: []byte(`{}`)}).FirstErr()
}

func endOffset(ctx context.Context, t *testing.T, brokers []string, topic string) int64 {
	t.Helper()
	cl, err := kafka.NewClient(roleConfig(brokers, "ops", "ops-pw"), kafka.KindAdmin)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	var sum int64
	ends.Each(func(o kadm.ListedOffset) { sum += o.Offset })
	return sum
}

// consumeOne reads one record of topic in group as cfg, or returns the
// error the broker answered with.
func consumeOne(ctx context.Context, cfg kafka.Config, topic, group string) error {
	cl, err := kafka.NewConsumer(cfg, kafka.GroupConfig{Group: group, Topics: []string{topic}})
	if err != nil {
		return err
	}
	defer cl.Close()
	for ctx.Err() == nil {
		fs := cl.PollFetches(ctx)
		var ferr error
		fs.EachError(func(_ string, _ int32, err error) {
			if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
				ferr = err
			}
		})
		if ferr != nil {
			return ferr
		}
		if fs.NumRecords() > 0 {
			return nil
		}
	}
	return ctx.Err()
}

func denied(err error) bool {
	return errors.Is(err, kerr.TopicAuthorizationFailed) || errors.Is(err, kerr.GroupAuthorizationFailed) ||
		errors.Is(err, kerr.ClusterAuthorizationFailed) || errors.Is(err, kerr.TransactionalIDAuthorizationFailed)
}

// The plan keeps domain topics written by mailplane's roles only and lets
// analysts read the audit topics and nothing else, on a broker enforcing
// it (kfake with SASL/SCRAM and ACLs, as Redpanda with SASL enabled).
func TestACLPlanEnforced(t *testing.T) {
	t.Parallel()
	brokers, _ := aclCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// The API writes every domain topic.
	for _, topic := range topics.IngestTopics() {
		if err := produce(ctx, t, as(brokers, topics.RoleAPI), topic); err != nil {
			t.Fatalf("api producing to %s: %v", topic, err)
		}
	}
	// ... and the operator audit (the console and the tokens-file reload
	// run in its process) ...
	if err := produce(ctx, t, as(brokers, topics.RoleAPI), topics.OpsAudit); err != nil {
		t.Fatalf("api producing to %s: %v", topics.OpsAudit, err)
	}
	// ... and nothing else: not the decision log, not mailbox.state.
	for _, topic := range []string{topics.PlacementDecisions, topics.MailboxState, topics.SyncAudit} {
		before := endOffset(ctx, t, brokers, topic)
		if err := produce(ctx, t, as(brokers, topics.RoleAPI), topic); !denied(err) {
			t.Fatalf("api producing to %s: got %v, want an authorization error", topic, err)
		}
		if after := endOffset(ctx, t, brokers, topic); after != before {
			t.Fatalf("%s moved from %d to %d after a refused produce", topic, before, after)
		}
	}

	// An analyst writes nothing, domain topics least of all.
	for _, topic := range append(topics.IngestTopics(), topics.AuditTopics()...) {
		before := endOffset(ctx, t, brokers, topic)
		if err := produce(ctx, t, as(brokers, topics.RoleAnalyst), topic); !denied(err) {
			t.Fatalf("analyst producing to %s: got %v, want an authorization error", topic, err)
		}
		if after := endOffset(ctx, t, brokers, topic); after != before {
			t.Fatalf("%s moved from %d to %d after a refused produce", topic, before, after)
		}
	}
	// It reads the audit topics in its own groups...
	for _, topic := range topics.AuditTopics() {
		if err := produce(ctx, t, roleConfig(brokers, "ops", "ops-pw"), topic); err != nil {
			t.Fatal(err)
		}
		rctx, rcancel := context.WithTimeout(ctx, 15*time.Second)
		err := consumeOne(rctx, as(brokers, topics.RoleAnalyst), topic, topics.GroupAnalystPrefix+"audit")
		rcancel()
		if err != nil {
			t.Fatalf("analyst reading %s: %v", topic, err)
		}
	}
	// ... and not the domain topics (sealed credentials, personal data),
	// nor in a group of mailplane's.
	rctx, rcancel := context.WithTimeout(ctx, 15*time.Second)
	defer rcancel()
	if err := consumeOne(rctx, as(brokers, topics.RoleAnalyst), topics.MailboxEvents, topics.GroupAnalystPrefix+"x"); !denied(err) {
		t.Fatalf("analyst reading %s: got %v, want an authorization error", topics.MailboxEvents, err)
	}
	if err := consumeOne(rctx, as(brokers, topics.RoleAnalyst), topics.SyncAudit, topics.GroupSync); !denied(err) {
		t.Fatalf("analyst joining %s: got %v, want an authorization error", topics.GroupSync, err)
	}
	// A client without credentials gets nowhere.
	if err := produce(ctx, t, kafka.Config{Brokers: brokers}, topics.MailboxEvents); err == nil {
		t.Fatal("an unauthenticated client produced to the mailbox topic")
	}
}

func TestACLPlanRPK(t *testing.T) {
	t.Parallel()
	out := topics.RPK(topics.ACLPlan("", map[topics.Role]string{topics.RoleAnalyst: "analytics", topics.RoleSync: "mp-sync"}))
	for _, want := range []string{
		"rpk security acl create --allow-principal User:analytics --operation read,describe --topic " + topics.PlacementDecisions + "," + topics.SyncAudit + "," + topics.OpsAudit + "\n",
		"rpk security acl create --allow-principal User:analytics --operation read,describe --group analytics- --resource-pattern-type prefixed\n",
		"rpk security acl create --allow-principal User:mp-sync --operation write,describe --transactional-id mailplane-outbox- --resource-pattern-type prefixed\n",
		"rpk security acl create --allow-principal User:mp-sync --operation idempotent_write --cluster\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("plan lacks %q; got:\n%s", want, out)
		}
	}
	if strings.Contains(out, "User:analytics --operation write") {
		t.Errorf("analysts are granted a write:\n%s", out)
	}
}

func TestParsePrincipals(t *testing.T) {
	t.Parallel()
	got, err := topics.ParsePrincipals("api=mp-api, analyst=analytics")
	if err != nil || got[topics.RoleAPI] != "mp-api" || got[topics.RoleAnalyst] != "analytics" || len(got) != 2 {
		t.Fatalf("got %v, %v", got, err)
	}
	for _, bad := range []string{"admin=x", "api", "api="} {
		if _, err := topics.ParsePrincipals(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// The real roles run under their own principals on a broker enforcing the
// plan: the API's producer publishes, the placement engine decides (its
// group, transactional id and decision log) and the mailbox.state processor
// folds (its group, transactional ids, dedupe changelog), and an analyst
// reads the decision. A grant missing from the plan fails this test.
func TestRolesRunUnderTheirACLs(t *testing.T) {
	t.Parallel()
	brokers, _ := aclCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	eng, err := engine.New(as(brokers, topics.RoleEngine), engine.WithSessionTimeout(6*time.Second),
		engine.WithHeartbeatInterval(500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	proc, err := mailboxstate.New(as(brokers, topics.RoleState),
		mailboxstate.WithGroup(kafka.GroupConfig{SessionTimeout: 6 * time.Second, HeartbeatInterval: 500 * time.Millisecond}))
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	errs := make(chan error, 2)
	go func() { errs <- eng.Run(rctx) }()
	go func() { errs <- proc.Run(rctx) }()
	defer func() {
		stop()
		for range 2 {
			if err := <-errs; err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("role stopped with %v", err)
			}
		}
	}()

	key := make([]byte, sealing.KeySize)
	keyring, err := sealing.NewKeyring("k1", map[string][]byte{"k1": key})
	if err != nil {
		t.Fatal(err)
	}
	kc, err := kafka.NewProducer(as(brokers, topics.RoleAPI))
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	pc := producer.New(kc, producer.WithSealer(keyring), producer.WithSource("/acl-test"))
	const worker, mailbox = "0190a5b2-4c5e-7b1a-9c3d-00000000d0a1", "0190a5b2-4c5e-7b1a-9c3d-00000000c0a1"
	if _, err := pc.Publish(ctx, domain.Event{ID: domain.NewEventID(), Type: domain.TypeWorkerHeartbeat, Source: "/acl-test", Time: time.Now(),
		Data: &domain.WorkerHeartbeat{WorkerID: worker, Tier: domain.TierSharedFree, Egress: domain.EgressColdSMTP, Address: "10.0.0.1:25"}}); err != nil {
		t.Fatalf("api publishing a heartbeat: %v", err)
	}
	if _, err := pc.Publish(ctx, domain.Event{ID: domain.NewEventID(), Type: domain.TypeMailboxAdded, Source: "/acl-test", Time: time.Now(),
		Data: &domain.MailboxAdded{MailboxID: mailbox, OrgID: "0190a5b2-4c5e-7b1a-9c3d-00000000a0a1", UserID: "0190a5b2-4c5e-7b1a-9c3d-00000000b0a1",
			Address: "acl@example.com", Provider: domain.ProviderSMTPIMAP,
			IMAP:        domain.IMAPEndpoint{Host: "imap.example.com", Port: 993, TLS: domain.TLSImplicit, Username: "acl@example.com"},
			Credentials: &domain.Credentials{Password: "pw"}}}); err != nil {
		t.Fatalf("api publishing a mailbox: %v", err)
	}

	// The engine's decision, read by an analyst.
	if err := consumeOne(ctx, as(brokers, topics.RoleAnalyst), topics.PlacementDecisions, topics.GroupAnalystPrefix+"decisions"); err != nil {
		t.Fatalf("no decision readable by the analyst (the engine could not decide under its ACLs?): %v", err)
	}
	// The processor's mailbox.state record, read as ops.
	ops := roleConfig(brokers, "ops", "ops-pw")
	for ctx.Err() == nil && endOffset(ctx, t, brokers, topics.MailboxState) == 0 {
		time.Sleep(50 * time.Millisecond)
	}
	if ctx.Err() != nil {
		t.Fatalf("the mailbox.state processor wrote nothing under its ACLs (%v)", ops.ClientID)
	}
}
