package eventschema_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"slices"
	"strings"
	"testing"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/eventschema"
)

// The agreement test runs every sample through the Go validation (strict
// DecodeData, then Validate) and through the JSON Schema, and requires both
// to accept or both to reject. Hand-written samples also name the stable
// code (and field) the Go side must report; samples schemaGenerated from the
// schemas (every property left out, set to null or to each wrong JSON type,
// every enum value, every bound and its neighbour) check agreement only.

type schemaSample struct {
	name  string
	data  string
	code  domain.Code // "" when the data is valid
	field string      // field of the Go problem with code, when set
}

const (
	sampleMailboxID = "0190a5b2-4c5e-7b1a-9c3d-00000000c001"
	sampleOrgID     = "0190a5b2-4c5e-7b1a-9c3d-00000000a001"
	sampleUserID    = "0190a5b2-4c5e-7b1a-9c3d-00000000b001"
	sampleWorkerID  = "0190a5b2-4c5e-7b1a-9c3d-00000000d001"
	// sampleRecipientID is the mailbox a warmup message was found in.
	sampleRecipientID = "0190a5b2-4c5e-7b1a-9c3d-00000000c002"
)

// schemaValidData is a valid log-form data object per type.
var schemaValidData = map[string]string{
	domain.TypeMailboxAdded: `{"mailbox_id":"` + sampleMailboxID + `","org_id":"` + sampleOrgID + `","user_id":"` + sampleUserID + `",
		"address":"ada@example.com","provider":"smtp_imap","warmup_enabled":true,
		"imap":{"host":"imap.example.com","port":993,"tls":"implicit","username":"ada@example.com"},
		"sealed_credentials":{"key_id":"k1","alg":"A256GCM","nonce":"AAECAwQFBgcICQoL","ciphertext":"c2VhbGVkIGNyZWRlbnRpYWxz"}}`,
	domain.TypeMailboxRemoved: `{"mailbox_id":"` + sampleMailboxID + `","reason":"closed by the user"}`,
	domain.TypeCredentialsRotated: `{"mailbox_id":"` + sampleMailboxID + `","cause":"oauth_rotation","added_at":"2024-07-12T06:47:24Z",
		"sealed_credentials":{"key_id":"k2","alg":"A256GCM","nonce":"AAECAwQFBgcICQoL","ciphertext":"c2VhbGVkIGNyZWRlbnRpYWxz"}}`,
	domain.TypeMailboxHealthScored: `{"mailbox_id":"` + sampleMailboxID + `","state":"watch","score":62.5,"reason":"bounces","until":"2024-07-19T06:47:24Z",` +
		`"evidence":{"window_seconds":604800,"window_end":"2024-07-12T06:47:24Z","inbox":73,"junk":23,"min_observations":20,` +
		`"rate":0.23958333333333334,"rule":"level","threshold":{"rate":0.2,"state":"quarantined"},"penalty_seconds":604800}}`,
	domain.TypeMailboxDisabled: `{"mailbox_id":"` + sampleMailboxID + `","cause":"auth_failing","reason":"AUTHENTICATIONFAILED Invalid credentials (Failure)","failing_since":"2024-07-10T06:47:24Z"}`,
	domain.TypeWarmupObserved: `{"mailbox_id":"` + sampleMailboxID + `","warmup_id":"wu-01J2ZK5Q8X.c001_7","placement":"junk","landed_at":"2024-07-12T06:40:11Z",
		"source":"imap_sync","recipient_mailbox_id":"` + sampleRecipientID + `"}`,
	domain.TypeOrgPlanChanged:          `{"org_id":"` + sampleOrgID + `","plan":"dedicated","dedicated_workers":2,"paid":true,"source":"billing:evt_1"}`,
	domain.TypeUserActive:              `{"user_id":"` + sampleUserID + `","source":"ws_ping"}`,
	domain.TypeMailboxOwnerTransferred: `{"mailbox_id":"` + sampleMailboxID + `","owner":"/importer","comment":"ticket OPS-1"}`,
	domain.TypeOrgOwnerTransferred:     `{"org_id":"` + sampleOrgID + `","owner":"urn:acme:","comment":"ticket OPS-2"}`,
	domain.TypeWorkerHeartbeat:         `{"worker_id":"` + sampleWorkerID + `","tier":"shared_free","egress":"oauth_api","address":"10.0.0.7:2525","stopping":false}`,
	domain.TypeWorkerHealthSampled:     `{"worker_id":"` + sampleWorkerID + `","window_seconds":3600,"sends":1200,"hard_bounces":6,"complaints":1}`,
}

// edit returns base with the value at a dotted path replaced (v is any JSON
// value; json.RawMessage for a literal) or, when v is del, removed.
func schemaEdit(base, path string, v any) string {
	var m map[string]any
	dec := json.NewDecoder(strings.NewReader(base))
	dec.UseNumber()
	if err := dec.Decode(&m); err != nil {
		panic(err)
	}
	keys := strings.Split(path, ".")
	obj := m
	for _, k := range keys[:len(keys)-1] {
		obj = obj[k].(map[string]any)
	}
	last := keys[len(keys)-1]
	if _, ok := v.(schemaDeleted); ok {
		delete(obj, last)
	} else {
		obj[last] = v
	}
	b, err := json.Marshal(m)
	if err != nil {
		panic(err)
	}
	return string(b)
}

type schemaDeleted struct{}

var schemaDel = schemaDeleted{}

func schemaRawJSON(s string) json.RawMessage { return json.RawMessage(s) }

func schemaUUIDCases(typ, field string) []schemaSample {
	b := schemaValidData[typ]
	return []schemaSample{
		{"missing " + field, schemaEdit(b, field, schemaDel), domain.CodeRequired, "data." + field},
		{"empty " + field, schemaEdit(b, field, ""), domain.CodeRequired, "data." + field},
		{"upper-case " + field, schemaEdit(b, field, strings.ToUpper(sampleMailboxID)), domain.CodeInvalid, "data." + field},
		{"short " + field, schemaEdit(b, field, sampleMailboxID[:35]), domain.CodeInvalid, "data." + field},
		{"long " + field, schemaEdit(b, field, sampleMailboxID+"0"), domain.CodeInvalid, "data." + field},
		{"braced " + field, schemaEdit(b, field, "{"+sampleMailboxID+"}"), domain.CodeInvalid, "data." + field},
		{"number " + field, schemaEdit(b, field, 42), domain.CodeInvalidType, "data." + field},
		{"null " + field, schemaEdit(b, field, nil), domain.CodeInvalidType, "data." + field},
	}
}

func schemaCommonCases(typ, idField string) []schemaSample {
	b := schemaValidData[typ]
	first := `"` + idField + `"`
	return append(schemaUUIDCases(typ, idField),
		schemaSample{"valid", b, "", ""},
		schemaSample{"unknown field", schemaEdit(b, "color", "blue"), domain.CodeUnknownField, "data.color"},
		schemaSample{"field name in another case", strings.Replace(b, first, strings.ToUpper(first), 1), domain.CodeUnknownField, "data." + strings.ToUpper(idField)},
		schemaSample{"repeated field", "{" + first + `:"x",` + strings.TrimSpace(b)[1:], domain.CodeMalformedJSON, "data." + idField},
		schemaSample{"null data", `null`, domain.CodeInvalidType, "data"},
		schemaSample{"array data", `[]`, domain.CodeInvalidType, "data"},
		schemaSample{"string data", `"x"`, domain.CodeInvalidType, "data"},
		schemaSample{"empty object", `{}`, domain.CodeRequired, "data." + idField},
		schemaSample{"truncated", b[:len(b)/2], domain.CodeMalformedJSON, "data"},
		schemaSample{"trailing data", b + ` {}`, domain.CodeMalformedJSON, "data"},
		schemaSample{"empty", ``, domain.CodeRequired, "data"},
	)
}

