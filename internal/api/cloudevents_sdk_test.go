package api

import (
	"context"
	"net/http"
	"testing"
	"time"

	cloudevents "github.com/cloudevents/sdk-go/v2"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"
	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/topics"
)

// TestCloudEventsSDKClientIsAccepted: the CloudEvents Go SDK's own HTTP
// client (github.com/cloudevents/sdk-go/v2, as producers use it) sends
// events to the running API in binary mode (its default) and structured
// mode, with the ids it mints (UUIDv4), the time it stamps, extensions
// (traceparent, tracestate, partitionkey), a dataschema or none, and a
// charset on the data's content type. Each is accepted (202) and lands on
// its topic with its attributes and extensions as ce_ headers: the SDK's
// id, the producer's dataschema kept or mailplane's set, and it decodes.
func TestCloudEventsSDKClientIsAccepted(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	c, err := cloudevents.NewClientHTTP(cehttp.WithTarget(e.Base+"/v1/events"),
		cehttp.WithHeader("Authorization", "Bearer "+tokenA))
	if err != nil {
		t.Fatal(err)
	}
	const (
		trace  = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
		state  = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"
		schema = "https://schemas.example.org/mailplane/user.active/v1.json"
	)
	type sent struct {
		user, schema, mode string
	}
	var all []sent
	for _, mode := range []string{"binary", "structured"} {
		for _, withSchema := range []bool{true, false} {
			user := newUUID()
			ev := cloudevents.NewEvent() // no id, no time: the client mints them
			ev.SetType(domain.TypeUserActive)
			ev.SetSource("urn:mailplane:test/sdk")
			ev.SetSubject(user)
			ev.SetExtension("traceparent", trace)
			ev.SetExtension("tracestate", state)
			ev.SetExtension("partitionkey", user)
			want := domain.SchemaURI(domain.TypeUserActive)
			if withSchema {
				ev.SetDataSchema(schema)
				want = schema
			}
			if err := ev.SetData("application/json; charset=utf-8", map[string]any{"user_id": user, "source": "login"}); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			if mode == "structured" {
				ctx = cloudevents.WithEncodingStructured(ctx)
			}
			res := c.Send(ctx, ev)
			cancel()
			var hr *cehttp.Result
			if !cloudevents.ResultAs(res, &hr) || hr.StatusCode != http.StatusAccepted {
				t.Fatalf("%s (dataschema %v): the SDK's send got %v", mode, withSchema, res)
			}
			// The client minted the id on its copy of ev: the record is
			// found by its key.
			all = append(all, sent{user: user, schema: want, mode: mode})
		}
	}

	found := map[string]*kgo.Record{}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	topic, _ := topics.ForType(domain.TypeUserActive)
	topic = e.ns.Topic(topic)
	if _, err := kafka.ReadToEnd(ctx, kafka.Config{Brokers: e.brokers}, kafka.ReadSpec{Topics: []string{topic}, ClientID: "sdk"},
		func(r *kgo.Record) error { found[string(r.Key)] = r; return nil }); err != nil {
		t.Fatal(err)
	}
	for _, s := range all {
		r := found[s.user]
		if r == nil {
			t.Errorf("%s: no record for user %s", s.mode, s.user)
			continue
		}
		id, _ := topics.Header(r, topics.HeaderID)
		if u, err := uuid.Parse(id); err != nil || u.Version() != 4 {
			t.Errorf("%s: ce_id %q is not the SDK's UUIDv4", s.mode, id)
		}
		for h, want := range map[string]string{
			topics.HeaderDataSchema: s.schema, "ce_traceparent": trace, "ce_tracestate": state,
			"ce_partitionkey": s.user, topics.HeaderSubject: s.user, topics.HeaderType: domain.TypeUserActive,
		} {
			if got, _ := topics.Header(r, h); got != want {
				t.Errorf("%s: header %s = %q, want %q", s.mode, h, got, want)
			}
		}
		ev, err := topics.Decode(r)
		if err != nil {
			t.Errorf("%s: the record does not decode: %v", s.mode, err)
			continue
		}
		// Decoded, mailplane's own dataschema is no producer's (empty).
		wantOwn := s.schema
		if wantOwn == domain.SchemaURI(domain.TypeUserActive) {
			wantOwn = ""
		}
		if ev.ID != id || ev.Time.IsZero() || ev.DataSchema != wantOwn || ev.Extensions["tracestate"] != state {
			t.Errorf("%s: decoded %+v", s.mode, ev)
		}
	}
}
