package daemon

import (
	"bufio"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	v1 "github.com/k7-dev/k7/api/v1"
)

func readNDJSON(t *testing.T, resp *http.Response) []v1.PullProgress {
	t.Helper()
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "application/x-ndjson" {
		t.Errorf("content type = %q", ct)
	}
	var out []v1.PullProgress
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		var p v1.PullProgress
		if err := json.Unmarshal(sc.Bytes(), &p); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		out = append(out, p)
	}
	return out
}

func TestImagesHTTP(t *testing.T) {
	h := startDaemon(t, testConfig(t, t.TempDir()), newTestEngine(false))
	var l v1.ImageList
	if code, _ := h.do("GET", "/v1/images", nil, &l); code != 200 || len(l.Images) != 1 {
		t.Errorf("images = %d %+v", code, l)
	}
	var img v1.Image
	if code, _ := h.do("GET", "/v1/images/busybox", nil, &img); code != 200 || img.ID != testImage.ID {
		t.Errorf("image = %d %+v", code, img)
	}
	if code, e := h.do("GET", "/v1/images/docker.io%2Flibrary%2Fnope", nil, nil); code != 404 || !strings.Contains(e.Error, "docker.io/library/nope") {
		t.Errorf("unknown image = %d %+v", code, e)
	}

	resp, err := h.hc.Post("http://k7d/v1/images/pull", "application/json", strings.NewReader(`{"ref":"busybox"}`))
	if err != nil {
		t.Fatal(err)
	}
	lines := readNDJSON(t, resp)
	if len(lines) < 2 || lines[len(lines)-1].Image == nil || lines[len(lines)-1].Image.ID != testImage.ID {
		t.Errorf("pull lines = %+v, want progress then the image", lines)
	}
	resp, _ = h.hc.Post("http://k7d/v1/images/pull", "application/json", strings.NewReader(`{"ref":"nope"}`))
	lines = readNDJSON(t, resp)
	if last := lines[len(lines)-1]; last.Error == "" || last.Code != v1.CodeNotFound {
		t.Errorf("failed pull last line = %+v, want error with not_found", last)
	}
	resp, _ = h.hc.Post("http://k7d/v1/images/import?name=mine", "application/x-tar", strings.NewReader("tar bytes"))
	lines = readNDJSON(t, resp)
	if last := lines[len(lines)-1]; last.Image == nil || last.Image.Refs[0] != "mine" {
		t.Errorf("import last line = %+v", last)
	}

	// An image in use cannot be removed.
	h.create("user")
	if code, e := h.do("DELETE", "/v1/images/busybox", nil, nil); code != 409 || e.Code != v1.CodeConflict {
		t.Errorf("remove used image = %d %+v, want 409 conflict", code, e)
	}
	h.do("DELETE", "/v1/sandboxes/user", nil, nil)
	if code, e := h.do("DELETE", "/v1/images/busybox", nil, nil); code != 200 {
		t.Errorf("remove unused image = %d %+v", code, e)
	}
}

func TestLogs(t *testing.T) {
	eng := newTestEngine(false)
	h := startDaemon(t, testConfig(t, t.TempDir()), eng)
	sb := h.create("l")
	eng.mu.Lock()
	eng.sbs[sb.ID].log.WriteString("booted\n")
	eng.mu.Unlock()
	resp, err := h.hc.Get("http://k7d/v1/sandboxes/l/logs")
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 100)
	n, _ := resp.Body.Read(b)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b[:n]) != "booted\n" {
		t.Errorf("logs = %d %q", resp.StatusCode, b[:n])
	}
	// follow ends when the sandbox is deleted.
	fresp, err := h.hc.Get("http://k7d/v1/sandboxes/l/logs?follow=1")
	if err != nil {
		t.Fatal(err)
	}
	defer fresp.Body.Close()
	body := fresp.Body
	done := make(chan string)
	go func() {
		var sb strings.Builder
		buf := make([]byte, 100)
		for {
			n, err := body.Read(buf)
			sb.Write(buf[:n])
			if err != nil {
				done <- sb.String()
				return
			}
		}
	}()
	h.do("DELETE", "/v1/sandboxes/l", nil, nil)
	if got := <-done; got != "booted\n" {
		t.Errorf("followed logs = %q", got)
	}
	if code, _ := h.do("GET", "/v1/sandboxes/nope/logs", nil, nil); code != 404 {
		t.Errorf("logs of unknown = %d, want 404", code)
	}
}
