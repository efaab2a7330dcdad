package testenv

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// EnvRedisURL names the Redis server scripts/services.sh starts.
const EnvRedisURL = "SAGA_REDIS_URL"

// Redis returns a client of the shared Redis server (SAGA_REDIS_URL) and a
// key prefix unique to the test; the keys under it are deleted and the
// client closed when the test ends. Like the other servers, a missing
// SAGA_REDIS_URL fails the test under CI=true and skips it otherwise; a
// server that does not answer fails it.
func Redis(t testing.TB) (*redis.Client, string) {
	t.Helper()
	raw := require(t, EnvRedisURL)
	opts, err := redis.ParseURL(raw)
	if err != nil {
		t.Fatalf("testenv: parse %s: %v", EnvRedisURL, err)
	}
	c := redis.NewClient(opts)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		_ = c.Close()
		t.Fatalf("testenv: Redis at %s does not answer: %v (%s)", redact(raw), err, howTo)
	}
	prefix := uniqueName(t) + ":"
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		iter := c.Scan(ctx, 0, prefix+"*", 100).Iterator()
		for iter.Next(ctx) {
			_ = c.Del(ctx, iter.Val()).Err()
		}
		_ = c.Close()
	})
	return c, prefix
}

// RedisServer is a Redis server of one test's own, a plain redis-server
// process on a free loopback port with its files in a temporary directory,
// that the test may stop and start again (which the shared server must not
// suffer).
type RedisServer struct {
	// URL reaches the server; it stays the same across restarts.
	URL string

	t    testing.TB
	dir  string
	port int
	args []string
	cmd  *exec.Cmd
}

// PrivateRedis starts a Redis server for the test and stops it when the
// test ends. With persist, the server keeps an append-only file fsynced on
// every write and a restart keeps its keys; without, a restart loses them.
// redis-server must be installed (scripts/services.sh installs it): without
// it the test fails under CI=true and is skipped otherwise.
func PrivateRedis(t testing.TB, persist bool) *RedisServer {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("testenv: redis-server is not installed: CI must install it (%s)", howTo)
		}
		t.Skipf("redis-server is not installed; this test needs it: %s", howTo)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testenv: find a free port: %v", err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	dir := t.TempDir()
	args := []string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
		"--daemonize", "no", "--save", "", "--logfile", filepath.Join(dir, "redis.log")}
	if persist {
		args = append(args, "--appendonly", "yes", "--appendfsync", "always")
	} else {
		args = append(args, "--appendonly", "no")
	}
	s := &RedisServer{URL: fmt.Sprintf("redis://127.0.0.1:%d/0", port), t: t, dir: dir, port: port, args: append([]string{bin}, args...)}
	t.Cleanup(s.Stop)
	s.Start()
	return s
}

// Start starts the server (again) on its port and waits until it answers.
func (s *RedisServer) Start() {
	s.t.Helper()
	if s.cmd != nil {
		s.t.Fatalf("testenv: Redis on port %d already runs", s.port)
	}
	cmd := exec.Command(s.args[0], s.args[1:]...)
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("testenv: start redis-server: %v", err)
	}
	s.cmd = cmd
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + strconv.Itoa(s.port), MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
			s.t.Fatalf("testenv: redis-server on port %d did not answer within 10 s: %v\n%s", s.port, err, log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop stops the server (SIGTERM: with persistence, Redis flushes its file
// first) and waits for it to exit. Stopping a stopped server does nothing.
func (s *RedisServer) Stop() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(os.Interrupt)
	done := make(chan struct{})
	go func() {
		_ = s.cmd.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		_ = s.cmd.Process.Kill()
		<-done
	}
	s.cmd = nil
}

// Restart stops and starts the server on the same port and files.
func (s *RedisServer) Restart() {
	s.t.Helper()
	s.Stop()
	s.Start()
}
