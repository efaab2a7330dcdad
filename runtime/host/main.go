package host

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
)

// Main runs a service from the environment: it reads the configuration with
// [FromEnv], builds the host, makes its logger slog's default (so the
// service's own logs come out alike), calls register to add the service's
// participants and sagas (the generated Register functions), and runs until
// SIGINT or SIGTERM, then stops in order and returns; SIGHUP reloads the
// admin tokens file (SAGA_ADMIN_TOKENS_FILE). When anything fails it
// prints the reason on standard error and exits the process with status 1.
// A service's main is one call:
//
//	func main() {
//		host.Main(func(h *host.Host) error {
//			return inventoryv1.RegisterInventoryParticipant(h, inventory{})
//		})
//	}
func Main(register func(*Host) error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Getenv, register, true); err != nil {
		fmt.Fprintln(os.Stderr, err)
		stop()
		os.Exit(1)
	}
}

// MainContext is [Main] without the process around it (and without setting
// slog's default): configuration through getenv, until ctx ends; it
// returns what Main would print.
func MainContext(ctx context.Context, getenv func(string) string, register func(*Host) error) error {
	return run(ctx, getenv, register, false)
}

func run(ctx context.Context, getenv func(string) string, register func(*Host) error, setDefault bool) error {
	cfg, err := FromEnv(getenv)
	if err != nil {
		return fmt.Errorf("configuration: %w", err)
	}
	h, err := New(ctx, cfg)
	if err != nil {
		return err
	}
	if setDefault {
		slog.SetDefault(h.Logger())
	}
	if err := register(h); err != nil {
		h.Close()
		return fmt.Errorf("host %s: register: %w", h.cfg.Service, err)
	}
	if setDefault && h.cfg.AdminTokensFile != "" {
		// SIGHUP reloads the admin tokens file (as the host does when the
		// file changes).
		hup := make(chan os.Signal, 1)
		signal.Notify(hup, syscall.SIGHUP)
		defer signal.Stop(hup)
		go func() {
			for range hup {
				_ = h.ReloadAdminTokens() // logged
			}
		}()
	}
	return h.Run(ctx)
}
