package projections_test

import (
	"context"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/cloudevents/sdk-go/protocol/kafka_sarama/v2"
	cloudevents "github.com/cloudevents/sdk-go/v2"
	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/internal/projections"
	"github.com/mailplane/mailplane/topics"
)

// TestCloudEventsSDKKafkaRecordsApply: records the CloudEvents Go SDK's
// Kafka binding (protocol/kafka_sarama, on IBM's sarama producer) writes
// to a mailplane topic, as another Kafka producer would, are read by
// mailplane's consumer path: topics.Decode (what every projector and the
// engine call) takes them, and the registry projector applies them to
// Postgres, nothing dead-lettered. Binary mode with a charset on
// content-type and structured mode (the whole CloudEvent in the value,
// its datacontenttype with a charset), each with the SDK's UUIDv4 id,
// extensions (traceparent, partitionkey, which the binding also makes the
// record key) and, when sent, a dataschema.
func TestCloudEventsSDKKafkaRecordsApply(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	brokers := e.kcfg.Brokers
	topic, err := topics.ForType(domain.TypeUserActive)
	if err != nil {
		t.Fatal(err)
	}
	topic = e.kcfg.Topic(topic)
	cfg := sarama.NewConfig()
	cfg.Version = sarama.V2_8_0_0
	cfg.Producer.Return.Successes = true
	cfg.Producer.RequiredAcks = sarama.WaitForAll
	cfg.Producer.Timeout = 10 * time.Second
	cfg.Net.DialTimeout, cfg.Net.ReadTimeout, cfg.Net.WriteTimeout = 10*time.Second, 10*time.Second, 10*time.Second
	sender, err := kafka_sarama.NewSender(brokers, cfg, topic)
	if err != nil {
		t.Fatal(err)
	}
	c, err := cloudevents.NewClient(sender, cloudevents.WithUUIDs(), cloudevents.WithTimeNow())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sender.Close(context.Background()) })

	const (
		trace  = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
		schema = "https://schemas.example.org/mailplane/user.active/v1.json"
	)
	type sent struct{ user, mode, schema string }
	var all []sent
	for _, mode := range []string{"binary", "structured"} {
		for _, withSchema := range []bool{false, true} {
			user := uuid.NewString()
			ev := cloudevents.NewEvent()
			ev.SetType(domain.TypeUserActive)
			ev.SetSource("/product-api/sessions")
			ev.SetSubject(user)
			ev.SetExtension("traceparent", trace)
			ev.SetExtension("partitionkey", user)
			if withSchema {
				ev.SetDataSchema(schema)
			}
			if err := ev.SetData("application/json; charset=utf-8", map[string]any{"user_id": user, "source": "login"}); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			if mode == "structured" {
				ctx = binding.WithForceStructured(ctx)
			}
			res := c.Send(ctx, ev)
			cancel()
			if !cloudevents.IsACK(res) {
				t.Fatalf("%s: the SDK's Kafka sender: %v", mode, res)
			}
			s := sent{user: user, mode: mode}
			if withSchema {
				s.schema = schema
			}
			all = append(all, s)
		}
	}

	recs := map[string]*kgo.Record{}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := kafka.ReadToEnd(ctx, kafka.Config{Brokers: brokers}, kafka.ReadSpec{Topics: []string{topic}, ClientID: "sdk"},
		func(r *kgo.Record) error { recs[string(r.Key)] = r; return nil }); err != nil {
		t.Fatal(err)
	}
	times := map[string]time.Time{}
	for _, s := range all {
		r := recs[s.user]
		if r == nil {
			t.Fatalf("%s: no record keyed %s (the binding keys by partitionkey)", s.mode, s.user)
		}
		ct, _ := topics.Header(r, topics.HeaderContentType)
		wantCT := map[string]string{"binary": "application/json; charset=utf-8", "structured": topics.ContentTypeCloudEvents}[s.mode]
		if ct != wantCT {
			t.Errorf("%s: the SDK wrote content-type %q, the test expects %q", s.mode, ct, wantCT)
		}
		ev, err := topics.Decode(r)
		if err != nil {
			t.Errorf("%s (dataschema %q): mailplane's decoder refuses the SDK's record: %v", s.mode, s.schema, err)
			continue
		}
		d, ok := ev.Data.(*domain.UserActive)
		if u, err := uuid.Parse(ev.ID); err != nil || u.Version() != 4 {
			t.Errorf("%s: id %q is not the SDK's UUIDv4", s.mode, ev.ID)
		}
		if !ok || d.UserID != s.user || ev.Subject != s.user || ev.Time.IsZero() || ev.Extensions["traceparent"] != trace || ev.DataSchema != s.schema {
			t.Errorf("%s: decoded %+v (data %+v)", s.mode, ev, ev.Data)
		}
		if ev.Key() == "" || !domain.IsUUIDv7(ev.Key()) {
			t.Errorf("%s: the event's dedupe key %q", s.mode, ev.Key())
		}
		times[s.user] = ev.Time
	}

	p, _ := e.projector(e.db.Pool, projections.NewRegistry())
	start(t, p)
	waitCaughtUp(t, e.kcfg, e.db.Pool, projections.RegistryName, domainTopics, 30*time.Second)
	for _, s := range all {
		var at time.Time
		var source string
		err := e.db.Pool.QueryRow(ctx, `SELECT last_active_at, last_source FROM users WHERE user_id = $1`, s.user).Scan(&at, &source)
		if err != nil || !at.Equal(times[s.user].Truncate(time.Microsecond)) || source != string(domain.ActivityLogin) {
			t.Errorf("%s: the registry projection holds %v %q (%v), want %v login", s.mode, at, source, err, times[s.user])
		}
	}
	if n := count(t, e.db.Pool, `SELECT count(*) FROM users`); n != len(all) {
		t.Errorf("%d users projected, want %d", n, len(all))
	}
	dead := 0
	if _, err := kafka.ReadToEnd(ctx, e.kcfg, kafka.ReadSpec{Topics: []string{e.kcfg.Topic(topics.DLQ)}, ClientID: "dlq"},
		func(*kgo.Record) error { dead++; return nil }); err != nil || dead != 0 {
		t.Errorf("%d dead letters (%v)", dead, err)
	}
}
