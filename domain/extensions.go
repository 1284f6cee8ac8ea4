package domain

import (
	"maps"
	"slices"
)

// CloudEvents extension attributes. The SDKs producers use add them
// (traceparent, partitionkey, their own); mailplane keeps each one a
// producer sends on the log, as a ce_<name> header, and ignores it.
const (
	// MaxExtensions bounds the extension attributes of one event.
	MaxExtensions = 16
	// MaxExtensionValue bounds one extension's value, in bytes.
	MaxExtensionValue = 1024
	// MaxDataSchema bounds the dataschema attribute, in bytes.
	MaxDataSchema = 2048
)

// reservedAttrs are the context attributes of the spec (and the data
// members of structured mode): never an extension name.
var reservedAttrs = map[string]bool{
	"specversion": true, "id": true, "type": true, "source": true, "time": true, "subject": true,
	"datacontenttype": true, "dataschema": true, "data": true, "data_base64": true,
}

// IsExtensionName reports whether n may name an extension attribute: 1 to
// 20 lower-case ASCII letters or digits (the spec's rule), and not an
// attribute of the spec.
func IsExtensionName(n string) bool {
	if len(n) == 0 || len(n) > 20 || reservedAttrs[n] {
		return false
	}
	for i := 0; i < len(n); i++ {
		if c := n[i]; (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			return false
		}
	}
	return true
}

// checkExtensions checks an event's extension attributes: valid names,
// at most MaxExtensions, values clean text of at most MaxExtensionValue
// bytes.
func checkExtensions(ps *Problems, ext map[string]string) {
	if len(ext) > MaxExtensions {
		ps.Add("extensions", CodeInvalid, "at most %d extension attributes, not %d", MaxExtensions, len(ext))
		return
	}
	for _, k := range slices.Sorted(maps.Keys(ext)) {
		if !IsExtensionName(k) {
			ps.Add(k, CodeInvalid, "is not an extension attribute name: 1 to 20 lower-case letters or digits, not an attribute of the spec")
			continue
		}
		checkText(ps, k, ext[k], false, MaxExtensionValue)
	}
}

// checkDataSchema checks the dataschema attribute: empty, or a URI (the
// spec's type) of at most MaxDataSchema bytes.
func checkDataSchema(ps *Problems, v string) {
	if v == "" {
		return
	}
	if checkText(ps, "dataschema", v, false, MaxDataSchema) && (!isURIReference(v) || !hasScheme(v)) {
		ps.Add("dataschema", CodeInvalid, "must be an absolute URI (RFC 3986)")
	}
}

// hasScheme reports whether a URI-reference starts with a scheme.
func hasScheme(v string) bool {
	for i := 0; i < len(v); i++ {
		c := v[i]
		switch {
		case c == ':':
			return i > 0
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z':
		case i > 0 && (c >= '0' && c <= '9' || c == '+' || c == '-' || c == '.'):
		default:
			return false
		}
	}
	return false
}