func schemaRepeat(s string, n int) string { return strings.Repeat(s, n) }

func schemaHandSamples() map[string][]schemaSample {
	ma := schemaValidData[domain.TypeMailboxAdded]
	creds := schemaRawJSON(`{"password":"hunter2"}`)
	sealed := "sealed_credentials"
	out := map[string][]schemaSample{}

	out[domain.TypeMailboxAdded] = append(schemaCommonCases(domain.TypeMailboxAdded, "mailbox_id"), slices.Concat(
		schemaUUIDCases(domain.TypeMailboxAdded, "org_id"),
		schemaUUIDCases(domain.TypeMailboxAdded, "user_id"),
		[]schemaSample{
			{"warmup absent", schemaEdit(ma, "warmup_enabled", schemaDel), "", ""},
			{"warmup as string", schemaEdit(ma, "warmup_enabled", "yes"), domain.CodeInvalidType, "data.warmup_enabled"},
			{"warmup null", schemaEdit(ma, "warmup_enabled", nil), domain.CodeInvalidType, "data.warmup_enabled"},
			{"missing address", schemaEdit(ma, "address", schemaDel), domain.CodeRequired, "data.address"},
			{"address without @", schemaEdit(ma, "address", "ada.example.com"), domain.CodeInvalid, "data.address"},
			{"address without dot", schemaEdit(ma, "address", "ada@example"), domain.CodeInvalid, "data.address"},
			{"address with space", schemaEdit(ma, "address", "a da@example.com"), domain.CodeInvalid, "data.address"},
			{"address with two @", schemaEdit(ma, "address", "ada@@example.com"), domain.CodeInvalid, "data.address"},
			{"address 254", schemaEdit(ma, "address", schemaRepeat("a", 242)+"@example.com"), "", ""},
			{"address 255", schemaEdit(ma, "address", schemaRepeat("a", 243)+"@example.com"), domain.CodeTooLong, "data.address"},
			{"address 254 non-ASCII", schemaEdit(ma, "address", schemaRepeat("é", 242)+"@example.com"), "", ""},
			{"missing provider", schemaEdit(ma, "provider", schemaDel), domain.CodeRequired, "data.provider"},
			{"bad provider", schemaEdit(ma, "provider", "yahoo"), domain.CodeInvalid, "data.provider"},
			{"provider in upper case", schemaEdit(ma, "provider", "GMAIL"), domain.CodeInvalid, "data.provider"},
			{"missing imap", schemaEdit(ma, "imap", schemaDel), domain.CodeRequired, "data.imap.host"},
			{"imap as string", schemaEdit(ma, "imap", "imap.example.com:993"), domain.CodeInvalidType, "data.imap"},
			{"imap null", schemaEdit(ma, "imap", nil), domain.CodeInvalidType, "data.imap"},
			{"missing imap host", schemaEdit(ma, "imap.host", schemaDel), domain.CodeRequired, "data.imap.host"},
			{"imap host IPv4", schemaEdit(ma, "imap.host", "127.0.0.1"), "", ""},
			{"imap host IPv6", schemaEdit(ma, "imap.host", "::1"), domain.CodeInvalid, "data.imap.host"},
			{"imap host leading dash", schemaEdit(ma, "imap.host", "-imap.example.com"), domain.CodeInvalid, "data.imap.host"},
			{"imap host trailing dot", schemaEdit(ma, "imap.host", "imap.example.com."), domain.CodeInvalid, "data.imap.host"},
			{"imap host underscore", schemaEdit(ma, "imap.host", "imap_1.example.com"), domain.CodeInvalid, "data.imap.host"},
			{"imap host with port", schemaEdit(ma, "imap.host", "imap.example.com:993"), domain.CodeInvalid, "data.imap.host"},
			{"imap host 253", schemaEdit(ma, "imap.host", schemaRepeat("a", 253)), "", ""},
			{"imap host 254", schemaEdit(ma, "imap.host", schemaRepeat("a", 254)), domain.CodeTooLong, "data.imap.host"},
			{"missing imap port", schemaEdit(ma, "imap.port", schemaDel), domain.CodeOutOfRange, "data.imap.port"},
			{"imap port 0", schemaEdit(ma, "imap.port", 0), domain.CodeOutOfRange, "data.imap.port"},
			{"imap port 1", schemaEdit(ma, "imap.port", 1), "", ""},
			{"imap port 65535", schemaEdit(ma, "imap.port", 65535), "", ""},
			{"imap port 65536", schemaEdit(ma, "imap.port", 65536), domain.CodeOutOfRange, "data.imap.port"},
			{"imap port negative", schemaEdit(ma, "imap.port", -993), domain.CodeOutOfRange, "data.imap.port"},
			{"imap port as string", schemaEdit(ma, "imap.port", "993"), domain.CodeInvalidType, "data.imap.port"},
			{"imap port fraction", schemaEdit(ma, "imap.port", schemaRawJSON("993.5")), domain.CodeInvalidType, "data.imap.port"},
			{"imap port integral with fraction", schemaEdit(ma, "imap.port", schemaRawJSON("993.0")), "", ""},
			{"imap port integral with exponent", schemaEdit(ma, "imap.port", schemaRawJSON("9.93e2")), "", ""},
			{"imap port integral with negative exponent", schemaEdit(ma, "imap.port", schemaRawJSON("99300e-2")), "", ""},
			{"imap port fraction with exponent", schemaEdit(ma, "imap.port", schemaRawJSON("9.935e2")), domain.CodeInvalidType, "data.imap.port"},
			{"imap port huge", schemaEdit(ma, "imap.port", schemaRawJSON("1e30")), domain.CodeInvalidType, "data.imap.port"},
			{"imap port zero with huge exponent", schemaEdit(ma, "imap.port", schemaRawJSON("0e99999")), domain.CodeOutOfRange, "data.imap.port"},
			{"missing imap tls", schemaEdit(ma, "imap.tls", schemaDel), domain.CodeRequired, "data.imap.tls"},
			{"bad imap tls", schemaEdit(ma, "imap.tls", "ssl"), domain.CodeInvalid, "data.imap.tls"},
			{"imap tls none", schemaEdit(ma, "imap.tls", "none"), "", ""},
			{"missing imap username", schemaEdit(ma, "imap.username", schemaDel), domain.CodeRequired, "data.imap.username"},
			{"imap username 320", schemaEdit(ma, "imap.username", schemaRepeat("ü", 320)), "", ""},
			{"imap username 321", schemaEdit(ma, "imap.username", schemaRepeat("u", 321)), domain.CodeTooLong, "data.imap.username"},
			{"unknown imap field", schemaEdit(ma, "imap.ssl", true), domain.CodeUnknownField, "data.imap.ssl"},
			{"imap field in another case", schemaEdit(schemaEdit(ma, "imap.port", schemaDel), "imap.Port", 993), domain.CodeUnknownField, "data.imap.Port"},
			{"plain credentials beside sealed", schemaEdit(ma, "credentials", creds), domain.CodePlaintextSecret, "data.credentials"},
			{"plain credentials only", schemaEdit(schemaEdit(ma, sealed, schemaDel), "credentials", creds), domain.CodePlaintextSecret, "data.credentials"},
			{"empty plain credentials", schemaEdit(ma, "credentials", schemaRawJSON(`{}`)), domain.CodePlaintextSecret, "data.credentials"},
			{"null credentials", schemaEdit(ma, "credentials", nil), domain.CodeInvalidType, "data.credentials"},
			{"missing sealed credentials", schemaEdit(ma, sealed, schemaDel), domain.CodeRequired, "data.sealed_credentials"},
			{"sealed credentials as string", schemaEdit(ma, sealed, "c2VhbGVk"), domain.CodeInvalidType, "data.sealed_credentials"},
			{"sealed credentials null", schemaEdit(ma, sealed, nil), domain.CodeInvalidType, "data.sealed_credentials"},
			{"missing key id", schemaEdit(ma, sealed+".key_id", schemaDel), domain.CodeRequired, "data.sealed_credentials.key_id"},
			{"key id 64", schemaEdit(ma, sealed+".key_id", schemaRepeat("k", 64)), "", ""},
			{"key id 65", schemaEdit(ma, sealed+".key_id", schemaRepeat("k", 65)), domain.CodeInvalid, "data.sealed_credentials.key_id"},
			{"key id with slash", schemaEdit(ma, sealed+".key_id", "a/b"), domain.CodeInvalid, "data.sealed_credentials.key_id"},
			{"missing alg", schemaEdit(ma, sealed+".alg", schemaDel), domain.CodeRequired, "data.sealed_credentials.alg"},
			{"bad alg", schemaEdit(ma, sealed+".alg", "A128GCM"), domain.CodeInvalid, "data.sealed_credentials.alg"},
			{"missing nonce", schemaEdit(ma, sealed+".nonce", schemaDel), domain.CodeRequired, "data.sealed_credentials.nonce"},
			{"nonce not base64", schemaEdit(ma, sealed+".nonce", "not base64!"), domain.CodeInvalid, "data.sealed_credentials.nonce"},
			{"nonce url-safe base64", schemaEdit(ma, sealed+".nonce", "AAEC-_"), domain.CodeInvalid, "data.sealed_credentials.nonce"},
			{"nonce 64", schemaEdit(ma, sealed+".nonce", schemaRepeat("A", 64)), "", ""},
			{"nonce 65", schemaEdit(ma, sealed+".nonce", schemaRepeat("A", 65)), domain.CodeTooLong, "data.sealed_credentials.nonce"},
			{"missing ciphertext", schemaEdit(ma, sealed+".ciphertext", schemaDel), domain.CodeRequired, "data.sealed_credentials.ciphertext"},
			{"ciphertext three pads", schemaEdit(ma, sealed+".ciphertext", "AAAA==="), domain.CodeInvalid, "data.sealed_credentials.ciphertext"},
			{"ciphertext 8192", schemaEdit(ma, sealed+".ciphertext", schemaRepeat("A", 8190)+"=="), "", ""},
			{"ciphertext 8193", schemaEdit(ma, sealed+".ciphertext", schemaRepeat("A", 8193)), domain.CodeTooLong, "data.sealed_credentials.ciphertext"},
			{"unknown sealed field", schemaEdit(ma, sealed+".tag", "AA=="), domain.CodeUnknownField, "data.sealed_credentials.tag"},
		},
	)...)

	mr := schemaValidData[domain.TypeMailboxRemoved]
	out[domain.TypeMailboxRemoved] = append(schemaCommonCases(domain.TypeMailboxRemoved, "mailbox_id"),
		schemaSample{"missing reason", schemaEdit(mr, "reason", schemaDel), domain.CodeRequired, "data.reason"},
		schemaSample{"empty reason", schemaEdit(mr, "reason", ""), domain.CodeRequired, "data.reason"},
		schemaSample{"reason 500", schemaEdit(mr, "reason", schemaRepeat("r", 500)), "", ""},
		schemaSample{"reason 500 emoji", schemaEdit(mr, "reason", schemaRepeat("📫", 500)), "", ""},
		schemaSample{"reason 501", schemaEdit(mr, "reason", schemaRepeat("r", 501)), domain.CodeTooLong, "data.reason"},
		schemaSample{"reason as number", schemaEdit(mr, "reason", 7), domain.CodeInvalidType, "data.reason"},
		schemaSample{"reason null", schemaEdit(mr, "reason", nil), domain.CodeInvalidType, "data.reason"},
		schemaSample{"credentials on removal", schemaEdit(mr, "credentials", schemaRawJSON(`{"password":"x"}`)), domain.CodeUnknownField, "data.credentials"},
	)

	hs := schemaValidData[domain.TypeMailboxHealthScored]
	out[domain.TypeMailboxHealthScored] = append(schemaCommonCases(domain.TypeMailboxHealthScored, "mailbox_id"),
		schemaSample{"missing state", schemaEdit(hs, "state", schemaDel), domain.CodeRequired, "data.state"},
		schemaSample{"bad state", schemaEdit(hs, "state", "sick"), domain.CodeInvalid, "data.state"},
		schemaSample{"score absent", schemaEdit(hs, "score", schemaDel), "", ""},
		schemaSample{"score 0", schemaEdit(hs, "score", 0), "", ""},
		schemaSample{"score 100", schemaEdit(hs, "score", 100), "", ""},
		schemaSample{"score tiny", schemaEdit(hs, "score", schemaRawJSON("1e-400")), "", ""},
		schemaSample{"score below 0", schemaEdit(hs, "score", -0.5), domain.CodeOutOfRange, "data.score"},
		schemaSample{"score above 100", schemaEdit(hs, "score", 100.001), domain.CodeOutOfRange, "data.score"},
		schemaSample{"score overflows", schemaEdit(hs, "score", schemaRawJSON("1e400")), domain.CodeInvalidType, "data.score"},
		schemaSample{"score rounds down onto 100", schemaEdit(hs, "score", schemaRawJSON("100.0000000000000000001")), domain.CodeOutOfRange, "data.score"},
		schemaSample{"score rounds up onto 100", schemaEdit(hs, "score", schemaRawJSON("99.99999999999999999999")), "", ""},
		schemaSample{"score rounds up onto 0", schemaEdit(hs, "score", schemaRawJSON("-1e-400")), domain.CodeOutOfRange, "data.score"},
		schemaSample{"score negative zero", schemaEdit(hs, "score", schemaRawJSON("-0.0")), "", ""},
		schemaSample{"score 100 with exponent", schemaEdit(hs, "score", schemaRawJSON("1e2")), "", ""},
		schemaSample{"score as string", schemaEdit(hs, "score", "50"), domain.CodeInvalidType, "data.score"},
		schemaSample{"score null", schemaEdit(hs, "score", nil), domain.CodeInvalidType, "data.score"},
		schemaSample{"missing reason", schemaEdit(hs, "reason", schemaDel), domain.CodeRequired, "data.reason"},
		schemaSample{"reason 501", schemaEdit(hs, "reason", schemaRepeat("r", 501)), domain.CodeTooLong, "data.reason"},
		schemaSample{"until absent", schemaEdit(hs, "until", schemaDel), "", ""},
		schemaSample{"until with offset and fraction", schemaEdit(hs, "until", "2024-07-19T08:47:24.123456789+02:00"), "", ""},
		schemaSample{"until with ten fraction digits", schemaEdit(hs, "until", "2024-07-19T08:47:24.1234567891Z"), "", ""},
		schemaSample{"until leap day", schemaEdit(hs, "until", "2024-02-29T00:00:00Z"), "", ""},
		schemaSample{"until not a leap day", schemaEdit(hs, "until", "2023-02-29T00:00:00Z"), domain.CodeInvalid, "data.until"},
		schemaSample{"until day 32", schemaEdit(hs, "until", "2024-01-32T00:00:00Z"), domain.CodeInvalid, "data.until"},
		schemaSample{"until month 13", schemaEdit(hs, "until", "2024-13-01T00:00:00Z"), domain.CodeInvalid, "data.until"},
		schemaSample{"until leap second", schemaEdit(hs, "until", "2016-12-31T23:59:60Z"), domain.CodeInvalid, "data.until"},
		schemaSample{"until hour 24", schemaEdit(hs, "until", "2024-07-19T24:00:00Z"), domain.CodeInvalid, "data.until"},
		schemaSample{"until offset hour 24", schemaEdit(hs, "until", "2024-07-19T06:47:24+24:00"), domain.CodeInvalid, "data.until"},
		schemaSample{"until one-digit hour", schemaEdit(hs, "until", "2024-07-19T6:47:24Z"), domain.CodeInvalid, "data.until"},
		schemaSample{"until comma fraction", schemaEdit(hs, "until", "2024-07-19T06:47:24,5Z"), domain.CodeInvalid, "data.until"},
		schemaSample{"until lower-case t", schemaEdit(hs, "until", "2024-07-19t06:47:24Z"), domain.CodeInvalid, "data.until"},
		schemaSample{"until with space", schemaEdit(hs, "until", "2024-07-19 06:47:24Z"), domain.CodeInvalid, "data.until"},
		schemaSample{"until without zone", schemaEdit(hs, "until", "2024-07-19T06:47:24"), domain.CodeInvalid, "data.until"},
		schemaSample{"until a date", schemaEdit(hs, "until", "2024-07-19"), domain.CodeInvalid, "data.until"},
		schemaSample{"until in words", schemaEdit(hs, "until", "next week"), domain.CodeInvalid, "data.until"},
		schemaSample{"until as number", schemaEdit(hs, "until", 1721371644), domain.CodeInvalidType, "data.until"},
		schemaSample{"until null", schemaEdit(hs, "until", nil), domain.CodeInvalidType, "data.until"},
		schemaSample{"evidence absent", schemaEdit(hs, "evidence", schemaDel), "", ""},
		schemaSample{"evidence null", schemaEdit(hs, "evidence", nil), domain.CodeInvalidType, "data.evidence"},
		schemaSample{"evidence empty", schemaEdit(hs, "evidence", map[string]any{}), domain.CodeRequired, "data.evidence.window_end"},
		schemaSample{"evidence rate NaN as string", schemaEdit(hs, "evidence.rate", "NaN"), domain.CodeInvalidType, "data.evidence.rate"},
		schemaSample{"evidence rate 1", schemaEdit(hs, "evidence.rate", 1), "", ""},
		schemaSample{"evidence rate above 1", schemaEdit(hs, "evidence.rate", 1.0001), domain.CodeOutOfRange, "data.evidence.rate"},
		schemaSample{"evidence rate negative", schemaEdit(hs, "evidence.rate", -0.0001), domain.CodeOutOfRange, "data.evidence.rate"},
		schemaSample{"evidence rate overflows", schemaEdit(hs, "evidence.rate", schemaRawJSON("1e400")), domain.CodeInvalidType, "data.evidence.rate"},
		schemaSample{"evidence junk negative", schemaEdit(hs, "evidence.junk", -1), domain.CodeOutOfRange, "data.evidence.junk"},
		schemaSample{"evidence junk at max", schemaEdit(hs, "evidence.junk", domain.MaxCount), "", ""},
		schemaSample{"evidence junk over max", schemaEdit(hs, "evidence.junk", domain.MaxCount+1), domain.CodeOutOfRange, "data.evidence.junk"},
		schemaSample{"evidence window under an hour", schemaEdit(hs, "evidence.window_seconds", 3599), domain.CodeOutOfRange, "data.evidence.window_seconds"},
		schemaSample{"evidence window_end zero time", schemaEdit(hs, "evidence.window_end", "0001-01-01T00:00:00Z"), "", ""},
		schemaSample{"evidence window_end in words", schemaEdit(hs, "evidence.window_end", "yesterday"), domain.CodeInvalid, "data.evidence.window_end"},
		schemaSample{"evidence rule unknown", schemaEdit(hs, "evidence.rule", "whim"), domain.CodeInvalid, "data.evidence.rule"},
		schemaSample{"evidence rule with a line break", schemaEdit(hs, "evidence.rule", "level\n"), domain.CodeInvalid, "data.evidence.rule"},
		schemaSample{"evidence threshold absent", schemaEdit(hs, "evidence.threshold", schemaDel), "", ""},
		schemaSample{"evidence threshold rate 0", schemaEdit(hs, "evidence.threshold.rate", 0), domain.CodeOutOfRange, "data.evidence.threshold.rate"},
		schemaSample{"evidence threshold rate tiny", schemaEdit(hs, "evidence.threshold.rate", schemaRawJSON("1e-300")), "", ""},
		schemaSample{"evidence threshold rate below every float", schemaEdit(hs, "evidence.threshold.rate", schemaRawJSON("1e-400")), "", ""},
		schemaSample{"evidence threshold without state", schemaEdit(hs, "evidence.threshold.state", schemaDel), domain.CodeRequired, "data.evidence.threshold.state"},
		schemaSample{"evidence penalty negative", schemaEdit(hs, "evidence.penalty_seconds", -1), domain.CodeOutOfRange, "data.evidence.penalty_seconds"},
		schemaSample{"evidence unknown member", schemaEdit(hs, "evidence.policy_version", 3), domain.CodeUnknownField, "data.evidence.policy_version"},
	)

	cr := schemaValidData[domain.TypeCredentialsRotated]
	out[domain.TypeCredentialsRotated] = append(schemaCommonCases(domain.TypeCredentialsRotated, "mailbox_id"),
		schemaSample{"cause reseal", schemaEdit(cr, "cause", "reseal"), "", ""},
		schemaSample{"missing cause", schemaEdit(cr, "cause", schemaDel), domain.CodeRequired, "data.cause"},
		schemaSample{"bad cause", schemaEdit(cr, "cause", "expired"), domain.CodeInvalid, "data.cause"},
		schemaSample{"cause in upper case", schemaEdit(cr, "cause", "RESEAL"), domain.CodeInvalid, "data.cause"},
		schemaSample{"missing sealed credentials", schemaEdit(cr, sealed, schemaDel), domain.CodeRequired, "data.sealed_credentials"},
		schemaSample{"sealed credentials null", schemaEdit(cr, sealed, nil), domain.CodeInvalidType, "data.sealed_credentials"},
		schemaSample{"plain credentials", schemaEdit(cr, "credentials", creds), domain.CodeUnknownField, "data.credentials"},
		schemaSample{"bad key id", schemaEdit(cr, sealed+".key_id", "k 2"), domain.CodeInvalid, "data.sealed_credentials.key_id"},
		schemaSample{"bad alg", schemaEdit(cr, sealed+".alg", "A128GCM"), domain.CodeInvalid, "data.sealed_credentials.alg"},
		schemaSample{"nonce not base64", schemaEdit(cr, sealed+".nonce", "not base64!"), domain.CodeInvalid, "data.sealed_credentials.nonce"},
		schemaSample{"missing added_at", schemaEdit(cr, "added_at", schemaDel), domain.CodeRequired, "data.added_at"},
		schemaSample{"added_at with offset", schemaEdit(cr, "added_at", "2024-07-12T08:47:24.25+02:00"), "", ""},
		schemaSample{"added_at not a time", schemaEdit(cr, "added_at", "yesterday"), domain.CodeInvalid, "data.added_at"},
	)

	md := schemaValidData[domain.TypeMailboxDisabled]
	out[domain.TypeMailboxDisabled] = append(schemaCommonCases(domain.TypeMailboxDisabled, "mailbox_id"),
		schemaSample{"missing cause", schemaEdit(md, "cause", schemaDel), domain.CodeRequired, "data.cause"},
		schemaSample{"empty cause", schemaEdit(md, "cause", ""), domain.CodeRequired, "data.cause"},
		schemaSample{"cause operator", schemaEdit(schemaEdit(md, "cause", "operator"), "failing_since", schemaDel), "", ""},
		schemaSample{"bad cause", schemaEdit(md, "cause", "expired"), domain.CodeInvalid, "data.cause"},
		schemaSample{"cause in upper case", schemaEdit(md, "cause", "AUTH_FAILING"), domain.CodeInvalid, "data.cause"},
		schemaSample{"cause as number", schemaEdit(md, "cause", 1), domain.CodeInvalidType, "data.cause"},
		schemaSample{"cause null", schemaEdit(md, "cause", nil), domain.CodeInvalidType, "data.cause"},
		schemaSample{"missing reason", schemaEdit(md, "reason", schemaDel), domain.CodeRequired, "data.reason"},
		schemaSample{"empty reason", schemaEdit(md, "reason", ""), domain.CodeRequired, "data.reason"},
		schemaSample{"reason 500", schemaEdit(md, "reason", schemaRepeat("r", 500)), "", ""},
		schemaSample{"reason 500 emoji", schemaEdit(md, "reason", schemaRepeat("🔒", 500)), "", ""},
		schemaSample{"reason 501", schemaEdit(md, "reason", schemaRepeat("r", 501)), domain.CodeTooLong, "data.reason"},
		schemaSample{"reason 501 non-ASCII", schemaEdit(md, "reason", schemaRepeat("é", 501)), domain.CodeTooLong, "data.reason"},
		schemaSample{"reason as number", schemaEdit(md, "reason", 535), domain.CodeInvalidType, "data.reason"},
		schemaSample{"reason null", schemaEdit(md, "reason", nil), domain.CodeInvalidType, "data.reason"},
		schemaSample{"failing since absent", schemaEdit(md, "failing_since", schemaDel), "", ""},
		schemaSample{"failing since with offset and fraction", schemaEdit(md, "failing_since", "2024-07-10T08:47:24.5+02:00"), "", ""},
		schemaSample{"failing since a date", schemaEdit(md, "failing_since", "2024-07-10"), domain.CodeInvalid, "data.failing_since"},
		schemaSample{"failing since without zone", schemaEdit(md, "failing_since", "2024-07-10T06:47:24"), domain.CodeInvalid, "data.failing_since"},
		schemaSample{"failing since hour 24", schemaEdit(md, "failing_since", "2024-07-10T24:00:00Z"), domain.CodeInvalid, "data.failing_since"},
		schemaSample{"failing since lower-case t", schemaEdit(md, "failing_since", "2024-07-10t06:47:24Z"), domain.CodeInvalid, "data.failing_since"},
		schemaSample{"failing since empty", schemaEdit(md, "failing_since", ""), domain.CodeInvalid, "data.failing_since"},
		schemaSample{"failing since as number", schemaEdit(md, "failing_since", 1720594044), domain.CodeInvalidType, "data.failing_since"},
		schemaSample{"failing since null", schemaEdit(md, "failing_since", nil), domain.CodeInvalidType, "data.failing_since"},
		schemaSample{"credentials on disable", schemaEdit(md, "credentials", schemaRawJSON(`{"password":"x"}`)), domain.CodeUnknownField, "data.credentials"},
	)

	wo := schemaValidData[domain.TypeWarmupObserved]
	out[domain.TypeWarmupObserved] = append(schemaCommonCases(domain.TypeWarmupObserved, "mailbox_id"),
		schemaSample{"missing warmup id", schemaEdit(wo, "warmup_id", schemaDel), domain.CodeRequired, "data.warmup_id"},
		schemaSample{"empty warmup id", schemaEdit(wo, "warmup_id", ""), domain.CodeRequired, "data.warmup_id"},
		schemaSample{"warmup id one character", schemaEdit(wo, "warmup_id", "7"), "", ""},
		schemaSample{"warmup id punctuation only", schemaEdit(wo, "warmup_id", "._-"), "", ""},
		schemaSample{"warmup id 128", schemaEdit(wo, "warmup_id", schemaRepeat("w", 128)), "", ""},
		schemaSample{"warmup id 129", schemaEdit(wo, "warmup_id", schemaRepeat("w", 129)), domain.CodeTooLong, "data.warmup_id"},
		schemaSample{"warmup id with slash", schemaEdit(wo, "warmup_id", "wu/1"), domain.CodeInvalid, "data.warmup_id"},
		schemaSample{"warmup id with space", schemaEdit(wo, "warmup_id", "wu 1"), domain.CodeInvalid, "data.warmup_id"},
		schemaSample{"warmup id with @", schemaEdit(wo, "warmup_id", "<wu1@example.com>"), domain.CodeInvalid, "data.warmup_id"},
		schemaSample{"warmup id with newline", schemaEdit(wo, "warmup_id", "wu1\n"), domain.CodeForbiddenCharacter, "data.warmup_id"},
		schemaSample{"warmup id non-ASCII", schemaEdit(wo, "warmup_id", "wü1"), domain.CodeInvalid, "data.warmup_id"},
		schemaSample{"warmup id 128 non-ASCII", schemaEdit(wo, "warmup_id", schemaRepeat("é", 128)), domain.CodeInvalid, "data.warmup_id"},
		schemaSample{"warmup id as number", schemaEdit(wo, "warmup_id", 42), domain.CodeInvalidType, "data.warmup_id"},
		schemaSample{"warmup id null", schemaEdit(wo, "warmup_id", nil), domain.CodeInvalidType, "data.warmup_id"},
		schemaSample{"missing placement", schemaEdit(wo, "placement", schemaDel), domain.CodeRequired, "data.placement"},
		schemaSample{"empty placement", schemaEdit(wo, "placement", ""), domain.CodeRequired, "data.placement"},
		schemaSample{"placement inbox", schemaEdit(wo, "placement", "inbox"), "", ""},
		schemaSample{"bad placement", schemaEdit(wo, "placement", "spam"), domain.CodeInvalid, "data.placement"},
		schemaSample{"placement in upper case", schemaEdit(wo, "placement", "INBOX"), domain.CodeInvalid, "data.placement"},
		schemaSample{"placement as bool", schemaEdit(wo, "placement", true), domain.CodeInvalidType, "data.placement"},
		schemaSample{"missing landed at", schemaEdit(wo, "landed_at", schemaDel), domain.CodeRequired, "data.landed_at"},
		schemaSample{"landed at with offset and fraction", schemaEdit(wo, "landed_at", "2024-07-12T08:40:11.123456789+02:00"), "", ""},
		schemaSample{"landed at leap day", schemaEdit(wo, "landed_at", "2024-02-29T00:00:00Z"), "", ""},
		schemaSample{"landed at not a leap day", schemaEdit(wo, "landed_at", "2023-02-29T00:00:00Z"), domain.CodeInvalid, "data.landed_at"},
		schemaSample{"landed at leap second", schemaEdit(wo, "landed_at", "2016-12-31T23:59:60Z"), domain.CodeInvalid, "data.landed_at"},
		schemaSample{"landed at with space", schemaEdit(wo, "landed_at", "2024-07-12 06:40:11Z"), domain.CodeInvalid, "data.landed_at"},
		schemaSample{"landed at without zone", schemaEdit(wo, "landed_at", "2024-07-12T06:40:11"), domain.CodeInvalid, "data.landed_at"},
		schemaSample{"landed at a date", schemaEdit(wo, "landed_at", "2024-07-12"), domain.CodeInvalid, "data.landed_at"},
		schemaSample{"landed at empty", schemaEdit(wo, "landed_at", ""), domain.CodeInvalid, "data.landed_at"},
		schemaSample{"landed at as number", schemaEdit(wo, "landed_at", 1720766411), domain.CodeInvalidType, "data.landed_at"},
		schemaSample{"landed at null", schemaEdit(wo, "landed_at", nil), domain.CodeInvalidType, "data.landed_at"},
		schemaSample{"missing source", schemaEdit(wo, "source", schemaDel), domain.CodeRequired, "data.source"},
		schemaSample{"source delivery report", schemaEdit(wo, "source", "delivery_report"), "", ""},
		schemaSample{"bad source", schemaEdit(wo, "source", "imap"), domain.CodeInvalid, "data.source"},
		schemaSample{"source as array", schemaEdit(wo, "source", schemaRawJSON(`["imap_sync"]`)), domain.CodeInvalidType, "data.source"},
		schemaSample{"recipient absent", schemaEdit(wo, "recipient_mailbox_id", schemaDel), "", ""},
		schemaSample{"recipient empty", schemaEdit(wo, "recipient_mailbox_id", ""), "", ""},
		schemaSample{"recipient is the sender", schemaEdit(wo, "recipient_mailbox_id", sampleMailboxID), "", ""},
		schemaSample{"upper-case recipient", schemaEdit(wo, "recipient_mailbox_id", strings.ToUpper(sampleRecipientID)), domain.CodeInvalid, "data.recipient_mailbox_id"},
		schemaSample{"short recipient", schemaEdit(wo, "recipient_mailbox_id", sampleRecipientID[:35]), domain.CodeInvalid, "data.recipient_mailbox_id"},
		schemaSample{"long recipient", schemaEdit(wo, "recipient_mailbox_id", sampleRecipientID+"0"), domain.CodeInvalid, "data.recipient_mailbox_id"},
		schemaSample{"braced recipient", schemaEdit(wo, "recipient_mailbox_id", "{"+sampleRecipientID+"}"), domain.CodeInvalid, "data.recipient_mailbox_id"},
		schemaSample{"recipient an address", schemaEdit(wo, "recipient_mailbox_id", "bob@example.com"), domain.CodeInvalid, "data.recipient_mailbox_id"},
		schemaSample{"recipient as number", schemaEdit(wo, "recipient_mailbox_id", 42), domain.CodeInvalidType, "data.recipient_mailbox_id"},
		schemaSample{"recipient null", schemaEdit(wo, "recipient_mailbox_id", nil), domain.CodeInvalidType, "data.recipient_mailbox_id"},
	)

	op := schemaValidData[domain.TypeOrgPlanChanged]
	out[domain.TypeOrgPlanChanged] = append(schemaCommonCases(domain.TypeOrgPlanChanged, "org_id"),
		schemaSample{"missing plan", schemaEdit(op, "plan", schemaDel), domain.CodeRequired, "data.plan"},
		schemaSample{"bad plan", schemaEdit(op, "plan", "enterprise"), domain.CodeInvalid, "data.plan"},
		schemaSample{"plan as number", schemaEdit(op, "plan", 2), domain.CodeInvalidType, "data.plan"},
		schemaSample{"dedicated workers absent", schemaEdit(op, "dedicated_workers", schemaDel), "", ""},
		schemaSample{"dedicated workers 1000", schemaEdit(op, "dedicated_workers", 1000), "", ""},
		schemaSample{"dedicated workers 1001", schemaEdit(op, "dedicated_workers", 1001), domain.CodeOutOfRange, "data.dedicated_workers"},
		schemaSample{"dedicated workers negative", schemaEdit(op, "dedicated_workers", -1), domain.CodeOutOfRange, "data.dedicated_workers"},
		schemaSample{"dedicated workers fraction", schemaEdit(op, "dedicated_workers", 2.5), domain.CodeInvalidType, "data.dedicated_workers"},
		schemaSample{"dedicated workers 2.0", schemaEdit(op, "dedicated_workers", schemaRawJSON("2.0")), "", ""},
		schemaSample{"paid absent", schemaEdit(op, "paid", schemaDel), "", ""},
		schemaSample{"paid as string", schemaEdit(op, "paid", "true"), domain.CodeInvalidType, "data.paid"},
		schemaSample{"paid as number", schemaEdit(op, "paid", 1), domain.CodeInvalidType, "data.paid"},
		schemaSample{"missing source", schemaEdit(op, "source", schemaDel), domain.CodeRequired, "data.source"},
		schemaSample{"source 200", schemaEdit(op, "source", schemaRepeat("s", 200)), "", ""},
		schemaSample{"source 201", schemaEdit(op, "source", schemaRepeat("s", 201)), domain.CodeTooLong, "data.source"},
	)

	for typ, idField := range map[string]string{domain.TypeMailboxOwnerTransferred: "mailbox_id", domain.TypeOrgOwnerTransferred: "org_id"} {
		ot := schemaValidData[typ]
		out[typ] = append(schemaCommonCases(typ, idField),
			schemaSample{"missing owner", schemaEdit(ot, "owner", schemaDel), domain.CodeRequired, "data.owner"},
			schemaSample{"empty owner", schemaEdit(ot, "owner", ""), domain.CodeRequired, "data.owner"},
			schemaSample{"owner a urn prefix", schemaEdit(ot, "owner", "urn:acme:product"), "", ""},
			schemaSample{"owner with a space", schemaEdit(ot, "owner", "/product api"), domain.CodeInvalid, "data.owner"},
			schemaSample{"owner with a colon in its first segment", schemaEdit(ot, "owner", "1a:b"), domain.CodeInvalid, "data.owner"},
			schemaSample{"owner 256", schemaEdit(ot, "owner", "/"+schemaRepeat("a", 255)), "", ""},
			schemaSample{"owner 257", schemaEdit(ot, "owner", "/"+schemaRepeat("a", 256)), domain.CodeTooLong, "data.owner"},
			schemaSample{"owner with a bidi override", schemaEdit(ot, "owner", "/a\u202eb"), domain.CodeForbiddenCharacter, "data.owner"},
			schemaSample{"owner as number", schemaEdit(ot, "owner", 7), domain.CodeInvalidType, "data.owner"},
			schemaSample{"missing comment", schemaEdit(ot, "comment", schemaDel), domain.CodeRequired, "data.comment"},
			schemaSample{"comment 500", schemaEdit(ot, "comment", schemaRepeat("c", 500)), "", ""},
			schemaSample{"comment 501", schemaEdit(ot, "comment", schemaRepeat("c", 501)), domain.CodeTooLong, "data.comment"},
		)
	}

	ua := schemaValidData[domain.TypeUserActive]
	out[domain.TypeUserActive] = append(schemaCommonCases(domain.TypeUserActive, "user_id"),
		schemaSample{"missing source", schemaEdit(ua, "source", schemaDel), domain.CodeRequired, "data.source"},
		schemaSample{"empty source", schemaEdit(ua, "source", ""), domain.CodeRequired, "data.source"},
		schemaSample{"bad source", schemaEdit(ua, "source", "logout"), domain.CodeInvalid, "data.source"},
		schemaSample{"source in upper case", schemaEdit(ua, "source", "LOGIN"), domain.CodeInvalid, "data.source"},
		schemaSample{"source as array", schemaEdit(ua, "source", schemaRawJSON(`["login"]`)), domain.CodeInvalidType, "data.source"},
	)

	hb := schemaValidData[domain.TypeWorkerHeartbeat]
	out[domain.TypeWorkerHeartbeat] = append(schemaCommonCases(domain.TypeWorkerHeartbeat, "worker_id"),
		schemaSample{"tier absent", schemaEdit(hb, "tier", schemaDel), "", ""},
		schemaSample{"tier empty", schemaEdit(hb, "tier", ""), "", ""},
		schemaSample{"tier shared premium", schemaEdit(hb, "tier", "shared_premium"), "", ""},
		schemaSample{"tier dedicated", schemaEdit(hb, "tier", "dedicated"), domain.CodeTierNotAllowed, "data.tier"},
		schemaSample{"bad tier", schemaEdit(hb, "tier", "premium"), domain.CodeInvalid, "data.tier"},
		schemaSample{"tier in upper case", schemaEdit(hb, "tier", "SHARED_FREE"), domain.CodeInvalid, "data.tier"},
		schemaSample{"tier null", schemaEdit(hb, "tier", nil), domain.CodeInvalidType, "data.tier"},
		schemaSample{"missing egress", schemaEdit(hb, "egress", schemaDel), domain.CodeRequired, "data.egress"},
		schemaSample{"bad egress", schemaEdit(hb, "egress", "smtp"), domain.CodeInvalid, "data.egress"},
		schemaSample{"missing address", schemaEdit(hb, "address", schemaDel), domain.CodeRequired, "data.address"},
		schemaSample{"address 255", schemaEdit(hb, "address", schemaRepeat("a", 255)), "", ""},
		schemaSample{"address 256", schemaEdit(hb, "address", schemaRepeat("a", 256)), domain.CodeTooLong, "data.address"},
		schemaSample{"stopping absent", schemaEdit(hb, "stopping", schemaDel), "", ""},
		schemaSample{"stopping true", schemaEdit(hb, "stopping", true), "", ""},
		schemaSample{"stopping as string", schemaEdit(hb, "stopping", "false"), domain.CodeInvalidType, "data.stopping"},
	)

	ws := schemaValidData[domain.TypeWorkerHealthSampled]
	const maxCount = 1 << 40
	out[domain.TypeWorkerHealthSampled] = append(schemaCommonCases(domain.TypeWorkerHealthSampled, "worker_id"),
		schemaSample{"missing window", schemaEdit(ws, "window_seconds", schemaDel), domain.CodeOutOfRange, "data.window_seconds"},
		schemaSample{"window 0", schemaEdit(ws, "window_seconds", 0), domain.CodeOutOfRange, "data.window_seconds"},
		schemaSample{"window 1", schemaEdit(ws, "window_seconds", 1), "", ""},
		schemaSample{"window 30 days", schemaEdit(ws, "window_seconds", 2592000), "", ""},
		schemaSample{"window over 30 days", schemaEdit(ws, "window_seconds", 2592001), domain.CodeOutOfRange, "data.window_seconds"},
		schemaSample{"window as string", schemaEdit(ws, "window_seconds", "3600"), domain.CodeInvalidType, "data.window_seconds"},
		schemaSample{"counters absent", schemaEdit(schemaEdit(schemaEdit(ws, "sends", schemaDel), "hard_bounces", schemaDel), "complaints", schemaDel), "", ""},
		schemaSample{"sends at max", schemaEdit(ws, "sends", maxCount), "", ""},
		schemaSample{"sends over max", schemaEdit(ws, "sends", maxCount+1), domain.CodeOutOfRange, "data.sends"},
		schemaSample{"sends overflow int64", schemaEdit(ws, "sends", schemaRawJSON("99999999999999999999")), domain.CodeInvalidType, "data.sends"},
		schemaSample{"sends 1.2e3", schemaEdit(ws, "sends", schemaRawJSON("1.2e3")), "", ""},
		schemaSample{"sends 9.9e18", schemaEdit(ws, "sends", schemaRawJSON("9.9e18")), domain.CodeInvalidType, "data.sends"},
		schemaSample{"sends 9e18", schemaEdit(ws, "sends", schemaRawJSON("9e18")), domain.CodeOutOfRange, "data.sends"},
		schemaSample{"hard bounces negative", schemaEdit(ws, "hard_bounces", -1), domain.CodeOutOfRange, "data.hard_bounces"},
		schemaSample{"hard bounces -0.0", schemaEdit(ws, "hard_bounces", schemaRawJSON("-0.0")), "", ""},
		schemaSample{"complaints fraction", schemaEdit(ws, "complaints", 1.5), domain.CodeInvalidType, "data.complaints"},
		schemaSample{"complaints as bool", schemaEdit(ws, "complaints", true), domain.CodeInvalidType, "data.complaints"},
	)
	return out
}

