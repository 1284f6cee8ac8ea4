package domain

import "testing"

// The code of an input refused for its problems: the one code they share,
// else invalid; Err carries the same code.
func TestProblemsCode(t *testing.T) {
	t.Parallel()
	tier := Problem{Field: "tier", Code: CodeTierNotAllowed, Message: "no"}
	for _, tc := range []struct {
		name string
		ps   Problems
		want Code
	}{
		{"none", nil, CodeInvalid},
		{"one", Problems{tier}, CodeTierNotAllowed},
		{"all alike", Problems{tier, {Field: "tier2", Code: CodeTierNotAllowed, Message: "no"}}, CodeTierNotAllowed},
		{"differing", Problems{tier, {Field: "x", Code: CodeUnknownField, Message: "?"}}, CodeInvalid},
		{"differing last", Problems{tier, tier, {Code: CodeMalformedJSON, Message: "?"}}, CodeInvalid},
	} {
		if got := tc.ps.Code(); got != tc.want {
			t.Errorf("%s: Code() = %s, want %s", tc.name, got, tc.want)
		}
		if len(tc.ps) > 0 {
			if got := ErrorCode(tc.ps.Err()); got != tc.want {
				t.Errorf("%s: Err() has code %s, want %s", tc.name, got, tc.want)
			}
		}
	}
}
