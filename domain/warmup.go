package domain

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"strings"
)

// The warmup header. Warmup messages carry, in a header whose name is
// configured (X-Mailplane-Warmup by default),
//
//	mailbox=<sending mailbox id>; id=<warmup id>[; sig=<signature>]
//
// where the id is 1-128 of [A-Za-z0-9._-] and sig is base64url (no padding)
// of the first 16 bytes of HMAC-SHA256(key, "<mailbox id>\x00<warmup id>").
// Where the message lands is evidence about the sender's health, so with a
// key configured an unsigned or wrongly signed header is refused: anyone can
// send mail carrying a header, only the warmup sender holds the key.

// FormatWarmupHeader returns the header value for a warmup message; with a
// key it is signed.
func FormatWarmupHeader(sender, id string, key []byte) string {
	v := "mailbox=" + sender + "; id=" + id
	if len(key) > 0 {
		v += "; sig=" + warmupSig(key, sender, id)
	}
	return v
}

// Outcomes of ParseWarmupHeader.
const (
	WarmupValid     = "valid"
	WarmupMalformed = "malformed"
	// WarmupUnsigned: a key is configured and the header has no sig.
	WarmupUnsigned = "unsigned"
	// WarmupForged: the sig does not match.
	WarmupForged = "forged"
)

// ParseWarmupHeader reads a header value. It returns the sender and the
// warmup id when the outcome is WarmupValid. With a key, the signature is
// required and checked (in constant time); without one it is ignored.
func ParseWarmupHeader(value string, key []byte) (sender, id, outcome string) {
	var sig string
	for _, part := range strings.Split(value, ";") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			continue
		}
		switch strings.ToLower(strings.TrimSpace(k)) {
		case "mailbox":
			sender = strings.ToLower(strings.TrimSpace(v))
		case "id":
			id = strings.TrimSpace(v)
		case "sig":
			sig = strings.TrimSpace(v)
		}
	}
	if !IsUUID(sender) || !isToken(id, MaxWarmupIDLen) {
		return "", "", WarmupMalformed
	}
	if len(key) > 0 {
		if sig == "" {
			return "", "", WarmupUnsigned
		}
		if !hmac.Equal([]byte(sig), []byte(warmupSig(key, sender, id))) {
			return "", "", WarmupForged
		}
	}
	return sender, id, WarmupValid
}

func warmupSig(key []byte, sender, id string) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(sender))
	m.Write([]byte{0})
	m.Write([]byte(id))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil)[:16])
}