// schemaGoProblems is what ingest reports: strict decoding, then validation.
func schemaGoProblems(typ string, data []byte) domain.Problems {
	d, ps := domain.DecodeData(typ, data, true)
	if len(ps) > 0 {
		return ps
	}
	return d.Validate().Prefixed("data")
}

func checkSchemaAgreement(t *testing.T, v *eventschema.Validator, typ string, s schemaSample) {
	t.Helper()
	gps := schemaGoProblems(typ, []byte(s.data))
	sps := v.Validate(typ, []byte(s.data))
	if (len(gps) == 0) != (len(sps) == 0) {
		t.Errorf("%s: Go and schema disagree on %s\n  data:   %.300s\n  go:     %s\n  schema: %s", typ, s.name, s.data, problemsOrAccepted(gps), problemsOrAccepted(sps))
	}
	for _, p := range sps {
		if p.Code != domain.CodeSchema && p.Code != domain.CodeMalformedJSON && p.Code != domain.CodeRequired {
			t.Errorf("%s: %s: schema problem with code %s: %s", typ, s.name, p.Code, p)
		}
	}
}

func problemsOrAccepted(ps domain.Problems) string {
	if len(ps) == 0 {
		return "accepted"
	}
	return ps.String()
}

func TestSchemaAgreementHandSamples(t *testing.T) {
	t.Parallel()
	v := eventschema.Default()
	samples := schemaHandSamples()
	for _, typ := range domain.EventTypes() {
		bad := 0
		for _, s := range samples[typ] {
			checkSchemaAgreement(t, v, typ, s)
			gps := schemaGoProblems(typ, []byte(s.data))
			if s.code == "" {
				continue
			}
			bad++
			if !schemaHasProblem(gps, s.code, s.field) {
				t.Errorf("%s: %s: Go must report %s at %q, got %s", typ, s.name, s.code, s.field, problemsOrAccepted(gps))
			}
			if sps := v.Validate(typ, []byte(s.data)); len(sps) > 0 && s.field != "" && !schemaNearField(sps, s.field) {
				t.Errorf("%s: %s: schema problems %s are not at or around %q", typ, s.name, sps, s.field)
			}
		}
		if bad < 8 {
			t.Errorf("%s has %d bad samples, want at least 8", typ, bad)
		}
	}
}

