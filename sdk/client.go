package sdk

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
)

// DefaultHost is the daemon address used when K7_HOST is unset.
const DefaultHost = "unix:///run/k7/k7.sock"

// Client is a connection to one k7 daemon. It is safe for concurrent use.
type Client struct {
	host  string       // as given, for messages
	base  *url.URL     // http(s)://... the requests go to
	hc    *http.Client // never has a timeout: streams are long-lived
	token string
}

// Option configures a Client.
type Option func(*Client)

// WithToken sets the bearer token sent with every request.
func WithToken(token string) Option { return func(c *Client) { c.token = token } }

// WithHTTPClient replaces the HTTP client. Its transport is used as is: for
// a unix socket host the caller's transport must dial the socket itself.
func WithHTTPClient(hc *http.Client) Option { return func(c *Client) { c.hc = hc } }

// New returns a Client for host, which is unix:///path/to/k7.sock (or a bare
// absolute socket path), http://host:port or https://host:port. An empty host
// means DefaultHost. New does not contact the daemon.
func New(host string, opts ...Option) (*Client, error) {
	if host == "" {
		host = DefaultHost
	}
	c := &Client{host: host}
	var sock string
	switch {
	case strings.HasPrefix(host, "unix://"):
		sock = strings.TrimPrefix(host, "unix://")
	case strings.HasPrefix(host, "/"):
		sock = host
		c.host = "unix://" + host
	case strings.HasPrefix(host, "http://"), strings.HasPrefix(host, "https://"):
		u, err := url.Parse(host)
		if err != nil {
			return nil, fmt.Errorf("parsing host %q: %w", host, err)
		}
		if u.Host == "" {
			return nil, fmt.Errorf("host %q has no address", host)
		}
		u.Path = strings.TrimSuffix(u.Path, "/")
		c.base = u
	default:
		return nil, fmt.Errorf("unsupported host %q: want unix:///path, http://host:port or https://host:port", host)
	}
	if sock != "" {
		if sock == "" || !strings.HasPrefix(sock, "/") {
			return nil, fmt.Errorf("unix socket host %q needs an absolute path", host)
		}
		c.base = &url.URL{Scheme: "http", Host: "k7d"}
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.Proxy = nil
		tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		}
		c.hc = &http.Client{Transport: tr}
	} else {
		c.hc = &http.Client{}
	}
	for _, o := range opts {
		o(c)
	}
	return c, nil
}

// FromEnv returns a Client for $K7_HOST (default DefaultHost) with the bearer
// token $K7_TOKEN, if set.
func FromEnv(opts ...Option) (*Client, error) {
	var o []Option
	if t := os.Getenv("K7_TOKEN"); t != "" {
		o = append(o, WithToken(t))
	}
	return New(os.Getenv("K7_HOST"), append(o, opts...)...)
}

// Host returns the daemon address the client talks to.
func (c *Client) Host() string { return c.host }

// url builds the URL of an API path with an optional query.
func (c *Client) url(path string, q url.Values) string {
	u := *c.base
	s := u.String() + path
	if len(q) > 0 {
		s += "?" + q.Encode()
	}
	return s
}

// pathID escapes one path segment (a sandbox ID or name, an image ref).
func pathID(s string) string { return url.PathEscape(s) }

// newRequest builds a request with the auth header set.
func (c *Client) newRequest(ctx context.Context, method, path string, q url.Values, body io.Reader) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.url(path, q), body)
	if err != nil {
		return nil, err
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	return req, nil
}

// send runs req and returns the response when it is 2xx; otherwise the
// daemon's error. The caller closes the body.
func (c *Client) send(req *http.Request) (*http.Response, error) {
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, c.transportError(err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		defer resp.Body.Close()
		return nil, errorFromResponse(resp)
	}
	return resp, nil
}

// stream sends a request with a raw body and returns the 2xx response.
func (c *Client) stream(ctx context.Context, method, path string, q url.Values, body io.Reader, contentType string) (*http.Response, error) {
	req, err := c.newRequest(ctx, method, path, q, body)
	if err != nil {
		return nil, err
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	return c.send(req)
}

// doJSON sends in (when non-nil) as JSON and decodes the answer into out
// (when non-nil).
func (c *Client) doJSON(ctx context.Context, method, path string, q url.Values, in, out any) error {
	var body io.Reader
	ct := ""
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body, ct = bytes.NewReader(b), "application/json"
	}
	resp, err := c.stream(ctx, method, path, q, body, ct)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("decoding %s %s answer: %w", method, path, err)
	}
	return nil
}

func bytesReader(b []byte) io.Reader { return bytes.NewReader(b) }
