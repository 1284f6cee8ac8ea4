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
	cases := []struct {
		name, section   string
		present, parsed bool
		sender, id      string
	}{
		{"absent", "\r\n", false, false, "", ""},
		{"empty", "", false, false, "", ""},
		{"good", h + ": mailbox=" + warmSender + "; id=abc.123\r\n\r\n", true, true, warmSender, "abc.123"},
		{"any case, spaces, upper-case uuid", "x-mailplane-warmup:  ID = w-1 ;MAILBOX= " + "0190A5B2-4C5E-7B1A-9C3D-00000000AA01" + "\r\n\r\n", true, true, warmSender, "w-1"},
		{"folded", h + ": mailbox=" + warmSender + ";\r\n id=w2\r\n\r\n", true, true, warmSender, "w2"},
		{"no terminator", h + ": mailbox=" + warmSender + "; id=w3", true, true, warmSender, "w3"},
		{"bare token", h + ": w2\r\n\r\n", true, false, "", ""},
		{"bad id", h + ": mailbox=" + warmSender + "; id=a b\r\n\r\n", true, false, "", ""},
		{"long id", h + ": mailbox=" + warmSender + "; id=" + string(bytes.Repeat([]byte("a"), 129)) + "\r\n\r\n", true, false, "", ""},
		{"bad mailbox", h + ": mailbox=nope; id=w\r\n\r\n", true, false, "", ""},
		{"other header only", "X-Other: 1\r\n\r\n", false, false, "", ""},
	}
	for _, c := range cases {
		tag, present := parseWarmup([]byte(c.section), h)
		if present != c.present || (tag != nil) != c.parsed {
			t.Errorf("%s: present %v parsed %v, want %v %v", c.name, present, tag != nil, c.present, c.parsed)
			continue
		}
		if tag != nil && (tag.sender != c.sender || tag.id != c.id) {
			t.Errorf("%s: %+v", c.name, tag)
		}
	}
}

func FuzzParseWarmup(f *testing.F) {
	f.Add([]byte(DefaultWarmupHeader + ": mailbox=" + warmSender + "; id=x\r\n\r\n"))
	f.Add([]byte(DefaultWarmupHeader + ":\r\n\r\n"))
	f.Add([]byte("\r\n \r\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		tag, present := parseWarmup(b, DefaultWarmupHeader)
		if tag != nil {
			if !present {
				t.Fatal("a tag from an absent header")
			}
			o := domain.WarmupObserved{MailboxID: tag.sender, WarmupID: tag.id, Placement: domain.PlacedJunk, LandedAt: time.Unix(1, 0), Source: domain.ObservedBySync}
			if ps := o.Validate(); len(ps) != 0 {
				t.Fatalf("tag %+v does not make a valid event: %v", tag, ps)
			}
		}
	})
}
