package apitest_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/apitest"
	"github.com/mailplane/mailplane/topics"
)

// recordingTB keeps the test's errors instead of failing it, so a test can
// check that the harness fails the tests it should.
type recordingTB struct {
	testing.TB
	errs []string
}

func (r *recordingTB) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

// A request's empty fields take the client's defaults, NoAuth sends no
// Authorization, and an answer echoing a secret fails the test.
func TestClientDefaultsAndSecrets(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "%s %s ct=%q auth=%q body=%s", r.Method, r.URL.Path, r.Header.Get("Content-Type"), r.Header.Get("Authorization"), body)
	}))
	t.Cleanup(srv.Close)
	rec := &recordingTB{TB: t}
	c := &apitest.Client{T: rec, Base: srv.URL, HTTP: srv.Client(),
		Method: http.MethodPost, Path: "/v1/events", ContentType: "application/json", Token: "tok-a", Secrets: []string{"hunter2"}}
	for _, tc := range []struct {
		r    apitest.Request
		want string
	}{
		{apitest.Request{}, `POST /v1/events ct="" auth="Bearer tok-a" body=`},
		{apitest.Request{Body: []byte("{}")}, `POST /v1/events ct="application/json" auth="Bearer tok-a" body={}`},
		{apitest.Request{NoAuth: true}, `POST /v1/events ct="" auth="" body=`},
		{apitest.Request{Method: http.MethodPut, Path: "/x", ContentType: "text/plain", Token: "tok-b", Body: []byte("hi"), Chunked: true},
			`PUT /x ct="text/plain" auth="Bearer tok-b" body=hi`},
		{apitest.Request{NoAuth: true, Headers: map[string]string{"Authorization": "Basic eA=="}}, `POST /v1/events ct="" auth="Basic eA==" body=`},
	} {
		if _, b := c.Do(tc.r); string(b) != tc.want {
			t.Errorf("%+v: answer %s, want %s", tc.r, b, tc.want)
		}
	}
	if len(rec.errs) != 0 {
		t.Fatalf("no secret was sent, yet: %v", rec.errs)
	}
	c.Do(apitest.Request{Body: []byte("hunter2")})
	if len(rec.errs) != 1 {
		t.Errorf("an answer echoing a secret: %d errors, want 1", len(rec.errs))
	}
}

// Grown sees a record produced after the offsets were taken, on its topic
// only.
func TestBrokerGrown(t *testing.T) {
	t.Parallel()
	b := apitest.NewBroker(t, "apitest-test")
	start := b.EndOffsets(topics.UserEvents, topics.MailboxEvents)
	b.AssertNothingProduced(start)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := b.Producer().PublishUserActive(ctx, domain.UserActive{UserID: "0190a5b2-4c5e-7b1a-9c3d-00000000b001", Source: domain.ActivityLogin})
	if err != nil {
		t.Fatal(err)
	}
	if got := b.Grown(start); len(got) != 1 || got[topics.UserEvents] != 1 {
		t.Errorf("grown %v, want 1 on %s only", got, topics.UserEvents)
	}
	if ev, err := topics.Decode(b.Fetch(r.Topic, r.Partition, r.Offset)); err != nil || ev.ID != r.ID {
		t.Errorf("fetched %v, %v; want event %s", ev.ID, err, r.ID)
	}
}

// DecodeStrict refuses a field the type does not have.
func TestDecodeStrict(t *testing.T) {
	t.Parallel()
	type answer struct {
		A int `json:"a"`
	}
	if got := apitest.DecodeStrict[answer](t, []byte(`{"a":1}`)); got.A != 1 {
		t.Errorf("decoded %+v", got)
	}
	rec := &fatalTB{TB: t}
	func() {
		defer func() { _ = recover() }()
		apitest.DecodeStrict[answer](rec, []byte(`{"a":1,"b":2}`))
	}()
	if !rec.failed {
		t.Error("an unknown field decoded")
	}
}

// fatalTB records Fatalf and stops the caller as Fatalf does.
type fatalTB struct {
	testing.TB
	failed bool
}

func (f *fatalTB) Fatalf(string, ...any) {
	f.failed = true
	panic("fatal")
}
