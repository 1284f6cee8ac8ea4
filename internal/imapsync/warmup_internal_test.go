package imapsync

import (
	"bytes"
	"strings"
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
		tag, outcome := parseWarmup(strings.NewReader(c.section), h, c.key)
		if outcome != c.outcome || (tag != nil) != (c.outcome == domain.WarmupValid) {
			t.Errorf("%s: outcome %q parsed %v, want %q", c.name, outcome, tag != nil, c.outcome)
			continue
		}
		if tag != nil && (tag.sender != c.sender || tag.id != c.id) {
			t.Errorf("%s: %+v", c.name, tag)
		}
	}
}

// endless is a header section that never ends: the warmup header's value
// goes on forever. It counts what was read of it.
type endless struct{ read int }

func (e *endless) Read(p []byte) (int, error) {
	prefix := DefaultWarmupHeader + ": mailbox=" + warmSender + "; id="
	for i := range p {
		if e.read+i < len(prefix) {
			p[i] = prefix[e.read+i]
		} else {
			p[i] = 'a'
		}
	}
	e.read += len(p)
	return len(p), nil
}

// TestParseWarmupBounded: a header section that never ends (a server's
// 100 MB header, or more) is read up to warmupMax and refused as
// malformed; nothing past that bound is read or held.
func TestParseWarmupBounded(t *testing.T) {
	t.Parallel()
	e := &endless{}
	tag, outcome := parseWarmup(e, DefaultWarmupHeader, nil)
	if tag != nil || outcome != domain.WarmupMalformed {
		t.Errorf("endless header: tag %v outcome %q, want malformed", tag, outcome)
	}
	if e.read > warmupMax {
		t.Errorf("read %d bytes of an endless header section, bound %d", e.read, warmupMax)
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
		tag, outcome := parseWarmup(bytes.NewReader(b), DefaultWarmupHeader, k)
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
