package errdefs

import (
	"errors"
	"fmt"
	"net/http"
	"testing"
)

func TestCodeRoundTrip(t *testing.T) {
	for _, c := range classes {
		wrapped := fmt.Errorf("doing something: %w", c.err)
		code, status := Code(wrapped)
		if code != c.code || status != c.status {
			t.Errorf("Code(%v) = %q, %d; want %q, %d", wrapped, code, status, c.code, c.status)
		}
		if got := FromCode(code); !errors.Is(got, c.err) {
			t.Errorf("FromCode(%q) = %v, want %v", code, got, c.err)
		}
	}
	if code, status := Code(errors.New("boom")); code != "internal" || status != http.StatusInternalServerError {
		t.Errorf("unclassified error: %q %d, want internal 500", code, status)
	}
	if FromCode("nonsense") != nil {
		t.Errorf("FromCode of an unknown code is not nil")
	}
}