func schemaHasProblem(ps domain.Problems, code domain.Code, field string) bool {
	for _, p := range ps {
		if p.Code == code && (field == "" || p.Field == field) {
			return true
		}
	}
	return false
}

// schemaNearField reports whether a problem is at field, a parent or a child.
func schemaNearField(ps domain.Problems, field string) bool {
	for _, p := range ps {
		if p.Field == field || strings.HasPrefix(field, p.Field+".") || strings.HasPrefix(p.Field, field+".") {
			return true
		}
	}
	return false
}

// schemaShape is the part of a JSON Schema the schemaGenerated samples use.
type schemaShape struct {
	Type                 string                  `json:"type"`
	Enum                 []string                `json:"enum"`
	Required             []string                `json:"required"`
	Properties           map[string]*schemaShape `json:"properties"`
	MaxLength            *int                    `json:"maxLength"`
	Pattern              string                  `json:"pattern"`
	Minimum              *json.Number            `json:"minimum"`
	Maximum              *json.Number            `json:"maximum"`
	AdditionalProperties *bool                   `json:"additionalProperties"`
}

func loadSchemaShape(t testing.TB, typ string) *schemaShape {
	t.Helper()
	b, ok := domain.Schema(typ)
	if !ok {
		t.Fatalf("no schema for %s", typ)
	}
	var n schemaShape
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if err := dec.Decode(&n); err != nil {
		t.Fatalf("%s: %v", typ, err)
	}
	return &n
}

