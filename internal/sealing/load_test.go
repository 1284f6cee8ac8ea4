package sealing_test

import (
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mailplane/mailplane/internal/sealing"
)

// TestLoad: configured keys win; else the data dir's key file, created
// only when asked; else no keyring.
func TestLoad(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	spec := "k1:" + base64.StdEncoding.EncodeToString([]byte(strings.Repeat("a", sealing.KeySize)))
	kr, err := sealing.Load(spec, "", dir, true)
	if err != nil || kr == nil || kr.ActiveKeyID() != "k1" {
		t.Fatalf("configured: %v %v", kr, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "seal.key")); !os.IsNotExist(err) {
		t.Fatalf("configured keys wrote a key file: %v", err)
	}

	if kr, err := sealing.Load("", "", dir, false); kr != nil || err != nil {
		t.Fatalf("nothing configured, no file: %v %v", kr, err)
	}
	created, err := sealing.Load("", "", dir, true)
	if err != nil || created == nil {
		t.Fatalf("create: %v %v", created, err)
	}
	again, err := sealing.Load("", "", dir, false)
	if err != nil || again == nil || again.ActiveKeyID() != created.ActiveKeyID() {
		t.Fatalf("kept key: %v %v", again, err)
	}
	sealed, err := created.Seal([]byte("secret"), []byte("aad"))
	if err != nil {
		t.Fatal(err)
	}
	if plain, err := again.Open(sealed, []byte("aad")); err != nil || string(plain) != "secret" {
		t.Fatalf("the kept key is another key: %q %v", plain, err)
	}
}
