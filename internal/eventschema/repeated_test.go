package eventschema

import (
	"reflect"

	"bytes"
	"encoding/json"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/mailplane/mailplane/domain"
)

var repeatedSamples = []string{
	`{"a":1,"b":2}`,
	`{"a":1,"a":2}`,
	`{"a":{"b":1,"b":2}}`,
	`{"a":[{"b":1},{"c":1,"c":2}]}`,
	`{"a":"x","b":{"a":"y"}}`,
	`{"a":1,"\u0061":2}`,
	`{"\u0061":1,"a":2}`,
	"{\"\xff\":1,\"\xfe\":2}",
	`{"a":"\"}","a":2}`,
	`{"k0":0,"k1":1,"k2":2,"k3":3,"k4":4,"k5":5,"k6":6,"k7":7,"k8":8,"k9":9,"k10":10,"k11":11,"k12":12,"k13":13,"k14":14,"k15":15,"k16":16,"k17":17,"k3":3}`,
	`[{"a":1},{"a":1,"a":1}]`,
	`{}`, `[]`, `{"a":[]}`, `{"a":{}}`, ` { "a" : [ 1 , true , null , "s" ] , "b" : -1.5e3 } `,
	`{"a":1} x`, `{"a" 1}`, `{"a":1,}`, `[1,]`, `{"a":`,
}

// checkRepeatedAgrees fails if the byte scan reads data otherwise than
// the token walk it stands in for.
func checkRepeatedAgrees(t *testing.T, data []byte) bool {
	t.Helper()
	path, found, ok := repeatedNamePlain(data)
	if !ok {
		return false
	}
	if !json.Valid(data) {
		return false // Validate parses data first; the scan may give up or not
	}
	wp, wf, _ := scanRepeated(json.NewDecoder(bytes.NewReader(data)), "data")
	if found != wf || (found && path != wp) {
		t.Fatalf("%q: scan %q %v, token walk %q %v", data, path, found, wp, wf)
	}
	return true
}

func TestRepeatedNameAgrees(t *testing.T) {
	t.Parallel()
	plain := 0
	for _, s := range repeatedSamples {
		if checkRepeatedAgrees(t, []byte(s)) {
			plain++
		}
	}
	if plain < 10 {
		t.Errorf("only %d samples took the byte scan", plain)
	}
	// Escaped or invalid names go to the token walk, which decodes them.
	for _, s := range []string{`{"a":1,"\u0061":2}`, "{\"\xff\":1,\"\xfe\":2}"} {
		if _, _, ok := repeatedNamePlain([]byte(s)); ok {
			t.Errorf("%q took the byte scan", s)
		}
		if p, found := repeatedName([]byte(s)); !found || p != "data.a" && p != "data.\ufffd" {
			t.Errorf("%q: %q %v", s, p, found)
		}
	}
	// And Validate still refuses a repeated name, where it is.
	ps := Default().Validate(domain.TypeUserActive, []byte(`{"user_id":"0190a5b2-0000-7000-8000-000000000001","source":"login","source":"login"}`))
	if len(ps) != 1 || ps[0].Field != "data.source" || ps[0].Code != domain.CodeMalformedJSON {
		t.Errorf("a repeated name: %v", ps)
	}
}

func FuzzRepeatedName(f *testing.F) {
	for _, s := range repeatedSamples {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkRepeatedAgrees(t, data)
	})
}

// checkPlainDocAgrees fails if plainDoc takes data that the parser it
// stands in for refuses or reads differently.
func checkPlainDocAgrees(t *testing.T, data []byte) bool {
	t.Helper()
	doc, ok := plainDoc(data)
	if !ok {
		return false
	}
	want, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("%q: plainDoc took what the parser refuses: %v", data, err)
	}
	if !reflect.DeepEqual(doc, want) {
		t.Fatalf("%q: plainDoc %#v, the parser %#v", data, doc, want)
	}
	if _, found := repeatedName(data); found {
		t.Fatalf("%q: plainDoc took a repeated name", data)
	}
	return true
}

func TestPlainDocAgrees(t *testing.T) {
	t.Parallel()
	samples := append([]string{
		`{"n":-0.5e+3,"z":0,"big":123456789012345678901234567890,"s":"ünï","t":true,"f":false,"x":null,"a":[],"o":{}}`,
		`{"n":01}`, `{"n":1.}`, `{"n":.5}`, `{"n":-}`, `{"n":1e}`, `{"n":tru}`, `{"n":nul}`,
		`{"s":"a\nb"}`, "{\"s\":\"a\tb\"}", `{"s":"\u00e9"}`, "{\"s\":\"\xff\"}",
	}, repeatedSamples...)
	plain := 0
	for _, s := range samples {
		if checkPlainDocAgrees(t, []byte(s)) {
			plain++
		}
	}
	if plain < 8 {
		t.Errorf("only %d samples took plainDoc", plain)
	}
	// What ingest validates (encoding/json's output of a Go value) takes it.
	b, err := json.Marshal(map[string]any{"user_id": "0190a5b2-0000-7000-8000-000000000001", "source": "login", "n": 1.5})
	if err != nil {
		t.Fatal(err)
	}
	if !checkPlainDocAgrees(t, b) {
		t.Errorf("%s missed plainDoc", b)
	}
}

func FuzzPlainDoc(f *testing.F) {
	for _, s := range repeatedSamples {
		f.Add([]byte(s))
	}
	f.Add([]byte(`{"n":-0.5e+3,"s":"ü","a":[1,{"b":null}],"t":true}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		checkPlainDocAgrees(t, data)
	})
}