// schemaGenerated derives samples from a schema: for every property (nested ones
// too) it is left out, set to null and to every JSON type, set to each of
// its enum values, and to each bound and the value just past it.
func schemaGenerated(typ string, root *schemaShape) []schemaSample {
	base := schemaValidData[typ]
	var out []schemaSample
	var walk func(prefix string, n *schemaShape)
	walk = func(prefix string, n *schemaShape) {
		names := make([]string, 0, len(n.Properties))
		for name := range n.Properties {
			names = append(names, name)
		}
		slices.Sort(names)
		for _, name := range names {
			p := n.Properties[name]
			path := prefix + name
			out = append(out,
				schemaSample{name: "without " + path, data: schemaEdit(base, path, schemaDel)},
				schemaSample{name: path + " null", data: schemaEdit(base, path, nil)},
				schemaSample{name: path + " string", data: schemaEdit(base, path, "x")},
				schemaSample{name: path + " empty string", data: schemaEdit(base, path, "")},
				schemaSample{name: path + " integer", data: schemaEdit(base, path, 7)},
				schemaSample{name: path + " fraction", data: schemaEdit(base, path, 7.5)},
				schemaSample{name: path + " boolean", data: schemaEdit(base, path, true)},
				schemaSample{name: path + " object", data: schemaEdit(base, path, map[string]any{})},
				schemaSample{name: path + " array", data: schemaEdit(base, path, []any{})},
			)
			for _, e := range p.Enum {
				out = append(out, schemaSample{name: fmt.Sprintf("%s = %q", path, e), data: schemaEdit(base, path, e)})
				out = append(out, schemaSample{name: fmt.Sprintf("%s = %q upper", path, e), data: schemaEdit(base, path, strings.ToUpper(e))})
			}
			for _, b := range []*json.Number{p.Minimum, p.Maximum} {
				if b == nil {
					continue
				}
				n, _ := b.Int64()
				for _, x := range []int64{n - 1, n, n + 1} {
					out = append(out, schemaSample{name: fmt.Sprintf("%s = %d", path, x), data: schemaEdit(base, path, x)})
				}
				if p.Type == "number" {
					for _, f := range []float64{float64(n) - 0.001, float64(n) + 0.001} {
						out = append(out, schemaSample{name: fmt.Sprintf("%s = %g", path, f), data: schemaEdit(base, path, f)})
					}
				}
			}
			if p.Type == "string" {
				for _, c := range hostileRunes {
					for _, v := range hostileVariants(schemaValueAt(base, path), c) {
						out = append(out, schemaSample{name: fmt.Sprintf("%s = %+q", path, v), data: schemaEdit(base, path, v)})
					}
				}
			}
			if p.MaxLength != nil && (p.Pattern == "" || p.Pattern == domain.TextPattern) {
				for _, l := range []int{*p.MaxLength, *p.MaxLength + 1} {
					for _, c := range []string{"x", "é", "😀"} {
						out = append(out, schemaSample{name: fmt.Sprintf("%s %d×%s", path, l, c), data: schemaEdit(base, path, schemaRepeat(c, l))})
					}
				}
			}
			if p.Type == "object" {
				out = append(out, schemaSample{name: path + " extra", data: schemaEdit(base, path+".extra", 1)})
				walk(path+".", p)
			}
		}
	}
	walk("", root)
	out = append(out, schemaSample{name: "extra top-level", data: schemaEdit(base, "extra", 1)})
	return out
}

