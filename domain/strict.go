package domain

import (
	"bytes"
	"encoding/json"
	"math"
	"math/big"
	"reflect"
	"strconv"
	"strings"
	"time"
)

// strictShape enforces, for strict (ingest) decoding of event data, the
// parts of the JSON Schema contract (domain/schemas) that encoding/json
// alone does not:
//
//   - field names match exactly: encoding/json also takes "Mailbox_ID" for
//     "mailbox_id", the schemas' additionalProperties do not (unknown_field);
//   - a field appears once: encoding/json merges or overwrites repeated
//     fields (malformed_json);
//   - no value is null: encoding/json silently skips nulls, so an explicit
//     null would pass for "absent" (invalid_type);
//   - timestamps are strings in strict RFC 3339: time.Time also parses a
//     one-digit hour or a comma before the fraction (invalid, invalid_type),
//     and its own errors would be reported as malformed JSON;
//   - an integral number written with a fraction or an exponent (1143.0,
//     1.2e3) is an integer, as JSON Schema's "integer" says: such numbers are
//     rewritten as plain integers for integer fields;
//   - bounds are compared exactly, as JSON Schema does: a number that would
//     round onto an integer it is not (100.0000000000000000001, -1e-400) is
//     rewritten as the nearest float on its side of that integer, so it is
//     not taken for 100 or 0 by range checks with integer bounds.
//
// It returns the data to decode (raw, or raw rewritten) and the problems
// found, field paths under "data". Data that is not well-formed JSON is
// returned as is, for the decoder proper to report.
func strictShape(raw []byte, t reflect.Type) ([]byte, Problems) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	v, err := readJSON(dec)
	if err != nil {
		return raw, nil
	}
	if _, err := dec.Token(); err == nil {
		return raw, nil // trailing data: the decoder proper reports it
	}
	var ps Problems
	if v == nil {
		ps.Add("data", CodeInvalidType, "must be an object, not null")
		return nil, ps
	}
	changed := shapeValue(&ps, "data", v, t)
	if len(ps) > 0 {
		return nil, ps
	}
	if !changed {
		return raw, nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return raw, nil
	}
	return b, nil
}

// jsonObject is a JSON object with its members in order, repeats kept.
type jsonObject []jsonMember

type jsonMember struct {
	Key   string
	Value any
}

// MarshalJSON writes the members in order.
func (o jsonObject) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, m := range o {
		if i > 0 {
			b.WriteByte(',')
		}
		k, err := json.Marshal(m.Key)
		if err != nil {
			return nil, err
		}
		b.Write(k)
		b.WriteByte(':')
		v, err := json.Marshal(m.Value)
		if err != nil {
			return nil, err
		}
		b.Write(v)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// readJSON reads one value: jsonObject, []any, string, json.Number, bool or
// nil. The decoder bounds nesting depth.
func readJSON(dec *json.Decoder) (any, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	d, ok := tok.(json.Delim)
	if !ok {
		return tok, nil
	}
	switch d {
	case '{':
		obj := jsonObject{}
		for dec.More() {
			kt, err := dec.Token()
			if err != nil {
				return nil, err
			}
			k, _ := kt.(string)
			v, err := readJSON(dec)
			if err != nil {
				return nil, err
			}
			obj = append(obj, jsonMember{k, v})
		}
		if _, err := dec.Token(); err != nil {
			return nil, err
		}
		return obj, nil
	case '[':
		arr := []any{}
		for dec.More() {
			v, err := readJSON(dec)
			if err != nil {
				return nil, err
			}
			arr = append(arr, v)
		}
		if _, err := dec.Token(); err != nil {
			return nil, err
		}
		return arr, nil
	}
	return nil, &json.SyntaxError{}
}

var timeType = reflect.TypeFor[time.Time]()

// shapeValue checks v against the Go type t it decodes into and reports
// whether it rewrote a number. Type mismatches are left to the decoder.
func shapeValue(ps *Problems, path string, v any, t reflect.Type) bool {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case t == timeType:
		s, ok := v.(string)
		if !ok {
			ps.Add(path, CodeInvalidType, "must be a string (an RFC 3339 timestamp)")
			return false
		}
		if _, err := time.Parse(time.RFC3339Nano, s); err != nil || !rfc3339Pattern.MatchString(s) {
			ps.Add(path, CodeInvalid, "must be an RFC 3339 timestamp such as 2024-07-15T09:30:00Z")
		}
		return false
	case t.Kind() == reflect.Struct:
		obj, ok := v.(jsonObject)
		if !ok {
			return false
		}
		changed := false
		seen := make(map[string]bool, len(obj))
		for i, m := range obj {
			fpath := path + "." + m.Key
			if seen[m.Key] {
				ps.Add(fpath, CodeMalformedJSON, "field appears more than once")
				continue
			}
			seen[m.Key] = true
			ft, ok := fieldType(t, m.Key)
			if !ok {
				ps.Add(fpath, CodeUnknownField, "unknown field")
				continue
			}
			if m.Value == nil {
				ps.Add(fpath, CodeInvalidType, "must not be null (leave the field out instead)")
				continue
			}
			if n, ok := m.Value.(json.Number); ok && isIntKind(ft) {
				if s, ok := integralLiteral(string(n)); ok && s != string(n) {
					obj[i].Value = json.Number(s)
					changed = true
				}
				continue
			}
			if n, ok := m.Value.(json.Number); ok && isFloatKind(ft) {
				if s, ok := unroundedFloat(string(n), ft.Bits()); ok {
					obj[i].Value = json.Number(s)
					changed = true
				}
				continue
			}
			if shapeValue(ps, fpath, m.Value, ft) {
				changed = true
			}
		}
		return changed
	}
	return false
}

