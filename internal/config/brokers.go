package config

import (
	"flag"

	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/topics"
)

// BrokerFlags are the bootstrap brokers and how to authenticate to them.
type BrokerFlags struct {
	brokers, mechanism, user, password, caFile, compression, namespace *string
	tls                                                                *bool
}

// RegisterBrokerFlags registers the broker settings on fs.
func RegisterBrokerFlags(fs *flag.FlagSet) *BrokerFlags {
	return &BrokerFlags{
		brokers:     Brokers.String(fs),
		mechanism:   KafkaSASLMechanism.String(fs),
		user:        KafkaSASLUser.String(fs),
		password:    KafkaSASLPassword.String(fs),
		tls:         KafkaTLS.Bool(fs),
		caFile:      KafkaCAFile.String(fs),
		compression: KafkaCompression.String(fs),
		namespace:   KafkaNamespace.String(fs),
	}
}

// Config returns the client configuration with clientID, once the flags
// are parsed. Bad settings stop the command, as a malformed flag does.
func (b *BrokerFlags) Config(clientID string) kafka.Config {
	c := kafka.Config{
		Brokers:     kafka.ParseBrokers(*b.brokers),
		ClientID:    clientID,
		SASL:        kafka.SASL{Mechanism: *b.mechanism, User: *b.user, Password: *b.password},
		Compression: *b.compression,
		Namespace:   topics.Namespace(*b.namespace),
	}
	if err := c.Namespace.Validate(); err != nil {
		fatalf("--%s: %v", KafkaNamespace.Flag, err)
	}
	if err := c.SASL.Validate(); err != nil {
		fatalf("%v", err)
	}
	if err := kafka.ValidCompression(c.Compression); err != nil {
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
