package api

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/mailplanetest"
)

// hostileText are characters no text field or attribute may hold.
var hostileText = []string{"\x00", "\r", "\n", "\r\nforged: line", "\t", "\x1b[31m", "\x7f", "\u0085", "\u2028", "\u2029", "\u202e", "\u2066"}

// dataStringPaths lists the dotted paths of every string in ev's data.
func dataStringPaths(m map[string]any, prefix string) []string {
	var out []string
	for k, v := range m {
		switch v := v.(type) {
		case string:
			out = append(out, prefix+k)
		case map[string]any:
			out = append(out, dataStringPaths(v, prefix+k+".")...)
		}
	}
	slices.Sort(out)
	return out
}

func valueAt(ev map[string]any, path string) string {
	parts := strings.Split(path, ".")
	m := ev
	for _, p := range parts[:len(parts)-1] {
		m = m[p].(map[string]any)
	}
	return m[parts[len(parts)-1]].(string)
}

// TestIngestRefusesHostileTextEverywhere: every string of every event type
// (data fields, the plain credentials included, and the source attribute),
// with each hostile character, is refused over HTTP with a problem at that
// field, and nothing reaches the log. One batch per type, each event
// carrying one hostile string: the batch is refused as a whole and every
// index is reported.
func TestIngestRefusesHostileTextEverywhere(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	total := 0
	for _, base := range allTypes() {
		typ := base["type"].(string)
		var batch []map[string]any
		var fields []string
		dataPaths := dataStringPaths(base["data"].(map[string]any), "data.")
		for _, sp := range schemaStringPaths(t, typ) {
			// The API takes plain credentials where the log has sealed ones.
			if !strings.HasPrefix(sp, "data.sealed_credentials.") && !slices.Contains(dataPaths, sp) {
				t.Errorf("%s: the sample lacks the schema's string field %s, so it is not tested", typ, sp)
			}
		}
		for _, path := range append([]string{"source"}, dataStringPaths(base["data"].(map[string]any), "data.")...) {
			for _, h := range hostileText {
				v := valueAt(base, path)
				ev := with(base, path, v[:len(v)/2]+h+v[len(v)/2:])
				ev["id"] = newID()
				batch = append(batch, ev)
				fields = append(fields, path)
			}
		}
		total += len(batch)
		resp, b := e.postBatch(batch...)
		if resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("%s: status %d, want 400: %.300s", typ, resp.StatusCode, b)
		}
		er := decodeErr(t, b)
		for i, f := range fields {
			if !slices.ContainsFunc(er.Problems, func(p Problem) bool {
				return p.Index == i && (p.Field == f || strings.HasPrefix(p.Field, f+".") || strings.HasPrefix(f, p.Field+"."))
			}) {
				t.Errorf("%s: event %d (hostile %s): no problem at %s in %v", typ, i, f, f, er.Problems)
			}
		}
		for _, p := range er.Problems {
			if strings.ContainsAny(p.Message, "\x00\r\n\x1b\u2028\u202e") {
				t.Errorf("%s: a problem message carries a hostile character: %+q", typ, p.Message)
			}
		}
	}
	if total < 150 {
		t.Fatalf("only %d hostile events: the walk is broken", total)
	}
	e.assertNothingProduced()
	if strings.Contains(e.logs.String(), "\nforged") {
		t.Errorf("a forged line reached the server log")
	}
}

// schemaStringPaths walks typ's JSON Schema for its string properties.
func schemaStringPaths(t *testing.T, typ string) []string {
	t.Helper()
	b, ok := domain.Schema(typ)
	if !ok {
		t.Fatalf("no schema for %s", typ)
	}
	var root map[string]any
	if err := json.Unmarshal(b, &root); err != nil {
		t.Fatal(err)
	}
	var out []string
	var walk func(prefix string, n map[string]any)
	walk = func(prefix string, n map[string]any) {
		props, _ := n["properties"].(map[string]any)
		for name, p := range props {
			switch pm := p.(map[string]any); pm["type"] {
			case "string":
				out = append(out, prefix+name)
			case "object":
				walk(prefix+name+".", pm)
			}
		}
	}
	walk("data.", root)
	slices.Sort(out)
	return out
}

// TestIngestRefusesHostileSource: ce-source with CR/LF (which forge lines
// in kcat and Console views), NUL and other controls is refused in binary
// mode (percent-encoded, as the HTTP binding carries them, and raw on the
// wire) and in structured mode; so is a source that is not a URI-reference.
func TestIngestRefusesHostileSource(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	ua := userActive()
	data := mailplanetest.MustJSON(t, ua["data"])
	post := func(name string, r req, field string, code domain.Code) {
		t.Helper()
		resp, b := e.Do(r)
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("%s: status %d, want 400: %s", name, resp.StatusCode, b)
			return
		}
		er := decodeErr(t, b)
		if !slices.ContainsFunc(er.Problems, func(p Problem) bool { return p.Field == field && p.Code == code }) {
			t.Errorf("%s: want %s at %s, got %s", name, code, field, b)
		}
	}
	for _, h := range hostileText {
		src := "urn:mailplane:test" + h + "x"
		hdr := binaryHeadersOf(ua)
		hdr["ce-source"] = url.PathEscape(src)
		post(fmt.Sprintf("binary %+q", h), req{ContentType: "application/json", Body: data, Headers: hdr}, "ce-source", domain.CodeForbiddenCharacter)
		post(fmt.Sprintf("structured %+q", h), req{ContentType: ContentTypeStructured, Body: mailplanetest.MustJSON(t, with(ua, "source", src))}, "source", domain.CodeForbiddenCharacter)
	}
	for _, src := range []string{"two words", "a%zz", "1a:b", "a<b>", "a#b#c"} {
		hdr := binaryHeadersOf(ua)
		hdr["ce-source"] = src
		code := domain.CodeInvalid
		if strings.Contains(src, "%") {
			code = domain.CodeMalformedHeader // the binding's percent-decoding refuses it first
		}
		post("binary "+src, req{ContentType: "application/json", Body: data, Headers: hdr}, "ce-source", code)
		post("structured "+src, req{ContentType: ContentTypeStructured, Body: mailplanetest.MustJSON(t, with(ua, "source", src))}, "source", domain.CodeInvalid)
	}
	// Raw bytes on the wire: what an HTTP client library would not send.
	for _, h := range []string{"\x00", "\r", "\x1b", "\x7f"} {
		status := rawPost(t, e.Base, "ce-source: urn:a"+h+"b\r\n", data)
		if status != http.StatusBadRequest {
			t.Errorf("raw ce-source with %+q: status %d, want 400", h, status)
		}
	}
	e.assertNothingProduced()
}

// rawPost sends a binary-mode event with extra raw header lines and returns
// the status code.
func rawPost(t *testing.T, base, extra string, body []byte) int {
	t.Helper()
	u, _ := url.Parse(base)
	c, err := net.DialTimeout("tcp", u.Host, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	ua := userActive()
	var sb strings.Builder
	fmt.Fprintf(&sb, "POST /v1/events HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n", u.Host, tokenA)
	fmt.Fprintf(&sb, "ce-specversion: 1.0\r\nce-id: %s\r\nce-type: %s\r\n%sContent-Length: %d\r\nConnection: close\r\n\r\n", ua["id"], ua["type"], extra, len(body))
	sb.Write(body)
	if _, err := c.Write([]byte(sb.String())); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}
