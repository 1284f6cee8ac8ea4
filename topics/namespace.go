package topics

import (
	"fmt"
	"strings"
)

// Namespace prefixes every topic, consumer group and transactional id a
// mailplane deployment uses, so that several deployments (staging and
// production, or the tests of one suite) share a Kafka cluster without
// touching each other's data, offsets or transactions. The empty namespace
// is the plain catalog names: a deployment that never set one keeps its
// topics.
//
// A namespace is lowercase letters, digits and dashes, and starts with a
// letter or digit; it is joined to a name with a dot, which a namespace
// never holds, so a namespaced name parses back unambiguously
// (docs/namespaces.md).
//
// The catalog's constants (MailboxEvents, ...) and the packages' default
// groups are catalog names; every client of the cluster maps them through
// its Namespace (Topic, Group, TransactionalID). Inside a deployment every
// topic name that came from a record (positions in Postgres, decision
// causes, dead letters) is the namespaced one, as the broker names it. The
// outbox is the exception: its rows hold catalog names, which the relay
// maps when it publishes.
type Namespace string

// MaxNamespaceLen bounds a namespace so that the longest namespaced name
// stays well under Kafka's 249-byte topic name limit.
const MaxNamespaceLen = 40

// ParseNamespace checks s as a namespace.
func ParseNamespace(s string) (Namespace, error) {
	n := Namespace(s)
	return n, n.Validate()
}

// Validate reports whether n is a usable namespace.
func (n Namespace) Validate() error {
	s := string(n)
	if s == "" {
		return nil
	}
	if len(s) > MaxNamespaceLen {
		return fmt.Errorf("namespace %.40q…: longer than %d bytes", s, MaxNamespaceLen)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
		case c == '-' && i > 0:
		default:
			return fmt.Errorf("namespace %q: only lowercase letters, digits and dashes (not first) are allowed", s)
		}
	}
	return nil
}

// prefix is what n puts before a name.
func (n Namespace) prefix() string {
	if n == "" {
		return ""
	}
	return string(n) + "."
}

// Topic returns the name of the catalog topic name within n.
func (n Namespace) Topic(name string) string { return n.prefix() + name }

// Topics maps names through Topic.
func (n Namespace) Topics(names ...string) []string {
	out := make([]string, len(names))
	for i, s := range names {
		out[i] = n.Topic(s)
	}
	return out
}

// Group returns the consumer group name within n.
func (n Namespace) Group(name string) string { return n.prefix() + name }

// TransactionalID returns the transactional id within n.
func (n Namespace) TransactionalID(id string) string { return n.prefix() + id }

// Base returns the catalog name of a topic of n (what Topic was given), and
// false for a topic outside n.
func (n Namespace) Base(topic string) (string, bool) {
	return strings.CutPrefix(topic, n.prefix())
}

// String returns the namespace, or "(none)" for the empty one.
func (n Namespace) String() string {
	if n == "" {
		return "(none)"
	}
	return string(n)
}
