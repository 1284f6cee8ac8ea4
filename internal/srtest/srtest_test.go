package srtest_test

import (
	"context"
	"errors"
	"net/http"
	"testing"

	"github.com/twmb/franz-go/pkg/sr"

	"github.com/mailplane/mailplane/internal/srtest"
)

// The stand-in answers as a Confluent-compatible registry does, through
// franz-go's client: ids, the same schema twice, lookups, 409 and 422.
func TestStandInAnswersLikeARegistry(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	reg := srtest.Start(t)
	cl, err := sr.NewClient(sr.URLs(reg.URL))
	if err != nil {
		t.Fatal(err)
	}
	v1 := sr.Schema{Type: sr.TypeJSON, Schema: `{"type":"object","properties":{"a":{"type":"string"}}}`}
	v2 := sr.Schema{Type: sr.TypeJSON, Schema: `{"type":"object","description":"v2","properties":{"a":{"type":"string"}}}`}
	withB := sr.Schema{Type: sr.TypeJSON, Schema: `{"type":"object","properties":{"a":{"type":"string"},"b":{"type":"integer"}}}`}
	// What a reader holding v2 would refuse records of: not FORWARD.
	looser := sr.Schema{Type: sr.TypeJSON, Schema: `{"type":"object","properties":{"a":{"type":["string","integer"]}}}`}

	code := func(err error) (int, int) {
		var re *sr.ResponseError
		if !errors.As(err, &re) {
			t.Fatalf("not a registry answer: %v", err)
		}
		return re.StatusCode, re.ErrorCode
	}
	if _, err := cl.LookupSchema(ctx, "s", v1); err == nil {
		t.Fatal("lookup in a missing subject succeeded")
	} else if st, ec := code(err); st != http.StatusNotFound || ec != sr.ErrSubjectNotFound.Code {
		t.Errorf("missing subject: %d %d", st, ec)
	}
	id1, err := cl.RegisterSchema(ctx, "s", v1, -1, -1)
	if err != nil || id1 == 0 {
		t.Fatalf("register: %d %v", id1, err)
	}
	if again, err := cl.RegisterSchema(ctx, "s", v1, -1, -1); err != nil || again != id1 {
		t.Errorf("the same schema again: id %d (%v), want %d", again, err, id1)
	}
	if _, err := cl.LookupSchema(ctx, "s", v2); err == nil {
		t.Fatal("lookup of an unregistered schema succeeded")
	} else if st, ec := code(err); st != http.StatusNotFound || ec != sr.ErrSchemaNotFound.Code {
		t.Errorf("missing schema: %d %d", st, ec)
	}
	// Under the default BACKWARD, a typed property added to an open
	// object narrows what it accepts (Confluent's rule too).
	if _, err := cl.RegisterSchema(ctx, "s", withB, -1, -1); err == nil {
		t.Fatal("BACKWARD let a typed property into an open object")
	} else if st, ec := code(err); st != http.StatusConflict || ec != sr.ErrIncompatibleSchema.Code {
		t.Errorf("incompatible: %d %d", st, ec)
	}
	if res := cl.SetCompatibility(ctx, sr.SetCompatibility{Level: sr.CompatForward}, "s"); res[0].Err != nil {
		t.Fatal(res[0].Err)
	}
	if res := cl.Compatibility(ctx, "s"); res[0].Err != nil || res[0].Level != sr.CompatForward {
		t.Fatalf("GET /config/s: %+v", res[0])
	}
	id2, err := cl.RegisterSchema(ctx, "s", v2, -1, -1)
	if err != nil || id2 == id1 {
		t.Fatalf("a compatible change: id %d (%v)", id2, err)
	}
	if ss, err := cl.LookupSchema(ctx, "s", v2); err != nil || ss.Version != 2 || ss.ID != id2 {
		t.Errorf("lookup: %+v %v", ss, err)
	}
	if other, err := cl.RegisterSchema(ctx, "t", v2, -1, -1); err != nil || other != id2 {
		t.Errorf("the same schema in another subject: id %d (%v), want the shared %d", other, err, id2)
	}
	if res, err := cl.CheckCompatibility(sr.WithParams(ctx, sr.Verbose), "s", -1, looser); err != nil || res.Is || len(res.Messages) == 0 {
		t.Errorf("compatibility of a looser schema: %+v %v", res, err)
	}
	if _, err := cl.RegisterSchema(ctx, "s", looser, -1, -1); err == nil {
		t.Error("an incompatible schema registered")
	} else if st, ec := code(err); st != http.StatusConflict || ec != sr.ErrIncompatibleSchema.Code {
		t.Errorf("incompatible: %d %d", st, ec)
	}
	for _, bad := range []sr.Schema{
		{Type: sr.TypeJSON, Schema: `{"type":`},
		{Type: sr.TypeJSON, Schema: `{"type":"no such type"}`},
	} {
		if _, err := cl.RegisterSchema(ctx, "s", bad, -1, -1); err == nil {
			t.Errorf("invalid schema %s registered", bad.Schema)
		} else if st, ec := code(err); st != http.StatusUnprocessableEntity || ec != sr.ErrInvalidSchema.Code {
			t.Errorf("invalid schema %s: %d %d", bad.Schema, st, ec)
		}
	}
	// NONE lets the looser schema in.
	if res := cl.SetCompatibility(ctx, sr.SetCompatibility{Level: sr.CompatNone}, "s"); res[0].Err != nil {
		t.Fatal(res[0].Err)
	}
	if _, err := cl.RegisterSchema(ctx, "s", looser, -1, -1); err != nil {
		t.Errorf("under NONE: %v", err)
	}
	if n := len(reg.Versions("s")); n != 3 {
		t.Errorf("%d versions, want 3", n)
	}
}
