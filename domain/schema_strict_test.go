package domain

import (
	"strings"
	"testing"
)

func TestIntegralLiteral(t *testing.T) {
	t.Parallel()
	cases := []struct {
		in   string
		want string // "" when not an integer of at most 19 digits
	}{
		{"0", "0"}, {"7", "7"}, {"-7", "-7"}, {"1143.0", "1143"}, {"1143.000", "1143"},
		{"9.93e2", "993"}, {"9.93E+2", "993"}, {"99300e-2", "993"}, {"0.5e1", "5"},
		{"0.05e2", "5"}, {"1.2e3", "1200"}, {"120e-1", "12"}, {"-0.0", "0"}, {"0e99999", "0"},
		{"0.000e-5", "0"}, {"9e18", "9000000000000000000"}, {"-1e0", "-1"},
		{"1.5", ""}, {"12e-1", ""}, {"0.001e2", ""}, {"1e19", ""}, {"1e99999", ""},
		{"1e-99999", ""}, {"9.935e2", ""}, {"5e-1", ""},
	}
	for _, c := range cases {
		got, ok := integralLiteral(c.in)
		if c.want == "" {
			if ok {
				t.Errorf("integralLiteral(%s) = %s, want not integral", c.in, got)
			}
			continue
		}
		if !ok || got != c.want {
			t.Errorf("integralLiteral(%s) = %q %v, want %q", c.in, got, ok, c.want)
		}
	}
}

// Lenient decoding (consumers reading the log) keeps encoding/json's
// tolerance; only ingest is held to the schema's shape.
func TestStrictShapeOnlyWhenStrict(t *testing.T) {
	t.Parallel()
	data := `{"User_ID":"0190a5b2-4c5e-7b1a-9c3d-00000000b001","source":"login","extra":null}`
	if _, ps := DecodeData(TypeUserActive, []byte(data), false); len(ps) > 0 {
		t.Errorf("lenient: %s", ps)
	}
	_, ps := DecodeData(TypeUserActive, []byte(data), true)
	if !ps.Has(CodeUnknownField) || len(ps) != 2 {
		t.Errorf("strict: want unknown_field for User_ID and extra, got %s", ps)
	}
	// Rewritten integers decode to their value.
	d, ps := DecodeData(TypeWorkerHealthSampled, []byte(`{"worker_id":"0190a5b2-4c5e-7b1a-9c3d-00000000d001","window_seconds":3.6e3,"sends":12.0}`), true)
	if len(ps) > 0 {
		t.Fatal(ps)
	}
	if w := d.(*WorkerHealthSampled); w.WindowSeconds != 3600 || w.Sends != 12 {
		t.Errorf("decoded %+v", w)
	}
	// Deep nesting is bounded by the decoder, not the stack.
	deep := `{"worker_id":` + strings.Repeat("[", 20000) + strings.Repeat("]", 20000) + `}`
	if _, ps := DecodeData(TypeWorkerHealthSampled, []byte(deep), true); !ps.Has(CodeMalformedJSON) && !ps.Has(CodeInvalidType) {
		t.Errorf("deep nesting: %s", ps)
	}
}

func TestUnroundedFloat(t *testing.T) {
	t.Parallel()
	cases := []struct {
		in   string
		want string // "" when the literal is left alone
	}{
		{"62.5", ""}, {"100", ""}, {"100.0", ""}, {"0", ""}, {"-0", ""}, {"0e99999", ""}, {"-0.0e-5", ""},
		{"62.1", ""}, {"1e300", ""}, {"1e400", ""}, {"99.5", ""},
		{"100.0000000000000000001", "100.00000000000001"},
		{"99.99999999999999999999", "99.99999999999999"},
		{"-1e-400", "-5e-324"}, {"1e-400", "5e-324"}, {"-0.5e-99999", "-5e-324"},
	}
	for _, c := range cases {
		got, ok := unroundedFloat(c.in, 64)
		if c.want == "" {
			if ok {
				t.Errorf("unroundedFloat(%s) = %s, want it left alone", c.in, got)
			}
			continue
		}
		if !ok || got != c.want {
			t.Errorf("unroundedFloat(%s) = %q %v, want %q", c.in, got, ok, c.want)
		}
	}
}
