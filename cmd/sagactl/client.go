package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/protosaga/saga/internal/termtext"
	"github.com/protosaga/saga/runtime/admin"
)

// cliEnv is what admin commands print to and read configuration from.
type cliEnv struct {
	stdout, stderr io.Writer
	getenv         func(string) string
}

// common holds the flags every admin command takes.
type common struct {
	server, token string
	json          bool
	timeout       time.Duration
}

func (c *common) register(fs *flag.FlagSet) {
	fs.StringVar(&c.server, "server", "", "admin server base URL (default $SAGACTL_SERVER)")
	fs.StringVar(&c.token, "token", "", "bearer token (default $SAGACTL_TOKEN)")
	fs.BoolVar(&c.json, "json", false, "print the API's JSON instead of a table")
	fs.DurationVar(&c.timeout, "timeout", 30*time.Second, "give up after this long")
}

// parse parses args, allowing flags before and after positional arguments,
// and returns the positional ones.
func parse(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, &usageError{err.Error()}
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		if args[0] == "--" {
			return append(pos, args[1:]...), nil
		}
		pos, args = append(pos, args[0]), args[1:]
	}
}

// client calls the admin API.
type client struct {
	base  *url.URL
	token string
	http  *http.Client
}

// connect returns the admin client and ctx bounded by --timeout; the
// caller cancels it.
func (c *common) connect(ctx context.Context, env *cliEnv) (context.Context, context.CancelFunc, *client, error) {
	cl, err := c.client(env)
	if err != nil {
		return nil, nil, nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	return ctx, cancel, cl, nil
}

func (c *common) client(env *cliEnv) (*client, error) {
	server, token := c.server, c.token
	if server == "" {
		server = env.getenv("SAGACTL_SERVER")
	}
	if token == "" {
		token = env.getenv("SAGACTL_TOKEN")
	}
	if c.timeout <= 0 {
		return nil, usagef("--timeout must be positive")
	}
	if server == "" {
		return nil, usagef("no admin server: pass --server URL or set SAGACTL_SERVER")
	}
	if token == "" {
		return nil, usagef("no token: pass --token or set SAGACTL_TOKEN")
	}
	u, err := url.Parse(server)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, usagef("--server %q: want an http:// or https:// URL", server)
	}
	u.Path = strings.TrimSuffix(u.Path, "/") + "/"
	return &client{base: u, token: token, http: &http.Client{Timeout: c.timeout}}, nil
}

// apiFailure is an error answer of the admin API.
type apiFailure struct {
	status int
	body   admin.Error
	raw    []byte
}

// Error is the status, code and message, escaped (termtext.Escape): the
// message may quote what a request or the database held.
func (e *apiFailure) Error() string {
	return fmt.Sprintf("%d %s: %s", e.status, termtext.Escape(e.body.Code), termtext.Escape(e.body.Message))
}

// call sends one request; a 2xx answer's body is returned raw (and decoded
// into out when out is not nil).
func (c *client) call(ctx context.Context, method, path string, query url.Values, body, out any) ([]byte, error) {
	u := c.base.JoinPath(path)
	if len(query) > 0 {
		u.RawQuery = query.Encode()
	}
	var rd io.Reader
	if body != nil {
		raw, err := json.Marshal(body)
		if err != nil {
			return nil, fmt.Errorf("encode request: %w", err)
		}
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), rd)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, u.Redacted(), err)
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(res.Body, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("%s %s: read answer: %w", method, path, err)
	}
	if res.StatusCode/100 != 2 {
		f := &apiFailure{status: res.StatusCode, raw: raw}
		if json.Unmarshal(raw, &f.body) != nil || f.body.Code == "" {
			f.body = admin.Error{Code: http.StatusText(res.StatusCode), Message: strings.TrimSpace(firstLine(string(raw)))}
		}
		return raw, f
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			return raw, fmt.Errorf("%s %s: decode answer: %w", method, path, err)
		}
	}
	return raw, nil
}

// printJSON writes an API answer as indented JSON.
func printJSON(w io.Writer, raw []byte) error {
	var buf bytes.Buffer
	if err := json.Indent(&buf, raw, "", "  "); err != nil {
		_, err = w.Write(raw)
		return err
	}
	buf.WriteByte('\n')
	_, err := w.Write(buf.Bytes())
	return err
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return s
}

// listPages GETs path with q and, when all is set, every following page by
// its next cursor, collecting the items unpack takes out of each page. With
// --json and without --all it prints the API's page as is and reports
// printed. next is the cursor of the page after the last one fetched.
func listPages[P any, T any](ctx context.Context, cl *client, env *cliEnv, asJSON, all bool, path string, q url.Values,
	unpack func(P) ([]T, string),
) (items []T, next string, printed bool, err error) {
	for {
		var page P
		raw, err := cl.call(ctx, http.MethodGet, path, q, nil, &page)
		if err != nil {
			return nil, "", false, err
		}
		if asJSON && !all {
			return nil, "", true, printJSON(env.stdout, raw)
		}
		got, cursor := unpack(page)
		items, next = append(items, got...), cursor
		if !all || next == "" {
			return items, next, false, nil
		}
		q.Set("cursor", next)
	}
}
