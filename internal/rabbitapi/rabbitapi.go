// Package rabbitapi calls RabbitMQ's management HTTP API, for the test
// environment and the benchmarks (which create and drop vhosts, list
// connections and queues).
package rabbitapi

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
)

// Call performs one management API call on the API at base URL api
// (http://user:password@host:port/api; the user info becomes basic auth).
// path is already escaped, e.g. "/vhosts/"+url.PathEscape(name). A JSON
// answer is decoded into out when out is not nil; a status of 300 or more is
// an error carrying the answer's body.
func Call(ctx context.Context, api, method, path string, body, out any) error {
	base, err := url.Parse(api)
	if err != nil {
		return fmt.Errorf("parse management API URL: %w", err)
	}
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return fmt.Errorf("%s %s: encode body: %w", method, path, err)
		}
		rd = strings.NewReader(string(b))
	}
	req, err := http.NewRequestWithContext(ctx, method, base.Scheme+"://"+base.Host+strings.TrimSuffix(base.Path, "/")+path, rd)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	if base.User != nil {
		pw, _ := base.User.Password()
		req.SetBasicAuth(base.User.Username(), pw)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode >= 300 {
		return fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, strings.TrimSpace(string(b)))
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("%s %s: decode: %w", method, path, err)
		}
	}
	return nil
}