func TestSchemaAgreementGenerated(t *testing.T) {
	t.Parallel()
	v := eventschema.Default()
	for _, typ := range domain.EventTypes() {
		for _, s := range schemaGenerated(typ, loadSchemaShape(t, typ)) {
			checkSchemaAgreement(t, v, typ, s)
		}
	}
}

// TestSchemaMirrorsGoRules checks structural facts of every schema: the
// required list is exactly what Go refuses to go without, every object is
// closed, and plain credentials are not part of any log form.
func TestSchemaMirrorsGoRules(t *testing.T) {
	t.Parallel()
	for _, typ := range domain.EventTypes() {
		root := loadSchemaShape(t, typ)
		var walk func(prefix string, n *schemaShape)
		walk = func(prefix string, n *schemaShape) {
			if n.AdditionalProperties == nil || *n.AdditionalProperties {
				t.Errorf("%s: object %q must set additionalProperties: false", typ, prefix)
			}
			for name, p := range n.Properties {
				path := prefix + name
				if name == "credentials" {
					t.Errorf("%s: %s: plain credentials must not be in the log form", typ, path)
				}
				_, goRejects := goRejectsWithout(typ, path)
				if slices.Contains(n.Required, name) != goRejects {
					t.Errorf("%s: %s: required in schema = %v, Go refuses its absence = %v", typ, path, slices.Contains(n.Required, name), goRejects)
				}
				if p.Type == "object" {
					walk(path+".", p)
				}
			}
		}
		walk("", root)
	}
}

