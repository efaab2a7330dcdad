// Package redislock is the Redis [lock.Backend], for teams that already run
// Redis: a lease is the key PREFIX{NAME} holding the owner token, set with
// SET NX PX; extend and release are Lua scripts that act only while the key
// still holds the caller's token (compare-and-set, compare-and-delete), so
// no process can extend or release another's lease.
//
// # Fencing tokens
//
// The token of a lease comes from INCR on the counter key
// PREFIX{NAME}:fence, in the same script as the SET, so a token is handed
// out exactly when a lease is taken. The counter never expires. A Redis that
// restarts without its data (no persistence, or an append-only file older
// than the last tokens) would count from a lower value again; the script
// therefore raises the counter to at least the server clock in
// microseconds (TIME) before it hands a token out, so tokens keep growing
// across such a restart as long as the Redis host's clock does not go
// backwards. Tokens are large numbers as a result; only their order
// matters.
//
// # Restarts and failover
//
// A lease lives in the server's memory. A restart without persistence
// forgets every lease: another owner can take a name at once while the
// previous owner still works, and the previous owner's Extend and Release
// fail with lock.ErrLost. With the append-only file (fsync every second or
// always), a restart keeps the leases that reached the file, with their
// absolute expiries. A replica promoted after a failover lacks the writes
// it had not received. In every case the fencing token is what keeps a
// superseded owner's writes out; the lease only keeps owners from working
// at the same time while Redis stays up. This package uses one Redis
// server (no Redlock).
package redislock

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/protosaga/saga/runtime/lock"
)

// DefaultPrefix starts every key this package writes.
const DefaultPrefix = "saga:lock:"

// Options configures the backend.
type Options struct {
	// Prefix starts every key (default DefaultPrefix): the lease is
	// Prefix+"{"+name+"}", its fencing counter the same with ":fence".
	Prefix string
}

// New returns the Redis backend on client.
func New(client redis.UniversalClient, opts Options) lock.Backend {
	if opts.Prefix == "" {
		opts.Prefix = DefaultPrefix
	}
	return &backend{c: client, prefix: opts.Prefix}
}

// NewLocker returns a Locker on the Redis backend of client.
func NewLocker(client redis.UniversalClient, opts Options, cfg lock.Config) (*lock.Locker, error) {
	return lock.New(New(client, opts), cfg)
}

type backend struct {
	c      redis.UniversalClient
	prefix string
}

func (*backend) Name() string { return "redis" }

// acquireScript: KEYS[1] lease, KEYS[2] counter; ARGV[1] owner, ARGV[2] ttl
// ms. Returns the token, or -1 when another owner holds the lease. The same
// owner takes its lease again (a retry after a lost reply).
var acquireScript = redis.NewScript(`
local cur = redis.call('GET', KEYS[1])
if cur and cur ~= ARGV[1] then
  return -1
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
local t = redis.call('TIME')
local floor = tonumber(t[1]) * 1000000 + tonumber(t[2])
local n = redis.call('INCR', KEYS[2])
if n < floor then
  redis.call('SET', KEYS[2], string.format('%d', floor))
  n = floor
end
return n
`)

// extendScript: KEYS[1] lease; ARGV[1] owner, ARGV[2] ttl ms. 1 when
// extended, 0 when the key does not hold owner.
var extendScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
`)

// releaseScript: KEYS[1] lease; ARGV[1] owner. 1 when deleted, 0 when the
// key does not hold owner.
var releaseScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
`)

// keys are the lease and counter keys of name, in one hash slot (the
// braces) so that a Redis Cluster runs the scripts.
func (b *backend) keys(name string) []string {
	k := b.prefix + "{" + name + "}"
	return []string{k, k + ":fence"}
}

func (b *backend) TryAcquire(ctx context.Context, name, owner string, ttl time.Duration) (int64, error) {
	n, err := acquireScript.Run(ctx, b.c, b.keys(name), owner, ttl.Milliseconds()).Int64()
	if err != nil {
		return 0, fmt.Errorf("redis acquire script: %w", err)
	}
	if n < 0 {
		return 0, lock.ErrHeld
	}
	return n, nil
}

// Extend checks the owner, not the token: the key holds only the owner,
// which is unique per lease.
func (b *backend) Extend(ctx context.Context, name, owner string, _ int64, ttl time.Duration) error {
	n, err := extendScript.Run(ctx, b.c, b.keys(name)[:1], owner, ttl.Milliseconds()).Int64()
	if err != nil {
		return fmt.Errorf("redis extend script: %w", err)
	}
	if n == 0 {
		return lock.ErrLost
	}
	return nil
}

func (b *backend) Release(ctx context.Context, name, owner string, _ int64) error {
	n, err := releaseScript.Run(ctx, b.c, b.keys(name)[:1], owner).Int64()
	if err != nil {
		return fmt.Errorf("redis release script: %w", err)
	}
	if n == 0 {
		return fmt.Errorf("%w: the key no longer holds this owner (expired, taken, or forgotten by a restart)", lock.ErrLost)
	}
	return nil
}
