package producer_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/eventschema"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/kafkatest"
	"github.com/mailplane/mailplane/internal/sealing"
	"github.com/mailplane/mailplane/producer"
	"github.com/mailplane/mailplane/topics"
)

const (
	mailboxID = "0190a5b2-0000-7000-8000-000000000001"
	orgID     = "0190a5b2-0000-7000-8000-0000000000a1"
	userID    = "0190a5b2-0000-7000-8000-0000000000b1"
	workerID  = "0190a5b2-0000-7000-8000-0000000000c1"
)

// newBroker returns a producer client and the test's configuration: the
// brokers with the catalog in a namespace of the test's own.
func newBroker(t testing.TB) (*kgo.Client, kafka.Config) {
	t.Helper()
	kcfg := kafkatest.Config(t, 4)
	kcfg.ClientID = "test"
	kc, err := kafka.NewProducer(kcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kc.Close)
	return kc, kcfg
}

func testKeyring(t testing.TB) *sealing.Keyring {
	k, err := sealing.ParseKeys("test-1:"+base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{7}, 32)), "")
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func mailboxAdded() domain.MailboxAdded {
	return domain.MailboxAdded{
		MailboxID: mailboxID, OrgID: orgID, UserID: userID,
		Address: "ada@example.com", Provider: domain.ProviderSMTPIMAP, WarmupEnabled: true,
		IMAP:        domain.IMAPEndpoint{Host: "imap.example.com", Port: 993, TLS: domain.TLSImplicit, Username: "ada@example.com"},
		Credentials: &domain.Credentials{Password: "correct horse battery staple"},
	}
}

// consumeAll reads n records of topic (a catalog name, in kcfg's namespace).
func consumeAll(t *testing.T, kcfg kafka.Config, topic string, n int) []*kgo.Record {
	t.Helper()
	cl, err := kafka.NewClient(kcfg, kafka.KindReader, kgo.ConsumeTopics(kcfg.Topic(topic)), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out []*kgo.Record
	for len(out) < n {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("got %d of %d records: %v", len(out), n, err)
		}
		out = append(out, fs.Records()...)
	}
	return out
}

func TestPublishSealsAndRoundTrips(t *testing.T) {
	t.Parallel()
	kc, kcfg := newBroker(t)
	keys := testKeyring(t)
	c := producer.New(kc, producer.WithNamespace(kcfg.Namespace), producer.WithSealer(keys), producer.WithSource("test"))
	ctx := context.Background()

	r, err := c.PublishMailboxAdded(ctx, mailboxAdded())
	if err != nil {
		t.Fatal(err)
	}
	if r.Topic != kcfg.Topic(topics.MailboxEvents) || r.Offset != 0 || !domain.IsUUIDv7(r.ID) {
		t.Fatalf("receipt %+v", r)
	}
	recs := consumeAll(t, kcfg, topics.MailboxEvents, 1)
	rec := recs[0]
	if bytes.Contains(rec.Value, []byte("correct horse")) {
		t.Fatal("plain-text password on the log")
	}
	for _, h := range rec.Headers {
		if bytes.Contains(h.Value, []byte("correct horse")) {
			t.Fatal("plain-text password in a header")
		}
	}
	if string(rec.Key) != mailboxID {
		t.Fatalf("key %q", rec.Key)
	}
	ev, err := topics.Decode(rec)
	if err != nil {
		t.Fatal(err)
	}
	m := ev.Data.(*domain.MailboxAdded)
	plain, err := keys.Open(*m.SealedCredentials, m.AAD())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(plain, []byte("correct horse battery staple")) {
		t.Fatalf("unsealed %q", plain)
	}
	if ev.ID != r.ID || ev.Source != "test" || ev.Subject != mailboxID {
		t.Fatalf("event %+v", ev)
	}
}

func TestPublishRefusesPlainSecretWithoutSealer(t *testing.T) {
	t.Parallel()
	kc, kcfg := newBroker(t)
	_, err := producer.New(kc, producer.WithNamespace(kcfg.Namespace)).PublishMailboxAdded(context.Background(), mailboxAdded())
	if domain.ErrorCode(err) != domain.CodePlaintextSecret {
		t.Fatalf("err = %v, want plaintext_secret", err)
	}
}

