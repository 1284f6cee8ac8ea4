package producer_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/kafka"
	"github.com/mailplane/mailplane/kafkatest"
	"github.com/mailplane/mailplane/producer"
	"github.com/mailplane/mailplane/sealing"
	"github.com/mailplane/mailplane/topics"
)

const (
	mailboxID = "0190a5b2-0000-7000-8000-000000000001"
	orgID     = "0190a5b2-0000-7000-8000-0000000000a1"
	userID    = "0190a5b2-0000-7000-8000-0000000000b1"
	workerID  = "0190a5b2-0000-7000-8000-0000000000c1"
)

func newBroker(t testing.TB) (*kgo.Client, []string) {
	t.Helper()
	brokers := kafkatest.Brokers(t, 4)
	kc, err := kafka.NewProducer(kafka.Config{Brokers: brokers, ClientID: "test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kc.Close)
	return kc, brokers
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

func consumeAll(t *testing.T, brokers []string, topic string, n int) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
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
	kc, brokers := newBroker(t)
	keys := testKeyring(t)
	c := producer.New(kc, producer.WithSealer(keys), producer.WithSource("test"))
	ctx := context.Background()

	r, err := c.PublishMailboxAdded(ctx, mailboxAdded())
	if err != nil {
		t.Fatal(err)
	}
	if r.Topic != topics.MailboxEvents || r.Offset != 0 || !domain.IsUUIDv7(r.ID) {
		t.Fatalf("receipt %+v", r)
	}
	recs := consumeAll(t, brokers, topics.MailboxEvents, 1)
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
	plain, err := keys.Open(*m.SealedCredentials, domain.CredentialsAAD(mailboxID))
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
	kc, _ := newBroker(t)
	_, err := producer.New(kc).PublishMailboxAdded(context.Background(), mailboxAdded())
	if domain.ErrorCode(err) != domain.CodePlaintextSecret {
		t.Fatalf("err = %v, want plaintext_secret", err)
	}
}

func TestPublishBatchIsAllOrNothing(t *testing.T) {
	t.Parallel()
	kc, _ := newBroker(t)
	c := producer.New(kc, producer.WithSealer(testKeyring(t)))
	good := c.NewEvent(&domain.UserActive{UserID: userID, Source: domain.ActivityLogin})
	bad := c.NewEvent(&domain.WorkerHeartbeat{WorkerID: workerID, Tier: domain.TierDedicated, Egress: domain.EgressColdSMTP, Address: "10.0.0.1"})
	_, err := c.Publish(context.Background(), good, bad)
	var be *producer.BatchError
	if !errors.As(err, &be) || len(be.Events) != 1 || be.Events[0].Index != 1 || !be.Events[0].Problems.Has(domain.CodeTierNotAllowed) {
		t.Fatalf("err = %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ends, err := kadmEnds(ctx, kc)
	if err != nil {
		t.Fatal(err)
	}
	for topic, n := range ends {
		if n != 0 {
			t.Errorf("%s has %d records after a refused batch", topic, n)
		}
	}
}

// Receipts name the right event even though kgo completes a batch's
// records in any order across partitions.
func TestPublishReceiptsMatchEvents(t *testing.T) {
	t.Parallel()
	kc, brokers := newBroker(t)
	c := producer.New(kc)
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
	for _, rec := range consumeAll(t, brokers, topics.UserEvents, len(evs)) {
		id, _ := topics.Header(rec, topics.HeaderID)
		if got := at[fmt.Sprintf("%d/%d", rec.Partition, rec.Offset)]; got != id {
			t.Fatalf("receipt at %d/%d names %s, the record there is %s", rec.Partition, rec.Offset, got, id)
		}
	}
}
