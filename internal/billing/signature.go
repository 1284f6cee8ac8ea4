package billing

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/api"
)

// CodeInvalidSignature is the stable code of a webhook whose
// Stripe-Signature header is missing, malformed, matches none of the
// endpoint secrets, or carries a timestamp outside the tolerance.
const CodeInvalidSignature domain.Code = "invalid_signature"

// SignatureHeader is the header Stripe signs webhooks in.
const SignatureHeader = "Stripe-Signature"

// maxSignatures bounds the v1 signatures considered in one header (Stripe
// sends one per active endpoint secret: two during a rotation).
const maxSignatures = 16

// Verify checks a Stripe-Signature header against the raw request body, as
// Stripe specifies: the header is a comma-separated list of key=value
// pairs with exactly one t (the Unix timestamp of the signing) and one or
// more v1 (hex HMAC-SHA256 of "<t>.<payload>" keyed by an endpoint
// secret); other schemes (v0) are ignored. The body is authentic when any
// v1 matches the HMAC under any of secrets (several during a rotation),
// every comparison in constant time and none cut short; it is fresh when t
// is within tolerance of now, in either direction. Errors are *domain.Error
// with CodeInvalidSignature; their messages never carry the header or the
// secrets.
func Verify(payload []byte, header string, secrets []string, now time.Time, tolerance time.Duration) error {
	ts, sigs, err := parseSignatureHeader(header)
	if err != nil {
		return err
	}
	match := false
	for _, secret := range secrets {
		expected := sign(secret, ts, payload)
		for _, sig := range sigs {
			// hmac.Equal is constant-time; |= keeps the loop from
			// stopping at the first match.
			match = hmac.Equal(expected, sig) || match
		}
	}
	if !match {
		return domain.Errorf(CodeInvalidSignature, "no signature in the %s header matches the payload", SignatureHeader)
	}
	if d := now.Sub(time.Unix(ts, 0)); d > tolerance || d < -tolerance {
		return domain.Errorf(CodeInvalidSignature, "the %s timestamp is more than %s away from the server's clock", SignatureHeader, tolerance)
	}
	return nil
}

// screen refuses, on its headers alone, a delivery that cannot verify (no
// Stripe-Signature header or more than one, a malformed one, no v1
// signature, a timestamp outside the tolerance) before a byte of its
// body is read or any budget reserved; the others take the billing
// class's budget (docs/architecture.md §4, api). Anyone can forge a fresh
// timestamp, so this only keeps the trivial floods off that budget; the
// signature over the body is what admits an event.
func (w *webhook) screen(rw http.ResponseWriter, r *http.Request) (api.Class, bool) {
	hs := r.Header.Values(SignatureHeader)
	var err error
	if len(hs) > 1 {
		err = domain.Errorf(CodeInvalidSignature, "the %s header must be given once", SignatureHeader)
	} else if ts, sigs, perr := parseSignatureHeader(r.Header.Get(SignatureHeader)); perr != nil {
		err = perr
	} else if len(sigs) == 0 {
		err = domain.Errorf(CodeInvalidSignature, "the %s header has no v1 signature", SignatureHeader)
	} else if d := w.opt.now().Sub(time.Unix(ts, 0)); d > w.cfg.Tolerance || d < -w.cfg.Tolerance {
		err = domain.Errorf(CodeInvalidSignature, "the %s timestamp is more than %s away from the server's clock", SignatureHeader, w.cfg.Tolerance)
	}
	if err != nil {
		w.log.Debug("billing: webhook refused before its body", "code", domain.ErrorCode(err), "remote", r.RemoteAddr)
		api.WriteDomainError(rw, err)
		return "", false
	}
	return api.ClassBilling, true
}

// Sign returns a Stripe-Signature header value for payload signed at t
// with each secret, as Stripe sends it (for tests and tools).
func Sign(payload []byte, t time.Time, secrets ...string) string {
	var b strings.Builder
	b.WriteString("t=")
	b.WriteString(strconv.FormatInt(t.Unix(), 10))
	for _, s := range secrets {
		b.WriteString(",v1=")
		b.WriteString(hex.EncodeToString(sign(s, t.Unix(), payload)))
	}
	return b.String()
}

func sign(secret string, ts int64, payload []byte) []byte {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(strconv.FormatInt(ts, 10)))
	m.Write([]byte{'.'})
	m.Write(payload)
	return m.Sum(nil)
}

func parseSignatureHeader(h string) (ts int64, sigs [][]byte, err error) {
	malformed := func(format string, args ...any) (int64, [][]byte, error) {
		return 0, nil, domain.Errorf(CodeInvalidSignature, "malformed %s header: "+format, append([]any{SignatureHeader}, args...)...)
	}
	if strings.TrimSpace(h) == "" {
		return 0, nil, domain.Errorf(CodeInvalidSignature, "the %s header is missing", SignatureHeader)
	}
	seenT := false
	for part := range strings.SplitSeq(h, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			return malformed("every element must be key=value")
		}
		switch k {
		case "t":
			if seenT {
				return malformed("more than one timestamp")
			}
			seenT = true
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n <= 0 || v[0] == '+' {
				return malformed("the timestamp is not a positive Unix time")
			}
			ts = n
		case "v1":
			if len(sigs) == maxSignatures {
				return malformed("more than %d signatures", maxSignatures)
			}
			sig, err := hex.DecodeString(v)
			if err != nil || len(sig) != sha256.Size {
				// Stripe's libraries skip what does not decode; so do we,
				// while keeping the count bounded.
				sigs = append(sigs, nil)
				continue
			}
			sigs = append(sigs, sig)
		}
	}
	if !seenT {
		return malformed("no timestamp (t=)")
	}
	if len(sigs) == 0 {
		return malformed("no %s signature", "v1")
	}
	return ts, sigs, nil
}
