// Package examples ships one valid, ready-to-publish structured CloudEvent
// per domain event type, in events/<short type>.json (for example
// events/mailbox.added.json). They are what the README and `mailplane dev`
// point at, and seeds for tests. The ids are fixed and consistent across the
// files: the mailbox's org and user are those of the org and user examples,
// every mailbox example is about that mailbox (warmup_observed: it sent the
// warmup message, which landed in another mailbox), and both worker
// examples are about the same worker. mailbox.added carries
// plain credentials, which the ingest API and the Go client seal before
// anything reaches the log; its IMAP endpoint is the dev server on
// 127.0.0.1:1143 (no TLS). mailbox.credentials_rotated is the exception:
// only mailplane's roles write it (domain.FromRolesOnly), so its example
// shows the log form, which ingest refuses.
package examples

import (
	"embed"
	"io/fs"

	"github.com/mailplane/mailplane/domain"
)

//go:embed events/*.json
var events embed.FS

// EventFiles returns the examples, one file per event type named
// "<short type>.json" at the root.
func EventFiles() fs.FS {
	sub, err := fs.Sub(events, "events")
	if err != nil {
		panic(err) // a constant, valid directory name
	}
	return sub
}

// EventFileName returns the name, in EventFiles, of eventType's example.
func EventFileName(eventType string) string { return domain.ShortType(eventType) + ".json" }

// Event returns the example structured CloudEvent of eventType.
func Event(eventType string) ([]byte, error) {
	return fs.ReadFile(EventFiles(), EventFileName(eventType))
}
