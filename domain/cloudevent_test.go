package domain_test

import (
	"testing"
	"time"

	"github.com/mailplane/mailplane/domain"
)

func TestParseStructuredAttributeNamesAreExact(t *testing.T) {
	t.Parallel()
	raw := `{"specversion":"1.0","ID":"0190a5b2-4c5e-7b1a-9c3d-00000000e005","type":"mailplane.user.active.v1","source":"t",
		"data":{"user_id":"0190a5b2-4c5e-7b1a-9c3d-00000000b001","source":"login"}}`
	_, ps := domain.ParseStructured([]byte(raw), time.Now(), nil)
	if len(ps) != 1 || ps[0].Code != domain.CodeUnknownField || ps[0].Field != "ID" {
		t.Fatalf("problems = %v", ps)
	}
}
