package kafka_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/kafka"
)

func TestSASLValidate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		s    kafka.SASL
		code domain.Code
	}{
		{kafka.SASL{}, ""},
		{kafka.SASL{Mechanism: kafka.SASLScramSHA256, User: "u", Password: "p"}, ""},
		{kafka.SASL{Mechanism: kafka.SASLPlain, User: "u", Password: "p"}, ""},
		{kafka.SASL{Mechanism: "GSSAPI", User: "u", Password: "p"}, domain.CodeInvalid},
		{kafka.SASL{Mechanism: kafka.SASLScramSHA512, User: "u"}, domain.CodeRequired},
		{kafka.SASL{Mechanism: kafka.SASLScramSHA512, Password: "p"}, domain.CodeRequired},
	} {
		if got := domain.ErrorCode(tc.s.Validate()); tc.code == "" && tc.s.Validate() != nil || tc.code != "" && got != tc.code {
			t.Errorf("%+v: got %v, want code %q", tc.s.Mechanism, tc.s.Validate(), tc.code)
		}
	}
}

func TestTLSConfigCAFile(t *testing.T) {
	t.Parallel()
	if c, err := kafka.TLSConfig(""); err != nil || c.RootCAs != nil {
		t.Fatalf("no CA file: %v %v (want the system roots)", c, err)
	}
	bad := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(bad, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := kafka.TLSConfig(bad); domain.ErrorCode(err) != domain.CodeInvalid {
		t.Fatalf("a CA file without a certificate: %v", err)
	}
	if _, err := kafka.TLSConfig(filepath.Join(t.TempDir(), "missing.pem")); err == nil {
		t.Fatal("a missing CA file was accepted")
	}
}
