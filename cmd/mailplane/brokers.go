package main

import (
	"flag"

	"github.com/mailplane/mailplane/internal/kafka"
)

// Broker connection settings, shared by every command that talks to Kafka.
var (
	cfgKafkaSASLMechanism = register(setting{"kafka-sasl-mechanism", "MAILPLANE_KAFKA_SASL_MECHANISM", "", "SASL mechanism to the brokers: SCRAM-SHA-256, SCRAM-SHA-512 or PLAIN; empty: none (SECURITY.md: one user per role)"})
	cfgKafkaSASLUser      = register(setting{"kafka-sasl-user", "MAILPLANE_KAFKA_SASL_USER", "", "SASL user of this role at the brokers"})
	cfgKafkaSASLPassword  = register(setting{"kafka-sasl-password", "MAILPLANE_KAFKA_SASL_PASSWORD", "", "SASL password (prefer the environment to the flag)"})
	cfgKafkaTLS           = register(setting{"kafka-tls", "MAILPLANE_KAFKA_TLS", "false", "connect to the brokers over TLS (system roots plus --kafka-ca-file)"})
	cfgKafkaCAFile        = register(setting{"kafka-ca-file", "MAILPLANE_KAFKA_CA_FILE", "", "PEM bundle of extra CAs trusted for the brokers (implies --kafka-tls)"})
)

// brokerFlags are the bootstrap brokers and how to authenticate to them.
type brokerFlags struct {
	brokers, mechanism, user, password, caFile *string
	tls                                        *bool
}

func registerBrokerFlags(fs *flag.FlagSet) *brokerFlags {
	return &brokerFlags{
		brokers:   cfgBrokers.String(fs),
		mechanism: cfgKafkaSASLMechanism.String(fs),
		user:      cfgKafkaSASLUser.String(fs),
		password:  cfgKafkaSASLPassword.String(fs),
		tls:       cfgKafkaTLS.Bool(fs),
		caFile:    cfgKafkaCAFile.String(fs),
	}
}

// config returns the client configuration with clientID, once the flags
// are parsed. Bad settings stop the command, as a malformed flag does.
func (b *brokerFlags) config(clientID string) kafka.Config {
	c := kafka.Config{
		Brokers:  kafka.ParseBrokers(*b.brokers),
		ClientID: clientID,
		SASL:     kafka.SASL{Mechanism: *b.mechanism, User: *b.user, Password: *b.password},
	}
	if err := c.SASL.Validate(); err != nil {
		fatalf("%v", err)
	}
	if *b.tls || *b.caFile != "" {
		t, err := kafka.TLSConfig(*b.caFile)
		if err != nil {
			fatalf("%v", err)
		}
		c.TLS = t
	}
	return c
}
