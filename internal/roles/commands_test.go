package roles

import (
	"context"
	"strings"
	"testing"
)

// TestAPIRoleNeedsTokensFile: outside dev mode the api role does not start
// without its callers.
func TestAPIRoleNeedsTokensFile(t *testing.T) {
	t.Parallel()
	err := API(context.Background(), []string{"--api-tokens-file", ""})
	if err == nil || !strings.Contains(err.Error(), "MAILPLANE_API_TOKENS_FILE") {
		t.Fatalf("api role without a tokens file: %v", err)
	}
}
