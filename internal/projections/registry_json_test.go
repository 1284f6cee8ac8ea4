package projections

import (
	"encoding/json"
	"testing"

	"github.com/mailplane/mailplane/domain"
)

func TestSealedJSONIsJSONMarshal(t *testing.T) {
	for _, s := range []domain.SealedSecret{
		{KeyID: "k1", Alg: domain.SealAlg, Nonce: "AAAAAAAAAAAAAAAA", Ciphertext: "c2VhbGVk+/=="},
		{},
		{KeyID: `a"b`, Alg: `\`, Nonce: "<>&", Ciphertext: "\u2028é\x01\x7f"},
		{KeyID: "k.1_-", Alg: "x y", Nonce: "~", Ciphertext: "{}"},
	} {
		got, err := appendSealedJSONB([]byte("x"), &s)
		if err != nil {
			t.Fatal(err)
		}
		j, _ := json.Marshal(&s)
		if want := appendJSONB([]byte("x"), j); string(got) != string(want) {
			t.Errorf("appendSealedJSONB(%+v) = %q, want %q", s, got, want)
		}
	}
}