func goRejectsWithout(typ, path string) (domain.Problems, bool) {
	ps := schemaGoProblems(typ, []byte(schemaEdit(schemaValidData[typ], path, schemaDel)))
	return ps, len(ps) > 0
}

// TestSchemaKnownDifferences pins the documented differences between Go and
// the schemas, so that closing one (or a new one) updates the docs too.
func TestSchemaKnownDifferences(t *testing.T) {
	t.Parallel()
	v := eventschema.Default()
	wo := schemaValidData[domain.TypeWarmupObserved]
	for _, zero := range []string{"0001-01-01T00:00:00Z", "0001-01-01T00:00:00.000+00:00", "0001-01-01T02:00:00+02:00"} {
		data := []byte(schemaEdit(wo, "landed_at", zero))
		gps, sps := schemaGoProblems(domain.TypeWarmupObserved, data), v.Validate(domain.TypeWarmupObserved, data)
		if !schemaHasProblem(gps, domain.CodeRequired, "data.landed_at") || len(sps) > 0 {
			t.Errorf("landed_at %s: Go %s, schema %s; want Go to refuse it as missing and the schema to accept it (or update domain/schemas/README.md)",
				zero, problemsOrAccepted(gps), problemsOrAccepted(sps))
		}
		if !schemaKnownGoStricter(domain.TypeWarmupObserved, data, gps, sps) {
			t.Errorf("landed_at %s: not recognised as the known difference", zero)
		}
	}
	// A time that is not the zero time is no exception.
	data := []byte(schemaEdit(wo, "landed_at", "0001-01-01T00:00:01Z"))
	if gps := schemaGoProblems(domain.TypeWarmupObserved, data); len(gps) > 0 {
		t.Errorf("landed_at one second after the zero time: %s", gps)
	}
}

// TestSchemaValidDataIsValid guards the table's base: a bad base would make
// every "bad" sample pass for the wrong reason.
func TestSchemaValidDataIsValid(t *testing.T) {
	t.Parallel()
	v := eventschema.Default()
	for _, typ := range domain.EventTypes() {
		d := schemaValidData[typ]
		if ps := schemaGoProblems(typ, []byte(d)); len(ps) > 0 {
			t.Errorf("%s: Go refuses the valid data: %s", typ, ps)
		}
		if ps := v.Validate(typ, []byte(d)); len(ps) > 0 {
			t.Errorf("%s: schema refuses the valid data: %s", typ, ps)
		}
	}
	names, err := fs.Glob(domain.SchemaFiles(), "*.json")
	if err != nil {
		t.Fatal(err)
	}
	if len(names) != len(schemaValidData) {
		t.Errorf("%d schemas, %d types with agreement samples", len(names), len(schemaValidData))
	}
}
