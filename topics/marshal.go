package topics

import (
	"encoding/json"

	"github.com/mailplane/mailplane/domain"
)

func marshalData(d domain.Data) ([]byte, error) {
	if d == nil {
		return nil, domain.Errorf(domain.CodeRequired, "event has no data")
	}
	return json.Marshal(d)
}
