package api

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/eventschema"
	"github.com/mailplane/mailplane/producer"
)

// The api role runs no JSON Schema validator (internal/roles/wiring.go):
// the domain's Go validation decides at ingest. That is sound only while
// every record ingest would produce conforms to the published schema, on
// both producing paths: the API's (parsed and checked by the domain, then
// PrepareChecked) and the Go client's (Prepare on events a Go caller
// built). FuzzIngestSchemaAgrees looks for a record either path would
// produce and the schema would refuse; internal/eventschema's agreement
// tests and FuzzSchemaAgreement hold the rules themselves together.

// schemaAgreesSeeds are the data objects the fuzzer starts from: one
// valid event of every type, and edits of them near the rules' edges.
func schemaAgreesSeeds() []map[string]any {
	seeds := allTypes()
	ma := mailboxAdded()
	seeds = append(seeds,
		with(ma, "data.imap.port", json.RawMessage("9.93e2")),
		with(ma, "data.imap.host", "127.0.0.1"),
		with(ma, "data.address", "é@example.com"),
		with(ma, "data.provider", "gmail"),
		without(ma, "data.warmup_enabled"),
		with(ma, "data.credentials", map[string]any{"oauth_refresh_token": "1//0g-token"}),
		with(healthScored(), "data.score", json.RawMessage("99.99999999999999999999")),
		with(healthScored(), "data.until", "2024-07-19T08:47:24.1234567891+02:00"),
		with(warmupObserved(), "data.landed_at", "0001-01-01T00:00:01Z"),
		with(mailboxRemoved(), "data.reason", "\u00e9\u00e8 \U0001F4EB"),
	)
	return seeds
}

func FuzzIngestSchemaAgrees(f *testing.F) {
	types := domain.EventTypes()
	index := map[string]uint8{}
	for i, t := range types {
		index[t] = uint8(i)
	}
	for _, ev := range schemaAgreesSeeds() {
		data, err := json.Marshal(ev["data"])
		if err != nil {
			f.Fatal(err)
		}
		f.Add(index[ev["type"].(string)], data)
	}
	k := newKeyring(f)
	prod := producer.New(nil, producer.WithSealer(k), producer.WithClock(func() time.Time { return fixedNow }))
	v := eventschema.Default()
	f.Fuzz(func(t *testing.T, ti uint8, data []byte) {
		typ := types[int(ti)%len(types)]

		// The API's path: a structured event around data, parsed and
		// checked as POST /v1/events does, sealed with the server's sealer.
		body, err := json.Marshal(map[string]any{
			"specversion": "1.0", "id": "e-1", "type": typ, "source": "urn:mailplane:test",
			"time": eventTime, "data": json.RawMessage(data),
		})
		if err == nil { // data is JSON
			if chk, ps := domain.ParseChecked(body, fixedNow, k.Seal); len(ps) == 0 {
				recs, err := prod.PrepareChecked([]domain.Checked{chk})
				if err != nil {
					t.Fatalf("%s: checked at parse, refused by PrepareChecked: %v", typ, err)
				}
				if sps := v.Validate(typ, recs[0].Value); len(sps) > 0 {
					t.Fatalf("%s: the API would produce %s, which the schema refuses: %s", typ, recs[0].Value, sps)
				}
			}
		}

		// The Go client's path: data a Go caller could have built (decoded
		// leniently, so more shapes reach Validate than strict decoding lets
		// through), then Prepare with a sealer.
		d, ps := domain.DecodeData(typ, data, false)
		if len(ps) > 0 {
			return
		}
		ev := domain.Event{ID: "e-1", Type: typ, Source: "urn:mailplane:test", Time: fixedNow, Data: d}
		recs, err := prod.Prepare([]domain.Event{ev})
		if err != nil {
			return // refused by the Go validation
		}
		if sps := v.Validate(typ, recs[0].Value); len(sps) > 0 {
			t.Fatalf("%s: the Go client would produce %s, which the schema refuses: %s", typ, recs[0].Value, sps)
		}
	})
}
