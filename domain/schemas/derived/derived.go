// Package derived holds the JSON Schemas (draft 2020-12) of the records
// mailplane derives from its domain events: the placement decision log
// (mailplane.placement.*), mailbox.state (mailplane.mailbox.state.v1),
// the sync records (mailplane.sync.*), and the operator audit
// (mailplane.ops.action.v1). One file per record type, named
// "<type>.json"; each schema's $id is "urn:mailplane:schema:<type>" and its
// x-mailplane-topic and x-mailplane-key annotations name the topic the
// records are on and how their key is made.
//
// They are the contract with analysts, like the domain event schemas in the
// parent directory, and follow the same compatibility rule: the released
// versions in baseline/ are never edited, and a test fails on a breaking
// change (see ../README.md). Package eventschema validates against them
// (eventschema.Derived).
//
// The directory is kept apart from the domain event schemas, which package
// domain embeds and enumerates as "schemas/*.json".
package derived

import (
	"embed"
	"io/fs"
	"slices"
	"strings"
)

//go:embed *.json
var files embed.FS

// Files returns the schemas, one file per record type named "<type>.json"
// (e.g. "mailplane.placement.assigned.v1.json") at the root.
func Files() fs.FS { return files }

// FileName returns the name, in Files, of recordType's schema.
func FileName(recordType string) string { return recordType + ".json" }

// Types returns every record type with a schema, sorted.
func Types() []string {
	names, err := fs.Glob(files, "*.json")
	if err != nil {
		panic(err) // a constant, valid pattern
	}
	types := make([]string, 0, len(names))
	for _, n := range names {
		types = append(types, strings.TrimSuffix(n, ".json"))
	}
	slices.Sort(types)
	return types
}

// Schema returns the JSON Schema of recordType's data.
func Schema(recordType string) ([]byte, bool) {
	if strings.ContainsAny(recordType, "/\\*?[") {
		return nil, false
	}
	b, err := fs.ReadFile(files, FileName(recordType))
	return b, err == nil
}
