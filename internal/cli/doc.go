// Package cli holds mailplane's operator commands and what they print:
// topics, migrate, publish, import, token, credentials, acls, dlq, rebuild
// (registry, placement, health, cleanup), placement show, ownership
// (transfer, backfill) and newid. Each
// command parses its own flags (settings from package config) and returns
// an error for the exit code; cmd/mailplane only dispatches to them.
package cli
