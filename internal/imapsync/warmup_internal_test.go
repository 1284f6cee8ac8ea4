package imapsync

import (
	"bytes"
	"testing"
	"time"

	"github.com/mailplane/mailplane/domain"
)

const warmSender = "0190a5b2-4c5e-7b1a-9c3d-00000000aa01"

func TestParseWarmup(t *testing.T) {
	t.Parallel()
	h := DefaultWarmupHeader
	key := []byte("warmup-test-key-0123456789")
	signed := h + ": " + domain.FormatWarmupHeader(warmSender, "s-1", key) + "\r\n\r\n"
	cases := []struct {
		name, section string
		key           []byte
		outcome       string
		sender, id    string
	}{
		{"absent", "\r\n", nil, "", "", ""},
		{"empty", "", nil, "", "", ""},
		{"good", h + ": mailbox=" + warmSender + "; id=abc.123\r\n\r\n", nil, domain.WarmupValid, warmSender, "abc.123"},
		{"any case, spaces, upper-case uuid", "x-mailplane-warmup:  ID = w-1 ;MAILBOX= " + "0190A5B2-4C5E-7B1A-9C3D-00000000AA01" + "\r\n\r\n", nil, domain.WarmupValid, warmSender, "w-1"},
		{"folded", h + ": mailbox=" + warmSender + ";\r\n id=w2\r\n\r\n", nil, domain.WarmupValid, warmSender, "w2"},
		{"no terminator", h + ": mailbox=" + warmSender + "; id=w3", nil, domain.WarmupValid, warmSender, "w3"},
		{"bare token", h + ": w2\r\n\r\n", nil, domain.WarmupMalformed, "", ""},
		{"empty value", h + ":\r\n\r\n", nil, domain.WarmupMalformed, "", ""},
		{"bad id", h + ": mailbox=" + warmSender + "; id=a b\r\n\r\n", nil, domain.WarmupMalformed, "", ""},
		{"long id", h + ": mailbox=" + warmSender + "; id=" + string(bytes.Repeat([]byte("a"), 129)) + "\r\n\r\n", nil, domain.WarmupMalformed, "", ""},
		{"bad mailbox", h + ": mailbox=nope; id=w\r\n\r\n", nil, domain.WarmupMalformed, "", ""},
		{"other header only", "X-Other: 1\r\n\r\n", nil, "", "", ""},
		{"signed, key", signed, key, domain.WarmupValid, warmSender, "s-1"},
		{"signed, no key: sig ignored", signed, nil, domain.WarmupValid, warmSender, "s-1"},
		{"unsigned, key", h + ": mailbox=" + warmSender + "; id=s-1\r\n\r\n", key, domain.WarmupUnsigned, "", ""},
		{"signed with another key", signed, []byte("another-key-0123456789"), domain.WarmupForged, "", ""},
		{"signature of another id", h + ": " + domain.FormatWarmupHeader(warmSender, "s-1", key)[:len("mailbox=")+36] + "; id=s-2; sig=" +
			domain.FormatWarmupHeader(warmSender, "s-1", key)[len("mailbox=")+36+len("; id=s-1; sig="):] + "\r\n\r\n", key, domain.WarmupForged, "", ""},
	}
	for _, c := range cases {
		tag, outcome := parseWarmup([]byte(c.section), h, c.key)
		if outcome != c.outcome || (tag != nil) != (c.outcome == domain.WarmupValid) {
			t.Errorf("%s: outcome %q parsed %v, want %q", c.name, outcome, tag != nil, c.outcome)
			continue
		}
		if tag != nil && (tag.sender != c.sender || tag.id != c.id) {
			t.Errorf("%s: %+v", c.name, tag)
		}
	}
}

func FuzzParseWarmup(f *testing.F) {
	key := []byte("fuzz-key-0123456789abcdef")
	f.Add([]byte(DefaultWarmupHeader+": mailbox="+warmSender+"; id=x\r\n\r\n"), false)
	f.Add([]byte(DefaultWarmupHeader+": "+domain.FormatWarmupHeader(warmSender, "x", key)+"\r\n\r\n"), true)
	f.Add([]byte(DefaultWarmupHeader+":\r\n\r\n"), false)
	f.Add([]byte("\r\n \r\n"), true)
	f.Fuzz(func(t *testing.T, b []byte, signed bool) {
		var k []byte
		if signed {
			k = key
		}
		tag, outcome := parseWarmup(b, DefaultWarmupHeader, k)
		if (tag != nil) != (outcome == domain.WarmupValid) {
			t.Fatalf("tag %v with outcome %q", tag, outcome)
		}
		if tag != nil {
			o := domain.WarmupObserved{MailboxID: tag.sender, WarmupID: tag.id, Placement: domain.PlacedJunk, LandedAt: time.Unix(1, 0), Source: domain.ObservedBySync}
			if ps := o.Validate(); len(ps) != 0 {
				t.Fatalf("tag %+v does not make a valid event: %v", tag, ps)
			}
		}
	})
}
