package domain_test

import (
	"testing"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/eventschema"
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
	}
	v := eventschema.Default()
	f.Fuzz(func(t *testing.T, ti uint8, data []byte) {
		typ := types[int(ti)%len(types)]
		gps := schemaGoProblems(typ, data)
		sps := v.Validate(typ, data)
		if (len(gps) == 0) != (len(sps) == 0) {
			t.Fatalf("%s: Go and schema disagree on %q\n  go:     %s\n  schema: %s", typ, data, problemsOrAccepted(gps), problemsOrAccepted(sps))
		}
		for _, p := range gps {
			if p.Code == "" || p.Code == domain.CodeInternal {
				t.Fatalf("%s: Go problem without a stable code: %s", typ, p)
			}
		}
	})
}