// fieldType returns the type of t's field whose JSON name is exactly name.
func fieldType(t reflect.Type, name string) (reflect.Type, bool) {
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		tag, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if tag == "-" {
			continue
		}
		if tag == "" {
			tag = f.Name
		}
		if tag == name {
			return f.Type, true
		}
	}
	return nil, false
}

func isFloatKind(t reflect.Type) bool {
	return t.Kind() == reflect.Float32 || t.Kind() == reflect.Float64
}

// unroundedFloat returns a replacement literal for a number whose nearest
// float is an integer the number is not: the next float towards the
// number's true value. Other numbers need no replacement.
func unroundedFloat(lit string, bits int) (string, bool) {
	f, err := strconv.ParseFloat(lit, bits)
	if err != nil || f != math.Trunc(f) || math.Abs(f) > 1<<53 {
		// The decoder reports overflow; non-integers compare fine with
		// integer bounds, and no bound is beyond 2^53.
		return "", false
	}
	var sign int
	if f == 0 {
		// Zero, or an underflow: the true value's sign is the mantissa's.
		mant, _, _ := strings.Cut(strings.ToLower(lit), "e")
		if strings.Trim(mant, "-0.") == "" {
			return "", false
		}
		sign = 1
		if strings.HasPrefix(mant, "-") {
			sign = -1
		}
	} else {
		r, ok := new(big.Rat).SetString(lit) // bounds the exponent itself
		if !ok {
			return "", false
		}
		sign = r.Cmp(new(big.Rat).SetFloat64(f))
	}
	if sign == 0 {
		return "", false
	}
	next := math.Nextafter(f, math.Inf(sign))
	if bits == 32 {
		next = float64(math.Nextafter32(float32(f), float32(math.Inf(sign))))
	}
	return strconv.FormatFloat(next, 'g', -1, bits), true
}

func isIntKind(t reflect.Type) bool {
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return true
	}
	return false
}

// integralLiteral returns a JSON number literal's value as a plain integer
// literal when the value is an integer of at most 19 digits.
func integralLiteral(s string) (string, bool) {
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	mant, exps, hasExp := strings.Cut(strings.ToLower(s), "e")
	intPart, frac, _ := strings.Cut(mant, ".")
	all := intPart + frac
	if !hasDigitsOnly(all) {
		return "", false
	}
	digits := strings.TrimLeft(all, "0")
	if digits == "" {
		return "0", true // zero, whatever the exponent
	}
	exp := 0
	if hasExp {
		sign := 1
		switch {
		case strings.HasPrefix(exps, "+"):
			exps = exps[1:]
		case strings.HasPrefix(exps, "-"):
			exps, sign = exps[1:], -1
		}
		exps = strings.TrimLeft(exps, "0")
		if len(exps) > 4 || !hasDigitsOnly(exps) {
			return "", false // far outside any integer field's range, or a fraction
		}
		for _, c := range exps {
			exp = exp*10 + int(c-'0')
		}
		exp *= sign
	}
	// The value is 0.digits × 10^point.
	point := len(intPart) - (len(all) - len(digits)) + exp
	if point < len(strings.TrimRight(digits, "0")) || point > 19 {
		return "", false
	}
	out := digits[:min(point, len(digits))] + strings.Repeat("0", max(point-len(digits), 0))
	if neg {
		out = "-" + out
	}
	return out, true
}

func hasDigitsOnly(s string) bool {
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}
