package raw

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	orderv1 "github.com/protosaga/saga/examples/placeorder/shop/order/v1"
	"github.com/protosaga/saga/runtime/schema"
)

// StepScript is the pgbench script of one saga step as the runtime's hot
// loop runs it, on the runtime's real tables: claim the message in the inbox,
// lock the saga row, update it, insert the next command into the outbox. One
// transaction, one commit. (The runtime's step also writes an audit row and
// runs pg_notify; the script leaves them out, so the ceiling it measures is
// generous.)
const StepScript = `\set sid random(1, :sagas)
BEGIN;
INSERT INTO saga_inbox (consumer, message_id) VALUES ('pgbench', gen_random_uuid()::text);
SELECT state, version, data FROM saga_place_order WHERE id = md5(:sid::text)::uuid FOR UPDATE;
UPDATE saga_place_order SET version = version + 1, attempt = 0, progress = '{"sent":["x"]}', updated_at = now() WHERE id = md5(:sid::text)::uuid;
INSERT INTO saga_outbox (message_id, exchange, routing_key, message_type, schema_version, body, occurred_at) VALUES (gen_random_uuid()::text, 'shop.payment.v1.commands', 'command.shop.payment.v1.authorize-payment', 'shop.payment.v1.AuthorizePayment', 1, convert_to(repeat('x', 300), 'UTF8'), now());
END;
`

// StepNotifyScript is StepScript plus the runtime's wake-up for relays,
// SELECT pg_notify('saga_outbox', ”), inside the transaction, exactly as
// outbox.Enqueue runs it. PostgreSQL serializes the commits of notifying
// transactions (PreCommit_Notify takes a database-wide lock held until the
// commit record is flushed), so these commits cannot share an fsync.
var StepNotifyScript = strings.Replace(StepScript, "END;", "SELECT pg_notify('saga_outbox', '');\nEND;", 1)

// StepNotifyAfterScript is StepScript followed by the notification in a
// transaction of its own, after the commit: a notify-only transaction writes
// no WAL before its commit record and commits without waiting for a flush.
var StepNotifyAfterScript = StepScript + "SELECT pg_notify('saga_outbox', '');\n"

// PGBenchSetup creates the runtime's tables and the Place Order saga table in
// the pool's schema and fills it with sagas rows.
func PGBenchSetup(ctx context.Context, pool *pgxpool.Pool, sagas int) error {
	if err := schema.Migrate(ctx, pool, orderv1.PlaceOrderMigrations()); err != nil {
		return fmt.Errorf("pgbench setup: migrate: %w", err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO saga_place_order (id, business_key, state, data)
SELECT md5(i::text)::uuid, 'o-' || i, $2, convert_to(repeat('d', 200), 'UTF8') FROM generate_series(1, $1::int) AS i`,
		sagas, orderv1.PlaceOrderStateAuthorizePayment); err != nil {
		return fmt.Errorf("pgbench setup: fill saga rows: %w", err)
	}
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE saga_place_order`); err != nil {
		return fmt.Errorf("pgbench setup: vacuum: %w", err)
	}
	return nil
}

// PGBench describes one pgbench run.
type PGBench struct {
	Bin                  string // pgbench binary
	Host, Port, User, DB string
	Password             string
	Schema               string
	Sagas, Clients       int
	Duration             time.Duration
	Dir                  string // where the script file is written
	Script               string // default StepScript
}

var tpsLine = regexp.MustCompile(`tps = ([0-9.]+) \(without initial connection time\)`)

// Run runs pgbench with StepScript and returns the committed transactions per
// second it reports.
func (p PGBench) Run(ctx context.Context) (float64, error) {
	script := filepath.Join(p.Dir, "step.sql")
	text := p.Script
	if text == "" {
		text = StepScript
	}
	if err := os.WriteFile(script, []byte(text), 0o644); err != nil {
		return 0, fmt.Errorf("write pgbench script: %w", err)
	}
	threads := min(p.Clients, 2)
	secs := max(1, int(p.Duration.Round(time.Second)/time.Second))
	cmd := exec.CommandContext(ctx, p.Bin, "-n", "-M", "prepared", "-f", script,
		"-D", "sagas="+strconv.Itoa(p.Sagas),
		"-c", strconv.Itoa(p.Clients), "-j", strconv.Itoa(threads), "-T", strconv.Itoa(secs),
		"-h", p.Host, "-p", p.Port, "-U", p.User, p.DB)
	cmd.Env = append(os.Environ(), "PGOPTIONS=-c search_path="+p.Schema, "PGAPPNAME="+p.Schema)
	if p.Password != "" {
		cmd.Env = append(cmd.Env, "PGPASSWORD="+p.Password)
	}
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return 0, fmt.Errorf("pgbench -c %d: %w: %s", p.Clients, err, bytes.TrimSpace(errOut.Bytes()))
	}
	m := tpsLine.FindSubmatch(out.Bytes())
	if m == nil {
		return 0, fmt.Errorf("pgbench -c %d: no tps line in output: %s", p.Clients, bytes.TrimSpace(out.Bytes()))
	}
	tps, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil {
		return 0, fmt.Errorf("pgbench -c %d: parse tps %q: %w", p.Clients, m[1], err)
	}
	return tps, nil
}

// FindPGBench returns the pgbench binary: $SAGA_PG_BIN (the PostgreSQL
// installation scripts/services.sh uses) first, then $PATH, then PostgreSQL
// 15's Debian location.
func FindPGBench() (string, error) {
	if dir := os.Getenv("SAGA_PG_BIN"); dir != "" {
		if p := filepath.Join(dir, "pgbench"); fileExists(p) {
			return p, nil
		}
	}
	if p, err := exec.LookPath("pgbench"); err == nil {
		return p, nil
	}
	const debian = "/usr/lib/postgresql/15/bin/pgbench"
	if _, err := os.Stat(debian); err == nil {
		return debian, nil
	}
	return "", fmt.Errorf("pgbench not found in $PATH nor at %s (apt-get install -y postgresql-15)", debian)
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
