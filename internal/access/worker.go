package access

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"strings"

	"github.com/mailplane/mailplane/domain"
)

// Worker credentials: "mpw1.<worker id>.<mac>", mac the base64url (no
// padding) of HMAC-SHA256(fleet secret, "mailplane.worker.v1:"+id). The id
// travels in the token, so the server derives the MAC for that id alone and
// a credential is good for nothing but its own worker id.
const (
	workerTokenPrefix = "mpw1."
	workerMACContext  = "mailplane.worker.v1:"
	// MinFleetSecretBytes is the shortest fleet secret accepted.
	MinFleetSecretBytes = 32
	// WorkerCallerName is the Name of every worker caller: one value, so
	// per-caller metrics stay bounded however many workers there are.
	WorkerCallerName = "worker"
)

var macEncoding = base64.RawURLEncoding.Strict()

func workerMAC(secret []byte, workerID string) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(workerMACContext + workerID))
	return m.Sum(nil)
}

// WorkerToken is the credential of workerID under the fleet secret.
func WorkerToken(secret []byte, workerID string) string {
	return workerTokenPrefix + workerID + "." + macEncoding.EncodeToString(workerMAC(secret, workerID))
}

func (a *Authenticator) authenticateWorker(token string) (*domain.Caller, bool) {
	if len(a.fleet) == 0 {
		return nil, false
	}
	id, mac, ok := strings.Cut(strings.TrimPrefix(token, workerTokenPrefix), ".")
	if !ok || !domain.IsUUID(id) {
		return nil, false
	}
	got, err := macEncoding.DecodeString(mac)
	if err != nil {
		return nil, false
	}
	if !hmac.Equal(got, workerMAC(a.fleet, id)) {
		return nil, false
	}
	return &domain.Caller{Name: WorkerCallerName, WorkerID: id}, true
}
