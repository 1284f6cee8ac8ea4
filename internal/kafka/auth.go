package kafka

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/mailplane/mailplane/domain"
)

// SASL mechanisms mailplane's clients speak. Redpanda supports the two
// SCRAM ones; PLAIN is for brokers behind TLS that only offer it.
const (
	SASLPlain       = "PLAIN"
	SASLScramSHA256 = "SCRAM-SHA-256"
	SASLScramSHA512 = "SCRAM-SHA-512"
)

// SASL is how a client authenticates to the brokers. The zero value
// authenticates nothing (a broker without SASL, such as dev mode's kfake).
type SASL struct {
	Mechanism string // SASLPlain, SASLScramSHA256 or SASLScramSHA512; empty: no SASL
	User      string
	Password  string
}

// Enabled reports whether a mechanism is set.
func (s SASL) Enabled() bool { return s.Mechanism != "" }

// Validate checks the mechanism and that a user and password are given.
func (s SASL) Validate() error {
	if !s.Enabled() {
		return nil
	}
	switch s.Mechanism {
	case SASLPlain, SASLScramSHA256, SASLScramSHA512:
	default:
		return domain.Errorf(domain.CodeInvalid, "kafka SASL mechanism %q is not one of %s, %s, %s", s.Mechanism, SASLPlain, SASLScramSHA256, SASLScramSHA512)
	}
	if s.User == "" || s.Password == "" {
		return domain.Errorf(domain.CodeRequired, "kafka SASL %s needs a user and a password", s.Mechanism)
	}
	return nil
}

func (s SASL) mechanism() sasl.Mechanism {
	switch s.Mechanism {
	case SASLPlain:
		return plain.Auth{User: s.User, Pass: s.Password}.AsMechanism()
	case SASLScramSHA512:
		return scram.Auth{User: s.User, Pass: s.Password}.AsSha512Mechanism()
	default:
		return scram.Auth{User: s.User, Pass: s.Password}.AsSha256Mechanism()
	}
}

// ConnOptions are the connection options every client of cfg's brokers
// uses, whatever else it does: the seed brokers, a dial deadline, and the
// SASL and TLS settings, so a cluster with SASL and ACLs (SECURITY.md) is
// reached by every client. NewClient starts from them; build clients
// there rather than from these alone, which lack the metrics, logging and
// request deadlines.
func ConnOptions(cfg Config) []kgo.Opt {
	opts := []kgo.Opt{
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.DialTimeout(5 * time.Second),
	}
	if cfg.SASL.Enabled() {
		opts = append(opts, kgo.SASL(cfg.SASL.mechanism()))
	}
	if cfg.TLS != nil {
		opts = append(opts, kgo.DialTLSConfig(cfg.TLS.Clone()))
	}
	return opts
}

// TLSConfig returns the TLS settings for the brokers: the system roots plus
// the PEM bundle at caFile when it is not empty.
func TLSConfig(caFile string) (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile == "" {
		return c, nil
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("kafka CA file: %w", err)
	}
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool()
	}
	if !pool.AppendCertsFromPEM(pem) {
		return nil, domain.Errorf(domain.CodeInvalid, "kafka CA file %s holds no PEM certificate", caFile)
	}
	c.RootCAs = pool
	return c, nil
}
