package eventschema

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"slices"
	"strings"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/domain/schemas/derived"
)

// ReaderSchema returns the reader's form of a schema: the same, except
// that objects accept members the schema does not list (every
// "additionalProperties": false is dropped). Producers are validated
// strictly, so nothing unknown reaches the log from them; but a reader
// validating this month's records with last month's schemas must not
// refuse a field added since (adding an optional field is a compatible
// change, docs in domain/schemas/README.md). Its $id gets ":reader".
func ReaderSchema(strict []byte) ([]byte, error) {
	var v any
	if err := json.Unmarshal(strict, &v); err != nil {
		return nil, fmt.Errorf("eventschema: schema: %w", err)
	}
	relax(v)
	if m, ok := v.(map[string]any); ok {
		if id, ok := m["$id"].(string); ok && !strings.HasSuffix(id, ":reader") {
			m["$id"] = id + ":reader"
		}
	}
	return json.MarshalIndent(v, "", "  ")
}

// relax drops every "additionalProperties": false under v.
func relax(v any) {
	switch t := v.(type) {
	case map[string]any:
		if b, ok := t["additionalProperties"].(bool); ok && !b {
			delete(t, "additionalProperties")
		}
		for _, c := range t {
			relax(c)
		}
	case []any:
		for _, c := range t {
			relax(c)
		}
	}
}

// SchemaOf returns the strict (producer's) schema of a record type: a
// domain event's data, or a record mailplane derives (decisions,
// mailbox.state, sync records).
func SchemaOf(recordType string) ([]byte, bool) {
	if b, ok := domain.Schema(recordType); ok {
		return b, true
	}
	if !slices.Contains(derived.Types(), recordType) {
		return nil, false
	}
	b, err := fs.ReadFile(derived.Files(), derived.FileName(recordType))
	return b, err == nil
}

// SchemaTypes returns every record type with a schema, sorted.
func SchemaTypes() []string {
	types := append(domain.EventTypes(), derived.Types()...)
	slices.Sort(types)
	return slices.Compact(types)
}