func TestPublishBatchIsAllOrNothing(t *testing.T) {
	t.Parallel()
	kc, kcfg := newBroker(t)
	c := producer.New(kc, producer.WithNamespace(kcfg.Namespace), producer.WithSealer(testKeyring(t)))
	good := c.NewEvent(&domain.UserActive{UserID: userID, Source: domain.ActivityLogin})
	bad := c.NewEvent(&domain.WorkerHeartbeat{WorkerID: workerID, Tier: domain.TierDedicated, Egress: domain.EgressColdSMTP, Address: "10.0.0.1"})
	_, err := c.Publish(context.Background(), good, bad)
	var be *producer.BatchError
	if !errors.As(err, &be) || len(be.Events) != 1 || be.Events[0].Index != 1 || !be.Events[0].Problems.Has(domain.CodeTierNotAllowed) {
		t.Fatalf("err = %v", err)
	}
	assertNothingProduced(t, kc, kcfg.Namespace, "a refused batch")
}

// assertNothingProduced fails t if any topic of namespace ns holds a record.
func assertNothingProduced(t *testing.T, kc *kgo.Client, ns topics.Namespace, after string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ends, err := kadmEnds(ctx, kc, ns)
	if err != nil {
		t.Fatal(err)
	}
	for topic, n := range ends {
		if n != 0 {
			t.Errorf("%s has %d records after %s", topic, n, after)
		}
	}
}

// Receipts name the right event even though kgo completes a batch's
// records in any order across partitions.
func TestPublishReceiptsMatchEvents(t *testing.T) {
	t.Parallel()
	kc, kcfg := newBroker(t)
	c := producer.New(kc, producer.WithNamespace(kcfg.Namespace))
	var evs []domain.Event
	for i := range 200 {
		evs = append(evs, c.NewEvent(&domain.UserActive{UserID: fmt.Sprintf("0190a5b2-0000-7000-8000-%012x", i), Source: domain.ActivityLogin}))
	}
	rs, err := c.Publish(context.Background(), evs...)
	if err != nil {
		t.Fatal(err)
	}
	at := map[string]string{}
	for _, r := range rs {
		at[fmt.Sprintf("%d/%d", r.Partition, r.Offset)] = r.ID
	}
	for _, rec := range consumeAll(t, kcfg, topics.UserEvents, len(evs)) {
		id, _ := topics.Header(rec, topics.HeaderID)
		if got := at[fmt.Sprintf("%d/%d", rec.Partition, rec.Offset)]; got != id {
			t.Fatalf("receipt at %d/%d names %s, the record there is %s", rec.Partition, rec.Offset, got, id)
		}
	}
}

