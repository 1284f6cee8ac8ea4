package api

import (
	"context"
	"io"
	"net/http"
	"time"
)

// A refused request's body is drained before the connection closes: a
// socket closed with unread data makes the kernel answer with a reset, and
// a client still sending its body (a 3 MiB batch refused as too large, or
// as unauthenticated before it was read) then loses the response it was
// sent, seeing "connection reset" instead of the 413 and its code. The
// drain is bounded: a body longer than drainMax, slower than the minimum
// body rate, or still arriving drainTimeout after the answer is cut off
// as before. The answer itself does not wait for the body (full duplex:
// net/http would otherwise read up to 256 KiB of an unread body before
// writing a response), so a refusal reaches a slow sender at once and
// reserves nothing.
const (
	drainMax     = 32 << 20
	drainTimeout = 10 * time.Second
)

// drainRefused reads and discards what h left unread of a request body it
// answered with an error, after flushing that answer. A body cut for
// coming too slowly (admitBody) is not drained: its sender gets the 408
// and the connection closes.
func (s *Server) drainRefused(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body == nil || r.Body == http.NoBody || r.ContentLength > drainMax {
			h.ServeHTTP(w, r)
			return
		}
		rc := http.NewResponseController(w)
		_ = rc.EnableFullDuplex()
		body := &trackedBody{ReadCloser: r.Body}
		st := &requestState{}
		r = r.WithContext(context.WithValue(r.Context(), stateKey{}, st))
		r.Body = body
		sw := &statusWriter{ResponseWriter: w}
		h.ServeHTTP(sw, r)
		if body.eof || st.cut || sw.status < http.StatusBadRequest {
			return
		}
		_ = rc.Flush()
		now := time.Now()
		g := &guardedBody{src: body.ReadCloser, rc: rc, rate: s.cfg.rate, start: now, deadline: now.Add(drainTimeout)}
		_, _ = io.CopyN(io.Discard, g, drainMax)
	})
}

// trackedBody notes whether a body was read to its end.
type trackedBody struct {
	io.ReadCloser
	eof bool
}

func (b *trackedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.eof = true
	}
	return n, err
}

// requestState is what the layers of one request tell the drain.
type requestState struct {
	cut bool // the body was cut for coming too slowly
}

type stateKey struct{}

func stateFrom(r *http.Request) *requestState {
	st, _ := r.Context().Value(stateKey{}).(*requestState)
	return st
}
