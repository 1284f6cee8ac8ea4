// Package sealing seals mailbox secrets with AES-256-GCM before they reach
// the log, and opens them in a sync runner's memory. Keys are named; the key
// id travels with every sealed secret so keys can be rotated.
package sealing

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/mailplane/mailplane/domain"
)

// KeySize is the AES-256 key size in bytes.
const KeySize = 32

// Keyring holds named keys; the active one seals, any of them opens.
type Keyring struct {
	active string
	aeads  map[string]cipher.AEAD
}

// NewKeyring builds a keyring from raw keys; active must be one of them.
func NewKeyring(active string, keys map[string][]byte) (*Keyring, error) {
	k := &Keyring{active: active, aeads: map[string]cipher.AEAD{}}
	for id, key := range keys {
		if ps := (domain.SealedSecret{KeyID: id, Alg: domain.SealAlg, Nonce: "AA==", Ciphertext: "AA=="}).Validate(); len(ps) > 0 {
			return nil, domain.Errorf(domain.CodeInvalid, "seal key id %q: %s", id, ps)
		}
		if len(key) != KeySize {
			return nil, domain.Errorf(domain.CodeInvalid, "seal key %q must be %d bytes, is %d", id, KeySize, len(key))
		}
		block, err := aes.NewCipher(key)
		if err != nil {
			return nil, err
		}
		aead, err := cipher.NewGCM(block)
		if err != nil {
			return nil, err
		}
		k.aeads[id] = aead
	}
	if _, ok := k.aeads[active]; !ok {
		return nil, domain.Errorf(domain.CodeInvalid, "active seal key %q is not in the keyring", active)
	}
	return k, nil
}

// ParseKeys parses "id:base64key[,id:base64key...]"; the first is active
// unless activeID names another. A key id given twice is refused
// (duplicate_key_id).
func ParseKeys(spec, activeID string) (*Keyring, error) {
	keys := map[string][]byte{}
	first := ""
	for _, part := range strings.Split(spec, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		id, b64, ok := strings.Cut(part, ":")
		if !ok {
			return nil, domain.Errorf(domain.CodeInvalid, "seal key must be id:base64key")
		}
		key, err := base64.StdEncoding.DecodeString(b64)
		if err != nil {
			return nil, domain.Errorf(domain.CodeInvalid, "seal key %q is not standard base64", id)
		}
		if first == "" {
			first = id
		}
		// A second key under an id would silently replace the first, and
		// every blob sealed with it would stop opening.
		if _, dup := keys[id]; dup {
			return nil, domain.Errorf(domain.CodeDuplicateKeyID, "seal key id %q is given twice", id)
		}
		keys[id] = key
	}
	if first == "" {
		return nil, domain.Errorf(domain.CodeRequired, "no seal keys given")
	}
	if activeID == "" {
		activeID = first
	}
	return NewKeyring(activeID, keys)
}

// KeyIDs returns the ids of the keys in the ring.
func (k *Keyring) KeyIDs() []string {
	ids := make([]string, 0, len(k.aeads))
	for id := range k.aeads {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// ActiveKeyID returns the id of the key that seals.
func (k *Keyring) ActiveKeyID() string { return k.active }

// Seal encrypts plain bound to aad with the active key.
func (k *Keyring) Seal(plain, aad []byte) (domain.SealedSecret, error) {
	aead := k.aeads[k.active]
	nonce := make([]byte, aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return domain.SealedSecret{}, err
	}
	ct := aead.Seal(nil, nonce, plain, aad)
	return domain.SealedSecret{
		KeyID:      k.active,
		Alg:        domain.SealAlg,
		Nonce:      base64.StdEncoding.EncodeToString(nonce),
		Ciphertext: base64.StdEncoding.EncodeToString(ct),
	}, nil
}

// Open decrypts a sealed secret bound to aad. The caller owns the plain
// text and should clear it when done.
func (k *Keyring) Open(s domain.SealedSecret, aad []byte) ([]byte, error) {
	aead, ok := k.aeads[s.KeyID]
	if !ok {
		return nil, domain.Errorf(domain.CodeNotFound, "seal key %q is not in the keyring", s.KeyID)
	}
	if s.Alg != domain.SealAlg {
		return nil, domain.Errorf(domain.CodeInvalid, "unsupported seal algorithm %q", s.Alg)
	}
	nonce, err := base64.StdEncoding.DecodeString(s.Nonce)
	if err != nil || len(nonce) != aead.NonceSize() {
		return nil, domain.Errorf(domain.CodeInvalid, "malformed nonce")
	}
	ct, err := base64.StdEncoding.DecodeString(s.Ciphertext)
	if err != nil {
		return nil, domain.Errorf(domain.CodeInvalid, "malformed ciphertext")
	}
	plain, err := aead.Open(nil, nonce, ct, aad)
	if err != nil {
		return nil, domain.Errorf(domain.CodeInvalid, "sealed secret does not open (wrong key, or bound to another mailbox or endpoint)")
	}
	return plain, nil
}

// LoadOrCreateFile reads a key file ("id:base64key" lines, first active) or,
// when missing, generates one key and writes it with mode 0600. Dev mode
// keeps its key in its data dir this way.
func LoadOrCreateFile(path string) (*Keyring, error) {
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		key := make([]byte, KeySize)
		if _, err := rand.Read(key); err != nil {
			return nil, err
		}
		line := "dev-1:" + base64.StdEncoding.EncodeToString(key) + "\n"
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return nil, err
		}
		if err := os.WriteFile(path, []byte(line), 0o600); err != nil {
			return nil, fmt.Errorf("write seal key: %w", err)
		}
		b = []byte(line)
	} else if err != nil {
		return nil, fmt.Errorf("read seal key: %w", err)
	}
	return ParseKeys(strings.ReplaceAll(strings.TrimSpace(string(b)), "\n", ","), "")
}

// Load returns the keyring of spec (MAILPLANE_SEAL_KEYS, with activeID),
// else the one kept in dataDir/seal.key by dev mode (created there when
// create is set), else nil: no keys configured.
func Load(spec, activeID, dataDir string, create bool) (*Keyring, error) {
	if spec != "" {
		return ParseKeys(spec, activeID)
	}
	path := filepath.Join(dataDir, "seal.key")
	if _, err := os.Stat(path); err == nil || create {
		return LoadOrCreateFile(path)
	}
	return nil, nil
}