// The two mailbox event types of the IMAP work: mailbox.disabled goes with
// the mailbox's lifecycle, warmup_observed to the observations topic, both
// keyed by the mailbox (the sender, for an observation), and both pass the
// published schemas.
func TestPublishDisabledAndWarmupObserved(t *testing.T) {
	t.Parallel()
	kc, kcfg := newBroker(t)
	c := producer.New(kc, producer.WithNamespace(kcfg.Namespace), producer.WithSchema(eventschema.Default()), producer.WithSource("test"))
	ctx := context.Background()
	since := time.Date(2026, 5, 1, 10, 0, 0, 0, time.UTC)
	landed := time.Date(2026, 5, 1, 11, 59, 58, 123000000, time.UTC)
	const recipient = "0190a5b2-0000-7000-8000-000000000002"

	dis := domain.MailboxDisabled{MailboxID: mailboxID, Cause: domain.DisableAuthFailing, Reason: "AUTHENTICATIONFAILED", FailingSince: &since}
	r1, err := c.PublishMailboxDisabled(ctx, dis)
	if err != nil {
		t.Fatal(err)
	}
	obs := domain.WarmupObserved{MailboxID: mailboxID, WarmupID: "wu-1.a_b", Placement: domain.PlacedJunk,
		LandedAt: landed, Source: domain.ObservedBySync, RecipientMailboxID: recipient}
	r2, err := c.PublishWarmupObserved(ctx, obs)
	if err != nil {
		t.Fatal(err)
	}
	if r1.Topic != kcfg.Topic(topics.MailboxEvents) || r1.Type != domain.TypeMailboxDisabled {
		t.Errorf("mailbox.disabled receipt %+v", r1)
	}
	if r2.Topic != kcfg.Topic(topics.MailboxObservations) || r2.Type != domain.TypeWarmupObserved {
		t.Errorf("warmup_observed receipt %+v", r2)
	}
	for _, tc := range []struct {
		topic string
		want  domain.Data
	}{{topics.MailboxEvents, &dis}, {topics.MailboxObservations, &obs}} {
		rec := consumeAll(t, kcfg, tc.topic, 1)[0]
		if string(rec.Key) != mailboxID {
			t.Errorf("%s: key %q, want the mailbox %s", tc.topic, rec.Key, mailboxID)
		}
		ev, err := topics.Decode(rec)
		if err != nil {
			t.Fatalf("%s: %v", tc.topic, err)
		}
		if ev.Subject != mailboxID || !reflect.DeepEqual(ev.Data, tc.want) {
			t.Errorf("%s: decoded %+v (subject %s), want %+v", tc.topic, ev.Data, ev.Subject, tc.want)
		}
	}

	// Invalid data is refused with its stable code, and nothing produced.
	bad := obs
	bad.WarmupID = "<wu-1@example.com>"
	if _, err := c.PublishWarmupObserved(ctx, bad); domain.ErrorCode(err) != domain.CodeInvalid {
		t.Errorf("bad warmup_id: err = %v, want invalid", err)
	}
	bad = obs
	bad.LandedAt = time.Time{}
	if _, err := c.PublishWarmupObserved(ctx, bad); domain.ErrorCode(err) != domain.CodeRequired {
		t.Errorf("no landed_at: err = %v, want required", err)
	}
	if _, err := c.PublishMailboxDisabled(ctx, domain.MailboxDisabled{MailboxID: mailboxID, Cause: "expired", Reason: "r"}); domain.ErrorCode(err) != domain.CodeInvalid {
		t.Errorf("bad cause: err = %v, want invalid", err)
	}
	ends, err := kadm.NewClient(kc).ListEndOffsets(ctx, kcfg.Topic(topics.MailboxEvents), kcfg.Topic(topics.MailboxObservations))
	if err != nil {
		t.Fatal(err)
	}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset > 1 {
			t.Errorf("%s/%d ends at %d after the refused events", o.Topic, o.Partition, o.Offset)
		}
	})
}

// TestPublishRefusesSealedCredentials: a client that seals never passes on
// sealed credentials it was handed (a copy from the log, redirected to
// another endpoint), and a mailbox.added needs credentials; nothing is
// produced.
func TestPublishRefusesSealedCredentials(t *testing.T) {
	t.Parallel()
	kc, kcfg := newBroker(t)
	c := producer.New(kc, producer.WithNamespace(kcfg.Namespace), producer.WithSealer(testKeyring(t)))
	copied := mailboxAdded()
	copied.Credentials = nil
	copied.IMAP = domain.IMAPEndpoint{Host: "attacker.example", Port: 143, TLS: domain.TLSNone, Username: copied.IMAP.Username}
	copied.SealedCredentials = &domain.SealedSecret{KeyID: "k1", Alg: domain.SealAlg, Nonce: "AAAA", Ciphertext: "AAAA"}
	if _, err := c.PublishMailboxAdded(context.Background(), copied); domain.ErrorCode(err) != domain.CodeSealedCredentialsRefused {
		t.Errorf("copied sealed credentials: %v", err)
	}
	none := mailboxAdded()
	none.Credentials = nil
	if _, err := c.PublishMailboxAdded(context.Background(), none); domain.ErrorCode(err) != domain.CodeCredentialsRequired {
		t.Errorf("no credentials: %v", err)
	}
	assertNothingProduced(t, kc, kcfg.Namespace, "refused publishes")
}
