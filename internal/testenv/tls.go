package testenv

import (
	"crypto/tls"
	"crypto/x509"
	"net/url"
	"os"
	"testing"
)

// TLS environment variables (see scripts/services.sh).
const (
	EnvTLSCA       = "SAGA_TLS_CA"
	EnvPostgresTLS = "SAGA_PG_TLS_URL"
	EnvAMQPS       = "SAGA_AMQPS_URL"
)

// TLSConfig returns a client TLS configuration that trusts only the test CA
// that signed the servers' certificates.
func TLSConfig(t testing.TB) *tls.Config {
	t.Helper()
	pemFile := require(t, EnvTLSCA)
	pem, err := os.ReadFile(pemFile)
	if err != nil {
		t.Fatalf("testenv: read %s: %v", EnvTLSCA, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		t.Fatalf("testenv: %s holds no certificate", pemFile)
	}
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
}

// PostgresTLSURL is PostgresURL over TLS with sslmode=verify-full against
// the test CA: a fresh schema, dropped when the test ends.
func PostgresTLSURL(t testing.TB) string {
	t.Helper()
	base := require(t, EnvPostgresTLS)
	plain, err := url.Parse(PostgresURL(t))
	if err != nil {
		t.Fatalf("testenv: parse schema URL: %v", err)
	}
	u, err := url.Parse(base)
	if err != nil {
		t.Fatalf("testenv: parse %s: %v", EnvPostgresTLS, err)
	}
	q := u.Query()
	for _, k := range []string{"search_path", "application_name"} {
		q.Set(k, plain.Query().Get(k))
	}
	u.RawQuery = q.Encode()
	return u.String()
}

// AMQPSURL is AMQP over the broker's TLS listener: a fresh vhost, deleted
// when the test ends. Dial it with TLSConfig.
func AMQPSURL(t testing.TB) string {
	t.Helper()
	base := require(t, EnvAMQPS)
	plain, err := url.Parse(AMQP(t))
	if err != nil {
		t.Fatalf("testenv: parse vhost URL: %v", err)
	}
	u, err := url.Parse(base)
	if err != nil {
		t.Fatalf("testenv: parse %s: %v", EnvAMQPS, err)
	}
	u.Path, u.RawPath = plain.Path, plain.RawPath
	return u.String()
}
