package api

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/producer"
)

// TestRefusedBodiesAlwaysGetTheirAnswer sends bodies far over the limit,
// as a client does: the whole body, then it reads. The answer (413 for
// too large, 401 for no token) must arrive every time, never a connection
// reset: the server drains what it refused before closing.
func TestRefusedBodiesAlwaysGetTheirAnswer(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{noBroker: true, prod: producer.New(nil)})
	addr := strings.TrimPrefix(e.Base, "http://")
	body := bytes.Repeat([]byte("x"), 8<<20)
	cases := []struct {
		name    string
		headers string
		chunked bool
		status  int
		code    domain.Code
	}{
		{"too large", "Authorization: Bearer " + tokenA + "\r\n", false, http.StatusRequestEntityTooLarge, domain.CodeTooLarge},
		{"too large, chunked", "Authorization: Bearer " + tokenA + "\r\n", true, http.StatusRequestEntityTooLarge, domain.CodeTooLarge},
		{"no token", "", false, http.StatusUnauthorized, domain.CodeUnauthorized},
	}
	for _, c := range cases {
		for i := range 5 {
			status, resp, err := sendRaw(addr, c.headers, body, c.chunked)
			if err != nil {
				t.Fatalf("%s #%d: %v (want %d)", c.name, i, err, c.status)
			}
			if status != c.status || !strings.Contains(resp, `"code":"`+string(c.code)+`"`) {
				t.Fatalf("%s #%d: %d %s, want %d with code %s", c.name, i, status, resp, c.status, c.code)
			}
		}
	}
}

// sendRaw writes a POST /v1/events with body over its own connection,
// then reads the answer's status and body.
func sendRaw(addr, headers string, body []byte, chunked bool) (int, string, error) {
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return 0, "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	w := bufio.NewWriter(conn)
	fmt.Fprintf(w, "POST /v1/events HTTP/1.1\r\nHost: mailplane\r\nContent-Type: application/cloudevents-batch+json\r\n%s", headers)
	if chunked {
		fmt.Fprint(w, "Transfer-Encoding: chunked\r\n\r\n")
		for off := 0; off < len(body); off += 64 << 10 {
			chunk := body[off:min(off+64<<10, len(body))]
			fmt.Fprintf(w, "%x\r\n", len(chunk))
			w.Write(chunk)
			fmt.Fprint(w, "\r\n")
		}
		fmt.Fprint(w, "0\r\n\r\n")
	} else {
		fmt.Fprintf(w, "Content-Length: %d\r\n\r\n", len(body))
		w.Write(body)
	}
	if err := w.Flush(); err != nil {
		return 0, "", fmt.Errorf("sending: %w", err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return 0, "", fmt.Errorf("reading the answer: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}
