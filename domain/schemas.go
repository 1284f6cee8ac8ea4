package domain

import (
	"embed"
	"io/fs"
)

// The JSON Schemas (draft 2020-12) of every event type's data, in its log
// form, one file per type named "<type>.json". They are the contract with
// analysts; package eventschema validates against them, and tests keep them
// in agreement with the Go validation here and compatible with the released
// baselines in schemas/baseline.
//
//go:embed schemas/*.json
var schemaFiles embed.FS

// SchemaFiles returns the data schemas, one file per event type named
// "<type>.json" (e.g. "mailplane.mailbox.added.v1.json") at the root.
func SchemaFiles() fs.FS {
	sub, err := fs.Sub(schemaFiles, "schemas")
	if err != nil {
		panic(err) // a constant, valid directory name
	}
	return sub
}

// SchemaFileName returns the name, in SchemaFiles, of eventType's schema.
func SchemaFileName(eventType string) string { return eventType + ".json" }

// Schema returns the JSON Schema of eventType's data.
func Schema(eventType string) ([]byte, bool) {
	if _, ok := registry[eventType]; !ok {
		return nil, false
	}
	b, err := fs.ReadFile(SchemaFiles(), SchemaFileName(eventType))
	return b, err == nil
}

// SchemaURIPrefix starts the $id of every record schema and the
// dataschema of every record mailplane writes: SchemaURI(t) is the prefix
// and the record type.
const SchemaURIPrefix = "urn:mailplane:schema:"

// SchemaURI is the dataschema of records of recordType: its schema's $id.
// The type is the URI's last segment, which is also the schema's path
// under the API's /v1/schemas/ and its Schema Registry subject
// (domain/schemas/README.md).
func SchemaURI(recordType string) string { return SchemaURIPrefix + recordType }
