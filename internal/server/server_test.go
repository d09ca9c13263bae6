package server

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	v1 "github.com/k7-dev/k7/api/v1"
)

func TestWriteJSONStampsLatency(t *testing.T) {
	tests := []struct {
		name string
		v    any
	}{
		{"field", &v1.OpResult{ID: "x"}},
		{"no field", &v1.SandboxList{Sandboxes: []v1.Sandbox{}}},
		{"empty object", &struct{}{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			writeJSONStatus(rec, 200, tt.v, 1234)
			var m map[string]any
			if err := json.Unmarshal(rec.Body.Bytes(), &m); err != nil {
				t.Fatalf("body %q: %v", rec.Body, err)
			}
			if got := m["latency_ns"]; got != float64(1234) {
				t.Errorf("latency_ns = %v, want 1234 in %s", got, rec.Body)
			}
		})
	}
}

func TestSignalNumber(t *testing.T) {
	tests := []struct {
		in   string
		want int
		ok   bool
	}{
		{"TERM", 15, true}, {"SIGKILL", 9, true}, {"int", 2, true}, {"HUP", 1, true},
		{"QUIT", 3, true}, {"USR1", 10, true}, {"USR2", 12, true}, {"9", 9, true},
		{"BOGUS", 0, false}, {"0", 0, false}, {"", 0, false},
	}
	for _, tt := range tests {
		got, err := signalNumber(tt.in)
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("signalNumber(%q) = %d, %v; want %d ok=%v", tt.in, got, err, tt.want, tt.ok)
		}
	}
}

func TestRequireToken(t *testing.T) {
	h := RequireToken(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(204) }), "tok")
	tests := []struct {
		path, auth string
		want       int
	}{
		{"/v1/info", "", 401},
		{"/v1/info", "Bearer nope", 401},
		{"/v1/info", "tok", 401},
		{"/v1/info", "Bearer tok", 204},
		{"/healthz", "", 204},
	}
	for _, tt := range tests {
		req := httptest.NewRequest("GET", tt.path, nil)
		if tt.auth != "" {
			req.Header.Set("Authorization", tt.auth)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != tt.want {
			t.Errorf("%s with %q = %d, want %d", tt.path, tt.auth, rec.Code, tt.want)
		}
	}
}

func FuzzDecodeExecRequest(f *testing.F) {
	f.Add([]byte(`{"args":["sh","-c","echo"],"stdin":true,"timeout_ns":5}`))
	f.Add([]byte(`{`))
	f.Fuzz(func(t *testing.T, b []byte) {
		req := httptest.NewRequest("POST", "/", bytes.NewReader(b))
		var v v1.ExecRequest
		_ = decode(httptest.NewRecorder(), req, &v)
	})
}
