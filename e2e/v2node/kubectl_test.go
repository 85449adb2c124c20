package v2node

import "testing"

// TestUnreached: what kubectl prints when its request never acted on the
// API server is tried again; an answer of the API server is not.
func TestUnreached(t *testing.T) {
	for out, want := range map[string]bool{
		`error: error validating "pod.yaml": error validating data: failed to download openapi: Get "https://127.0.0.1:40189/openapi/v2?timeout=32s": context deadline exceeded; if you choose to ignore these errors, turn validation off with --validate=false`: true,
		`Unable to connect to the server: net/http: TLS handshake timeout`: true,
		`Error from server (AlreadyExists): pods "x" already exists`:       false,
		`Error from server (NotFound): pods "x" not found`:                 false,
	} {
		if got := unreached(out); got != want {
			t.Errorf("unreached(%q) = %v, want %v", out, got, want)
		}
	}
}
