package sealing_test

import (
	"bytes"
	"encoding/base64"
	"path/filepath"
	"testing"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/sealing"
)

func testKey(b byte) string { return base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{b}, 32)) }

func TestSealOpenBindsMailbox(t *testing.T) {
	t.Parallel()
	k, err := sealing.ParseKeys("k1:"+testKey(1)+",k2:"+testKey(2), "k2")
	if err != nil {
		t.Fatal(err)
	}
	s, err := k.Seal([]byte("hunter2"), []byte("mb-1"))
	if err != nil {
		t.Fatal(err)
	}
	if s.KeyID != "k2" || s.Alg != domain.SealAlg {
		t.Fatalf("sealed with %s/%s", s.KeyID, s.Alg)
	}
	if ps := s.Validate(); len(ps) > 0 {
		t.Fatal(ps)
	}
	if bytes.Contains([]byte(s.Ciphertext+s.Nonce), []byte("hunter2")) {
		t.Fatal("plain text visible in sealed form")
	}
	got, err := k.Open(s, []byte("mb-1"))
	if err != nil || string(got) != "hunter2" {
		t.Fatalf("open = %q, %v", got, err)
	}
	if _, err := k.Open(s, []byte("mb-2")); domain.ErrorCode(err) != domain.CodeInvalid {
		t.Fatalf("open bound to other mailbox: %v", err)
	}
	s.KeyID = "nope"
	if _, err := k.Open(s, []byte("mb-1")); domain.ErrorCode(err) != domain.CodeNotFound {
		t.Fatalf("unknown key: %v", err)
	}
}

func TestParseKeysRejectsBadInput(t *testing.T) {
	t.Parallel()
	for _, spec := range []string{"", "k1", "k1:not-base64!", "k1:" + base64.StdEncoding.EncodeToString([]byte("short")), "bad id!:" + testKey(1)} {
		if _, err := sealing.ParseKeys(spec, ""); err == nil {
			t.Errorf("ParseKeys(%q) accepted", spec)
		}
	}
	if _, err := sealing.ParseKeys("k1:"+testKey(1), "k9"); err == nil {
		t.Error("active key not in ring accepted")
	}
}

func TestLoadOrCreateFileKeepsKey(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "seal.key")
	k1, err := sealing.LoadOrCreateFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s, _ := k1.Seal([]byte("x"), nil)
	k2, err := sealing.LoadOrCreateFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := k2.Open(s, nil); err != nil || string(got) != "x" {
		t.Fatalf("second load cannot open: %v", err)
	}
}
