package cli

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/mailplane/mailplane/internal/importer"
	"github.com/mailplane/mailplane/internal/mailplanetest"
)

// BenchmarkImport imports 100,000 mailboxes (JSON lines, plain rows with
// passwords) into a real API (sealing, schema validation, an in-process
// broker) in batches of 500, 4 requests in flight, and reports events/s;
// beside it, in the same run, the limit of the import's own side: the same
// rows sent to a handler that only reads each request.
//
//	go test ./internal/cli/ -run '^$' -bench Import -benchtime 1x
func BenchmarkImport(b *testing.B) {
	const rows = 100_000
	var in bytes.Buffer
	for n := range rows {
		m := plainRow(n)
		m["credentials"] = map[string]any{"password": "bench-password"}
		in.WriteString(jsonLineTB(b, m))
		in.WriteByte('\n')
	}
	run := func(b *testing.B, url string) {
		cpu := mailplanetest.CPUTime()
		for b.Loop() {
			s, err := importer.Run(context.Background(), bytes.NewReader(in.Bytes()), importer.Config{
				API: url, Token: importToken, Source: "/crm/import", Format: importer.JSONL,
			})
			if err != nil || s.Accepted != rows {
				b.Fatalf("%v: %d of %d accepted, %d refused, %d not delivered %v", err, s.Accepted, rows, s.Refused, s.Failed, s.NotDelivered[:min(3, len(s.NotDelivered))])
			}
		}
		b.ReportMetric(float64(b.N*rows)/b.Elapsed().Seconds(), "events/s")
		b.ReportMetric(float64((mailplanetest.CPUTime()-cpu).Microseconds())/float64(b.N*rows), "cpu-us/event")
	}
	b.Run("api", func(b *testing.B) {
		a := startImportAPI(b)
		run(b, a.base)
	})
	b.Run("limit/http-read-only", func(b *testing.B) {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.WriteHeader(http.StatusAccepted)
		}))
		defer srv.Close()
		run(b, srv.URL)
	})
}
