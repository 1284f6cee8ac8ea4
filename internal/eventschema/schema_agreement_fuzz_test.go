package eventschema_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/eventschema"
)

// FuzzSchemaAgreement looks for data that the Go validation and the JSON
// Schema judge differently, starting from every agreement sample.
func FuzzSchemaAgreement(f *testing.F) {
	types := domain.EventTypes()
	samples := schemaHandSamples()
	for i, typ := range types {
		for _, s := range samples[typ] {
			f.Add(uint8(i), []byte(s.data))
		}
		// The generated ones too: hostile characters in every string field.
		for _, s := range schemaGenerated(typ, loadSchemaShape(f, typ)) {
			f.Add(uint8(i), []byte(s.data))
		}
	}
	v := eventschema.Default()
	f.Fuzz(func(t *testing.T, ti uint8, data []byte) {
		typ := types[int(ti)%len(types)]
		gps := schemaGoProblems(typ, data)
		sps := v.Validate(typ, data)
		if (len(gps) == 0) != (len(sps) == 0) && !schemaKnownGoStricter(typ, data, gps, sps) {
			t.Fatalf("%s: Go and schema disagree on %q\n  go:     %s\n  schema: %s", typ, data, problemsOrAccepted(gps), problemsOrAccepted(sps))
		}
		for _, p := range gps {
			if p.Code == "" || p.Code == domain.CodeInternal {
				t.Fatalf("%s: Go problem without a stable code: %s", typ, p)
			}
		}
	})
}

// schemaKnownGoStricter reports the one documented difference between the
// Go validation and the schemas (domain/schemas/README.md, "Where Go and the
// schemas differ"): a required time that is present but the zero time
// (0001-01-01T00:00:00Z, in any of its RFC 3339 spellings) is refused by Go
// as missing, and accepted by the schema, which checks the format only.
func schemaKnownGoStricter(typ string, data []byte, gps, sps domain.Problems) bool {
	if typ != domain.TypeWarmupObserved || len(sps) > 0 || len(gps) != 1 ||
		gps[0].Field != "data.landed_at" || gps[0].Code != domain.CodeRequired {
		return false
	}
	var m map[string]json.RawMessage
	if json.Unmarshal(data, &m) != nil {
		return false
	}
	var at time.Time
	return json.Unmarshal(m["landed_at"], &at) == nil && at.IsZero()
}
